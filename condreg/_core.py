"""The k-vector arithmetic of every spectral quantity, written once against the Array API.

Every quantity condreg computes is a function of the singular values ``s`` of a matrix ``S`` (or
of the eigenvalues ``mu = s²`` of ``H = FᵀF`` when ``gram=True``). :func:`parts` decides, from
``s`` alone, the numerical rank's extreme values, their tie sets, the value and its derivative
``d value / d mu = a·mu + h`` (``h`` nonzero on the extreme tie sets only): the one home of every
formula. The engine (:mod:`condreg._spectrum`) runs it on a host copy of ``s`` (NumPy) in eager
calls and on the device arrays when tracing; it is homogeneous in ``s``, so it is evaluated on the
exactly rescaled spectrum and the result rescaled by a power of two (:func:`pow2`).

Nothing here imports a framework. Value-dependent checks (the ``"raise"`` subgradient) go through a
``read`` callback: a 0-d boolean array to a Python ``bool``, or ``None`` where values cannot be
read (then the check cannot be made).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import numpy as np

from condreg._backend import quiet
from condreg._errors import PoleError, TiedExtremeError

Array = Any
Concrete = Callable[[Array], "bool | None"]
Subgradient = Literal["min_norm", "any", "raise"]

SUBGRADIENTS = ("min_norm", "any", "raise")
QUANTITIES = ("condition_number", "r_well", "r_ill")
#: Degree of homogeneity of each value in mu, and of d value / d mu (one less).
VALUE_DEGREE = {"condition_number": 0, "r_well": 2, "r_ill": -2}
DEGREE = {q: d - 1 for q, d in VALUE_DEGREE.items()}


def never(x: Array) -> None:
    """``read`` callback that reads nothing (checks skipped)."""
    return None


def check_name(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


class Spectrum(NamedTuple):
    """A decomposition (:func:`condreg._spectrum.decompose`): ``s`` (descending), ``mu`` =
    ``s`` or ``s**2`` (``gram``), ``mask``/``k`` the numerical rank, ``p`` the R_well
    normaliser; ``U``/``Vh`` singular vectors or ``None``; ``mu_err`` the Gram path's error bound
    relative to ``mu_1``; ``F`` the argument; ``tie`` the default tie tolerance; ``G`` the Gram
    matrix or ``R`` the exact route's triangular factor, where kept."""

    U: Array | None
    s: Array
    Vh: Array | None
    mu: Array
    mask: Array
    k: Array
    p: int
    gram: bool
    mu_err: Any = 0.0
    F: Array | None = None
    tie: Any = None
    G: Array | None = None
    R: Array | None = None


class Parts(NamedTuple):
    """What :func:`parts` decides: the value (shape ``(...)``), ``d value / d mu = a·mu + h``
    (``a`` a float or ``(..., 1)``, ``h`` ``(..., L)``), the tie weights of the top and bottom
    (``None`` where the quantity does not use them), ``mu_k`` and R_ill's pole (``den == 0``)."""

    value: Array
    a: Any
    h: Array
    wt: Array | None = None
    wb: Array | None = None
    mb: Array | None = None
    pole: Array | None = None

    def dmu(self, mu: Array) -> Array:
        return self.a * mu + self.h


def rank(s: Array, rtol: float, xp: Any) -> tuple[Array, Array]:
    """``(mask, k)``: the numerical rank ``s_i > rtol·s_1`` and its count (floating)."""
    mask = s > rtol * s[..., :1]
    return mask, xp.sum(xp.astype(mask, s.dtype), axis=-1)


def _weights(ties: Array, index: Any, policy: str, which: str, xp: Any, read: Concrete) -> Array:
    """The extreme pair(s)' weights: the tie set's average (``min_norm``), the pair at ``index()``
    (``any``), or ``min_norm`` after checking there is no tie (``raise``)."""
    if policy == "any":
        index = index()
        positions = xp.arange(ties.shape[-1], dtype=index.dtype)
        return xp.astype(positions == index, ties.dtype)
    count = xp.sum(ties, axis=-1, keepdims=True)
    if policy == "raise":
        tied = read(xp.any(count > 1))
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
    return ties / count


