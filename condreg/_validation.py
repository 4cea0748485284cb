"""Input validation shared by every public function."""

from __future__ import annotations

from typing import Any

from array_api_compat import array_namespace, is_numpy_array

from condreg import _core

Array = Any


def _inferred(arrays: tuple[Array, ...], where: str) -> Any:
    try:
        return array_namespace(*arrays)
    except TypeError as exc:
        kinds = sorted({type(a).__module__ + "." + type(a).__name__ for a in arrays})
        raise TypeError(
            f"{where}: expected arrays of one Array API library (NumPy, CuPy, PyTorch, JAX, "
            f"array-api-strict ...), got {', '.join(kinds)} ({exc})"
        ) from None


def _kind(a: Any) -> str:
    return type(a).__module__.split(".")[0] + "." + type(a).__name__


def named_namespace(where: str, arrays: dict[str, Array], hint: str = "") -> Any:
    """The one Array API library of the named ``arrays``: ``TypeError`` naming the argument that
    is not an array, or every argument's library when they differ (condreg never converts
    between libraries); ``hint`` ends that message."""
    from array_api_compat import is_array_api_obj

    for name, a in arrays.items():
        if not is_array_api_obj(a):
            raise TypeError(
                f"{where}: {name} must be an array (NumPy, PyTorch, JAX or another Array API "
                f"library), got {_kind(a)}"
            )
    try:
        return array_namespace(*arrays.values())
    except TypeError:
        kinds = ", ".join(f"{k}: {_kind(a)}" for k, a in arrays.items())
        raise TypeError(
            f"{where}: all arrays must come from one Array API library ({kinds}){hint}"
        ) from None


def namespace(*arrays: Array, xp: Any = None, where: str = "condreg") -> Any:
    """The Array API namespace of ``arrays`` (``xp`` overrides it).

    Raises ``TypeError`` for non-arrays, for arrays of different libraries in one call, for an
    ``xp`` of another library than the arrays, and for a namespace without the ``linalg``
    extension.
    """
    inferred = _inferred(arrays, where)
    chosen = inferred if xp is None else xp
    if not hasattr(chosen, "linalg"):
        raise TypeError(
            f"{where}: the array namespace {getattr(chosen, '__name__', chosen)!r} has no linalg "
            "extension; condreg needs linalg.svd"
        )
    if _library(inferred) != _library(chosen):
        # An explicit namespace must belong to the same library as the arrays: condreg does not
        # convert between libraries (that would silently copy across devices).
        raise TypeError(
            f"{where}: the input is a {_library(inferred)} array but xp is the "
            f"{_library(chosen)} namespace; convert the input first (mixed namespaces are not "
            "supported)"
        )
    xp = chosen
    return xp


def _library(xp: Any) -> str:
    """The library a namespace belongs to: ``numpy`` for both ``numpy`` and
    ``array_api_compat.numpy``, ``torch``, ``jax``, ``array_api_strict``, ``cupy`` ..."""
    name = getattr(xp, "__name__", type(xp).__name__)
    if name.startswith("array_api_compat."):
        name = name[len("array_api_compat.") :]
    return name.split(".")[0]


def concrete_for(S: Array, enabled: bool, concrete: _core.Concrete | None = None) -> _core.Concrete:
    """The callback that reads 0-d booleans for value checks, or skips them (``enabled`` false).

    ``concrete``: the adapter's own callback (PyTorch's returns ``None`` under
    ``torch.compile``); default :func:`condreg._spectrum.readable` (``None`` for a JAX tracer or
    inside ``torch.func.vmap``), NumPy arrays are always read."""
    if not enabled:
        return _core.never
    if concrete is not None:
        return concrete
    return _core.eager if is_numpy_array(S) else _core.readable


def default_float(xp: Any, S: Array) -> Any:
    info = getattr(xp, "__array_namespace_info__", None)
    if info is not None:
        try:
            return info().default_dtypes()["real floating"]
        except Exception:  # pragma: no cover - older namespaces
            pass
    return xp.float64


def all_finite(S: Array, xp: Any) -> Array:
    """0-d boolean: no NaN or Inf in ``S``, from the smallest and largest entry (reductions
    propagate NaN; ±Inf is an extreme), without an ``S``-sized temporary."""
    return xp.isfinite(xp.min(S)) & xp.isfinite(xp.max(S))


