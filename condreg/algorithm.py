"""Algorithm 1 (condition-number regularized gradient descent) and the paper's baselines.

:func:`immunize` pre-trains a linear feature extractor ``f_θ(x) = xᵀθ`` (``θ ∈ R^{D×D}``) and a
head ``ω`` so that linear probing on a harmful task ``X_H`` is ill-conditioned while the
pre-training task ``(X_P, y_P)`` stays well-conditioned (docs/math.md §2, §5). It runs on the arrays'
own library (NumPy, PyTorch on CPU or CUDA, JAX, any Array API namespace with ``linalg``) and
returns results in that namespace. See ``docs/immunization.md`` for the choice of every default.

Methods (all through the same harness: same data scaling, supervised loss, step-size safety and
λ rule, so they compare fairly):

``"condreg"``
    Algorithm 1 as printed: ``ω ← ω − η∇_ωL``;
    ``θ ← θ − η∇_θL − ηλ_P K_P⁻¹∇_θR_well(H_P) − ηλ_H K_H⁻¹∇_θR_ill(H_H)`` with full covariances.
    ``K⁻¹`` multiplies on the **left**; since ``∇_θ f(θᵀKθ) = 2KθG``, ``K⁻¹∇_θ f = 2θG`` is
    computed without forming ``K⁻¹`` (``G = ∇_H f``). The supervised gradient is not
    preconditioned.
``"r_ill_only"``
    The same without the R_well term.
``"opt_kappa"``
    Plain gradient descent on ``λ_H / log κ(H_H) + λ_P log κ(H_P)`` (+ the supervised loss),
    un-preconditioned, through the closed-form gradient of κ (chain rule ``2KθG``).
``"imma"``
    Bi-level (Zheng & Yeh 2024): an inner loop of ``imma_steps`` differentiable gradient steps of
    the attacker's linear probe on ``(X_H, y_H)`` from ``w = 0``; the outer step ascends the
    adapted probe's harmful loss (weight ``λ_H``) while descending the pre-training loss. The
    outer gradient is the exact adjoint of the unrolled inner loop (closed form, no autodiff).

Numerical policy (documented in full in ``docs/immunization.md``):

- *Scaling.* κ is invariant to scaling ``K`` by a scalar, the regularizers are not. The
  regularizers see ``K̃ = 2^{-e}K`` with ``2^{-e}`` a power of two bringing ``λ_max(K)`` into
  ``[1/2, 2]`` (an exact rescaling); the supervised loss sees ``x̂ = x·√N/‖X‖₂`` and, for
  regression, ``ŷ = y / rms(y)``. ``omega`` is returned in the units of the raw data.
- *Step-size safety.* Each regularizer step is clipped so that every eigenvalue of its Hessian
  moves by at most a factor ``(1 ± max_step)²``: for the preconditioned steps ``θ(I − E)`` with
  ``E = 2ηλG``, ``‖E‖₂ ≤ max_step``; for un-preconditioned steps ``Δ`` (opt_kappa, imma),
  ``‖Δ‖_F·√D/‖θ‖_F ≤ max_step``.
- *Default λ.* ``lam_p``/``lam_h`` left ``None`` are chosen so that, at ``θ_0``, the norms of the
  regularizer updates are balanced and equal to ``max_step`` (the size the clip allows).
- *Singular K* (constant features, collinear columns, ``N < D``): the pseudo-inverse (default; the
  regularizer step is projected onto the row space of ``X``) or, with ``ridge=ε``,
  ``(K + ε·λ_max(K)·I)⁻¹K``. κ is always over the nonzero eigenvalues.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from condreg import _core, _linalg

Array = Any

__all__ = [
    "immunize",
    "ImmunizationResult",
    "ImmunizationWarning",
    "preconditioned_gradient",
    "METHODS",
    "TASKS",
]

METHODS = ("condreg", "r_ill_only", "opt_kappa", "imma")
TASKS = ("regression", "classification")
HISTORY_KEYS = (
    "epoch",
    "kappa_hp",
    "kappa_hh",
    "kappa_kp",
    "kappa_kh",
    "i",
    "ii",
    "rir",
    "r_well",
    "r_ill",
    "loss",
)


class ImmunizationWarning(UserWarning):
    """Immunization did not succeed (RIR ≤ 1 or (ii) > 1), the run stopped on a non-finite step,
    or the input is degenerate in a way that makes the result meaningless."""


@dataclass
class ImmunizationResult:
    """The outcome of :func:`immunize`.

    ``theta`` (``D×D``) and ``omega`` (``D``; the head in the units of the raw data, so that
    ``X_p @ theta @ omega`` predicts ``y_p`` / the logits) are arrays of the input's namespace.
    ``history`` maps each of :data:`HISTORY_KEYS` to a list of Python floats, one entry per
    evaluated ``θ_t`` (``t = 0 … epochs_run``; entry 0 is ``θ_0``): the four condition numbers
    ``kappa_hp = κ(H_P(θ_t))``, ``kappa_hh = κ(H_H(θ_t))``, ``kappa_kp = κ(K_P)``,
    ``kappa_kh = κ(K_H)`` (constant), the ratios ``i``, ``ii``, ``rir`` (Eq. 15), ``r_well`` =
    R_well(H̃_P), ``r_ill`` = R_ill(H̃_H) of the rescaled Hessians, and the task ``loss`` at
    ``(θ_t, ω_t)``: relative mean squared error ``mean((xᵀθω − y)²)/mean(y²)`` for regression,
    mean logistic loss for classification. Condition numbers here come from the algorithm's
    ``eigh`` (rank tolerance ``10·n·eps``: ``κ(H)`` resolved up to ~1e11 in float64). The final
    figures ``rir``, ``i``, ``ii`` (and ``metrics``, a :class:`condreg.metrics.RIR`) are recomputed
    from SVDs by :func:`condreg.metrics.rir`, which resolves more; the two agree whenever κ(H)
    stays well below 1e11.

    To continue a run: ``immunize(..., theta0=res.theta, omega0=res.omega, lam_p=res.lam_p,
    lam_h=res.lam_h)``.
    """

    theta: Array
    omega: Array
    method: str
    task: str
    lam_p: float
    lam_h: float
    lr: float
    max_step: float
    epochs_run: int
    history: dict[str, list[float]] = field(repr=False)
    metrics: Any = field(repr=False, default=None)
    stopped: str = "completed"

    @property
    def rir(self) -> float:
        """Final RIR = (i)/(ii) (Eq. 15), from :func:`condreg.metrics.rir` (SVDs)."""
        return self.metrics.rir

    @property
    def i(self) -> float:
        """Final κ(H_H(θ_I))/κ(K_H), from :func:`condreg.metrics.rir`."""
        return self.metrics.i

    @property
    def ii(self) -> float:
        """Final κ(H_P(θ_I))/κ(K_P), from :func:`condreg.metrics.rir`."""
        return self.metrics.ii

    @property
    def succeeded(self) -> bool:
        """RIR > 1 and (ii) ≤ 1 (Definition 3.1 (a), (b) in ratio form)."""
        return bool(self.rir > 1.0 and self.ii <= 1.0)

    def __repr__(self) -> str:
        return (
            f"ImmunizationResult(method={self.method!r}, task={self.task!r}, "
            f"epochs_run={self.epochs_run}, i={self.i:.4g}, ii={self.ii:.4g}, "
            f"rir={self.rir:.4g}, lam_p={self.lam_p:.4g}, lam_h={self.lam_h:.4g}, "
            f"stopped={self.stopped!r})"
        )


# --------------------------------------------------------------------------------------------
# Validation (everything is checked before any decomposition runs)
# --------------------------------------------------------------------------------------------


def _namespace(*arrays: Array, xp: Any = None) -> Any:
    if xp is not None:
        return xp
    try:
        return array_namespace(*arrays)
    except TypeError as exc:
        kinds = sorted({type(a).__module__ + "." + type(a).__name__ for a in arrays})
        raise TypeError(
            "immunize: X_p, y_p, X_h (and theta0/omega0/y_h) must be arrays of one Array API "
            f"library; got {', '.join(kinds)} ({exc})"
        ) from None


def _float_dtype(xp: Any, *arrays: Array) -> Any:
    dtypes = []
    for a in arrays:
        if xp.isdtype(a.dtype, "bool") or xp.isdtype(a.dtype, "complex floating"):
            raise TypeError(f"immunize: data must be real numbers, got dtype {a.dtype}")
        if xp.isdtype(a.dtype, "real floating"):
            dtypes.append(a.dtype)
    if not dtypes:
        from condreg._validation import default_float

        return default_float(xp, arrays[0])
    return xp.result_type(*dtypes)


def _check_matrix(X: Array, name: str, xp: Any) -> None:
    if getattr(X, "ndim", None) != 2:
        raise ValueError(
            f"immunize: {name} must be a 2-D array (samples × features), got shape "
            f"{tuple(getattr(X, 'shape', ()))}"
        )
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"immunize: {name} is empty (shape {tuple(X.shape)})")


def _finite(x: Array, xp: Any) -> bool:
    return bool(xp.all(xp.isfinite(x)))


def _labels(y: Array, n: int, name: str, task: str, xp: Any, dtype: Any, dev: Any) -> Array:
    if not hasattr(y, "shape"):
        y = xp.asarray(np.asarray(y), device=dev)
    shape = tuple(y.shape)
    if shape == (n, 1):
        y = xp.reshape(y, (n,))
    elif shape != (n,):
        raise ValueError(
            f"immunize: {name} must have shape ({n},) or ({n}, 1) to match its inputs, got {shape}"
        )
    if xp.isdtype(y.dtype, "complex floating"):
        raise TypeError(f"immunize: {name} must be real, got dtype {y.dtype}")
    y = xp.astype(y, dtype)
    if not _finite(y, xp):
        raise ValueError(f"immunize: {name} contains NaN or Inf")
    if task == "classification":
        if not bool(xp.all((y == 0) | (y == 1))):
            raise ValueError(
                f"immunize: task='classification' needs binary labels in {{0, 1}}; {name} has "
                "other values (map them to 0/1 first)"
            )
        if bool(xp.all(y == y[0])):
            warnings.warn(
                f"{name} is constant: the supervised loss is degenerate (docs/math.md §9.5)",
                ImmunizationWarning,
                stacklevel=4,
            )
    return y


def _positive(value: Any, name: str, *, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"immunize: {name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"immunize: {name} must be finite and {bound}, got {value!r}")
    return v


# --------------------------------------------------------------------------------------------
# The problem: scaled data, covariances, projectors
# --------------------------------------------------------------------------------------------


@dataclass
class _Task:
    """One task's data as the algorithm uses it."""

    mode: str  # "feature" (A = K̃, D×D) or "sample" (A = X̃, N×D)
    A: Array
    Xhat: Array  # x·√N/‖X‖₂ for the supervised / probe losses
    scale: float  # √N/‖X‖₂
    kappa_K: float
    mu1_K: float  # λ_max(K̃)
    rank: int
    proj: tuple[str, Array] | None  # None (K invertible), ("range", V), ("null", Z), ("matrix", M)


