"""Test helpers (docs/testing.md): array comparison, matrices with a prescribed spectrum, gradient
checks. NumPy only at import; every function accepts arrays of any Array API library.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

Array = Any

__all__ = ["SpectralFactors", "assert_close", "check_gradient", "default_tolerance", "to_numpy"]
__all__ += ["matrix_with_spectrum", "numerical_gradient", "random_orthonormal"]
__all__ += ["rank_preserving_direction"]


def to_numpy(x: Array) -> np.ndarray:
    """A NumPy copy of ``x`` (any Array API array, even on a GPU or requiring grad; a scalar).

    Parameters
    ----------
    x : array_like
        The array to copy.

    Examples
    --------
    >>> from condreg.testing import to_numpy
    >>> to_numpy([[1.0, 2.0]]).shape
    (1, 2)
    """
    from condreg import _backend

    return np.array(_backend.to_host(x) if hasattr(x, "shape") else x, copy=True)


def default_tolerance(dtype: Any) -> float:
    """Default relative tolerance of :func:`assert_close` for a NumPy ``dtype``.

    ``4·sqrt(eps(dtype))`` for floating dtypes (as SciPy's ``xp_assert_close``), ``0`` otherwise.

    Parameters
    ----------
    dtype : dtype_like
        Anything ``numpy.dtype`` accepts.

    Examples
    --------
    >>> from condreg.testing import default_tolerance
    >>> default_tolerance("int64")
    0.0
    """
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.inexact):  # floating or complex
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

    ``|actual − desired| ≤ atol + rtol·|desired|`` elementwise, NaN equal to NaN; a Python scalar
    or sequence ``desired`` is compared by value only.

    Parameters
    ----------
    actual, desired : array_like
        The arrays to compare.
    rtol, atol : float, optional
        Tolerances; default :func:`default_tolerance` of ``actual``'s dtype and 0.
    check_namespace, check_dtype, check_shape, check_device : bool
        Require the same Array API namespace, dtype, shape and device.
    err_msg : str
        Prepended to the failure message.

    Raises
    ------
    AssertionError
        If a check fails or the values are not close.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.testing import assert_close
    >>> assert_close(np.asarray([1.0, np.nan]), np.asarray([1.0 + 1e-12, np.nan]))
    """
    prefix = f"{err_msg}: " if err_msg else ""
    scalar_desired = isinstance(desired, (int, float, bool, np.generic, list, tuple))
    if check_namespace and not scalar_desired:
        from array_api_compat import array_namespace

        xa, xd = array_namespace(actual), array_namespace(desired)
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
    a, d = to_numpy(actual), to_numpy(desired)
    if check_shape and not scalar_desired and a.shape != d.shape:
        raise AssertionError(f"{prefix}shapes differ: {a.shape} vs {d.shape}")
    rtol = default_tolerance(a.dtype) if rtol is None else rtol
    atol = 0.0 if atol is None else atol
    np.testing.assert_allclose(a, d, rtol=rtol, atol=atol, equal_nan=True, err_msg=err_msg)


def random_orthonormal(n: int, r: int, *, seed: Any = None) -> np.ndarray:
    """A random (Haar-distributed) float64 ``n×r`` matrix ``Q`` with orthonormal columns.

    Parameters
    ----------
    n, r : int
        The shape, ``r ≤ n``.
    seed : optional
        Anything ``numpy.random.default_rng`` accepts, or a ``Generator``.

    Raises
    ------
    ValueError
        If ``r > n``.

    Examples
    --------
    >>> from condreg.testing import random_orthonormal
    >>> random_orthonormal(5, 3, seed=0).shape
    (5, 3)
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
    """Float64 factors ``S = U @ (s[..., :, None] * Vt)`` of :func:`matrix_with_spectrum`;
    ``rank`` counts the nonzero ``s`` (of the first matrix of a batch)."""

    U: np.ndarray
    s: np.ndarray
    Vt: np.ndarray

    @property
    def V(self) -> np.ndarray:
        return np.swapaxes(self.Vt, -1, -2)

    @property
    def rank(self) -> int:
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
    """``S = U diag(s) Vᵀ`` with random orthonormal ``U`` (``m×p``), ``V`` (``n×p``), p = min(m, n).

    Parameters
    ----------
    singular_values : sequence of float or numpy.ndarray
        At most ``p`` values ``≥ 0`` (zero-padded); a 2-D ``(B, r)`` array builds a batch.
    m, n : int
        The matrix shape.
    seed : optional
        Passed to ``numpy.random.default_rng``.
    xp, dtype, device : optional
        Convert the float64 ``S`` with ``xp.asarray(S, dtype=dtype, device=device)``.
    return_factors : bool
        Also return the float64 :class:`SpectralFactors`.

    Returns
    -------
    array or tuple
        ``S``, or ``(S, SpectralFactors(U, s, Vt))`` with ``return_factors=True``.

    Raises
    ------
    ValueError
        For negative or non-finite values, more than ``p`` of them, or an array not 1-D or 2-D.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.testing import matrix_with_spectrum
    >>> S = matrix_with_spectrum([3.0, 1.0, 0.0], 4, 3)
    >>> np.round(np.linalg.svd(S, compute_uv=False), 12)
    array([3., 1., 0.])
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
    if xp is not None and xp is not np:
        kwargs = {"dtype": dtype, "device": device}
        out = xp.asarray(S, **{k: v for k, v in kwargs.items() if v is not None})
    else:
        out = np.asarray(S, dtype=dtype)
    return (out, SpectralFactors(U, s, Vt)) if return_factors else out


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
    """Entrywise central-difference gradient ``(f(S + h e_idx) − f(S − h e_idx)) / (2h)``.

    Parameters
    ----------
    f : callable
        Called with float64 NumPy arrays of ``S``'s shape; returns a scalar.
    S : array_like
        The point (any shape).
    h : float, optional
        The step; default ``eps**(1/3)·max(1, max|S|)``.

    Raises
    ------
    ValueError
        If ``f`` does not return a scalar.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.testing import numerical_gradient
    >>> np.round(numerical_gradient(lambda a: np.sum(a**2), np.asarray([1.0, -2.0])), 6)
    array([ 2., -4.])
    """
    S = to_numpy(S).astype(np.float64)
    h = _default_step(S, 3.0) if h is None else h
    G = np.zeros_like(S)
    for idx in np.ndindex(S.shape):
        E = np.zeros_like(S)
        E[idx] = h
        G[idx] = (_scalar(f(S + E)) - _scalar(f(S - E))) / (2.0 * h)
    return G


def rank_preserving_direction(U: Any, V: Any, rng: Any = None) -> np.ndarray:
    """A random direction ``E = U A Vᵀ``, ``‖E‖_F = 1``: ``S + tE`` keeps the rank of ``S``.

    Parameters
    ----------
    U, V : array_like
        ``(..., m, k)`` and ``(..., n, k)``: orthonormal factors of ``S``'s nonzero part.
    rng : optional
        A seed or ``numpy.random.Generator``.

    Examples
    --------
    >>> from condreg.testing import matrix_with_spectrum, rank_preserving_direction
    >>> S, f = matrix_with_spectrum([2.0, 1.0, 0.0], 3, 3, return_factors=True)
    >>> rank_preserving_direction(f.U[:, :2], f.V[:, :2], rng=0).shape
    (3, 3)
    """
    U, V = to_numpy(U).astype(np.float64), to_numpy(V).astype(np.float64)
    A = np.random.default_rng(rng).standard_normal(U.shape[:-2] + (U.shape[-1], V.shape[-1]))
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
    """Check ``grad``, the gradient of the scalar ``f`` at ``S``, against finite differences.

    Passes when ``|⟨grad, E⟩ − fd| ≤ atol + rtol·max(|fd|, ‖grad‖_F ‖E‖_F)`` for each direction
    ``E``, ``fd = (−f(S+2hE) + 8 f(S+hE) − 8 f(S−hE) + f(S−2hE)) / (12 h)``.

    Parameters
    ----------
    f : callable
        Called with float64 NumPy arrays of ``S``'s shape; returns a scalar.
    grad, S : array_like
        The gradient to check and the point, of one shape.
    directions : sequence of array_like, optional
        The directions ``E``; default ``n_directions`` random unit ones drawn from ``seed``.
    n_directions : int, optional
        Number of random directions.
    seed : int, optional
        Their seed.
    h : float, optional
        The step; default ``eps**(1/5)·max(1, max|S|)``.
    rtol : float
        Relative tolerance of the test above.
    atol : float
        Absolute tolerance of the test above.

    Raises
    ------
    AssertionError
        Listing every failing direction, or if ``grad`` and ``S`` differ in shape.
    ValueError
        For a direction of another shape.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.testing import check_gradient
    >>> S = np.asarray([[1.0, 2.0], [3.0, 4.0]])
    >>> check_gradient(lambda a: np.sum(a**3), 3 * S**2, S)
    """
    S = to_numpy(S).astype(np.float64)
    G = to_numpy(grad).astype(np.float64)
    if G.shape != S.shape:
        raise AssertionError(f"gradient shape {G.shape} differs from the input's {S.shape}")
    if directions is None:
        rng = np.random.default_rng(seed)
        directions = [rng.standard_normal(S.shape) for _ in range(n_directions)]
        directions = [E / np.linalg.norm(E) for E in directions]
    h = _default_step(S, 5.0) if h is None else h
    failures = []
    for i, E in enumerate(directions):
        E = to_numpy(E).astype(np.float64)
        if E.shape != S.shape:
            raise ValueError(f"direction {i} has shape {E.shape}, expected {S.shape}")
        fp2, fp1, fm1, fm2 = (_scalar(f(S + c * h * E)) for c in (2, 1, -1, -2))
        fd = (-fp2 + 8 * fp1 - 8 * fm1 + fm2) / (12 * h)
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
