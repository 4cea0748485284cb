"""Test helpers shipped with condreg (usable by downstream code to test its own use of condreg).

Nothing here imports a framework at module level: everything works with NumPy alone and accepts
arrays of any Array API library (NumPy, array-api-strict, PyTorch — including tensors that require
grad or live on a GPU —, JAX, CuPy ...).

- :func:`assert_close` — compare arrays with namespace, dtype and shape checks and a dtype-aware
  default tolerance (after SciPy's ``xp_assert_close``).
- :func:`to_numpy` — a NumPy copy of any supported array.
- :func:`random_orthonormal`, :func:`matrix_with_spectrum` — matrices with a prescribed singular
  spectrum, exact ties and exact zeros included, in any namespace and dtype.
- :func:`numerical_gradient`, :func:`check_gradient`, :func:`rank_preserving_direction` — central
  finite differences in float64, entrywise or along chosen directions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

Array = Any

__all__ = [
    "SpectralFactors",
    "assert_close",
    "check_gradient",
    "default_tolerance",
    "matrix_with_spectrum",
    "numerical_gradient",
    "random_orthonormal",
    "rank_preserving_direction",
    "to_numpy",
]


# --------------------------------------------------------------------------------------------
# Conversion and comparison
# --------------------------------------------------------------------------------------------


def _module(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def to_numpy(x: Array) -> np.ndarray:
    """A NumPy copy of ``x`` (any Array API array, a Python scalar or a nested sequence).

    PyTorch tensors are detached and moved to the CPU first (``requires_grad`` and CUDA tensors are
    fine); CuPy arrays are copied to the host; JAX arrays are transferred to the host; other
    arrays go through ``numpy.asarray`` and, failing that, DLPack.
    """
    if isinstance(x, np.ndarray):
        return x.copy()
    if _module(x) == "torch":
        return x.detach().cpu().numpy().copy()
    if _module(x) == "cupy":
        return x.get()
    try:
        return np.array(x, copy=True)
    except Exception:  # noqa: BLE001 - arrays without __array__: go through DLPack on the CPU
        from array_api_compat import to_device

        try:
            x = to_device(x, "cpu")
        except Exception:  # noqa: BLE001 - not every library names its host device "cpu"
            pass
        return np.from_dlpack(x).copy()


def _namespace(x: Array) -> Any:
    from array_api_compat import array_namespace

    return array_namespace(x)


def _is_float_dtype(dtype: Any) -> bool:
    return np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating)


def default_tolerance(dtype: Any) -> float:
    """Default relative tolerance of :func:`assert_close` for a NumPy ``dtype``.

    ``4 * sqrt(eps(dtype))`` for floating dtypes (float64: ``6.0e-8``, float32: ``1.4e-3``,
    float16: ``0.12``), as SciPy's ``xp_assert_close``; ``0`` (exact comparison) otherwise.
    """
    dtype = np.dtype(dtype)
    if _is_float_dtype(dtype):
        return 4.0 * math.sqrt(float(np.finfo(dtype).eps))
    return 0.0


def assert_close(
    actual: Array,
    desired: Array,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    check_namespace: bool = True,
    check_dtype: bool = True,
    check_shape: bool = True,
    check_device: bool = True,
    err_msg: str = "",
) -> None:
    """Assert that ``actual`` and ``desired`` are the same kind of array and numerically close.

    Checks, in order (each can be switched off):

    - ``check_namespace``: both have the same Array API namespace (``array_namespace``); a Python
      scalar ``desired`` is accepted and compared by value only;
    - ``check_dtype``: the same dtype; ``check_shape``: the same shape;
    - ``check_device``: the same device (``array_api_compat.device``);
    - values: ``|actual - desired| <= atol + rtol * |desired|`` elementwise (``numpy.testing.
      assert_allclose`` in the dtype of ``actual`` converted to NumPy), NaNs equal to NaNs and
      infinities equal to infinities of the same sign.

    Default tolerances: ``rtol = 4 * sqrt(eps)`` of ``actual``'s dtype (float64: 6e-8, float32:
    1.4e-3; see :func:`default_tolerance`) and ``atol = 0``. Pass ``atol`` for values that may be
    (near) zero, e.g. gradient entries.

    Raises ``AssertionError`` with ``err_msg`` prepended.
    """
    prefix = f"{err_msg}: " if err_msg else ""
    scalar_desired = isinstance(desired, (int, float, bool, np.generic)) or (
        isinstance(desired, (list, tuple))
    )
    if check_namespace and not scalar_desired:
        xa, xd = _namespace(actual), _namespace(desired)
        if xa is not xd:
            raise AssertionError(
                f"{prefix}namespaces differ: {getattr(xa, '__name__', xa)} "
                f"vs {getattr(xd, '__name__', xd)}"
            )
    if check_dtype and not scalar_desired and actual.dtype != desired.dtype:
        raise AssertionError(f"{prefix}dtypes differ: {actual.dtype} vs {desired.dtype}")
    if check_device and not scalar_desired:
        from array_api_compat import device

        da, dd = device(actual), device(desired)
        if da != dd:
            raise AssertionError(f"{prefix}devices differ: {da} vs {dd}")
    a = to_numpy(actual)
    d = to_numpy(desired)
    if check_shape and not scalar_desired and a.shape != d.shape:
        raise AssertionError(f"{prefix}shapes differ: {a.shape} vs {d.shape}")
    if rtol is None:
        rtol = default_tolerance(a.dtype)
    if atol is None:
        atol = 0.0
    np.testing.assert_allclose(a, d, rtol=rtol, atol=atol, equal_nan=True, err_msg=err_msg)


# --------------------------------------------------------------------------------------------
# Matrices with a prescribed spectrum
# --------------------------------------------------------------------------------------------


def random_orthonormal(n: int, r: int, *, seed: Any = None) -> np.ndarray:
    """A random ``n×r`` matrix with orthonormal columns (``r <= n``), float64.

    The Q factor of the QR decomposition of an ``n×r`` standard Gaussian matrix, with the signs of
    the columns fixed so that ``diag(R) > 0`` (which makes Q Haar-distributed).
    ``seed``: anything ``numpy.random.default_rng`` accepts, or a ``Generator``.
    """
    if r > n:
        raise ValueError(f"cannot have {r} orthonormal columns in dimension {n}")
    rng = np.random.default_rng(seed)
    if r == 0:
        return np.zeros((n, 0))
    Q, R = np.linalg.qr(rng.standard_normal((n, r)))
    signs = np.sign(np.diag(R))
    signs[signs == 0] = 1.0
    return Q * signs


class SpectralFactors(NamedTuple):
    """Float64 NumPy factors of a matrix built by :func:`matrix_with_spectrum`.

    ``S = U @ (s[..., :, None] * Vt)`` with ``U`` of shape ``(..., m, p)``, ``s`` ``(..., p)``
    (the given values, zero-padded to ``p = min(m, n)``, in the given order) and ``Vt`` of shape
    ``(..., p, n)``; ``V = Vt.mT``. The columns of ``U``/``V`` beyond the nonzero values are still
    orthonormal (a basis of the complement).
    """

    U: np.ndarray
    s: np.ndarray
    Vt: np.ndarray

    @property
    def V(self) -> np.ndarray:
        return np.swapaxes(self.Vt, -1, -2)

    @property
    def rank(self) -> int:
        """Number of exactly nonzero values (of the first matrix of a batch)."""
        return int(np.count_nonzero(self.s.reshape(-1, self.s.shape[-1])[0]))


def matrix_with_spectrum(
    singular_values: Sequence[float] | np.ndarray,
    m: int,
    n: int,
    *,
    seed: Any = 0,
    xp: Any = None,
    dtype: Any = None,
    device: Any = None,
    return_factors: bool = False,
) -> Any:
    """``S = U diag(s) Vᵀ`` with random orthonormal ``U`` (``m×p``), ``V`` (``n×p``).

    ``p = min(m, n)``.

    ``singular_values``: at most ``p`` values (zero-padded to ``p``), any order, repeats and zeros
    allowed — exactly tied values give exactly tied singular values of the float64 matrix (up to
    the rounding of the product), zeros give a rank-deficient matrix. A 2-D array of shape
    ``(B, r)`` builds a batch of shape ``(B, m, n)`` (independent factors per matrix).

    The matrix is formed in float64 NumPy, then converted with ``xp.asarray(S, dtype=dtype,
    device=device)`` (``xp`` defaults to NumPy; ``dtype=None`` keeps float64 where the library
    allows it; ``device=None`` uses the library's default).

    With ``return_factors=True`` returns ``(S, SpectralFactors(U, s, Vt))`` with float64 NumPy
    factors, useful to build directions (see :func:`rank_preserving_direction`) or rotate a tied
    subspace. ``seed`` is passed to ``numpy.random.default_rng``.
    """
    rng = np.random.default_rng(seed)
    values = np.asarray(singular_values, dtype=np.float64)
    if values.ndim not in (1, 2):
        raise ValueError("singular_values must be a sequence (one matrix) or 2-D (a batch)")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError("singular values must be finite and non-negative")
    p = min(m, n)
    if values.shape[-1] > p:
        raise ValueError(f"at most min(m, n) = {p} singular values, got {values.shape[-1]}")
    s = np.zeros(values.shape[:-1] + (p,))
    s[..., : values.shape[-1]] = values
    if values.ndim == 1:
        U = random_orthonormal(m, p, seed=rng)
        V = random_orthonormal(n, p, seed=rng)
    else:
        U = np.stack([random_orthonormal(m, p, seed=rng) for _ in range(values.shape[0])])
        V = np.stack([random_orthonormal(n, p, seed=rng) for _ in range(values.shape[0])])
    Vt = np.swapaxes(V, -1, -2)
    S = U @ (s[..., :, None] * Vt)
    out = S
    if xp is not None and xp is not np:
        kwargs = {}
        if dtype is not None:
            kwargs["dtype"] = dtype
        if device is not None:
            kwargs["device"] = device
        out = xp.asarray(S, **kwargs)
    elif dtype is not None or device is not None:
        out = np.asarray(S, dtype=dtype)
    if return_factors:
        return out, SpectralFactors(U, s, Vt)
    return out


# --------------------------------------------------------------------------------------------
# Finite differences
# --------------------------------------------------------------------------------------------


def _scalar(y: Any) -> float:
    a = to_numpy(y)
    if a.size != 1:
        raise ValueError(f"the function must return a scalar, got shape {a.shape}")
    return float(a.reshape(()))


def _default_step(S: np.ndarray, order: float) -> float:
    scale = max(1.0, float(np.max(np.abs(S))) if S.size else 1.0)
    return float(np.finfo(np.float64).eps) ** (1.0 / order) * scale


def numerical_gradient(
    f: Callable[[np.ndarray], Any], S: Array, *, h: float | None = None
) -> np.ndarray:
    """Entrywise central-difference gradient of a scalar function, in float64 NumPy.

    ``G[idx] = (f(S + h e_idx) − f(S − h e_idx)) / (2h)`` for every index ``idx`` of ``S`` (any
    shape; ``f`` must return a scalar, e.g. a sum over a batch). ``S`` is converted to float64
    NumPy and ``f`` is called with float64 NumPy arrays. Default step ``h = eps**(1/3) *
    max(1, max|S|)`` (about ``6e-6`` at unit scale), which balances the O(h²) truncation error
    against rounding. Costs ``2 * S.size`` evaluations; only valid where ``f`` is differentiable.
    """
    S = to_numpy(S).astype(np.float64)
    if h is None:
        h = _default_step(S, 3.0)
    G = np.zeros_like(S)
    for idx in np.ndindex(S.shape):
        E = np.zeros_like(S)
        E[idx] = h
        G[idx] = (_scalar(f(S + E)) - _scalar(f(S - E))) / (2.0 * h)
    return G


def rank_preserving_direction(U: Any, V: Any, rng: Any = None) -> np.ndarray:
    """A random unit-Frobenius-norm direction ``E = U A Vᵀ`` that keeps the rank of ``S``.

    ``U`` (``(..., m, k)``) and ``V`` (``(..., n, k)``) are orthonormal factors of the nonzero
    part of ``S = U diag(s) Vᵀ`` (``s > 0``); ``A`` is ``k×k`` standard Gaussian. Then
    ``S + tE = U (diag(s) + tA) Vᵀ`` has rank ``k`` for all small ``t``, so finite differences of
    functions of the nonzero spectrum (κ, R_ill) stay on the smooth rank-``k`` manifold.
    ``rng``: a seed or ``numpy.random.Generator``.
    """
    U = to_numpy(U).astype(np.float64)
    V = to_numpy(V).astype(np.float64)
    rng = np.random.default_rng(rng)
    A = rng.standard_normal(U.shape[:-2] + (U.shape[-1], V.shape[-1]))
    E = U @ A @ np.swapaxes(V, -1, -2)
    return E / np.linalg.norm(E)


def check_gradient(
    f: Callable[[np.ndarray], Any],
    grad: Array,
    S: Array,
    *,
    directions: Sequence[Array] | None = None,
    n_directions: int = 4,
    seed: Any = 0,
    h: float | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-9,
) -> None:
    """Check ``grad`` (the gradient of the scalar ``f`` at ``S``) against finite differences.

    For each direction ``E`` (given, or ``n_directions`` random Gaussian ones of unit Frobenius
    norm), the directional derivative ``⟨grad, E⟩ = Σ grad * E`` is compared with the fourth-order
    central difference

        (−f(S+2hE) + 8 f(S+hE) − 8 f(S−hE) + f(S−2hE)) / (12 h)

    computed in float64 NumPy (``f`` is called with float64 NumPy arrays and must return a
    scalar). Default step ``h = eps**(1/5) * max(1, max|S|)`` (about ``7e-4`` at unit scale); the
    truncation error is O(h⁴). The check passes when

        |⟨grad, E⟩ − fd| <= atol + rtol * max(|fd|, ‖grad‖_F ‖E‖_F)

    for every direction (the second term makes the test scale-aware when ``⟨grad, E⟩`` happens to
    be small). At points where ``f`` is not differentiable (tied extreme singular values, a change
    of rank) use directions along which it is: e.g. :func:`rank_preserving_direction` at
    rank-deficient ``S``.

    Raises ``AssertionError`` listing every failing direction.
    """
    S = to_numpy(S).astype(np.float64)
    G = to_numpy(grad).astype(np.float64)
    if G.shape != S.shape:
        raise AssertionError(f"gradient shape {G.shape} differs from the input's {S.shape}")
    if directions is None:
        rng = np.random.default_rng(seed)
        directions = []
        for _ in range(n_directions):
            E = rng.standard_normal(S.shape)
            directions.append(E / np.linalg.norm(E))
    if h is None:
        h = _default_step(S, 5.0)
    failures = []
    for i, E in enumerate(directions):
        E = to_numpy(E).astype(np.float64)
        if E.shape != S.shape:
            raise ValueError(f"direction {i} has shape {E.shape}, expected {S.shape}")
        fd = (
            -_scalar(f(S + 2 * h * E))
            + 8 * _scalar(f(S + h * E))
            - 8 * _scalar(f(S - h * E))
            + _scalar(f(S - 2 * h * E))
        ) / (12 * h)
        analytic = float(np.sum(G * E))
        scale = max(abs(fd), float(np.linalg.norm(G) * np.linalg.norm(E)))
        err = abs(analytic - fd)
        if not (err <= atol + rtol * scale):
            failures.append(
                f"direction {i}: <grad, E> = {analytic:.10g}, finite difference = {fd:.10g}, "
                f"|error| = {err:.3g} > atol + rtol*scale = {atol + rtol * scale:.3g}"
            )
    if failures:
        raise AssertionError(
            f"gradient check failed (h = {h:.3g}) in {len(failures)} of {len(directions)} "
            "directions:\n  " + "\n  ".join(failures)
        )
