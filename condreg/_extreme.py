"""Eigenvectors of the extreme clusters only (docs/math.md §10.4), for eager Algorithm 1
(:mod:`condreg.algorithm._step`) and the engine's ``"extreme"`` route (:func:`gram_product`).

Every derivative with respect to the eigenvalues has the form ``d = a·mu + e`` with ``e`` zero
outside the top and bottom tie sets (Theorem 4.2), so for a factor ``F`` with left singular
vectors ``W`` the gradient's product is ``(W diag(d) Wᵀ) F = a·(F Fᵀ) F + W_S diag(e_S) W_Sᵀ F``:
it needs the vectors ``W_S`` of the extreme clusters only. They come from block inverse
iteration started at the eigenvalues already computed — shift-and-invert with one LU on the
Gram matrix (:func:`gram_cluster`), or two triangular solves per step on the ``R`` of
``F = RᵀQᵀ`` for the bottom cluster the Gram does not resolve (:func:`triangular_bottom`) — and
are accepted only when an a-posteriori residual is at a backward-stable dense solver's level
(``RESIDUAL·n·eps`` times the largest value). Otherwise they return ``None`` and the caller
takes the full decomposition. Everything here reads values: eager only.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from condreg import _backend

Array = Any

#: Accepted residual, in units of ``n·eps·(largest value)``.
RESIDUAL = 20.0
#: Largest convergence ratio per iteration accepted for shift-and-invert on the Gram.
MAX_RATIO_GRAM = 1e-2
#: Largest convergence ratio per iteration accepted for the triangular inverse iteration.
MAX_RATIO_TRIANGULAR = 0.6
#: Most guard vectors the triangular block iteration adds below a close cluster.
MAX_GUARD = 24
#: Target reduction of the unwanted components (the residual check decides acceptance).
TARGET = 1e-17
#: Most extreme vectors (all clusters together, over the Gram size) before the full ``eigh``
#: is cheaper than :func:`gram_product`'s inverse iterations.
MAX_FRACTION = 8


def _start(n: int, t: int, like: Array, xp: Any, seed: int = 12345) -> Array:
    """A fixed pseudo-random ``n×t`` start block (deterministic runs)."""
    block = np.random.default_rng(seed).standard_normal((n, t))
    return xp.asarray(block, dtype=like.dtype, device=getattr(like, "device", None))


def _orthonormal(X: Array, xp: Any) -> Array:
    Q, _ = xp.linalg.qr(X)
    return Q


def _shifted(G: Array, sigma: float, xp: Any) -> Array:
    """``G − σI`` (PyTorch: a copy with its diagonal shifted in place, three ops)."""
    if _backend.library(G) == "torch":
        M = G.clone()
        M.diagonal().sub_(sigma)
        return M
    return G - sigma * xp.eye(G.shape[-1], dtype=G.dtype)


def _lu_solver(M: Array, xp: Any):
    """``b ↦ M⁻¹ b`` from one LU factorisation: SciPy's for NumPy arrays, the library's own where
    it has one (PyTorch), else one explicit inverse."""
    if isinstance(M, np.ndarray):
        from scipy.linalg import lu_factor, lu_solve

        factors = lu_factor(M, check_finite=False)
        return lambda b: lu_solve(factors, b, check_finite=False)
    if hasattr(xp.linalg, "lu_factor_ex") and hasattr(xp.linalg, "lu_solve"):
        LU, piv, _ = xp.linalg.lu_factor_ex(M)  # a failure shows in the residual check
        return lambda b: xp.linalg.lu_solve(LU, piv, b)
    M_inv = xp.linalg.inv(M)
    return lambda b: M_inv @ b


def _triangular_solvers(R: Array, xp: Any):
    """``(b ↦ R⁻¹b, b ↦ R⁻ᵀb)`` for upper-triangular ``R``: SciPy's for NumPy arrays, the
    library's own where it has them (PyTorch), else ``R⁻¹`` once."""
    if isinstance(R, np.ndarray):
        from scipy.linalg import solve_triangular as solve

        kw = {"check_finite": False}
        return (lambda b: solve(R, b, **kw), lambda b: solve(R, b, trans="T", **kw))
    solve = getattr(xp.linalg, "solve_triangular", None)
    if solve is not None:
        return (lambda b: solve(R, b, upper=True), lambda b: solve(R.T, b, upper=False))
    R_inv = xp.linalg.inv(R)
    return (lambda b: R_inv @ b, lambda b: R_inv.T @ b)