def _prepare_task(X: Array, xp: Any, ridge: float | None) -> _Task:
    N, D = X.shape
    mode = "sample" if N < D else "feature"
    A_raw = X.T @ X if mode == "feature" else X
    eye = xp.eye(D, dtype=X.dtype, device=_device(X))
    hs = _linalg.hessian_spectrum(eye, A_raw, mode, xp)
    mu1 = float(hs.mu[0])
    if not (mu1 > 0 and math.isfinite(mu1)):
        raise ValueError("immunize: a data matrix is zero (rank 0); nothing to immunize")
    if mode == "feature":
        c = _linalg.power_of_two_scale(mu1)
        A = A_raw * c
        mu_scaled = hs.mu * c
    else:
        c = _linalg.power_of_two_scale(math.sqrt(mu1))
        A = A_raw * c
        mu_scaled = hs.mu * (c * c)
    kappa_K = float(_linalg.kappa(hs, xp))
    rank = int(hs.sp.k)
    V = hs.V
    if mode == "feature" and rank < D:
        # Rank-deficient K (constant or collinear features): work with a factor K̃ = RᵀR,
        # R = diag(√μ) Vᵀ (rank×D), so each epoch decomposes a rank×rank Gram instead of D×D.
        c = _linalg.power_of_two_scale(math.sqrt(mu1))
        A = (xp.sqrt(hs.mu[:rank]) * c)[:, None] * V[:, :rank].T
        mode = "sample"
        mu_scaled = hs.mu * (c * c)
        hs_r = _linalg.hessian_spectrum(eye, A, mode, xp)
        kappa_K = float(_linalg.kappa(hs_r, xp))  # the loop's own κ at θ = I (row 0 is 1)
    proj: tuple[str, Array] | None
    if ridge is not None:
        mu1s = mu_scaled[0]
        f = mu_scaled / (mu_scaled + ridge * mu1s)
        f = f * xp.astype(hs.sp.mask, f.dtype)
        proj = ("matrix", (V * f[None, :]) @ V.T)
    elif rank == D:
        proj = None
    elif V.shape[-1] == D and D - rank < rank:  # a full eigenbasis: the null space is thinner
        proj = ("null", V[:, rank:])
    else:
        proj = ("range", V[:, :rank])
    scale = math.sqrt(N / mu1)
    return _Task(mode, A, X * scale, scale, kappa_K, float(mu_scaled[0]), rank, proj)


