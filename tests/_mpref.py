"""A 50-digit reference for κ, R_well, R_ill and their (sub)gradients (docs/math.md §1–§4).

Written from the closed forms, independently of condreg: mpmath in its own context at 50
significant digits (mpmath's global ``mp`` is left alone). The singular values and vectors of a
real matrix ``A`` (m×n) come from ``eigsy`` of the smaller Gram matrix, formed exactly from the
input's binary entries (float16/32/64 entries are exact in 50 digits and so are their products
and sums at these sizes): at 50 digits the Gram resolves every singular value down to
``σ_i/σ_1 ≈ 1e-25``, far beyond κ = 1e15. The vectors of the other side are ``A v_i / σ_i``.

Conventions (condreg's):

- rank ``k = #{σ_i > rtol·σ_1}`` (default ``rtol = max(m, n)·eps(float64)``);
- ``gram=True``: the quantity of ``H = AᵀA`` (eigenvalues ``μ_i = σ_i²``, ``p = n``), the gradient
  with respect to ``A``: ``2 A G_H`` (Theorem 4.2);
- at a tie the minimum-norm subgradient: the tied rank-one terms averaged (docs/math.md §3).
  Ties are taken within ``tie·σ_1`` of the extreme value (``tie=0``: exact equality only), so the
  reference of a rounded exact tie, whose values rounding split by ~eps, can average the split
  cluster as condreg's tie window does.

Values are ``mpf``; matrices and gradients NumPy object arrays of ``mpf``. :func:`rel_err`
compares a float array with a reference in 50 digits (no overflow, no underflow at any scale).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from mpmath.ctx_mp import MPContext

DPS = 50
ctx = MPContext()
ctx.dps = DPS

QUANTITIES = ("condition_number", "r_well", "r_ill")


def mpmat(A: Any) -> np.ndarray:
    """An object array of ``mpf`` with exactly the entries of ``A`` (a NumPy array of any float
    dtype; an object array of ``mpf`` or an mpmath matrix is converted as is)."""
    if isinstance(A, ctx.matrix):
        return np.array(A.tolist(), dtype=object)
    A = np.asarray(A)
    if A.dtype == object:
        return A
    A64 = A.astype(np.float64)  # exact for float16/float32/float64 entries
    if not np.array_equal(A64.astype(A.dtype), A):
        raise ValueError("entries are not exactly representable in float64")
    return np.array([ctx.mpf(x) for x in A64.ravel()], dtype=object).reshape(A.shape)


def to_float(M: Any, dtype: Any = np.float64) -> np.ndarray:
    """``M`` rounded (to nearest) to float64, then cast to ``dtype``."""
    M = mpmat(M)
    return np.array([float(x) for x in M.ravel()]).reshape(M.shape).astype(dtype)


def orthonormal(m: int, p: int, seed: int) -> np.ndarray:
    """An m×p matrix with orthonormal columns to 50 digits: mpmath QR of a Gaussian matrix."""
    G = np.random.default_rng(seed).standard_normal((m, p))
    Q, _ = ctx.qr(ctx.matrix(G.tolist()), mode="skinny")
    return mpmat(Q)


def construct(s: Any, m: int, n: int, seed: int = 0) -> np.ndarray:
    """``U diag(s) Vᵀ`` in 50 digits (exact ties and zeros stay exact): m×n, ``len(s) =
    min(m, n)``, ``s`` given as numbers or strings (strings parse exactly in 50 digits)."""
    p = min(m, n)
    if len(s) != p:
        raise ValueError("need min(m, n) singular values")
    U = orthonormal(m, p, seed)
    V = orthonormal(n, p, seed + 1000)
    d = np.array([ctx.mpf(x) for x in s], dtype=object)
    return (U * d) @ V.T


class SVD(NamedTuple):
    A: Any  # the matrix (object array of mpf, m×n)
    s: list  # singular values, descending (mpf), length p = min(m, n)
    U: Any  # m×p
    V: Any  # n×p
    small: Any  # the smaller Gram: AᵀA (m >= n) or AAᵀ (m < n)
    fro2_H: Any  # ‖AᵀA‖_F² = Σ σ_i⁴
    cache: dict  # lazily computed products (A·AᵀA)


def make_svd(A: Any, s: list, U: Any, V: Any) -> SVD:
    """An :class:`SVD` from known factors (no decomposition)."""
    A = mpmat(A)
    small = A.T @ A if A.shape[0] >= A.shape[1] else A @ A.T
    fro2_H = ctx.fsum(x**2 for x in small.ravel())
    return SVD(A, list(s), mpmat(U), mpmat(V), small, fro2_H, {})


def svd50(A: Any) -> SVD:
    """Thin SVD of ``A`` to ~50 digits via ``eigsy`` of the smaller Gram matrix."""
    M = mpmat(A)
    m, n = M.shape
    tall = m >= n
    small = M.T @ M if tall else M @ M.T
    E, Q = ctx.eigsy(ctx.matrix(small.tolist()))
    p = small.shape[0]
    order = sorted(range(p), key=lambda i: -E[i])
    s = [ctx.sqrt(max(E[i], ctx.mpf(0))) for i in order]
    X = mpmat(Q)[:, order]
    other = M @ X if tall else M.T @ X  # columns A v_i (or Aᵀ u_i) = σ_i · (the other vector)
    inv = np.array([1 / x if x > 0 else ctx.mpf(0) for x in s], dtype=object)
    other = other * inv
    U, V = (other, X) if tall else (X, other)
    fro2_H = ctx.fsum(x**2 for x in small.ravel())  # ‖AᵀA‖_F = ‖AAᵀ‖_F
    return SVD(M, s, U, V, small, fro2_H, {})


def _rank(s: list, rtol: float) -> int:
    return sum(1 for x in s if x > ctx.mpf(rtol) * s[0])


def _tied(s: list, e: int, k: int, tie: float) -> list[int]:
    w = ctx.mpf(tie) * s[0]
    return [i for i in range(k) if abs(s[i] - s[e]) <= w]


def _avg_uv(sv: SVD, J: list[int], power: int = 0) -> np.ndarray:
    """(1/r) Σ_{i∈J} σ_i^power u_i v_iᵀ (``power=1``: ``A·(1/r) Σ v_i v_iᵀ``, Av_i = σ_i u_i)."""
    w = np.array([sv.s[i] ** power / len(J) for i in J], dtype=object)
    return (sv.U[:, J] * w) @ sv.V[:, J].T


def _A_times_H(sv: SVD) -> np.ndarray:
    """``A (AᵀA)``, computed once per matrix on the smaller side."""
    if "AH" not in sv.cache:
        tall = sv.A.shape[0] >= sv.A.shape[1]
        sv.cache["AH"] = sv.A @ sv.small if tall else sv.small @ sv.A
    return sv.cache["AH"]


class Reference(NamedTuple):
    value: Any  # mpf (or +inf at R_ill's pole)
    grad: Any  # object array of mpf, the shape of A (None at the pole)
    k: int  # numerical rank
    top: list  # the tie set of σ_1 (indices)
    bottom: list  # the tie set of σ_k


def reference(
    quantity: str,
    A: Any,
    *,
    gram: bool = False,
    rtol: float | None = None,
    tie: float = 0.0,
    sv: SVD | None = None,
) -> Reference:
    """κ, R_well or R_ill of ``A`` (of ``AᵀA`` with ``gram``) and its (minimum-norm sub)gradient
    with respect to ``A``, in 50 digits. ``sv``: a precomputed :func:`svd50` of ``A``."""
    if sv is None:
        sv = svd50(A)
    m, n = sv.A.shape
    p = min(m, n)
    if rtol is None:
        rtol = max(m, n) * float(np.finfo(np.float64).eps)
    s = sv.s
    k = _rank(s, rtol)
    if k == 0:
        raise ValueError("zero matrix")
    top, bottom = _tied(s, 0, k, tie), _tied(s, k - 1, k, tie)
    if quantity == "r_ill" and len(bottom) == k:  # the pole: all nonzero σ tied
        return Reference(ctx.inf, None, k, top, bottom)
    if not gram:
        s1, sk = s[0], s[k - 1]
        if quantity == "condition_number":
            value = s1 / sk
            grad = _avg_uv(sv, top) / sk - _avg_uv(sv, bottom) * (s1 / sk**2)
        elif quantity == "r_well":
            fro2 = ctx.fsum(x**2 for x in sv.A.ravel())
            value = s1**2 / 2 - fro2 / (2 * p)
            grad = _avg_uv(sv, top) * s1 - sv.A / p
        elif quantity == "r_ill":
            den = ctx.fsum(x**2 for x in s[:k]) / (2 * k) - sk**2 / 2
            value = 1 / den
            grad = (_avg_uv(sv, bottom) * sk - sv.A / k) / den**2
        else:
            raise ValueError(quantity)
        return Reference(value, grad, k, top, bottom)
    mu = [x**2 for x in s]
    m1, mk = mu[0], mu[k - 1]
    if quantity == "condition_number":
        value = m1 / mk
        grad = 2 * (_avg_uv(sv, top, 1) / mk - _avg_uv(sv, bottom, 1) * (m1 / mk**2))
    elif quantity == "r_well":
        value = m1**2 / 2 - sv.fro2_H / (2 * n)
        grad = 2 * (_avg_uv(sv, top, 1) * m1 - _A_times_H(sv) / n)
    elif quantity == "r_ill":
        den = ctx.fsum(x**2 for x in mu[:k]) / (2 * k) - mk**2 / 2
        value = 1 / den
        grad = 2 * (_avg_uv(sv, bottom, 1) * mk - _A_times_H(sv) / k) / den**2
    else:
        raise ValueError(quantity)
    return Reference(value, grad, k, top, bottom)


def fro(M: Any) -> Any:
    return ctx.sqrt(ctx.fsum(x**2 for x in np.asarray(M, dtype=object).ravel()))


def rel_err(x: Any, ref: Any) -> float:
    """Relative error of a float array or scalar ``x`` against the 50-digit ``ref`` (a matrix:
    in the Frobenius norm), evaluated in 50 digits."""
    if isinstance(ref, np.ndarray):
        X = mpmat(np.asarray(x, dtype=np.float64))
        return float(fro(X - ref) / fro(ref))
    x = ctx.mpf(float(x))
    return float(abs(x - ref) / abs(ref))


def max_abs(ref: Any) -> Any:
    """Largest magnitude of a reference value or of a reference matrix's entries (mpf)."""
    if isinstance(ref, np.ndarray):
        return max(abs(x) for x in ref.ravel())
    return abs(ref)


def representable(ref: Any, dtype: Any) -> bool:
    """True when ``ref`` (value or matrix) fits in ``dtype`` with its significant entries normal:
    largest magnitude between ``1000·tiny`` and ``max / 1000``. (Entries below ``tiny`` are
    subnormal, with absolute error up to ``tiny·eps``: relative to a largest entry above
    ``1000·tiny`` that is below ``eps / 1000``, negligible in a Frobenius-norm comparison.)"""
    fi = np.finfo(dtype)
    a = max_abs(ref)
    return ctx.mpf(float(fi.tiny)) * 1000 < a < ctx.mpf(float(fi.max)) / 1000