def _host(x: Array) -> list[float]:
    """The values of a 1-d array as Python floats (one read, :func:`condreg._backend.to_host`)."""
    return np.asarray(_backend.to_host(x), dtype=np.float64).reshape(-1).tolist()


def _iterations(ratio: float) -> int:
    return int(math.ceil(math.log(TARGET) / math.log(max(ratio, 1e-300)))) + 1


def _column_norms(X: Array, xp: Any) -> Array:
    return xp.linalg.vector_norm(X, axis=0)


def _certified(values: Array, target: list[float], tol: float, value_tol: float, t: int) -> bool:
    """One read of ``[residuals, Ritz values]``: every residual within ``tol`` and the Ritz
    values (in any order) within ``value_tol`` of ``target``."""
    got = _host(values)
    ritz = sorted(got[t:])
    return all(r <= tol for r in got[:t]) and all(
        abs(a - b) <= value_tol for a, b in zip(ritz, sorted(target), strict=True)
    )


def gram_cluster(
    G: Array, mu: Array, lo: int, hi: int, xp: Any, *, value_eps: float | None = None
) -> Array | None:
    """Orthonormal eigenvectors (``n×(hi−lo)``, a basis of the cluster in any order) of the
    symmetric ``G`` for ``mu[lo:hi]`` (``mu`` descending), or ``None``; ``value_eps``: the
    rounding unit of ``mu`` when computed in a lower precision than ``G``."""
    n = G.shape[-1]
    t = hi - lo
    values = _host(mu)
    top = max(values[0], 0.0)
    e = float(xp.finfo(G.dtype).eps)
    if not (top > 0 and math.isfinite(top)) or t < 1 or t >= n:
        return None
    inside = values[lo:hi]
    outside = values[:lo] + values[hi:]
    delta = 10.0 * n * e * top  # keeps G − σI away from exact singularity
    sigma = 0.5 * (inside[0] + inside[-1]) + (delta if lo == 0 else -delta)
    near = max(abs(v - sigma) for v in inside)
    far = min(abs(v - sigma) for v in outside)
    if not far > 0 or near / far > MAX_RATIO_GRAM:
        return None
    solve = _lu_solver(_shifted(G, sigma, xp), xp)
    X = _start(n, t, G, xp)
    for _ in range(_iterations(near / far)):
        X = _orthonormal(solve(X), xp)
    GX = G @ X
    theta, Z = xp.linalg.eigh(X.T @ GX)  # Rayleigh–Ritz (the lower triangle)
    V = X @ Z
    residual = _column_norms(GX @ Z - V * theta, xp)
    value_tol = RESIDUAL * n * max(e, value_eps or 0.0) * top
    ok = _certified(xp.concat([residual, theta]), inside, RESIDUAL * n * e * top, value_tol, t)
    return V if ok else None


def _guard(values: list[float], lo: int, t: int, tol: float) -> tuple[int, float] | None:
    """``(p, ratio)``: the number of guard vectors for the bottom block ``[lo, n)`` minimising
    the work ``(t + p + 4)·iterations`` with a ratio ``(σ_lo / σ_{lo−1−p})²`` <=
    :data:`MAX_RATIO_TRIANGULAR`, or ``None``. Guards only across a gap ``> 2·tol``, so that the
    residual check (tolerance ``tol``) tells the wanted directions from the guards'."""
    best: tuple[float, int, float] | None = None
    guards = MAX_GUARD if values[lo - 1] - values[lo] > 2.0 * tol else 0
    for p in range(min(guards, lo - 1) + 1):
        ratio = (values[lo] / values[lo - 1 - p]) ** 2
        if ratio <= MAX_RATIO_TRIANGULAR:
            work = (t + p + 4) * _iterations(ratio)
            if best is None or work < best[0]:
                best = (work, p, ratio)
    return None if best is None else (best[1], best[2])