def _project(proj: tuple[str, Array] | None, step: Array) -> Array:
    """Apply the left preconditioner's projection (pinv) or ridge filter to a ``2θG``-type step."""
    if proj is None:
        return step
    kind, M = proj
    if kind == "range":
        return M @ (M.T @ step)
    if kind == "null":
        return step - M @ (M.T @ step)
    return M @ step


@dataclass
class _Config:
    method: str
    task: str
    lr: float
    lam_p: float
    lam_h: float
    max_step: float
    imma_steps: int
    imma_lr: float


# --------------------------------------------------------------------------------------------
# One epoch, written as pure Array API code (no host synchronisation: it traces under jax.jit)
# --------------------------------------------------------------------------------------------


def _sigmoid(z: Array, xp: Any) -> Array:
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _loss_parts(z: Array, y: Array, task: str, xp: Any) -> tuple[Array, Array, Array]:
    """Per-sample loss, first and second derivative with respect to the logit/prediction ``z``."""
    if task == "regression":
        r = z - y
        return r * r, 2.0 * r, 2.0 * xp.ones_like(z)
    p = _sigmoid(z, xp)
    loss = xp.logaddexp(xp.zeros_like(z), z) - y * z
    return loss, p - y, p * (1.0 - p)


def _supervised(theta: Array, omega: Array, X: Array, y: Array, task: str, xp: Any):
    """Mean loss and its gradients with respect to θ and ω (the head sits on ``Xθ``)."""
    N = X.shape[0]
    v = theta @ omega
    z = X @ v
    loss, d1, _ = _loss_parts(z, y, task, xp)
    q = X.T @ (d1 / N)
    return xp.mean(loss), q[:, None] * omega[None, :], theta.T @ q


def _clip_factor(rho: Array, max_step: float, xp: Any) -> Array:
    """``min(1, max_step / rho)`` without dividing by zero."""
    safe = xp.where(rho > max_step, rho, xp.full_like(rho, max_step))
    return max_step / safe


def _rel_size(step: Array, theta: Array, xp: Any) -> Array:
    """Relative size ``‖Δ‖_F·√D/‖θ‖_F`` of an un-preconditioned step."""
    D = theta.shape[-1]
    return xp.sqrt(xp.sum(step * step)) * math.sqrt(D) / xp.sqrt(xp.sum(theta * theta))


