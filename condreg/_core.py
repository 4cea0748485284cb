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

import contextlib
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from array_api_compat import device

from condreg import _spectrum
from condreg._errors import PoleError, TiedExtremeError
from condreg._spectrum import Spectrum


def check_tie_rtol(tie_rtol: float | None) -> float | None:
    """``tie_rtol`` checked (``None`` stays ``None``: the spectrum's default, ``Spectrum.tie``)."""
    return None if tie_rtol is None else _spectrum.check_rtol(tie_rtol, "tie_rtol")


never = _spectrum.never

Array = Any
Concrete = Callable[[Array], "bool | None"]
Subgradient = Literal["min_norm", "any", "raise"]
Quantity = Literal["condition_number", "r_well", "r_ill"]

SUBGRADIENTS = ("min_norm", "any", "raise")
QUANTITIES = ("condition_number", "r_well", "r_ill")
POLES = ("raise", "zero")


def mu_top(sp: Spectrum) -> Array:
    """Largest value of ``mu`` (shape ``(..., 1)``)."""
    return sp.mu[..., :1]


def mu_bottom(sp: Spectrum, xp: Any) -> Array:
    """Smallest value of ``mu`` inside the numerical rank (shape ``(..., 1)``)."""
    return xp.min(xp.where(sp.mask, sp.mu, math.inf), axis=-1, keepdims=True)


def s_bottom(sp: Spectrum, xp: Any) -> Array:
    """Smallest singular value inside the numerical rank (shape ``(..., 1)``)."""
    return xp.min(xp.where(sp.mask, sp.s, math.inf), axis=-1, keepdims=True)


def _tied(sp: Spectrum, s_ext: Array, mu_ext: Array, tie_rtol: float, xp: Any) -> Array:
    """Boolean: tied with the extreme value up to rounding, ``|s_i − s_e| <= tie_rtol·s_1``;
    on ``mu = s²`` ``|mu_i − mu_e| <= tie_rtol·s_1·(s_i + s_e) + 2·mu_err·mu_1`` (not
    ``tie_rtol·mu_1``, which would tie every value below ``√tie_rtol·s_1``)."""
    if tie_rtol is None:
        tie_rtol = sp.tie
        if tie_rtol is None:
            raise ValueError("tie_rtol is None and the spectrum carries no default tie tolerance")
    s1 = sp.s[..., :1]
    if sp.gram:
        tol = tie_rtol * s1 * (sp.s + s_ext) + 2.0 * sp.mu_err * (s1 * s1)
        return xp.abs(sp.mu - mu_ext) <= tol
    return xp.abs(sp.s - s_ext) <= tie_rtol * s1


def top_ties(sp: Spectrum, tie_rtol: float, xp: Any) -> Array:
    """0/1 indicator (floating) of values tied with the largest one."""
    tied = _tied(sp, sp.s[..., :1], mu_top(sp), tie_rtol, xp)
    return xp.astype(tied & sp.mask, sp.mu.dtype)


def _bottom(sp: Spectrum, tie_rtol: float, xp: Any) -> tuple[Array, Array]:
    """``(mu_k, ties)``: the smallest value inside the rank and the 0/1 indicator of the values
    tied with it (computed together: both need ``s_k``)."""
    s_b = s_bottom(sp, xp)
    mu_b = _spectrum.square(s_b) if sp.gram else s_b  # min of mu = s²: (min s)² (monotone)
    tied = _tied(sp, s_b, mu_b, tie_rtol, xp)
    return mu_b, xp.astype(tied & sp.mask, sp.mu.dtype)


def bottom_ties(sp: Spectrum, tie_rtol: float, xp: Any) -> Array:
    """0/1 indicator (floating) of values inside the rank tied with the smallest nonzero one."""
    return _bottom(sp, tie_rtol, xp)[1]


def _weights(
    ties: Array, index: Array, policy: str, which: str, xp: Any, concrete: Concrete
) -> Array:
    """Weights selecting the extreme pair(s): the average over the tied ones (``min_norm``), the
    one at ``index`` (``any``), or ``min_norm`` after checking there is no tie (``raise``)."""
    if policy == "any":
        positions = xp.arange(ties.shape[-1], device=device(ties))
        return xp.astype(positions == xp.astype(index, positions.dtype), ties.dtype)
    count = xp.sum(ties, axis=-1, keepdims=True)
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


def _bottom_w(sp: Spectrum, ties: Array, policy: str, xp: Any, concrete: Concrete) -> Array:
    index = None if policy != "any" else (sp.k - 1)[..., None]
    return _weights(ties, index, policy, "smallest nonzero", xp, concrete)