def triangular_bottom(R: Array, s: Array, lo: int, xp: Any) -> Array | None:
    """Right singular vectors of the full-rank upper-triangular ``R`` for its smallest singular
    values ``s[lo:]`` (in the order of ``s``), or ``None`` when not accepted."""
    n = R.shape[-1]
    t = n - lo
    values = _host(s)
    if t < 1 or lo < 1 or not (values[-1] > 0 and math.isfinite(values[0])):
        return None
    tol = RESIDUAL * n * float(xp.finfo(R.dtype).eps) * values[0]
    guard = _guard(values, lo, t, tol)
    if guard is None:
        return None
    p, ratio = guard
    inv, inv_t = _triangular_solvers(R, xp)
    X = _start(n, t + p, R, xp)
    for _ in range(_iterations(ratio)):
        X = _orthonormal(inv(inv_t(X)), xp)
    # Two-sided Rayleigh–Ritz: the left block from one more half-step (R⁻ᵀ amplifies the
    # wanted directions, so Y is as accurate as X), then the SVD of the small YᵀRX; the
    # wanted pairs are its t smallest (the guard directions' are above them).
    Y = _orthonormal(inv_t(X), xp)
    P, sb, Qt = xp.linalg.svd(Y.T @ (R @ X), full_matrices=False)
    P, sb, Qt = P[:, p:], sb[p:], Qt[p:, :]
    U, V = Y @ P, X @ Qt.T
    r1 = _column_norms(R @ V - U * sb[None, :], xp)
    r2 = _column_norms(R.T @ U - V * sb[None, :], xp)
    worst = xp.concat([xp.maximum(r1, r2), sb])
    ok = _certified(worst, values[lo:], tol, tol, t)
    return V if ok else None


def gram_plus_clusters(G: Array, a: Any, clusters: list[tuple[Array, Array]]) -> Array:
    """``a·G + Σ_c W_c diag(e_c) W_cᵀ``: ``Σ_i g_i w_i w_iᵀ`` for ``g = a·mu + e``, ``e`` nonzero
    on the clusters ``[(W_c, e_c), ...]`` only."""
    M = a * G
    for W, e in clusters:
        M += (W * e) @ W.T
    return M


def gram_product(
    M: Array, mu: Any, a: float, h: Any, xp: Any, *, value_eps: float | None = None
) -> Array | None:
    """``P = 2 (a·M + Σ_c h_c Q_c Q_cᵀ)`` = ``2 W diag(a·mu + h) Wᵀ`` of the symmetric ``M``
    (descending eigenvalues ``mu``, host values; ``h`` a host vector) from the eigenvectors of
    the runs of equal nonzero ``h`` only (:func:`gram_cluster`). ``None`` (take the full eigh)
    when ``a`` or ``h`` is not finite, the runs hold over ``max(8, n / MAX_FRACTION)`` values, or
    a cluster is not certified."""
    n = M.shape[-1]
    hs = _host(h)
    if M.ndim != 2 or not (math.isfinite(a) and all(math.isfinite(v) for v in hs)):
        return None
    runs, start = [], 0
    for value, group in itertools.groupby(hs):
        size = len(list(group))
        if value != 0.0:
            runs.append((start, start + size, value))
        start += size
    if sum(hi - lo for lo, hi, _ in runs) > max(8, n // MAX_FRACTION):
        return None
    clusters = []
    for lo, hi, c in runs:
        Q = gram_cluster(M, mu, lo, hi, xp, value_eps=value_eps)
        if Q is None:
            return None
        clusters.append((Q, 2.0 * c))
    return gram_plus_clusters(M, 2.0 * a, clusters)