def _plain_grad(theta: Array, task: _Task, hs: _linalg.HessianSpectrum, d: Array) -> Array:
    """Un-preconditioned ``∇_θ f(θᵀK̃θ) = 2K̃θG`` for ``G = V diag(d) Vᵀ``.

    Sample mode (``K̃ = AᵀA``, ``F = Aθ``): ``FG = W diag(s·d) Vᵀ`` since ``FV = W diag(s)``."""
    if task.mode == "feature":
        return 2.0 * (task.A @ ((theta @ hs.V) * d[None, :])) @ hs.V.T
    return 2.0 * ((task.A.T @ hs.W) * (hs.sp.s * d)[None, :]) @ hs.V.T


def _imma_grad(theta: Array, X: Array, y: Array, cfg: _Config, xp: Any) -> tuple[Array, Array]:
    """The attacker's adapted loss Φ(θ) = L_H(w_J(θ), θ) and its exact gradient (adjoint).

    Inner loop: ``w_{j+1} = w_j − α Aᵀℓ'(Aw_j)/N`` from ``w_0 = 0``, ``A = Xθ`` (never formed).
    """
    N = X.shape[0]
    alpha = cfg.imma_lr

    def apply_A(w):
        return X @ (theta @ w)

    def apply_At(c):
        return theta.T @ (X.T @ c)

    ws = [xp.zeros((theta.shape[-1],), dtype=theta.dtype, device=_device(theta))]
    for _ in range(cfg.imma_steps):
        _, d1, _ = _loss_parts(apply_A(ws[-1]), y, cfg.task, xp)
        ws.append(ws[-1] - alpha * apply_At(d1 / N))
    loss, d1, _ = _loss_parts(apply_A(ws[-1]), y, cfg.task, xp)
    phi = xp.mean(loss)
    p = apply_At(d1 / N)
    us = [d1 / N]  # dΦ/dA = Σ u_j v_jᵀ
    vs = [ws[-1]]
    for j in range(cfg.imma_steps - 1, -1, -1):
        _, d1, d2 = _loss_parts(apply_A(ws[j]), y, cfg.task, xp)
        Ap = apply_A(p)
        us.append(-alpha * d1 / N)
        vs.append(p)
        us.append(-alpha * (d2 / N) * Ap)
        vs.append(ws[j])
        p = p - alpha * apply_At((d2 / N) * Ap)
    U = xp.stack(us, axis=1)
    W = xp.stack(vs, axis=1)
    return phi, (X.T @ U) @ W.T


def _step(
    theta: Array,
    omega: Array,
    P: _Task,
    H: _Task,
    yp: Array,
    yh: Array | None,
    cfg: _Config,
    xp: Any,
) -> tuple[Array, Array, Array]:
    """One epoch of the chosen method. Returns ``(θ_{t+1}, ω_{t+1}, record_t)`` where
    ``record_t = [κ(H_P), κ(H_H), R_well(H̃_P), R_ill(H̃_H), loss]`` at ``(θ_t, ω_t)``."""
    vec_p = cfg.method in ("condreg", "opt_kappa") and cfg.lam_p > 0
    vec_h = cfg.method in ("condreg", "r_ill_only", "opt_kappa") and cfg.lam_h > 0
    hsP = _linalg.hessian_spectrum(theta, P.A, P.mode, xp, vectors=vec_p)
    hsH = _linalg.hessian_spectrum(theta, H.A, H.mode, xp, vectors=vec_h)
    loss, g_theta, g_omega = _supervised(theta, omega, P.Xhat, yp, cfg.task, xp)
    record = xp.stack(
        [
            _linalg.kappa(hsP, xp),
            _linalg.kappa(hsH, xp),
            _linalg.r_well(hsP, xp),
            _linalg.r_ill(hsH, xp),
            loss,
        ]
    )
    c = cfg.max_step
    new_theta = theta - cfg.lr * g_theta
    if cfg.method in ("condreg", "r_ill_only"):
        E_terms = []
        if cfg.method == "condreg" and cfg.lam_p > 0:
            d = _linalg.d_r_well(hsP, xp)
            rho = 2.0 * cfg.lr * cfg.lam_p * xp.max(xp.abs(d))
            d = (2.0 * cfg.lr * cfg.lam_p * _clip_factor(rho, c, xp)) * d
            E_terms.append((P, hsP, d))
        if cfg.lam_h > 0:
            d = _linalg.d_r_ill(hsH, xp)
            rho = 2.0 * cfg.lr * cfg.lam_h * xp.max(xp.abs(d))
            d = (2.0 * cfg.lr * cfg.lam_h * _clip_factor(rho, c, xp)) * d
            E_terms.append((H, hsH, d))
        if len(E_terms) == 2 and P.proj is None and H.proj is None:
            G = _linalg.right_factor(E_terms[0][1], E_terms[0][2])
            G = G + _linalg.right_factor(E_terms[1][1], E_terms[1][2])
            new_theta = new_theta - theta @ G
        else:
            for task, hs, d in E_terms:
                # K⁺∇ = P_K·θ V diag(d) Vᵀ, evaluated as ((P_K (θV)) · d) Vᵀ
                T = _project(task.proj, theta @ hs.V)
                new_theta = new_theta - (T * d[None, :]) @ hs.V.T
    elif cfg.method == "opt_kappa":
        if cfg.lam_p > 0:
            d = cfg.lam_p * _linalg.d_log_kappa(hsP, xp)
            step = cfg.lr * _plain_grad(theta, P, hsP, d)
            new_theta = new_theta - _clip_factor(_rel_size(step, theta, xp), c, xp) * step
        if cfg.lam_h > 0:
            log_k = xp.log(_linalg.kappa(hsH, xp))
            ok = log_k > 0
            safe = xp.where(ok, log_k, xp.ones_like(log_k))
            coef = -cfg.lam_h / (safe * safe) * xp.astype(ok, log_k.dtype)
            d = coef * _linalg.d_log_kappa(hsH, xp)
            step = cfg.lr * _plain_grad(theta, H, hsH, d)
            new_theta = new_theta - _clip_factor(_rel_size(step, theta, xp), c, xp) * step
    elif cfg.method == "imma":
        if cfg.lam_h > 0:
            _, g_phi = _imma_grad(theta, H.Xhat, yh, cfg, xp)
            step = -cfg.lr * cfg.lam_h * g_phi  # ascent on the adapted harmful loss
            new_theta = new_theta - _clip_factor(_rel_size(step, theta, xp), c, xp) * step
    new_omega = omega - cfg.lr * g_omega
    return new_theta, new_omega, record