def top_weights(sp: Spectrum, tie_rtol: float, policy: str, xp: Any, concrete: Concrete) -> Array:
    index = None if policy != "any" else xp.zeros_like(sp.k)[..., None]
    return _weights(top_ties(sp, tie_rtol, xp), index, policy, "largest", xp, concrete)


def _safe_k(sp: Spectrum, xp: Any) -> Array:
    return xp.where(sp.k < 1.0, 1.0, sp.k)[..., None]


def kappa_value(sp: Spectrum, xp: Any, bottom: Array | None = None) -> Array:
    """kappa = mu_1 / mu_k over the nonzero values (Eq. 1); NaN for rank 0 (unchecked input).
    ``bottom``: ``mu_k`` if already at hand."""
    bottom = mu_bottom(sp, xp) if bottom is None else bottom
    return xp.where(sp.k > 0, (mu_top(sp) / bottom)[..., 0], math.nan)


def r_well_value(sp: Spectrum, xp: Any) -> Array:
    """R_well = ½ mu_1² − ‖M‖_F² / (2p) (Eq. 3) as mu_1² · ((p − L) + Σ (1 − r_i)(1 + r_i)) / (2p),
    r_i = mu_i / mu_1, over the L values at hand (the other p − L are 0): no cancellation, never
    negative, overflows only where the value does."""
    top = mu_top(sp)
    r = sp.mu / top
    missing = float(sp.p - sp.mu.shape[-1])
    total = xp.sum((1.0 - r) * (1.0 + r), axis=-1) + missing
    return (top[..., 0] * (total / (2.0 * sp.p))) * top[..., 0]


def _r_ill_den(sp: Spectrum, bottom: Array, ties: Array, xp: Any) -> Array:
    keep = xp.astype(sp.mask, sp.mu.dtype) - ties
    terms = keep * (sp.mu - bottom) * (sp.mu + bottom)
    return xp.sum(terms, axis=-1) / (2.0 * xp.where(sp.k < 1.0, 1.0, sp.k))


def r_ill_denominator(sp: Spectrum, tie_rtol: float, xp: Any) -> Array:
    """‖M‖_F²/(2k) − ½ mu_k² as Σ_{i≤k, not tied with k} (mu_i² − mu_k²) / (2k): exactly 0 at the
    pole, never negative."""
    return _r_ill_den(sp, *_bottom(sp, tie_rtol, xp), xp)


def r_ill_from_denominator(den: Array, xp: Any) -> Array:
    """1 / den, +inf exactly at the pole (den == 0), without a division-by-zero warning."""
    pole = den == 0
    return xp.where(pole, math.inf, 1.0 / xp.where(pole, 1.0, den))  # NaN stays NaN


def normalized(sp: Spectrum, xp: Any) -> tuple[Spectrum, Array]:
    """``(unit, s_1)``: the spectrum of ``S / s_1`` (``F`` kept as is) and ``s_1`` (``(..., 1)``).
    Quantities are homogeneous in ``s``: evaluated on ``unit`` and rescaled, a result over- or
    underflows only where it truly does (never 0·inf = NaN)."""
    s1 = sp.s[..., :1]
    s = sp.s / s1
    return sp._replace(s=s, mu=s * s if sp.gram else s), s1


def rescale(x: Array, scale: Array, power: int, xp: Any) -> Array:
    """``x · scale**power`` one factor at a time (monotone toward the result: no spurious
    over- or underflow)."""
    with quiet(x):  # NumPy: an over- or underflowing value is the documented result
        for _ in range(abs(power)):
            x = x * scale if power > 0 else x / scale
    return x


#: Degree of homogeneity of each value in mu.
_VALUE_DEGREE = {"condition_number": 0, "r_well": 2, "r_ill": -2}


class Parts(NamedTuple):
    """What a value and its derivative share: the spectrum over ``s_1`` (:func:`normalized`),
    ``s_1``, and on it ``mu_k``, its tie indicator (κ, R_ill) and R_ill's denominator."""

    unit: Spectrum
    s1: Array
    bottom: Array | None = None
    ties: Array | None = None
    den: Array | None = None


def parts(quantity: str, sp: Spectrum, xp: Any, *, tie_rtol: float | None) -> Parts:
    """The :class:`Parts` of ``quantity`` on ``sp`` (``tie_rtol=None``: ``sp.tie``)."""
    if quantity not in QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; expected one of {QUANTITIES}")
    unit, s1 = normalized(sp, xp)
    return Parts(unit, s1, *_extremes(quantity, unit, tie_rtol, xp))