def parts(
    quantity: str,
    s: Array,
    xp: Any,
    *,
    gram: bool,
    p: int,
    mask: Array,
    k: Array,
    tie: Any,
    mu_err: Any = 0.0,
    policy: str = "min_norm",
    read: Concrete = never,
    pole: str = "raise",
) -> Parts:
    """Value and ``d value / d mu`` of ``quantity`` from the descending singular values ``s``
    (``(..., L)``, any positive scale), the rank ``mask``/``k`` and the tie tolerance ``tie``.

    - κ = mu_1 / mu_k (Eq. 1): ``a = 0``, ``h = w_top / mu_k − (mu_1 / mu_k²) w_bottom``;
    - R_well = ½ mu_1² − Σ mu² / (2p) (Eq. 3) as mu_1²·((p − L) + Σ (1 − r)(1 + r)) / (2p),
      ``r = mu / mu_1`` (no cancellation, never negative): ``a = −1/p``, ``h = mu_1 w_top``;
    - R_ill = 1 / den, den = Σ_{i ≤ k, not tied with k} (mu_i² − mu_k²) / (2k) (Eq. 12; exactly 0
      at the pole, where the value is +inf): ``a = −1/(k·den²)``, ``h = mu_k w_bottom / den²``
      (Eq. 13; ``pole="zero"``: 0 at the pole, Algorithm 1's "no step").

    Ties (docs/math.md §10.1) are decided where the rounding is: ``|s_i − s_e| <= tie·s_1``; on
    ``mu = s²``, ``|mu_i − mu_e| <= tie·s_1·(s_i + s_e) + 2·mu_err·mu_1`` (``mu_err``: the Gram
    path's error bound relative to ``mu_1``). ``w`` are the tie weights of ``policy``.
    """
    with quiet(s):  # quantity, policy and pole: checked by the callers (internal)
        mu = s * s if gram else s
        s1, m1, inside = s[..., :1], mu[..., :1], xp.astype(mask, s.dtype)
        tol = tie * s1
        exact = isinstance(mu_err, float) and mu_err == 0.0  # then the two forms are one

        def ties(se: Array, me: Array) -> Array:
            if gram and not exact:
                near = xp.abs(mu - me) <= tol * (s + se) + 2.0 * mu_err * (s1 * s1)
            else:  # |mu_i − mu_e| <= tie·s_1·(s_i + s_e)  <=>  |s_i − s_e| <= tie·s_1
                near = xp.abs(s - se) <= tol
            return xp.astype(near, s.dtype) * inside

        def top() -> Array:
            index = lambda: xp.zeros_like(k[..., None])  # noqa: E731
            return _weights(ties(s1, m1), index, policy, "largest", xp, read)

        if quantity == "r_well":
            r = mu / m1
            total = xp.sum((1.0 - r) * (1.0 + r), axis=-1) + float(p - s.shape[-1])
            value = (m1[..., 0] * (total / (2.0 * p))) * m1[..., 0]
            wt = top()
            return Parts(value, -1.0 / p, m1 * wt, wt)
        sb = xp.min(xp.where(mask, s, math.inf), axis=-1, keepdims=True)
        mb = sb * sb if gram else sb  # min of mu = s²: (min s)² (monotone)
        tb = ties(sb, mb)
        wb = _weights(tb, lambda: (k - 1.0)[..., None], policy, "smallest nonzero", xp, read)
        if quantity == "condition_number":
            wt = top()
            value = xp.where(k > 0, (m1 / mb)[..., 0], math.nan)
            return Parts(value, 0.0, wt / mb - ((m1 / mb) / mb) * wb, wt, wb, mb)
        k1 = xp.where(k < 1.0, 1.0, k)
        den = xp.sum((inside - tb) * (mu - mb) * (mu + mb), axis=-1) / (2.0 * k1)
        at = den == 0
        value = xp.where(at, math.inf, 1.0 / xp.where(at, 1.0, den))  # NaN stays NaN
        d = (xp.where(at, 1.0, den) if pole == "zero" else den)[..., None]
        a = ((-1.0 / k1[..., None]) / d) / d
        h = ((mb * wb) / d) / d  # divided twice: den·den underflows long before the result
        if pole == "zero":
            keep = xp.astype(~at, s.dtype)[..., None]
            a, h = a * keep, h * keep
        return Parts(value, a, h, None, wb, mb, at)


def pow2(x: Array, n: Array, xp: Any) -> Array:
    """``x · 2**n`` for integer-valued ``n`` (broadcastable), exactly: in three factors that are
    each a representable power of two (``2**c·2**c·2**(n − 2c)``, ``c = ⌊n/3⌋``), so the result
    over- or underflows only where it truly does (never NaN; NaN for a NaN ``n``)."""
    lim = float(math.floor(math.log2(float(xp.finfo(x.dtype).max)))) - 4.0
    with quiet(x):
        if isinstance(n, np.ndarray) and np.all(np.abs(n) <= lim):  # host: one factor does
            return x * 2.0**n
        n = xp.clip(n, -3.0 * lim, 3.0 * lim)
        c = xp.floor(n / 3.0)
        f = 2.0**c
        return x * f * f * 2.0 ** (n - 2.0 * c)