def _evaluate(
    theta: Array, omega: Array, P: _Task, H: _Task, yp: Array, task: str, xp: Any
) -> Array:
    hsP = _linalg.hessian_spectrum(theta, P.A, P.mode, xp, vectors=False)
    hsH = _linalg.hessian_spectrum(theta, H.A, H.mode, xp, vectors=False)
    loss, _, _ = _supervised(theta, omega, P.Xhat, yp, task, xp)
    return xp.stack(
        [
            _linalg.kappa(hsP, xp),
            _linalg.kappa(hsH, xp),
            _linalg.r_well(hsP, xp),
            _linalg.r_ill(hsH, xp),
            loss,
        ]
    )


def _default_lams(theta, omega, P, H, yp, yh, cfg, xp) -> tuple[float, float, list[str]]:
    """Per-unit-λ step sizes at θ_0 → λ = max_step / size (the balancing rule)."""
    c, lr = cfg.max_step, cfg.lr
    hsP = _linalg.hessian_spectrum(theta, P.A, P.mode, xp)
    hsH = _linalg.hessian_spectrum(theta, H.A, H.mode, xp)
    size_p = size_h = 0.0
    if cfg.method in ("condreg", "r_ill_only"):
        size_p = 2.0 * lr * float(xp.max(xp.abs(_linalg.d_r_well(hsP, xp))))
        size_h = 2.0 * lr * float(xp.max(xp.abs(_linalg.d_r_ill(hsH, xp))))
    elif cfg.method == "opt_kappa":
        d = _linalg.d_log_kappa(hsP, xp)
        size_p = float(_rel_size(lr * _plain_grad(theta, P, hsP, d), theta, xp))
        log_k = float(_linalg.kappa(hsH, xp))
        log_k = math.log(log_k) if log_k > 1 else 0.0
        if log_k > 0:
            d = _linalg.d_log_kappa(hsH, xp) / log_k**2
            size_h = float(_rel_size(lr * _plain_grad(theta, H, hsH, d), theta, xp))
    elif cfg.method == "imma":
        _, g = _imma_grad(theta, H.Xhat, yh, cfg, xp)
        size_h = float(_rel_size(lr * g, theta, xp))
    notes = []

    def pick(size: float, name: str) -> float:
        if size > 0 and math.isfinite(size):
            return c / size
        notes.append(name)
        return 1.0

    lam_p = pick(size_p, "lam_p") if cfg.method in ("condreg", "opt_kappa") else 0.0
    lam_h = pick(size_h, "lam_h")
    return lam_p, lam_h, notes


# --------------------------------------------------------------------------------------------
# The preconditioned regularizer gradient on its own (Theorem 4.3; used by the JAX transform)
# --------------------------------------------------------------------------------------------