def _extremes(quantity: str, sp: Spectrum, tie_rtol: float | None, xp: Any) -> tuple:
    """``(mu_k, its tie indicator, R_ill's denominator)`` where ``quantity`` needs them."""
    if quantity == "r_well":
        return None, None, None
    bottom, ties = _bottom(sp, tie_rtol, xp)
    return bottom, ties, (_r_ill_den(sp, bottom, ties, xp) if quantity == "r_ill" else None)


def value_of(quantity: str, p: Parts, xp: Any) -> Array:
    """The value of ``quantity`` from its :class:`Parts`, evaluated scale-free and rescaled."""
    unit = p.unit
    if quantity == "condition_number":
        return kappa_value(unit, xp, p.bottom)
    v = r_well_value(unit, xp) if quantity == "r_well" else r_ill_from_denominator(p.den, xp)
    power = _VALUE_DEGREE[quantity] * (2 if unit.gram else 1)
    return rescale(v, p.s1[..., 0], power, xp)


def value_from_spectrum(quantity: str, sp: Spectrum, xp: Any, *, tie_rtol: float | None) -> Array:
    """Value of ``quantity`` from a spectrum, evaluated scale-free (:func:`normalized`).
    ``tie_rtol=None``: the spectrum's own default (``sp.tie``, at the rounding scale of the
    path that computed it)."""
    return value_of(quantity, parts(quantity, sp, xp, tie_rtol=tie_rtol), xp)


def value(
    quantity: str,
    S: Array,
    xp: Any,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    concrete: Concrete,
    method: str = "auto",
) -> Array:
    """Value of ``quantity`` for a validated ``S`` (no gradient, singular values only)."""
    if quantity not in QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; expected one of {QUANTITIES}")
    tie = check_tie_rtol(tie_rtol)
    sp = _spectrum.decompose(
        S, xp, gram=gram, vectors=False, rtol=rtol, concrete=concrete, method=method
    )
    return value_from_spectrum(quantity, sp, xp, tie_rtol=tie)


def _kappa_d(sp: Spectrum, bottom: Array, wt: Array, wb: Array) -> Array:
    top = mu_top(sp)
    return wt / bottom - ((top / bottom) / bottom) * wb


def check_pole(any_pole: Array, concrete: Concrete) -> None:
    """:class:`PoleError` when the 0-d boolean ``any_pole`` (some matrix is at R_ill's pole,
    ``den == 0``) holds and ``concrete`` can tell."""
    if concrete(any_pole):
        raise PoleError(
            "R_ill is at its pole (all nonzero singular values are equal: kappa = 1, or rank 1): "
            "its value is +inf and it has no gradient there"
        )


def r_ill_parts(sp: Spectrum, bottom: Array, wb: Array, den: Array, xp: Any) -> tuple[Array, Array]:
    """``(a, h)`` with d R_ill / d mu = a·mu + h: ``a = −1 / (k·den²)`` (shape ``(..., 1)``) and
    ``h = mu_k w_bottom / den²`` (nonzero on the bottom tie set only). Divided twice: den * den
    underflows to 0 (and 0/0 = NaN) long before the gradient overflows."""
    den = den[..., None]
    return ((-1.0 / _safe_k(sp, xp)) / den) / den, ((bottom * wb) / den) / den


def dmu_parts(
    quantity: str,
    sp: Spectrum,
    tie_rtol: float | None,
    policy: str,
    xp: Any,
    concrete: Concrete,
    pole: str = "raise",
    shared: Parts | None = None,
) -> tuple[Any, Array]:
    """``(a, h)`` with ``d value / d mu = a·mu + h``: ``a`` a float or of shape ``(..., 1)``, ``h``
    nonzero only on the tie sets of the extreme values — the one home of every derivative.

    - κ: ``a = 0``, ``h = w_top / mu_k − (mu_1 / mu_k²) w_bottom``;
    - R_well: ``a = −1/p``, ``h = mu_1 w_top`` (Nenov et al., Theorem A.1);
    - R_ill: ``a = −1/(k·den²)``, ``h = mu_k w_bottom / den²`` (Eq. 13).

    ``w`` are the tie weights of ``policy`` (:func:`top_weights`). At R_ill's pole
    (``den == 0``: all nonzero values tied, kappa = 1 or rank 1) there is no derivative:
    ``pole="raise"`` raises :class:`PoleError` when ``concrete`` can tell (otherwise the entries
    are inf/NaN), ``"zero"`` returns 0 for the matrices at the pole (Algorithm 1: no step).
    ``shared``: the :class:`Parts` of ``quantity`` whose ``unit`` is ``sp`` (not recomputed).
    """
    if quantity not in QUANTITIES:
        raise ValueError(f"unknown quantity {quantity!r}; expected one of {QUANTITIES}")
    if pole not in POLES:
        raise ValueError(f"pole must be one of {POLES}, got {pole!r}")
    if quantity == "r_well":
        return -1.0 / sp.p, mu_top(sp) * top_weights(sp, tie_rtol, policy, xp, concrete)
    bottom, ties, den = _extremes(quantity, sp, tie_rtol, xp) if shared is None else shared[2:]
    if quantity == "condition_number":
        wt = top_weights(sp, tie_rtol, policy, xp, concrete)
        return 0.0, _kappa_d(sp, bottom, wt, _bottom_w(sp, ties, policy, xp, concrete))
    at_pole = den == 0
    if pole == "raise":
        check_pole(xp.any(at_pole), concrete)
    wb = _bottom_w(sp, ties, policy, xp, concrete)
    if pole == "zero":
        a, h = r_ill_parts(sp, bottom, wb, xp.where(at_pole, 1.0, den), xp)
        keep = xp.astype(~at_pole, den.dtype)[..., None]
        return a * keep, h * keep
    with quiet(den):  # at the pole: inf/NaN (checked above when it can be)
        return r_ill_parts(sp, bottom, wb, den, xp)


