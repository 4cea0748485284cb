"""Private linear algebra for Algorithm 1: the probing-Hessian spectrum from the engine.

Algorithm 1 needs, every epoch and for each task, the nonzero eigenvalues of ``H(θ) = θᵀKθ`` and
the eigenvectors that enter the closed-form gradients. They come from the spectral engine
(:mod:`condreg._spectrum`), the one home of every decomposition in condreg:

- *sample mode* (``A = X``, a factor with ``K = XᵀX``, any number of rows: the data, or
  ``R = diag(√μ)Vᵀ`` when ``K`` has rank ``r < D``): ``F = Xθ``; the engine takes the eigh of the
  smaller Gram (``FFᵀ`` when ``N < D``, ``FᵀF`` when ``N >= D``) when that resolves every singular
  value the rank rule counts, a backward-stable decomposition of ``F`` otherwise;
- *feature mode* (``A = K``, ``D×D``, stored): ``eigh(θᵀ(Kθ))``. With ``factor=X`` the engine
  falls back to ``F = Xθ`` where that eigh does not resolve what the rule counts; without it the
  counted values are capped at what the eigh resolves (``μ_i > RANK_FACTOR·n·eps·μ₁``).

Rank rule (the "one κ per run" convention): ``rtol`` applies to the singular values of the factor
``F = Xθ`` (``σ_i = √μ_i``): rank ``k = #{σ_i > rtol·σ₁}``, default ``rtol = max(N, D)·eps`` —
exactly :func:`condreg.condition_number` ``(X @ theta, rtol=rtol)``. Ties are decided on ``σ``
(absolute tolerance ``tie_rtol·σ₁``, see :mod:`condreg._spectrum`). Everything here is Array API
code; the one data-dependent branch (Gram or factor) is a ``lax.cond`` under ``jax.jit``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from condreg import _core, _spectrum

Array = Any

#: Multiplier of ``n·eps`` in the resolution cap of feature mode without a factor.
RANK_FACTOR = 10.0


class HessianSpectrum(NamedTuple):
    """``mu`` (descending, clamped at 0), ``V`` (``D×r`` eigenvectors of ``H`` as columns, zero
    outside the numerical rank in sample mode), and a :class:`condreg._core.Spectrum` view
    (``gram=True``, ``p = D``) for the core's value and derivative formulas. ``rtol`` is the rank
    tolerance that was applied (on ``σ = √μ``)."""

    mu: Array
    V: Array
    sp: _core.Spectrum
    tie_rtol: float
    W: Array | None = None  # sample mode: F V = W diag(s) (left singular vectors of F)
    rtol: float | None = None
    #: eager sample mode: the vectors of the extreme clusters on demand (``condreg.algorithm
    #: ._step.Extremes``); ``V`` and ``W`` are then ``None``
    ext: Any = None


def rank_rtol(n: int, dtype: Any, xp: Any) -> float:
    return RANK_FACTOR * n * _core.eps(xp, dtype)


def _mask_from_s(s: Array, rtol: float, xp: Any) -> tuple[Array, Array]:
    return _spectrum._rank(s, rtol, xp)  # the engine's rank rule s_i > rtol·s_1


def _both_sides(F: Array, s: Array, Q: Array, mask: Array, xp: Any) -> tuple[Array, Array]:
    """``(V, W)`` with ``F V = W diag(s)`` from the small side's vectors ``Q`` (zero outside the
    rank on the side that is computed from ``F``)."""
    fmask = xp.astype(mask, s.dtype)
    safe = xp.where(mask, s, xp.ones_like(s))
    if F.shape[-2] < F.shape[-1]:
        return (F.T @ Q) * (fmask / safe)[None, :], Q
    return Q, (F @ Q) * (fmask / safe)[None, :]


def _sample_spectrum(F: Array, xp: Any, vectors: bool, tol: float) -> tuple:
    """``(s, V, W, mu_err)`` of ``F``: the smaller Gram's eigh where it resolves every value the
    rule ``s_i > tol·s_1`` counts, the thin SVD of ``F`` otherwise (both sides' vectors exact)."""
    gdtype = _spectrum.gram_dtype(F, xp)
    acc = _spectrum.gram_accuracy(xp, F.dtype)
    M = _spectrum._gram_matrix(F, xp, gdtype)
    shape = (F.shape[-2], F.shape[-1])
    gram = _spectrum.checked_eigh_gram(M, shape, xp, vectors, F.dtype, tol, acc)
    refused = gram is None  # proven without the eigenvalues
    if not refused:
        s, Q, _, err_rel, ok = gram

    def from_gram():
        if not vectors:
            return s, None, None, err_rel
        V, W = _both_sides(F, s, Q, s > tol * s[..., :1], xp)
        return s, V, W, err_rel

    def from_svd():
        # refused: a single NumPy matrix (its error bound then has the shape (1,))
        zero = xp.zeros((1,), dtype=F.dtype) if refused else xp.zeros_like(err_rel)
        if not vectors:
            return xp.linalg.svdvals(F), None, None, zero
        U, s2, Vh = xp.linalg.svd(F, full_matrices=False)
        keep = xp.astype(s2 > tol * s2[..., :1], s2.dtype)
        return s2, Vh.T * keep[None, :], U, zero

    if refused:
        return from_svd()
    return _spectrum.choose(ok, from_gram, from_svd)


def hessian_spectrum(
    theta: Array,
    A: Array,
    mode: str,
    xp: Any,
    *,
    vectors: bool = True,
    rtol: float | None = None,
    factor: Array | None = None,
) -> HessianSpectrum:
    """Spectrum of ``H = θᵀKθ``: ``A`` is ``K`` (``mode="feature"``) or a factor ``X`` with
    ``K = XᵀX`` (``"sample"``, any number of rows). ``vectors=False``: eigenvalues only (``V`` is
    ``None``).

    ``rtol``: rank tolerance on ``σ(F)``, ``F = Xθ`` (default ``max(N, D)·eps``): rank
    ``#{σ_i > rtol·σ₁}``, identical to ``condreg.condition_number(X @ theta, rtol=rtol)``; every
    counted σ is resolved (Gram eigh only when it resolves them, the factor's decomposition
    otherwise). ``factor``: the data ``X`` in feature mode (``K = XᵀX``), used when the eigh of
    ``θᵀKθ`` does not resolve the counted values; without it (feature mode) the count is capped
    at ``μ_i > RANK_FACTOR·n·eps·μ₁`` and ``rtol`` defaults to ``D·eps``.
    """
    D = theta.shape[-1]
    if mode == "sample":
        F = A @ theta
        tol = _spectrum.resolve_rtol(rtol, F.shape, F.dtype, xp)
        s, V, W, mu_err = _sample_spectrum(F, xp, vectors, tol)
        mask, k = _mask_from_s(s, tol, xp)
        mu = s * s
        tie = _spectrum.default_tie_rtol(F.shape, F.dtype, xp)
        sp = _core.Spectrum(None, s, None, mu, mask, k, D, True, mu_err)
        return HessianSpectrum(mu, V, sp, tie, W, tol)
    if mode != "feature":
        raise ValueError(f"mode must be 'feature' or 'sample', got {mode!r}")
    M = theta.T @ (A @ theta)
    M = 0.5 * (M + M.T)
    n = M.shape[-1]
    shape = (n, n) if factor is None else (factor.shape[0], D)
    tol = _spectrum.resolve_rtol(rtol, shape, M.dtype, xp)
    if vectors:
        mu, V = xp.linalg.eigh(M)
        V = xp.flip(V, axis=-1)
    else:
        mu, V = xp.linalg.eigvalsh(M), None
    mu = xp.flip(mu, axis=-1)
    mu = xp.maximum(mu, xp.zeros_like(mu))
    top = mu[..., :1]
    e = _core.eps(xp, M.dtype)
    err = e * (n * top + math.sqrt(n) * xp.sum(mu, axis=-1, keepdims=True))
    tie = _spectrum.default_tie_rtol(shape, M.dtype, xp)
    if factor is None:
        cut = max(tol * tol, rank_rtol(n, mu.dtype, xp))
        mask = mu > cut * top
        k = xp.sum(xp.astype(mask, mu.dtype), axis=-1)
        sp = _core.Spectrum(None, xp.sqrt(mu), None, mu, mask, k, D, True, err / top)
        return HessianSpectrum(mu, V, sp, tie, None, tol)
    safe_top = xp.where(top > 0, top, xp.ones_like(top))
    ok = _spectrum.gram_resolves(
        mu / safe_top, err / safe_top, tol, _spectrum.gram_accuracy(xp, M.dtype), xp
    )

    def from_eigh():
        return xp.sqrt(mu), V, err / safe_top

    def from_factor():
        F = factor @ theta
        s, Q = _spectrum._svd_small_side(F, xp, vectors)
        if vectors and F.shape[-2] < F.shape[-1]:
            Q, _ = _both_sides(F, s, Q, s > tol * s[..., :1], xp)
        return s, Q, xp.zeros_like(top)

    s, V, mu_err = _spectrum.choose(ok, from_eigh, from_factor)
    mask, k = _mask_from_s(s, tol, xp)
    mu = s * s
    sp = _core.Spectrum(None, s, None, mu, mask, k, D, True, mu_err)
    return HessianSpectrum(mu, V, sp, tie, None, tol)


def kappa(hs: HessianSpectrum, xp: Any) -> Array:
    return _core.kappa_value(hs.sp, xp)


def r_well(hs: HessianSpectrum, xp: Any) -> Array:
    return _core.r_well_value(hs.sp, xp)


def r_ill(hs: HessianSpectrum, xp: Any) -> Array:
    den = _core.r_ill_denominator(hs.sp, hs.tie_rtol, xp)
    return _core.r_ill_from_denominator(den, xp)


def d_r_well(hs: HessianSpectrum, xp: Any) -> Array:
    """dR_well/dμ (minimum-norm at a tied top)."""
    return _core.r_well_dmu(hs.sp, hs.tie_rtol, "min_norm", xp, _core.never)


def d_r_ill(hs: HessianSpectrum, xp: Any) -> Array:
    """dR_ill/dμ (minimum-norm at a tied bottom); zero at the pole (``pole="zero"`` of
    :func:`condreg._core.r_ill_dmu`, the one home of R_ill's derivative)."""
    return _core.r_ill_dmu(hs.sp, hs.tie_rtol, "min_norm", xp, _core.never, pole="zero")


def r_well_mu_coefficient(hs: HessianSpectrum, xp: Any) -> float:
    """The coefficient ``a`` of ``mu`` in ``dR_well/dmu = a·mu + (top-tie terms)``: ``−1/D``
    (:func:`condreg._core.r_well_dmu`)."""
    return -1.0 / float(hs.sp.p)


def r_ill_mu_coefficient(hs: HessianSpectrum, xp: Any) -> Array:
    """The coefficient ``a`` of ``mu`` in ``dR_ill/dmu = a·mu + (bottom-tie terms)``:
    ``−1/(k·den²)`` from :func:`condreg._core._r_ill_parts`, 0 at the pole (as :func:`d_r_ill`)."""
    sp = hs.sp
    den = _core.r_ill_denominator(sp, hs.tie_rtol, xp)
    at_pole = den == 0
    safe = xp.where(at_pole, xp.ones_like(den), den)
    zero = xp.zeros_like(sp.mu)
    a, _ = _core._r_ill_parts(sp, zero[..., :1], zero, safe, xp)
    return a[..., 0] * xp.astype(~at_pole, den.dtype)


def d_log_kappa(hs: HessianSpectrum, xp: Any) -> Array:
    """d log κ / dμ = w_top/μ₁ − w_bottom/μ_k (minimum-norm at ties)."""
    return _core.log_kappa_dmu(hs.sp, hs.tie_rtol, "min_norm", xp, _core.never)


def right_factor(hs: HessianSpectrum, d: Array) -> Array:
    """``G = V diag(d) Vᵀ`` (``D×D``), the gradient with respect to ``H`` of a spectral function."""
    return (hs.V * d[None, :]) @ hs.V.T


def power_of_two_scale(value: float) -> float:
    """``2**-round(log2(value))``: an exact rescaling that brings ``value`` into [1/√2, √2]
    (applied to ``√λ_max`` of a factor, it brings ``λ_max`` into [1/2, 2])."""
    if not (value > 0 and math.isfinite(value)):
        return 1.0
    return 2.0 ** (-round(math.log2(value)))