def preconditioned_gradient(
    theta: Array,
    X: Array,
    quantity: str = "r_well",
    *,
    ridge: float | None = None,
    rtol: float | None = None,
    xp: Any = None,
) -> Array:
    """``K⁻¹∇_θ f(H(θ))`` with ``K⁻¹`` on the **left**: ``H(θ) = θᵀKθ``, ``K = XᵀX``.

    Theorem 4.2 gives ``∇_θ f = 2KθG`` with ``G = ∇_H f``, so the result is ``2θG`` when ``K`` is
    invertible; in general ``K⁺K·2θG`` (projection onto the row space of ``X``, pseudo-inverse,
    default) or ``(K + ε·λ_max(K)·I)⁻¹K·2θG`` with ``ridge=ε``. ``quantity`` is ``"r_well"``,
    ``"r_ill"`` or ``"condition_number"``; ``G`` is the minimum-norm (sub)gradient from the SVD of
    ``F = Xθ`` (rank tolerance ``rtol``, default ``max(N, D)·eps``; the same for the row space of
    ``X``). ``theta`` is ``(D, D_out)``, ``X`` is ``(N, D)``. Pure Array API code without value
    checks (at R_ill's pole the result is not finite): it traces under ``jax.jit``.

    A step ``θ' = θ − η·preconditioned_gradient(θ, X, f)`` gives
    ``H(θ') = (I − 2ηG) H (I − 2ηG)``: the same eigenvectors (Theorem 4.3).
    """
    if quantity not in _core.QUANTITIES:
        raise ValueError(f"quantity must be one of {_core.QUANTITIES}, got {quantity!r}")
    xp = _namespace(theta, X, xp=xp)
    F = X @ theta
    sp = _core.decompose(F, xp, gram=True, vectors=True, rtol=rtol, concrete=_core.never)
    tie = _core.default_tie_rtol(F.shape, F.dtype, xp)
    d = _core._DMU[quantity](sp, tie, "min_norm", xp, _core.never)
    V = sp.Vh.T
    step = 2.0 * (theta @ ((V * d[None, :]) @ sp.Vh))
    _, sx, Vx = xp.linalg.svd(X, full_matrices=False)
    tol = _core.default_rtol(X.shape, X.dtype, xp) if rtol is None else rtol
    keep = xp.astype(sx > tol * sx[:1], sx.dtype)
    if ridge is None:
        f = keep
    else:
        s2 = sx * sx
        f = keep * s2 / (s2 + ridge * s2[:1])
    return Vx.T @ (f[:, None] * (Vx @ step))


# --------------------------------------------------------------------------------------------
# The public entry point
# --------------------------------------------------------------------------------------------


@dataclass
class _Setup:
    xp: Any
    P: _Task
    H: _Task
    yp: Array
    yh: Array | None
    head_scale: float
    theta: Array
    omega: Array
    cfg: _Config
    lam_p: float | None
    lam_h: float | None
    X_p: Array
    X_h: Array


def _build(
    X_p,
    y_p,
    X_h,
    *,
    method,
    task,
    lam_p,
    lam_h,
    lr,
    epochs,
    theta0,
    seed,
    omega0,
    y_h,
    max_step,
    ridge,
    imma_steps,
    imma_lr,
    xp,
) -> _Setup:
    """Validate everything (before any decomposition), then scale the data and decompose K."""
    # ---- options
    if method not in METHODS:
        raise ValueError(f"immunize: method must be one of {METHODS}, got {method!r}")
    if task not in TASKS:
        raise ValueError(f"immunize: task must be one of {TASKS}, got {task!r}")
    lr = _positive(lr, "lr")
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 0:
        raise ValueError(f"immunize: epochs must be an integer >= 0, got {epochs!r}")
    epochs = int(epochs)
    max_step = _positive(max_step, "max_step")
    if not max_step < 0.5:
        raise ValueError(f"immunize: max_step must be in (0, 0.5), got {max_step!r}")
    if lam_p is not None:
        lam_p = _positive(lam_p, "lam_p", allow_zero=True)
    if lam_h is not None:
        lam_h = _positive(lam_h, "lam_h", allow_zero=True)
    if ridge is not None:
        ridge = _positive(ridge, "ridge")
    if (
        isinstance(imma_steps, bool)
        or not isinstance(imma_steps, (int, np.integer))
        or (imma_steps < 1)
    ):
        raise ValueError(f"immunize: imma_steps must be an integer >= 1, got {imma_steps!r}")
    if imma_lr is not None:
        imma_lr = _positive(imma_lr, "imma_lr")

    # ---- data
    arrays = [a for a in (X_p, X_h, theta0, omega0) if a is not None]
    arrays += [a for a in (y_p, y_h) if hasattr(a, "__array_namespace__")]
    xp = _namespace(*arrays, xp=xp)
    _check_matrix(X_p, "X_p", xp)
    _check_matrix(X_h, "X_h", xp)
    if X_p.shape[1] != X_h.shape[1]:
        raise ValueError(
            f"immunize: X_p and X_h must have the same number of features, got {X_p.shape[1]} "
            f"and {X_h.shape[1]}"
        )
    N_p, D = X_p.shape
    N_h = X_h.shape[0]
    dtype = _float_dtype(xp, X_p, X_h)
    dev = _device(X_p)
    X_p = xp.astype(X_p, dtype)
    X_h = xp.astype(X_h, dtype)
    for X, name in ((X_p, "X_p"), (X_h, "X_h")):
        if not _finite(X, xp):
            raise ValueError(f"immunize: {name} contains NaN or Inf")
        if not bool(xp.any(X != 0)):
            raise ValueError(f"immunize: {name} is all zeros (rank 0); nothing to immunize")
    yp = _labels(y_p, N_p, "y_p", task, xp, dtype, dev)
    yh = None
    if y_h is not None:
        yh = _labels(y_h, N_h, "y_h", task, xp, dtype, dev)
    if theta0 is None:
        theta = xp.eye(D, dtype=dtype, device=dev)
    else:
        if tuple(theta0.shape) != (D, D):
            raise ValueError(
                f"immunize: theta0 must have shape ({D}, {D}), got {tuple(theta0.shape)}"
            )
        theta = xp.astype(theta0, dtype)
        if not _finite(theta, xp):
            raise ValueError("immunize: theta0 contains NaN or Inf")
    if omega0 is not None:
        omega0 = xp.reshape(omega0, (-1,)) if tuple(omega0.shape) == (D, 1) else omega0
        if tuple(omega0.shape) != (D,):
            raise ValueError(f"immunize: omega0 must have shape ({D},), got {tuple(omega0.shape)}")
        if not _finite(omega0, xp):
            raise ValueError("immunize: omega0 contains NaN or Inf")

    # ---- preparation (decompositions start here)
    P = _prepare_task(X_p, xp, ridge)
    H = _prepare_task(X_h, xp, ridge)
    if method in ("condreg", "r_ill_only") and H.rank < 2:
        raise ValueError(
            f"immunize: R_ill needs X_h of rank >= 2 (its covariance has rank {H.rank})"
        )
    y_scale = 1.0
    if task == "regression":
        y_scale = float(xp.sqrt(xp.mean(yp * yp)))
        if not y_scale > 0:
            y_scale = 1.0
    yp_hat = yp / y_scale
    if method == "imma":
        if yh is None:
            rng = np.random.default_rng(seed)
            draw = rng.standard_normal(N_h) if task == "regression" else rng.integers(0, 2, N_h)
            yh = xp.asarray(np.asarray(draw, dtype=np.float64), dtype=dtype, device=dev)
        elif task == "regression":
            s = float(xp.sqrt(xp.mean(yh * yh)))
            yh = yh / (s if s > 0 else 1.0)
    head_scale = P.scale * y_scale  # omega (raw units) = omega_hat * head_scale
    if omega0 is None:
        omega = xp.zeros((D,), dtype=dtype, device=dev)
    else:
        omega = xp.astype(omega0, dtype) / head_scale

    if imma_lr is None and method == "imma":
        hs = _linalg.hessian_spectrum(theta, H.A, H.mode, xp)
        top = float(hs.mu[0]) / H.mu1_K
        curvature = 2.0 if task == "regression" else 0.25
        imma_lr = 1.0 / (curvature * top)
    cfg = _Config(method, task, lr, 0.0, 0.0, max_step, int(imma_steps), imma_lr or 0.0)

    return _Setup(xp, P, H, yp_hat, yh, head_scale, theta, omega, cfg, lam_p, lam_h, X_p, X_h)