def dmu(
    quantity: str,
    sp: Spectrum,
    tie_rtol: float | None,
    policy: str,
    xp: Any,
    concrete: Concrete,
    pole: str = "raise",
) -> Array:
    """``d value / d mu = a·mu + h`` (:func:`dmu_parts`)."""
    a, h = dmu_parts(quantity, sp, tie_rtol, policy, xp, concrete, pole)
    return a * sp.mu + h


#: Degree of homogeneity of d value / d mu in mu (see :func:`gradient_from_spectrum`).
DEGREE = {"condition_number": -1, "r_well": 1, "r_ill": -3}


def log_kappa_dmu(sp: Spectrum, tie_rtol: float, policy: str, xp: Any, concrete: Concrete) -> Array:
    """d log kappa / d mu = w_top / mu_1 − w_bottom / mu_k."""
    bottom, ties = _bottom(sp, tie_rtol, xp)
    wt = top_weights(sp, tie_rtol, policy, xp, concrete)
    return wt / mu_top(sp) - _bottom_w(sp, ties, policy, xp, concrete) / bottom


def quiet(x: Array) -> Any:
    """NumPy's floating-point warnings off for arithmetic on ``x`` (a no-op context for other
    arrays): for values whose non-finite results are reported by the caller, not warned about."""
    if type(x).__module__ == "numpy":
        import numpy as np

        return np.errstate(divide="ignore", invalid="ignore", over="ignore")
    return contextlib.nullcontext()


def gradient_from_parts(
    quantity: str, p: Parts, a: Any, h: Array, xp: Any, weight: Array | None = None
) -> Array:
    """The gradient from ``d value / d mu = a·mu + h`` on ``p.unit`` (with vectors), times
    ``weight``, then times sigma_1 to its degree (:data:`DEGREE`; ``2·degree + 1`` with gram)."""
    power = 2 * DEGREE[quantity] + 1 if p.unit.gram else DEGREE[quantity]
    with quiet(h):
        return _spectrum.assemble(p.unit, a, h, xp, p.s1, power, weight)


def gradient_from_spectrum(
    quantity: str,
    sp: Spectrum,
    xp: Any,
    *,
    tie_rtol: float | None,
    subgradient: str,
    concrete: Concrete,
    weight: Array | None = None,
) -> Array:
    """Closed-form gradient from a spectrum with vectors, times ``weight`` (``S.shape[:-2]``)."""
    if subgradient not in SUBGRADIENTS:
        raise ValueError(f"subgradient must be one of {SUBGRADIENTS}, got {subgradient!r}")
    p = parts(quantity, sp, xp, tie_rtol=tie_rtol)
    a, h = dmu_parts(quantity, p.unit, tie_rtol, subgradient, xp, concrete, shared=p)
    return gradient_from_parts(quantity, p, a, h, xp, weight)


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
    method: str = "auto",
) -> Array:
    """Closed-form (sub)gradient of ``quantity`` with respect to ``S`` (or ``F`` when gram)."""
    if subgradient not in SUBGRADIENTS:
        raise ValueError(f"subgradient must be one of {SUBGRADIENTS}, got {subgradient!r}")
    tie = check_tie_rtol(tie_rtol)
    sp = _spectrum.decompose(
        S, xp, gram=gram, vectors=True, rtol=rtol, concrete=concrete, method=method
    )
    return gradient_from_spectrum(
        quantity, sp, xp, tie_rtol=tie, subgradient=subgradient, concrete=concrete
    )
