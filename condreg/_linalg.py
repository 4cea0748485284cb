"""Algorithm 1's view of the spectral engine: the probing-Hessian spectrum ``H(θ) = θᵀKθ`` of a
factor ``A`` (``K = AᵀA``), from :func:`condreg._spectrum.decompose` of ``F = Aθ`` with
``gram=True``, and the core's value and derivative formulas on it. Rank rule: ``σ_i(F) >
rtol·σ₁(F)``, default ``max(N, D)·eps`` — exactly :func:`condreg.condition_number`
``(A @ theta, rtol=rtol, gram=True)``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from condreg import _core, _spectrum

Array = Any


class HessianSpectrum(NamedTuple):
    """``mu`` (descending), ``V`` (``D×r`` eigenvectors of ``H`` as columns, or ``None``), and a
    :class:`condreg._core.Spectrum` view (``gram=True``, ``p = D``) for the core's value and
    derivative formulas. ``tie_rtol``: ``None`` for the spectrum's own default. ``rtol`` is the
    rank tolerance that was applied (on ``σ = √μ``)."""

    mu: Array
    V: Array | None
    sp: _core.Spectrum
    tie_rtol: float | None
    W: Array | None = None  # F V = W diag(s) (left singular vectors of F), where computed
    rtol: float | None = None
    #: eager: the vectors of the extreme clusters on demand (``condreg.algorithm``'s
    #: ``Extremes``); ``V`` and ``W`` are then ``None``
    ext: Any = None


def hessian_spectrum(
    F: Array, xp: Any, *, vectors: bool = True, rtol: float | None = None, method: str = "auto"
) -> HessianSpectrum:
    """Spectrum of ``H = FᵀF`` for ``F = Aθ``: the engine's :func:`condreg._spectrum.decompose`
    of ``F`` (``gram=True``, route ``method``), rank ``#{σ_i(F) > rtol·σ₁(F)}``.
    ``vectors=False``: eigenvalues only. Pure Array API code (what traced steps use)."""
    tol = _spectrum.resolve_rtol(rtol, F.shape, F.dtype, xp)
    sp = _spectrum.decompose(
        F, xp, gram=True, vectors=vectors, rtol=tol, concrete=_core.never, method=method
    )
    V = None if sp.Vh is None else sp.Vh.T
    return HessianSpectrum(sp.mu, V, sp, None, sp.U, tol)


def _parts(hs: HessianSpectrum, quantity: str, xp: Any, pole: str = "raise") -> _core.Parts:
    return _core.spectrum_parts(quantity, hs.sp, xp, hs.tie_rtol, pole=pole)


def kappa(hs: HessianSpectrum, xp: Any) -> Array:
    return _parts(hs, "condition_number", xp).value


def r_well(hs: HessianSpectrum, xp: Any) -> Array:
    return _parts(hs, "r_well", xp).value


def r_ill(hs: HessianSpectrum, xp: Any) -> Array:
    return _parts(hs, "r_ill", xp).value


def d_r_well(hs: HessianSpectrum, xp: Any) -> Array:
    """dR_well/dμ (minimum-norm at a tied top)."""
    return _parts(hs, "r_well", xp).dmu(hs.sp.mu)


def d_r_ill(hs: HessianSpectrum, xp: Any) -> Array:
    """dR_ill/dμ (minimum-norm at a tied bottom); zero at the pole (``pole="zero"`` of
    :func:`condreg._core.parts`, the one home of R_ill's derivative)."""
    return _parts(hs, "r_ill", xp, "zero").dmu(hs.sp.mu)


def r_well_mu_coefficient(hs: HessianSpectrum, xp: Any) -> float:
    """The coefficient ``a`` of ``mu`` in ``dR_well/dmu = a·mu + (top-tie terms)``: ``−1/D``."""
    return -1.0 / float(hs.sp.p)


def r_ill_mu_coefficient(hs: HessianSpectrum, xp: Any) -> Array:
    """The coefficient ``a`` of ``mu`` in ``dR_ill/dmu = a·mu + (bottom-tie terms)``:
    ``−1/(k·den²)``, 0 at the pole (as :func:`d_r_ill`)."""
    return _parts(hs, "r_ill", xp, "zero").a[..., 0]


def d_log_kappa(hs: HessianSpectrum, xp: Any) -> Array:
    """d log κ / dμ = w_top/μ₁ − w_bottom/μ_k (minimum-norm at ties)."""
    p = _parts(hs, "condition_number", xp)
    return p.wt / hs.sp.mu[..., :1] - p.wb / p.mb


def power_of_two_scale(value: float) -> float:
    """``2**-round(log2(value))``: an exact rescaling that brings ``value`` into [1/√2, √2]
    (applied to ``√λ_max`` of a factor, it brings ``λ_max`` into [1/2, 2])."""
    if not (value > 0 and math.isfinite(value)):
        return 1.0
    return 2.0 ** (-round(math.log2(value)))