def immunize(
    X_p: Array,
    y_p: Array,
    X_h: Array,
    *,
    method: str = "condreg",
    task: str = "regression",
    lam_p: float | None = None,
    lam_h: float | None = None,
    lr: float = 0.005,
    epochs: int = 100,
    theta0: Array | None = None,
    seed: int = 0,
    omega0: Array | None = None,
    y_h: Array | None = None,
    max_step: float = 0.3,
    ridge: float | None = None,
    imma_steps: int = 5,
    imma_lr: float | None = None,
    progress: bool = False,
    callback: Callable[[int, dict[str, float]], bool | None] | None = None,
    warn: bool = True,
    xp: Any = None,
) -> ImmunizationResult:
    """Immunize a linear feature extractor θ against linear probing on ``X_h`` (Algorithm 1).

    Parameters
    ----------
    X_p, y_p : arrays ``(N_p, D)``, ``(N_p,)`` (or ``(N_p, 1)``)
        The pre-training task. ``task="classification"`` needs labels in {0, 1}.
    X_h : array ``(N_h, D)``
        The harmful task's inputs (its labels are not needed, except by ``"imma"``).
    method : {"condreg", "r_ill_only", "opt_kappa", "imma"}
        See the module documentation.
    task : {"regression", "classification"}
        Supervised loss of the head on ``D_P``: squared error or binary logistic.
    lam_p, lam_h : float, optional
        Regularizer weights. ``None``: balanced at ``θ_0`` so that each regularizer's update has
        relative size ``max_step`` there (``docs/immunization.md``). Ignored terms (R_well in
        ``"r_ill_only"``/``"imma"``) are 0.
    lr : float
        Step size η of every update (default 0.005, the paper's).
    epochs : int
        Number of full-batch iterations of Algorithm 1 (the paper's "epochs").
    theta0, omega0 : arrays ``(D, D)``, ``(D,)``, optional
        Starting point (default: identity and zeros). Pass a previous result's ``theta``,
        ``omega``, ``lam_p`` and ``lam_h`` to continue a run.
    seed : int
        Seeds the surrogate harmful labels of ``"imma"`` when ``y_h`` is not given.
    y_h : array ``(N_h,)``, optional
        Harmful labels for ``"imma"``. Without them IMMA uses a documented surrogate: random labels
        (standard normal for regression, fair coin flips for classification) drawn with ``seed``
        — an attacker task that exercises every direction of ``X_h``.
    max_step : float in (0, 0.5)
        Step-size safety (default 0.3): the bound on the relative change of θ per regularizer
        step (every eigenvalue of the corresponding Hessian moves by at most a factor
        ``(1 ± max_step)²``; both steps together by ``(1 ± 2·max_step)²``, so θ stays invertible).
    ridge : float, optional
        ``None`` (default): ``K⁻¹`` is the pseudo-inverse. A float ``ε > 0``: the ridge inverse
        ``(K + ε·λ_max(K)·I)⁻¹``.
    imma_steps, imma_lr : int, float
        IMMA's inner loop: number of simulated probe steps and their step size (default
        ``1/L`` with ``L`` the smoothness of the probe loss at ``θ_0``).
    progress : bool
        Print one line per epoch to stderr.
    callback : callable ``(epoch, record) -> bool | None``, optional
        Called with each history row as it is computed (the row of ``θ_t``, ``t = 0 … epochs``);
        returning ``True`` stops the run there, keeping ``θ_t``.
    warn : bool
        Emit :class:`ImmunizationWarning` when the run did not succeed (RIR ≤ 1 or (ii) > 1).
    xp : namespace, optional
        Array API namespace to use instead of the inputs'.

    Returns
    -------
    ImmunizationResult

    Raises
    ------
    TypeError
        Arrays of different libraries, non-real dtypes, non-numeric options.
    ValueError
        Non-2-D or empty ``X``, mismatched feature dimensions or sample counts, NaN/Inf in the
        data, labels of the wrong shape (or not in {0, 1} for classification), an unknown method
        or task, a zero data matrix, ``X_h`` of rank < 2 (R_ill needs rank ≥ 2), bad options.
        All checks run before any decomposition.
    """
    st = _build(
        X_p,
        y_p,
        X_h,
        method=method,
        task=task,
        lam_p=lam_p,
        lam_h=lam_h,
        lr=lr,
        epochs=epochs,
        theta0=theta0,
        seed=seed,
        omega0=omega0,
        y_h=y_h,
        max_step=max_step,
        ridge=ridge,
        imma_steps=imma_steps,
        imma_lr=imma_lr,
        xp=xp,
    )
    xp, P, H, yp_hat, yh = st.xp, st.P, st.H, st.yp, st.yh
    theta, omega, cfg, head_scale = st.theta, st.omega, st.cfg, st.head_scale
    lam_p, lam_h, lr, max_step = st.lam_p, st.lam_h, cfg.lr, cfg.max_step
    epochs = int(epochs)
    if lam_p is None or lam_h is None:
        auto_p, auto_h, degenerate = _default_lams(theta, omega, P, H, yp_hat, yh, cfg, xp)
        if degenerate and warn:
            warnings.warn(
                f"immunize: the regularizer gradient is zero at theta0 for {degenerate}; using "
                "weight 1.0 (e.g. R_ill at its pole: all nonzero eigenvalues of H_H equal)",
                ImmunizationWarning,
                stacklevel=2,
            )
        lam_p = auto_p if lam_p is None else lam_p
        lam_h = auto_h if lam_h is None else lam_h
    if method in ("r_ill_only", "imma"):
        lam_p = 0.0
    cfg.lam_p, cfg.lam_h = float(lam_p), float(lam_h)

    # ---- the loop
    history: dict[str, list[float]] = {key: [] for key in HISTORY_KEYS}

    def add(t: int, rec: Array) -> dict[str, float]:
        k_hp, k_hh, rw, ri, loss = (float(v) for v in rec)
        i_ratio, ii_ratio = k_hh / H.kappa_K, k_hp / P.kappa_K
        row = {
            "epoch": float(t),
            "kappa_hp": k_hp,
            "kappa_hh": k_hh,
            "kappa_kp": P.kappa_K,
            "kappa_kh": H.kappa_K,
            "i": i_ratio,
            "ii": ii_ratio,
            "rir": i_ratio / ii_ratio,
            "r_well": rw,
            "r_ill": ri,
            "loss": loss,
        }
        for key in HISTORY_KEYS:
            history[key].append(row[key])
        return row

    def report(row: dict[str, float]) -> bool:
        if progress:
            print(
                f"[condreg {method}] epoch {int(row['epoch'])}/{epochs}  i={row['i']:.4g}  "
                f"ii={row['ii']:.4g}  RIR={row['rir']:.4g}  loss={row['loss']:.4g}",
                file=sys.stderr,
            )
        return bool(callback is not None and callback(int(row["epoch"]), row))

    stopped = "completed"
    epochs_run = epochs
    for t in range(epochs):
        new_theta, new_omega, rec = _step(theta, omega, P, H, yp_hat, yh, cfg, xp)
        if report(add(t, rec)):
            stopped, epochs_run = f"stopped by callback at epoch {t}", t
            break
        if not (_finite(new_theta, xp) and _finite(new_omega, xp)):
            stopped, epochs_run = f"non-finite update at epoch {t}; returned theta of epoch {t}", t
            break
        theta, omega = new_theta, new_omega
    else:
        report(add(epochs, _evaluate(theta, omega, P, H, yp_hat, task, xp)))

    from condreg.metrics import rir as _rir

    result = ImmunizationResult(
        metrics=_rir(theta, st.X_p, st.X_h),
        theta=theta,
        omega=omega * head_scale,
        method=method,
        task=task,
        lam_p=cfg.lam_p,
        lam_h=cfg.lam_h,
        lr=lr,
        max_step=max_step,
        epochs_run=epochs_run,
        history=history,
        stopped=stopped,
    )
    if warn and stopped.startswith("non-finite"):
        warnings.warn(f"immunize: {stopped}", ImmunizationWarning, stacklevel=2)
    if warn and not result.succeeded:
        warnings.warn(
            f"immunize ({method}): immunization did not succeed: (i) = {result.i:.4g}, "
            f"(ii) = {result.ii:.4g}, RIR = {result.rir:.4g} (success needs RIR > 1 and "
            "(ii) <= 1); try more epochs, a larger max_step or other lam_p/lam_h",
            ImmunizationWarning,
            stacklevel=2,
        )
    return result