def matrix(
    S: Array,
    *,
    xp: Any = None,
    where: str,
    check_finite: bool = True,
    concrete: _core.Concrete | None = None,
) -> tuple[Array, Any, _core.Concrete]:
    """Validate a (batch of) matrices; returns ``(S, xp, concrete)`` (``concrete``: the reader
    of :func:`concrete_for`, from the adapter's callback where one is passed).

    - ``ndim < 2`` or an empty matrix dimension: ``ValueError``;
    - boolean or complex dtype: ``TypeError``; integer dtype: promoted to the namespace's default
      real floating dtype (like ``numpy.linalg``);
    - NaN/Inf entries: ``ValueError`` when the values can be read (eagerly) and ``check_finite``.
    """
    xp = namespace(S, xp=xp, where=where)
    ndim = getattr(S, "ndim", None)
    if ndim is None or ndim < 2:
        raise ValueError(
            f"{where}: expected an array of shape (..., m, n) with ndim >= 2, got ndim {ndim}"
        )
    m, n = S.shape[-2], S.shape[-1]
    if m == 0 or n == 0:
        raise ValueError(f"{where}: the matrix is empty (shape {tuple(S.shape)})")
    dtype = S.dtype
    if xp.isdtype(dtype, "bool"):
        raise TypeError(f"{where}: boolean input is not supported; convert to a real float dtype")
    if xp.isdtype(dtype, "complex floating"):
        raise TypeError(
            f"{where}: complex input ({dtype}) is not supported; condreg works on real matrices"
        )
    if xp.isdtype(dtype, "integral"):
        S = xp.astype(S, default_float(xp, S))
    elif not xp.isdtype(dtype, "real floating"):
        raise TypeError(f"{where}: unsupported dtype {dtype}; expected a real floating dtype")
    concrete = concrete_for(S, check_finite, concrete)
    empty = any(d == 0 for d in S.shape)
    if not empty and concrete is not _core.never and concrete(all_finite(S, xp)) is False:
        raise nonfinite_error(where)
    return S, xp, concrete


def nonfinite_error(where: str) -> ValueError:
    """The error for NaN/Inf input (raised by :func:`matrix`, and by the PyTorch adapter's
    ``vmap`` rule, which sees the batch :func:`matrix` could not read)."""
    return ValueError(
        f"{where}: the input contains NaN or Inf (pass check_finite=False to skip this check)"
    )


def _is_half(dtype: Any) -> bool:
    """float16 or bfloat16 (bfloat16 is not an Array API dtype: known by its name)."""
    return str(dtype).split(".")[-1] in ("float16", "bfloat16")


def _dtype_library(dtype: Any) -> str:
    """The library a dtype object belongs to (``torch``, ``numpy``, ``jax`` ...)."""
    mod = dtype.__module__ if isinstance(dtype, type) else type(dtype).__module__
    return mod.split(".")[0]


def compute_dtype(S: Array, xp: Any, dtype: Any, *, where: str) -> tuple[Array, Any]:
    """``(S in the compute dtype, the output dtype)``.

    ``dtype=None``: float16/bfloat16 input is computed in float32 (no backend decomposes half
    precision, and its rounding would swamp every singular value below ~1e-3·sigma_1); other
    dtypes as they are. An explicit ``dtype`` (a real floating dtype of the namespace, e.g.
    float64 for float32 input) is used as given. Results and gradients come back in the input
    dtype (the cast is differentiable on PyTorch and JAX).
    """
    out = S.dtype
    if dtype is None:
        if not _is_half(out):
            return S, out
        dtype = xp.float32
    else:
        try:
            ok = xp.isdtype(dtype, "real floating")
        except Exception:
            ok = False
        if not ok:
            lib, own = _dtype_library(dtype), _library(xp)
            if lib not in (own, "builtins") and not (own == "jax" and lib == "numpy"):
                raise TypeError(
                    f"{where}: compute_dtype {dtype!r} is a {lib} dtype but the input is a {own} "
                    f"array; pass a dtype of the input's library (e.g. {own}.float64)"
                )
            raise TypeError(f"{where}: compute_dtype must be a real floating dtype, got {dtype!r}")
    if dtype == out:
        return S, out
    return xp.astype(S, dtype), out


def as_output(x: Array, dtype: Any, xp: Any) -> Array:
    """``x`` in the output ``dtype`` (a no-op when it already is)."""
    return x if x.dtype == dtype else xp.astype(x, dtype)
