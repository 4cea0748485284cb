"""The paper's immunization metrics (docs/math.md §6), on any Array API array.

- :func:`rir` — the relative immunization ratio of a linear extractor θ (Eq. 15);
- :func:`rir_theta0` — its estimate for non-linear feature maps relative to the initial model
  (Eq. 17), averaged over random groups of samples;
- :func:`probe_convergence` — the norm-ratio curve of linear probing by gradient descent with exact
  line search (Eq. 16).

Condition numbers are those of :func:`condreg.condition_number` with ``gram=True``: over the nonzero
singular values of the feature matrix, every counted one resolved (rank tolerance on ``σ``:
``max(N_P, N_H, D)·eps`` for :func:`rir`, one number for the pair, as in :func:`condreg.immunize`;
``max(N, D)·eps`` per matrix elsewhere).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from condreg._api import condition_number

Array = Any

__all__ = ["RIR", "RIRTheta0", "rir", "run_rtol", "rir_theta0", "probe_convergence"]


class RIR(NamedTuple):
    """Eq. 15 as Python floats: ``i = κ(H_H(θ))/κ(K_H)``, ``ii = κ(H_P(θ))/κ(K_P)``,
    ``rir = i / ii``, and the four condition numbers. Success: ``i`` large, ``ii ≤ 1``,
    ``rir ≫ 1``."""

    i: float
    ii: float
    rir: float
    kappa_hp: float
    kappa_hh: float
    kappa_kp: float
    kappa_kh: float


class RIRTheta0(NamedTuple):
    """Eq. 17: ``rir`` is the mean of the per-group ratios ``ratios`` (one per group); ``i`` and
    ``ii`` are the means of the per-group numerators and denominators (for reporting)."""

    rir: float
    i: float
    ii: float
    ratios: list[float]


def _namespace(where: str, **arrays: Array) -> Any:
    """The one library of ``arrays``; ``TypeError`` naming them otherwise."""
    from array_api_compat import is_array_api_obj

    for name, a in arrays.items():
        if not is_array_api_obj(a):
            raise TypeError(f"{where}: {name} must be an array, got {type(a).__name__}")
    try:
        return array_namespace(*arrays.values())
    except TypeError:
        kinds = ", ".join(f"{k}: {type(a).__module__.split('.')[0]}" for k, a in arrays.items())
        raise TypeError(
            f"{where}: all arrays must come from one Array API library ({kinds})"
        ) from None


def _kappa(F: Array, rtol: float | None) -> float:
    return float(condition_number(F, gram=True, rtol=rtol))


def _as_matrix(X: Array, name: str, where: str) -> None:
    if getattr(X, "ndim", None) != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(
            f"{where}: {name} must be a non-empty 2-D array, got shape "
            f"{tuple(getattr(X, 'shape', ()))}"
        )


def run_rtol(X_p: Array, X_h: Array, dtype: Any = None) -> float:
    """The one rank tolerance of a pair of tasks: ``max(N_P, N_H, D)·eps(dtype)`` (the default of
    :func:`rir` and of :func:`condreg.immunize`, recorded there as ``res.rtol``)."""
    xp = array_namespace(X_p, X_h)
    dtype = X_p.dtype if dtype is None else dtype
    if not xp.isdtype(dtype, "real floating"):
        dtype = xp.float64
    return max(X_p.shape[0], X_h.shape[0], X_p.shape[1]) * float(xp.finfo(dtype).eps)


def rir(theta: Array, X_p: Array, X_h: Array, *, rtol: float | None = None) -> RIR:
    """Relative immunization ratio of a linear extractor (Eq. 15).

    ``RIR = [κ(H_H(θ))/κ(K_H)] / [κ(H_P(θ))/κ(K_P)]`` with ``H(θ) = θᵀXᵀXθ`` and ``K = XᵀX``,
    each κ computed as ``condition_number(X @ θ, gram=True, rtol=rtol)`` (the ``D×D`` matrices
    are never formed; every singular value the rank rule counts is resolved). One tolerance
    serves all four κ's: a singular value counts when ``σ_i > rtol·σ₁``, default
    :func:`run_rtol` ``= max(N_P, N_H, D)·eps`` — the rule :func:`condreg.immunize` uses, so
    ``rir(res.theta, X_p, X_h)`` (or ``rtol=res.rtol``) reproduces ``res.metrics``. ``theta`` is
    ``(D, D_out)``; ``X_p``, ``X_h`` are ``(N, D)`` of the same namespace. ``rir(I, X_p, X_h)`` is
    exactly 1. Eager (returns Python floats).

    Raises ``ValueError`` for mismatched shapes, empty or non-finite input, zero matrices and an
    ``rtol`` outside ``[0, 1)``.
    """
    xp = _namespace("rir", theta=theta, X_p=X_p, X_h=X_h)
    for X, name in ((X_p, "X_p"), (X_h, "X_h")):
        _as_matrix(X, name, "rir")
    if not bool(xp.all(xp.isfinite(theta))):
        raise ValueError("rir: theta contains NaN or Inf")
    if getattr(theta, "ndim", None) != 2:
        shape = tuple(getattr(theta, "shape", ()))
        raise ValueError(f"rir: theta must be a 2-D array, got shape {shape}")
    if not (X_p.shape[1] == X_h.shape[1] == theta.shape[0]):
        raise ValueError(
            "rir: feature dimensions disagree: X_p has "
            f"{X_p.shape[1]}, X_h has {X_h.shape[1]}, theta has {theta.shape[0]} rows"
        )
    # κ is scale-invariant: bring θ and the data near 1 by powers of two (exact), so that any
    # representable scale works (θ = 1e200·I, X ~ 1e-170) whatever the decomposition path
    theta, X_p, X_h = (_unit(a, xp) for a in (theta, X_p, X_h))
    F_p, F_h = X_p @ theta, X_h @ theta
    if rtol is None:
        rtol = run_rtol(X_p, X_h, F_p.dtype)
    k_kp, k_kh = _kappa(X_p, rtol), _kappa(X_h, rtol)
    k_hp, k_hh = _kappa(F_p, rtol), _kappa(F_h, rtol)
    i_ratio, ii_ratio = k_hh / k_kh, k_hp / k_kp
    return RIR(i_ratio, ii_ratio, i_ratio / ii_ratio, k_hp, k_hh, k_kp, k_kh)


def _features(f: Callable[[Array], Array], X: Array, xp: Any) -> Array:
    F = f(X)
    F = xp.reshape(F, (F.shape[0], -1))
    return F


def rir_theta0(
    f_I: Callable[[Array], Array],
    f_0: Callable[[Array], Array],
    X_p: Array,
    X_h: Array,
    groups: int = 20,
    group_size: int = 100,
    seed: int = 0,
    *,
    rtol: float | None = None,
) -> RIRTheta0:
    """RIR relative to the initial model θ_0, for non-linear feature maps (Eq. 17).

    ``K`` of Eq. 15 is replaced by ``H̃(θ_0) = X̃(θ_0)ᵀX̃(θ_0)`` with ``X̃(θ) = [f_θ(x)]``. For each of
    ``groups`` random groups (``group_size`` samples drawn without replacement from each of
    ``X_p`` and ``X_h``, with ``numpy.random.default_rng(seed)``; all samples if fewer), the ratio

        [κ(H̃_H(θ_I)) / κ(H̃_H(θ_0))] / [κ(H̃_P(θ_I)) / κ(H̃_P(θ_0))]

    is computed from the features (flattened to ``(n, -1)``; ``gram=True``), and the ratios are
    averaged, as the paper does. ``f_I`` is the immunized feature map, ``f_0`` the initial one;
    they take a batch (``X[idx]`` along axis 0, any trailing shape) and return features of the
    same namespace (wrap a network in ``torch.no_grad()`` yourself).

    Raises ``ValueError`` when ``f_I is f_0`` — the defect of the public code (docs/math.md §9.6),
    which passes the same extractor twice so that every ratio is 1 — and warns
    (``UserWarning``) when both maps return identical features on the first group (e.g. a network
    modified in place after its "initial" copy was taken).
    """
    if f_I is f_0:
        raise ValueError(
            "rir_theta0: f_I and f_0 are the same object; pass the immunized feature map as f_I "
            "and a copy of the initial one as f_0 (otherwise every ratio is 1, docs/math.md §9.6)"
        )
    if not (callable(f_I) and callable(f_0)):
        raise TypeError("rir_theta0: f_I and f_0 must be callables returning feature arrays")
    if int(groups) < 1 or int(group_size) < 2:
        raise ValueError("rir_theta0: groups must be >= 1 and group_size >= 2")
    xp = _namespace("rir_theta0", X_p=X_p, X_h=X_h)
    for X, name in ((X_p, "X_p"), (X_h, "X_h")):
        if getattr(X, "ndim", 0) < 1 or X.shape[0] == 0:
            raise ValueError(f"rir_theta0: {name} is empty")
    rng = np.random.default_rng(seed)
    ratios, nums, dens = [], [], []
    for g in range(int(groups)):
        parts = {}
        for X, name in ((X_p, "p"), (X_h, "h")):
            n = X.shape[0]
            idx = rng.choice(n, size=min(int(group_size), n), replace=False)
            batch = xp.take(X, xp.asarray(idx, device=_device(X)), axis=0)
            F_I, F_0 = _features(f_I, batch, xp), _features(f_0, batch, xp)
            if g == 0 and tuple(F_I.shape) == tuple(F_0.shape):
                if bool(array_namespace(F_I).all(F_I == F_0)):
                    warnings.warn(
                        "rir_theta0: f_I and f_0 return identical features; was the initial "
                        "model modified in place? (docs/math.md §9.6)",
                        UserWarning,
                        stacklevel=2,
                    )
            parts[name] = _kappa(F_I, rtol) / _kappa(F_0, rtol)
        nums.append(parts["h"])
        dens.append(parts["p"])
        ratios.append(parts["h"] / parts["p"])
    return RIRTheta0(float(np.mean(ratios)), float(np.mean(nums)), float(np.mean(dens)), ratios)


def _pow2(amax: Array, xp: Any) -> Array:
    """``2**-round(log2(amax))`` as an array (1 for 0): brings the largest entry near 1, exactly;
    no host synchronisation."""
    safe = xp.where(amax > 0, amax, xp.ones_like(amax))
    return 2.0 ** (-xp.round(xp.log2(safe)))


def _unit(a: Array, xp: Any) -> Array:
    """``a`` times the power of two that brings its largest entry near 1 (floating ``a`` only)."""
    if not xp.isdtype(a.dtype, "real floating"):
        return a
    return a * xp.astype(_pow2(xp.max(xp.abs(a)), xp), a.dtype)


def _readable(x: Array) -> bool | None:
    """``bool(x)``, or None where the value cannot be read (under ``jax.jit``)."""
    try:
        return bool(x)
    except Exception:  # a tracer: the check is skipped, as in the core's ``concrete`` policy
        return None


def probe_convergence(A: Array, y: Array, steps: int, *, norm: str = "euclidean") -> Array:
    """Norm-ratio curve of linear probing with exact line search (Eq. 16).

    Gradient descent on ``L(w) = ‖Aw − y‖²`` from ``w_0 = 0`` with the exact step
    ``α = gᵀg / (2 gᵀAᵀA g)`` (``g = ∇L = 2Aᵀ(Aw − y)``; α = 0 once ``g`` vanishes). Returns the
    1-D array ``[‖w_t − w*‖² / ‖w_0 − w*‖²]_{t=0..steps}`` (first entry 1) in ``A``'s namespace,
    ``w*`` the minimum-norm least-squares solution ``pinv(A) y``. ``norm="hessian"`` measures the
    error in the ``AᵀA``-norm instead, ``‖A(w_t − w*)‖² / ‖A(w_0 − w*)‖²``. Steepest descent with
    exact line search contracts ``‖A(w − w*)‖²`` by at least ``((κ−1)/(κ+1))²`` per step
    (Kantorovich), ``κ = κ(AᵀA)``; a larger κ gives a slower curve. No host synchronisation
    (jit-able).

    ``A`` and ``y`` are first scaled by powers of two (the ratios do not change), so entries of
    any representable size work. Raises ``ValueError`` for shapes other than ``A (N, D)``,
    ``y (N,)`` or ``(N, 1)`` and for NaN/Inf, ``TypeError`` for arrays of different libraries.
    When ``w* = 0`` (``y ⟂`` the range of ``A``, or ``A = 0``) the ratio is undefined (NaN).
    """
    xp = _namespace("probe_convergence", A=A, y=y)
    _as_matrix(A, "A", "probe_convergence")
    N, D = A.shape
    if tuple(y.shape) == (N, 1):
        y = xp.reshape(y, (N,))
    if tuple(y.shape) != (N,):
        raise ValueError(f"probe_convergence: y must have shape ({N},), got {tuple(y.shape)}")
    if norm not in ("euclidean", "hessian"):
        raise ValueError(f"probe_convergence: norm must be 'euclidean' or 'hessian', got {norm!r}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 0:
        raise ValueError(f"probe_convergence: steps must be an integer >= 0, got {steps!r}")
    if not xp.isdtype(A.dtype, "real floating"):
        A = xp.astype(A, xp.float64 if xp.isdtype(A.dtype, "integral") else A.dtype)
    y = xp.astype(y, A.dtype)
    if _readable(xp.all(xp.isfinite(A)) & xp.all(xp.isfinite(y))) is False:
        raise ValueError("probe_convergence: A or y contains NaN or Inf")
    # the ratios are invariant under A → aA, y → by: scale both by powers of two (exact)
    A = A * _pow2(xp.max(xp.abs(A)), xp)
    y = y * _pow2(xp.max(xp.abs(y)), xp)
    w_star = xp.linalg.pinv(A) @ y
    w = xp.zeros((D,), dtype=A.dtype, device=_device(A))

    def size(e):
        if norm == "hessian":
            e = A @ e
        return xp.sum(e * e)

    e0 = size(w_star)
    ratios = [xp.ones_like(e0)]
    for _ in range(int(steps)):
        g = 2.0 * (A.T @ (A @ w - y))
        Ag = A @ g
        den = 2.0 * xp.sum(Ag * Ag)
        ok = den > 0
        safe = xp.where(ok, den, xp.ones_like(den))
        alpha = xp.where(ok, xp.sum(g * g) / safe, xp.zeros_like(den))
        w = w - alpha * g
        ratios.append(size(w - w_star) / e0)
    return xp.stack(ratios)