def check_pole(any_pole: Array | bool | None, read: Concrete = never) -> None:
    """:class:`PoleError` where some matrix is at R_ill's pole (``den == 0``), if readable."""
    if isinstance(any_pole, bool) or any_pole is None:
        at = any_pole
    else:
        at = read(any_pole)
    if at:
        raise PoleError(
            "R_ill is at its pole (all nonzero singular values are equal: kappa = 1, or rank 1): "
            "its value is +inf and it has no gradient there"
        )


def _real(value: Any, name: str, where: str) -> float:
    """``value`` as a float: ``TypeError`` unless a real number (``bool`` is not), ``ValueError``
    for NaN."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{where}{name} must be a real number, got {type(value).__name__} {value!r}"
        )
    out = float(value)
    if math.isnan(out):
        raise ValueError(f"{where}{name} must not be NaN")
    return out


def check_rtol(rtol: Any, name: str = "rtol", where: str = "") -> float | None:
    """The one check of a relative tolerance (``rtol``, ``tie_rtol``): ``None`` (the default)
    or a real number in ``[0, 1)`` relative to ``s_1``; ``TypeError`` for another type,
    ``ValueError`` for a value outside. ``where`` prefixes the message (``"probe: "``)."""
    if rtol is None:
        return None
    value = _real(rtol, name, where)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{where}{name} must be in [0, 1), got {rtol!r}")
    return value


def check_ridge(ridge: Any, name: str = "ridge", where: str = "", *, zero: bool = True) -> Any:
    """The one check of a ridge: ``None`` or a finite real number ``>= 0`` (``> 0`` without
    ``zero``); ``TypeError`` for another type, ``ValueError`` for a value outside."""
    if ridge is None:
        return None
    value = _real(ridge, name, where)
    if not (math.isfinite(value) and (value > 0 or (zero and value == 0))):
        raise ValueError(
            f"{where}{name} must be finite and {'>=' if zero else '>'} 0, got {ridge!r}"
        )
    return value


# --------------------------------------------------------------------------------------------
# The same arithmetic on a Spectrum (Algorithm 1, the metrics, data parallel)
# --------------------------------------------------------------------------------------------


def spectrum_parts(
    quantity: str,
    sp: Any,
    xp: Any,
    tie_rtol: float | None = None,
    policy: str = "min_norm",
    read: Concrete = never,
    pole: str = "raise",
) -> Parts:
    """:func:`parts` of a :class:`Spectrum` as it is (no rescaling)."""
    tie = sp.tie if tie_rtol is None else tie_rtol
    kw = {"gram": sp.gram, "p": sp.p, "mask": sp.mask, "k": sp.k, "tie": tie}
    return parts(quantity, sp.s, xp, mu_err=sp.mu_err, policy=policy, read=read, pole=pole, **kw)


def _on_unit(
    quantity: str, sp: Any, xp: Any, tie_rtol: float | None, policy: str, read: Concrete
) -> tuple[Parts, Array, Array]:
    """``(parts, s, E)``: :func:`spectrum_parts` on ``s = sp.s·2**-E`` with ``s_1`` in [1, 2)
    (``E`` ``(..., 1)``), the one exact rescaling of a spectrum."""
    E = xp.floor(xp.log2(sp.s[..., :1]))
    s = pow2(sp.s, -E, xp)
    return spectrum_parts(quantity, sp._replace(s=s), xp, tie_rtol, policy, read), s, E


def value_from_spectrum(quantity: str, sp: Any, xp: Any, *, tie_rtol: float | None) -> Array:
    """Value of ``quantity`` from a spectrum, evaluated on ``s·2**-E`` (``s_1`` in [1, 2)) and
    rescaled exactly (:func:`pow2`): it over- or underflows only where the result does."""
    p, _, E = _on_unit(quantity, sp, xp, tie_rtol, "min_norm", never)
    value = p.value
    degree = VALUE_DEGREE[quantity] * (2 if sp.gram else 1)
    return value if degree == 0 else pow2(value, degree * E[..., 0], xp)


def gradient_from_spectrum(
    quantity: str,
    sp: Any,
    xp: Any,
    *,
    tie_rtol: float | None,
    subgradient: str,
    concrete: Concrete,
    weight: Array | None = None,
) -> Array:
    """``weight · 2 F (V diag(d value / d mu) Vᵀ)`` of a ``gram`` spectrum with ``sp.F`` and the
    ``V`` of ``sp.Vh`` (data parallel: a rank's rows ``F_r`` against the global Gram's ``V``),
    evaluated on the exactly rescaled spectrum."""
    p, s, E = _on_unit(quantity, sp, xp, tie_rtol, subgradient, concrete)
    g = p.dmu(s * s)
    if weight is not None:
        g = g * weight[..., None]
    G = sp.F @ ((sp.Vh.mT * (2.0 * g)[..., None, :]) @ sp.Vh)
    return pow2(G, (2 * VALUE_DEGREE[quantity] - 2) * E[..., None], xp)
