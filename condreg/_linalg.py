"""Private linear algebra for Algorithm 1: the probing-Hessian spectrum from one ``eigh``.

Algorithm 1 needs, every epoch and for each task, the nonzero eigenvalues of
``H(θ) = θᵀKθ`` and the eigenvectors that enter the closed-form gradients. This module computes
them with one symmetric eigendecomposition of the smaller of the two Gram matrices:

- *feature mode* (``N >= D``): ``H = θᵀ(Kθ)`` (``D×D``) with ``K`` stored;
- *sample mode* (``K = XᵀX`` with a factor ``X`` of fewer rows than ``D``: the data when
  ``N < D``, or ``R = diag(√μ)Vᵀ`` when ``K`` has rank ``r < D``): ``F = Xθ`` and the Gram
  ``FFᵀ``, whose nonzero eigenvalues are those of ``H``; the eigenvectors in ``D``-space are
  ``Fᵀu_i / s_i``.

``eigh`` is 2–3× faster than an SVD of ``F`` at MNIST size; its eigenvalues carry an absolute error
of a small multiple of ``eps·μ₁``, so the numerical rank counts ``μ_i > RANK_FACTOR·n·eps·μ₁``
(``n`` the size of the decomposed matrix). In float64 that resolves ``κ(H)`` up to ~1e11; the
public :func:`condreg.condition_number` (SVD of ``F``, used by :mod:`condreg.metrics`) resolves
more. Everything here is plain Array API code without host synchronisation, so it traces under
``jax.jit``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from condreg import _core

Array = Any

#: Multiplier of ``n·eps`` in the rank tolerance on the eigenvalues of ``H`` (see module docs).
RANK_FACTOR = 10.0


class HessianSpectrum(NamedTuple):
    """``mu`` (descending, clamped at 0), ``V`` (``D×r`` eigenvectors of ``H`` as columns, zero
    outside the numerical rank in sample mode), and a :class:`condreg._core.Spectrum` view
    (``gram=True``, ``p = D``) for the core's value and derivative formulas."""

    mu: Array
    V: Array
    sp: _core.Spectrum
    tie_rtol: float
    W: Array | None = None  # sample mode: eigenvectors of FFᵀ (F V = W diag(s))


def rank_rtol(n: int, dtype: Any, xp: Any) -> float:
    return RANK_FACTOR * n * _core.eps(xp, dtype)


def hessian_spectrum(
    theta: Array, A: Array, mode: str, xp: Any, *, vectors: bool = True
) -> HessianSpectrum:
    """Spectrum of ``H = θᵀKθ``: ``A`` is ``K`` (``mode="feature"``) or a factor ``X`` with
    ``K = XᵀX`` (``"sample"``). ``vectors=False``: eigenvalues only (``V`` is ``None``)."""
    D = theta.shape[-1]
    if mode == "feature":
        Kt = A @ theta
        M = theta.T @ Kt
    else:
        F = A @ theta
        M = F @ F.T
    M = 0.5 * (M + M.T)
    n = M.shape[-1]
    if vectors:
        mu, W = xp.linalg.eigh(M)
        W = xp.flip(W, axis=-1)
    else:
        mu, W = xp.linalg.eigvalsh(M), None
    mu = xp.flip(mu, axis=-1)
    mu = xp.maximum(mu, xp.zeros_like(mu))
    mask = mu > rank_rtol(n, mu.dtype, xp) * mu[..., :1]
    fmask = xp.astype(mask, mu.dtype)
    s = xp.sqrt(mu)
    if W is None or mode == "feature":
        V = W
    else:
        safe = xp.where(mask, s, xp.ones_like(s))
        V = (F.T @ W) * (fmask / safe)[None, :]
    k = xp.sum(fmask, axis=-1)
    sp = _core.Spectrum(None, s, None, mu, mask, k, D, True)
    tie = _core.default_tie_rtol((n, n), mu.dtype, xp)
    return HessianSpectrum(mu, V, sp, tie, None if mode == "feature" else W)


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
    """dR_ill/dμ (minimum-norm at a tied bottom); zero at the pole instead of inf/NaN."""
    sp = hs.sp
    den = _core.r_ill_denominator(sp, hs.tie_rtol, xp)
    ok = den > 0
    safe = xp.where(ok, den, xp.ones_like(den))
    wb = _core.bottom_weights(sp, hs.tie_rtol, "min_norm", xp, _core.never)
    k = xp.maximum(sp.k, xp.ones_like(sp.k))
    d = (_core.mu_bottom(sp, xp) * wb - sp.mu / k) / (safe * safe)
    return d * xp.astype(ok, d.dtype)


def d_log_kappa(hs: HessianSpectrum, xp: Any) -> Array:
    """d log κ / dμ = w_top/μ₁ − w_bottom/μ_k (minimum-norm at ties)."""
    sp = hs.sp
    wt = _core.top_weights(sp, hs.tie_rtol, "min_norm", xp, _core.never)
    wb = _core.bottom_weights(sp, hs.tie_rtol, "min_norm", xp, _core.never)
    return wt / _core.mu_top(sp) - wb / _core.mu_bottom(sp, xp)


def right_factor(hs: HessianSpectrum, d: Array) -> Array:
    """``G = V diag(d) Vᵀ`` (``D×D``), the gradient with respect to ``H`` of a spectral function."""
    return (hs.V * d[None, :]) @ hs.V.T


def power_of_two_scale(value: float) -> float:
    """``2**-round(log2(value))``: an exact rescaling that brings ``value`` into [1/√2, √2]
    (applied to ``√λ_max`` of a factor, it brings ``λ_max`` into [1/2, 2])."""
    if not (value > 0 and math.isfinite(value)):
        return 1.0
    return 2.0 ** (-round(math.log2(value)))
