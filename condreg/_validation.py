"""Input validation shared by every public function."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from condreg import _backend, _core, _spectrum

Array = Any


def named_namespace(where: str, arrays: dict[str, Array], hint: str = "") -> Any:
    """The one Array API library of the named ``arrays``: ``TypeError`` naming the argument that
    is not an array, or every argument's library when they differ (condreg never converts
    between libraries); ``hint`` ends that message."""
    from array_api_compat import is_array_api_obj

    for name, a in arrays.items():
        if not is_array_api_obj(a):
            raise TypeError(
                f"{where}: {name} must be an array (NumPy, PyTorch, JAX or another Array API "
                f"library), got {_backend.kind(a)}"
            )
    try:
        return array_namespace(*arrays.values())
    except TypeError:
        kinds = ", ".join(f"{k}: {_backend.kind(a)}" for k, a in arrays.items())
        raise TypeError(
            f"{where}: all arrays must come from one Array API library ({kinds}){hint}"
        ) from None


def namespace(*arrays: Array, xp: Any = None, where: str = "condreg") -> Any:
    """The Array API namespace of ``arrays`` (``xp`` overrides it); ``TypeError`` for non-arrays,
    mixed libraries, an ``xp`` of another library, or a namespace without ``linalg``."""
    known = _KNOWN.get(_backend.library(arrays[0])) if len(arrays) == 1 else None
    try:
        inferred = array_namespace(*arrays) if known is None else sys.modules.get(known)
        inferred = importlib.import_module(known) if inferred is None else inferred
    except TypeError as exc:
        kinds = sorted({_backend.kind(a) for a in arrays})
        raise TypeError(
            f"{where}: expected arrays of one Array API library (NumPy, CuPy, PyTorch, JAX, "
            f"array-api-strict ...), got {', '.join(kinds)} ({exc})"
        ) from None
    chosen = inferred if xp is None else xp
    if not hasattr(chosen, "linalg"):
        raise TypeError(
            f"{where}: the array namespace {getattr(chosen, '__name__', chosen)!r} has no linalg "
            "extension; condreg needs linalg.svd"
        )
    if _backend.library(inferred) != _backend.library(chosen):  # never convert (a device copy)
        raise TypeError(
            f"{where}: the input is a {_backend.library(inferred)} array but xp is the "
            f"{_backend.library(chosen)} namespace; convert the input first (mixed namespaces are "
            "not supported)"
        )
    return chosen


#: Namespaces of the common libraries, found without array-api-compat's helpers (whose caches
#: ``torch.compile`` traces and warns about).
_KNOWN = {"numpy": "array_api_compat.numpy", "torch": "array_api_compat.torch", "jax": "jax.numpy"}


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


def concrete_for(S: Array, enabled: bool, concrete: _core.Concrete | None = None) -> _core.Concrete:
    """The reader of 0-d booleans for value checks: none (``enabled`` false), the adapter's
    ``concrete``, or :func:`condreg._backend.readable` (NumPy arrays: always read)."""
    if not enabled:
        return _core.never
    if concrete is not None:
        return concrete
    return _backend.eager if _backend.library(S) == "numpy" else _backend.readable


def _finite(S: Array, xp: Any, concrete: _core.Concrete) -> bool:
    """False where ``S`` readably holds NaN or Inf: a finite sum (one pass) proves every entry
    finite, else :func:`all_finite` decides (a sum of finite entries may overflow)."""
    with _backend.quiet(S):
        total = xp.sum(S)
    return bool(concrete(xp.isfinite(total))) or concrete(all_finite(S, xp)) is not False


def flag(value: Any, name: str, where: str) -> bool:
    """A boolean argument: ``bool`` or ``numpy.bool_``, else ``TypeError`` (``"yes"`` is not
    true)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{where}: {name} must be a bool, got {type(value).__name__} {value!r}")


