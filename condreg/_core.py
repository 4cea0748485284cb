"""Backend-neutral spectral core, written once against the Python Array API.

Every quantity condreg computes is a *spectral function*: a function of the singular values of a
matrix ``S`` (or of the eigenvalues of the Gram matrix ``H = FᵀF`` when ``gram=True``). This module
computes the spectrum once, the values from it, and the closed-form (sub)gradients as
``U diag(d) Vᵀ`` where ``d`` is the derivative of the value with respect to the singular values.

Nothing here imports a framework. Value-dependent checks (rank 0, the R_ill pole, tied extremes
under ``subgradient="raise"``) go through a ``concrete`` callback supplied by the caller: it turns a
0-d boolean array into a Python ``bool``, or returns ``None`` when the value cannot be read (under
``jax.jit``, ``torch.compile`` ...) or when checks are disabled; then the check is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from condreg._errors import PoleError, RankError, TiedExtremeError

Array = Any
Concrete = Callable[[Array], "bool | None"]
Subgradient = Literal["min_norm", "any", "raise"]
Quantity = Literal["condition_number", "r_well", "r_ill"]

SUBGRADIENTS = ("min_norm", "any", "raise")
QUANTITIES = ("condition_number", "r_well", "r_ill")

#: Multiplier of ``max(m, n) * eps`` in the default tie tolerance (see :func:`default_tie_rtol`).
TIE_FACTOR = 16.0


def eager(x: Array) -> bool:
    """``concrete`` callback for eager arrays: read the value."""
    return bool(x)


def never(x: Array) -> None:
    """``concrete`` callback that skips every value-dependent check."""
    return None


class Spectrum(NamedTuple):
    """The decomposition every value and gradient is computed from.

    ``s`` are the singular values of the argument (``S``, or ``F`` when ``gram``), descending;
    ``mu`` is the spectrum of the matrix the quantity is about: ``s`` itself, or ``s**2`` (the
    nonzero eigenvalues of ``H = FᵀF``) when ``gram``. ``mask`` marks the numerical rank and ``k``
    counts it (in the floating dtype). ``p`` is the R_well normaliser: ``min(m, n)``, or ``D`` (the
    size of ``H``) when ``gram``.
    """

    U: Array | None
    s: Array
    Vh: Array | None
    mu: Array
    mask: Array
    k: Array
    p: int
    gram: bool


def eps(xp: Any, dtype: Any) -> float:
    return float(xp.finfo(dtype).eps)


def default_rtol(shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """``max(m, n) * eps(dtype)``: numpy.linalg.matrix_rank's convention, on the singular values
    of the argument (of ``F`` when ``gram=True``; rank(FᵀF) = rank(F))."""
    return max(shape[-2], shape[-1]) * eps(xp, dtype)


def default_tie_rtol(shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """``16 * max(m, n) * eps(dtype)``, relative to the largest value of the spectrum ``mu``.

    Backward-stable SVDs return singular values with absolute error of a small multiple of
    ``eps * sigma_1``; values closer than this are equal up to rounding and are treated as tied.
    """
    return TIE_FACTOR * max(shape[-2], shape[-1]) * eps(xp, dtype)


def _full(xp: Any, like: Array, value: float) -> Array:
    return xp.full(like.shape, value, dtype=like.dtype, device=_device(like))


def _device(x: Array) -> Any:
    from array_api_compat import device

    return device(x)


def decompose(
    S: Array,
    xp: Any,
    *,
    gram: bool,
    vectors: bool,
    rtol: float | None,
    concrete: Concrete,
) -> Spectrum:
    """Thin SVD (or singular values only) of ``S`` and the numerical rank.

    Raises :class:`RankError` when any matrix of the batch has rank 0 (if ``concrete`` can tell).
    """
    if rtol is None:
        rtol = default_rtol(S.shape, S.dtype, xp)
    elif not (isinstance(rtol, (int, float)) and 0.0 <= float(rtol) < 1.0):
        raise ValueError(f"rtol must be a float in [0, 1), got {rtol!r}")
    if vectors:
        U, s, Vh = xp.linalg.svd(S, full_matrices=False)
    else:
        U, Vh = None, None
        s = xp.linalg.svdvals(S)
    mask = s > float(rtol) * s[..., :1]
    k = xp.sum(xp.astype(mask, s.dtype), axis=-1)
    if concrete(xp.any(k == 0)):
        raise RankError(
            "the matrix is zero (numerical rank 0): condition numbers and the regularizers are "
            "undefined"
        )
    mu = s * s if gram else s
    p = S.shape[-1] if gram else min(S.shape[-2], S.shape[-1])
    return Spectrum(U, s, Vh, mu, mask, k, p, gram)


# --------------------------------------------------------------------------------------------
# The extreme values and their tie weights
# --------------------------------------------------------------------------------------------


def mu_top(sp: Spectrum) -> Array:
    """Largest value of ``mu`` (shape ``(..., 1)``)."""
    return sp.mu[..., :1]


def mu_bottom(sp: Spectrum, xp: Any) -> Array:
    """Smallest value of ``mu`` inside the numerical rank (shape ``(..., 1)``)."""
    return xp.min(xp.where(sp.mask, sp.mu, _full(xp, sp.mu, math.inf)), axis=-1, keepdims=True)


def top_ties(sp: Spectrum, tie_rtol: float, xp: Any) -> Array:
    """0/1 indicator (floating) of values tied with the largest one."""
    top = mu_top(sp)
    return xp.astype((top - sp.mu <= tie_rtol * top) & sp.mask, sp.mu.dtype)


def bottom_ties(sp: Spectrum, tie_rtol: float, xp: Any) -> Array:
    """0/1 indicator (floating) of values inside the rank tied with the smallest nonzero one."""
    bottom = mu_bottom(sp, xp)
    return xp.astype((sp.mu - bottom <= tie_rtol * mu_top(sp)) & sp.mask, sp.mu.dtype)


def _weights(
    ties: Array, index: Array, policy: str, which: str, xp: Any, concrete: Concrete
) -> Array:
    """Weights over the spectrum selecting the extreme singular pair(s).

    ``min_norm``: the average over the tied ones (the minimum-norm subgradient); ``any``: the
    single index the decomposition put at the extreme position; ``raise``: like ``min_norm`` after
    checking there is no tie.
    """
    count = xp.sum(ties, axis=-1, keepdims=True)
    if policy == "any":
        positions = xp.arange(ties.shape[-1], device=_device(ties))
        return xp.astype(positions == xp.astype(index, positions.dtype), ties.dtype)
    if policy == "raise":
        tied = concrete(xp.any(count > 1))
        if tied is None:
            raise ValueError(
                'subgradient="raise" needs concrete values; it cannot be checked under tracing '
                '(jit, vmap, torch.compile) or with check_finite=False: use "min_norm"'
            )
        if tied:
            raise TiedExtremeError(
                f"the {which} singular value is tied (multiplicity > 1): the gradient does not "
                'exist there; use subgradient="min_norm" for the minimum-norm subgradient'
            )
    elif policy != "min_norm":
        raise ValueError(f"subgradient must be one of {SUBGRADIENTS}, got {policy!r}")
    return ties / count


def top_weights(sp: Spectrum, tie_rtol: float, policy: str, xp: Any, concrete: Concrete) -> Array:
    index = xp.zeros_like(sp.k)[..., None]
    return _weights(top_ties(sp, tie_rtol, xp), index, policy, "largest", xp, concrete)


def bottom_weights(
    sp: Spectrum, tie_rtol: float, policy: str, xp: Any, concrete: Concrete
) -> Array:
    index = (sp.k - 1)[..., None]
    return _weights(bottom_ties(sp, tie_rtol, xp), index, policy, "smallest nonzero", xp, concrete)


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


def _safe_k(sp: Spectrum, xp: Any) -> Array:
    return xp.maximum(sp.k, xp.ones_like(sp.k))[..., None]


def kappa_value(sp: Spectrum, xp: Any) -> Array:
    """kappa = mu_1 / mu_k over the nonzero values (Eq. 1); NaN for rank 0 (unchecked input)."""
    kappa = (mu_top(sp) / mu_bottom(sp, xp))[..., 0]
    return xp.where(sp.k > 0, kappa, _full(xp, kappa, math.nan))


def r_well_value(sp: Spectrum, xp: Any) -> Array:
    """R_well = ½ mu_1² − ‖M‖_F² / (2p) (Eq. 3), computed as
    mu_1² · ((p − L) + Σ_{i≤L} (1 − r_i)(1 + r_i)) / (2p) with r_i = mu_i / mu_1 ∈ [0, 1] over the
    L = len(mu) values at hand (L < p = D with ``gram`` and N < D: the other eigenvalues are 0).

    This form has no cancellation (it is exactly 0 when all p values equal mu_1, never negative)
    and overflows only when the value itself does (the difference form gives inf − inf = NaN for
    sigma_1 > ~1e154 in float64).
    """
    top = mu_top(sp)
    r = sp.mu / top
    missing = float(sp.p - sp.mu.shape[-1])
    total = xp.sum((1.0 - r) * (1.0 + r), axis=-1) + missing
    return (top[..., 0] * (total / (2.0 * sp.p))) * top[..., 0]


def r_ill_denominator(sp: Spectrum, tie_rtol: float, xp: Any) -> Array:
    """‖M‖_F²/(2k) − ½ mu_k², computed as Σ_{i≤k, i not tied with k} (mu_i² − mu_k²) / (2k).

    The sum form is exact at the pole (every nonzero value tied with mu_k gives exactly 0) and
    never negative; the terms of the numerically-zero values (i > k) are below rounding and are
    left out, as the rank is.
    """
    bottom = mu_bottom(sp, xp)
    keep = xp.astype(sp.mask, sp.mu.dtype) - bottom_ties(sp, tie_rtol, xp)
    terms = keep * (sp.mu - bottom) * (sp.mu + bottom)
    return xp.sum(terms, axis=-1) / (2.0 * _safe_k(sp, xp)[..., 0])


def r_ill_from_denominator(den: Array, xp: Any) -> Array:
    """1 / den, +inf exactly at the pole (den == 0), without a division-by-zero warning."""
    pole = den == 0
    safe = xp.where(pole, xp.ones_like(den), den)
    return xp.where(pole, _full(xp, den, math.inf), 1.0 / safe)  # NaN stays NaN


# --------------------------------------------------------------------------------------------
# Gradients: derivative with respect to mu, then U diag(d) Vᵀ
# --------------------------------------------------------------------------------------------


def assemble(sp: Spectrum, g: Array) -> Array:
    """Gradient with respect to the argument from ``g = d value / d mu``.

    Without ``gram``: ``U diag(g) Vᵀ``. With ``gram`` (mu = s²): ``U diag(2 s g) Vᵀ``, which equals
    ``2 F G_H`` for the symmetric gradient ``G_H = V diag(g) Vᵀ`` with respect to H (Theorem 4.2).
    """
    d = 2.0 * sp.s * g if sp.gram else g
    return (sp.U * d[..., None, :]) @ sp.Vh


def kappa_dmu(sp: Spectrum, tie_rtol: float, policy: str, xp: Any, concrete: Concrete) -> Array:
    """d kappa / d mu = w_top / mu_k − (mu_1 / mu_k²) w_bottom."""
    top, bottom = mu_top(sp), mu_bottom(sp, xp)
    wt = top_weights(sp, tie_rtol, policy, xp, concrete)
    wb = bottom_weights(sp, tie_rtol, policy, xp, concrete)
    return wt / bottom - ((top / bottom) / bottom) * wb


def r_well_dmu(sp: Spectrum, tie_rtol: float, policy: str, xp: Any, concrete: Concrete) -> Array:
    """d R_well / d mu = mu_1 w_top − mu / p (Nenov et al., Theorem A.1)."""
    wt = top_weights(sp, tie_rtol, policy, xp, concrete)
    return mu_top(sp) * wt - sp.mu / float(sp.p)


def r_ill_dmu(sp: Spectrum, tie_rtol: float, policy: str, xp: Any, concrete: Concrete) -> Array:
    """d R_ill / d mu = (mu_k w_bottom − mu / k) / den² (Eq. 13).

    Raises :class:`PoleError` at the pole (if ``concrete`` can tell).
    """
    den = r_ill_denominator(sp, tie_rtol, xp)
    if concrete(xp.any(den == 0)):
        raise PoleError(
            "R_ill is at its pole (all nonzero singular values are equal: kappa = 1, or rank 1): "
            "its value is +inf and it has no gradient there"
        )
    wb = bottom_weights(sp, tie_rtol, policy, xp, concrete)
    den = den[..., None]
    # Divide twice: den * den underflows to 0 (and 0/0 = NaN) long before the gradient overflows.
    return ((mu_bottom(sp, xp) * wb - sp.mu / _safe_k(sp, xp)) / den) / den


# --------------------------------------------------------------------------------------------
# Entry points used by the public API and the adapters
# --------------------------------------------------------------------------------------------


def value(
    quantity: str,
    S: Array,
    xp: Any,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    concrete: Concrete,
) -> Array:
    """Value of ``quantity`` for a validated ``S`` (no gradient, singular values only)."""
    if quantity not in QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; expected one of {QUANTITIES}")
    tie = resolve_tie_rtol(tie_rtol, S.shape, S.dtype, xp)
    sp = decompose(S, xp, gram=gram, vectors=False, rtol=rtol, concrete=concrete)
    return value_from_spectrum(quantity, sp, xp, tie_rtol=tie)


def resolve_tie_rtol(tie_rtol: float | None, shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """The tie tolerance to use: ``tie_rtol`` checked, or the default for ``shape``/``dtype``."""
    if tie_rtol is None:
        return default_tie_rtol(shape, dtype, xp)
    if not (isinstance(tie_rtol, (int, float)) and 0.0 <= float(tie_rtol) < 1.0):
        raise ValueError(f"tie_rtol must be a float in [0, 1), got {tie_rtol!r}")
    return float(tie_rtol)


def value_from_spectrum(quantity: str, sp: Spectrum, xp: Any, *, tie_rtol: float) -> Array:
    """Value of ``quantity`` from a spectrum (``tie_rtol`` resolved: :func:`resolve_tie_rtol`)."""
    if quantity == "condition_number":
        return kappa_value(sp, xp)
    if quantity == "r_well":
        return r_well_value(sp, xp)
    if quantity == "r_ill":
        return r_ill_from_denominator(r_ill_denominator(sp, tie_rtol, xp), xp)
    raise ValueError(f"unknown quantity {quantity!r}; expected one of {QUANTITIES}")


_DMU = {"condition_number": kappa_dmu, "r_well": r_well_dmu, "r_ill": r_ill_dmu}


def gradient_from_spectrum(
    quantity: str,
    sp: Spectrum,
    xp: Any,
    *,
    tie_rtol: float,
    subgradient: str,
    concrete: Concrete,
) -> Array:
    """Closed-form gradient from a spectrum computed with ``vectors=True``.

    Computed scale-free: each quantity is homogeneous in the singular values (kappa of degree 0,
    R_well 2, R_ill −2; their gradients of degree −1, 1, −3, and 2·degree + 1 with respect to
    ``F`` when ``gram``), so the gradient is assembled from the spectrum divided by sigma_1 and
    then multiplied by the matching power of sigma_1, one factor at a time. Where the true
    gradient is representable this changes nothing; where it over- or underflows the entries
    become ±inf or 0 — never 0·inf = NaN (which the direct form gives, e.g. for R_ill at
    sigma ~ 1e-100 in float64 or ~1e-8 with ``gram`` in float32), and R_ill's pole is not
    mistaken for an underflowing denominator.
    """
    if subgradient not in SUBGRADIENTS:
        raise ValueError(f"subgradient must be one of {SUBGRADIENTS}, got {subgradient!r}")
    s1 = sp.s[..., :1]
    s = sp.s / s1
    unit = sp._replace(s=s, mu=s * s if sp.gram else s)
    G = assemble(unit, _DMU[quantity](unit, tie_rtol, subgradient, xp, concrete))
    power = 2 * _DEGREE[quantity] + 1 if sp.gram else _DEGREE[quantity]
    scale = s1[..., None]
    for _ in range(abs(power)):
        G = G * scale if power > 0 else G / scale
    return G


#: Degree of homogeneity of d value / d mu in mu (see :func:`gradient_from_spectrum`).
_DEGREE = {"condition_number": -1, "r_well": 1, "r_ill": -3}


def gradient(
    quantity: str,
    S: Array,
    xp: Any,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    subgradient: str,
    concrete: Concrete,
) -> Array:
    """Closed-form (sub)gradient of ``quantity`` with respect to ``S`` (or ``F`` when gram)."""
    if subgradient not in SUBGRADIENTS:
        raise ValueError(f"subgradient must be one of {SUBGRADIENTS}, got {subgradient!r}")
    tie = resolve_tie_rtol(tie_rtol, S.shape, S.dtype, xp)
    sp = decompose(S, xp, gram=gram, vectors=True, rtol=rtol, concrete=concrete)
    return gradient_from_spectrum(
        quantity, sp, xp, tie_rtol=tie, subgradient=subgradient, concrete=concrete
    )