def as_array(S: Any, where: str) -> Any:
    """``S`` as an array: an array of any Array API library as it is; an array-like (nested
    lists, tuples, scalars) converted by NumPy, as numpy.linalg does; ``TypeError`` for NumPy
    masked arrays (the mask would be silently dropped)."""
    if isinstance(S, np.ma.MaskedArray):
        raise TypeError(
            f"{where}: masked arrays are not supported (the mask would be ignored); pass "
            "S.filled(value) to fill the masked entries, or S.data to use them as they are"
        )
    from array_api_compat import is_array_api_obj

    if _backend.library(S) in _KNOWN or is_array_api_obj(S):
        return S
    try:
        A = np.asarray(S)
    except (TypeError, ValueError) as exc:  # e.g. ragged nested lists
        why = str(exc)
    else:
        if A.dtype.kind in "biufc":  # numbers (booleans are refused later, by dtype)
            return A
        why = f"NumPy reads it as {A.dtype}"
    raise TypeError(
        f"{where}: S must be an array or a numeric array-like (nested lists or tuples), got "
        f"{_backend.kind(S)} ({why})"
    )


#: The real floating dtypes condreg computes in (float16 and bfloat16 in float32).
SUPPORTED = ("float16", "bfloat16", "float32", "float64")


def matrix(
    S: Array,
    *,
    xp: Any = None,
    where: str,
    check_finite: bool = True,
    concrete: _core.Concrete | None = None,
) -> tuple[Array, Any, _core.Concrete]:
    """``(S, xp, concrete)`` for a validated (batch of) matrices: ``ValueError`` for ``ndim < 2``,
    an empty matrix or (``check_finite``) readable NaN/Inf; ``TypeError`` for boolean, complex or
    other unsupported dtypes (:data:`SUPPORTED`); integers are promoted to the default real
    floating dtype; array-likes become NumPy arrays (:func:`as_array`)."""
    S = as_array(S, where)
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
    supported = f"supported dtypes: {', '.join(SUPPORTED)} (integers are promoted)"
    if xp.isdtype(dtype, "bool"):
        raise TypeError(f"{where}: boolean input is not supported; convert to a real float dtype")
    if xp.isdtype(dtype, "complex floating"):
        raise TypeError(
            f"{where}: complex input ({dtype}) is not supported; condreg works on real matrices "
            f"({supported})"
        )
    if xp.isdtype(dtype, "integral"):
        S = xp.astype(S, default_float(xp, S))
    elif not xp.isdtype(dtype, "real floating") or str(dtype).split(".")[-1] not in SUPPORTED:
        raise TypeError(f"{where}: unsupported dtype {dtype}; {supported}")
    if not check_finite:
        return S, xp, _core.never
    concrete = concrete_for(S, check_finite, concrete)
    if 0 not in tuple(S.shape) and concrete is not _core.never and not _finite(S, xp, concrete):
        raise _spectrum.nonfinite_error(where)
    return S, xp, concrete


def compute_dtype(S: Array, xp: Any, dtype: Any, *, where: str) -> tuple[Array, Any]:
    """``(S in the compute dtype, the output dtype)``: float32 for float16/bfloat16 input (no
    backend decomposes half precision) unless ``dtype`` (a real floating dtype of the namespace)
    is given; results come back in the input dtype (a differentiable cast)."""
    out = S.dtype
    if dtype is None:
        if str(out).split(".")[-1] not in ("float16", "bfloat16"):  # bfloat16: by its name
            return S, out
        dtype = xp.float32
    else:
        try:
            ok = xp.isdtype(dtype, "real floating")
        except Exception:
            ok = False
        if not ok:
            lib, own = _backend.library(dtype), _backend.library(xp)
            if lib not in (own, "builtins") and not (own == "jax" and lib == "numpy"):
                raise TypeError(
                    f"{where}: compute_dtype {dtype!r} is a {lib} dtype but the input is a {own} "
                    f"array; pass a dtype of the input's library (e.g. {own}.float64)"
                )
            raise TypeError(f"{where}: compute_dtype must be a real floating dtype, got {dtype!r}")
    if dtype == out:
        return S, out
    return xp.astype(S, dtype), out
