"""The methods of :func:`condreg.immunize`: one registry, each entry its λ rule and its step;
and the gradients they follow as public functions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from array_api_compat import array_namespace

from condreg import _core, _linalg, _precondition, _spectrum
from condreg.algorithm._factored import Delta, basis_step, clip_factor, rel_size
from condreg.algorithm._problem import Method, Problem
from condreg.algorithm._step import loss_parts

Array = Any


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

    ``= 2θG`` (``G = ∇_H f``) for invertible ``K``, else ``K⁺K·2θG`` or, with ``ridge=ε``,
    ``(K + ε·λ_max(K)·I)⁻¹K·2θG`` (Theorem 4.3). Pure Array API code: it traces under ``jax.jit``.

    Parameters
    ----------
    theta, X : array, shape (D, D_out) and (N, D)
        The extractor and the task's data.
    quantity : {"r_well", "r_ill", "condition_number"}
        The regularizer ``f``.
    ridge : float >= 0, optional
        ``None``: the pseudo-inverse; ``ε``: ``(K + ε·λ_max(K)·I)⁻¹``.
    rtol : float, optional
        Rank tolerance on the singular values of ``Xθ`` and ``X``; default ``max(N, D)·eps``.
    xp : namespace, optional
        Array API namespace to use instead of the arrays'.

    Returns
    -------
    array, shape (D, D_out)
        ``K⁻¹∇_θ f(H(θ))`` in the arrays' namespace.

    Raises
    ------
    ValueError
        An unknown ``quantity``.
    TypeError
        ``theta`` and ``X`` of different libraries.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.algorithm import preconditioned_gradient
    >>> X = np.random.default_rng(0).standard_normal((20, 4))
    >>> preconditioned_gradient(np.eye(4), X, "r_well").shape
    (4, 4)
    """
    if quantity not in _core.QUANTITIES:
        raise ValueError(f"quantity must be one of {_core.QUANTITIES}, got {quantity!r}")
    if xp is None:
        try:
            xp = array_namespace(theta, X)
        except TypeError:
            raise TypeError(
                "preconditioned_gradient: theta and X must be arrays of one Array API library"
            ) from None
    F = X @ theta
    sp = _spectrum.decompose(
        F, xp, gram=True, vectors=True, rtol=rtol, concrete=_core.never, method="svd"
    )
    # θ against H's V: the engine's one gradient of a spectrum (2 θ V diag(d/dmu) Vᵀ, on the
    # exactly rescaled spectrum: an over- or underflowing result is ±inf or 0, not NaN)
    kw = {"tie_rtol": None, "subgradient": "min_norm", "concrete": _core.never}
    step = _core.gradient_from_spectrum(quantity, sp._replace(F=theta), xp, **kw)
    return _precondition.left_preconditioner(X, ridge=ridge, rtol=rtol, xp=xp).apply(step)


# -- condreg and r_ill_only: K⁻¹-left-preconditioned steps θ(I − E), ‖E‖₂ ≤ max_step ----------


def _preconditioned(
    problem: Problem, hs: Any, task: Any, d: Array, lam: float, a: Any, side: str
) -> Array:
    """The clipped, preconditioned step of ``d = a·mu + (terms on the ``side`` tie set)``."""
    xp = problem.xp
    rho = 2.0 * problem.lr * lam * xp.max(xp.abs(d))
    factor = 2.0 * problem.lr * lam * clip_factor(rho, problem.max_step, xp)
    return basis_step(task, hs, factor * d, task.pinv, factor * a, (side,))


def _condreg_update(problem: Problem, theta: Any, hsP: Any, hsH: Any) -> Delta:
    xp = problem.xp
    total = Delta()  # θ is not read (uses_theta=False)
    if problem.lam_p > 0:
        d, a = _linalg.d_r_well(hsP, xp), _linalg.r_well_mu_coefficient(hsP, xp)
        total = total + _preconditioned(problem, hsP, problem.P, d, problem.lam_p, a, "top")
    if problem.lam_h > 0:
        d, a = _linalg.d_r_ill(hsH, xp), _linalg.r_ill_mu_coefficient(hsH, xp)
        total = total + _preconditioned(problem, hsH, problem.H, d, problem.lam_h, a, "bottom")
    return total


def _condreg_sizes(problem: Problem, theta: Array, hsP: Any, hsH: Any) -> tuple[float, float]:
    xp, lr = problem.xp, problem.lr
    size_p = 2.0 * lr * float(xp.max(xp.abs(_linalg.d_r_well(hsP, xp))))
    size_h = 2.0 * lr * float(xp.max(xp.abs(_linalg.d_r_ill(hsH, xp))))
    return size_p, size_h


# -- opt_kappa: plain gradient of λ_H / log κ(H_H) + λ_P log κ(H_P) ----------------------------


def _inv_log_kappa_coef(hs: Any, xp: Any) -> Array:
    """``d(1/log κ)/d log κ = −1/log²κ`` (0 where κ ≤ 1)."""
    log_k = xp.log(_linalg.kappa(hs, xp))
    ok = log_k > 0
    safe = xp.where(ok, log_k, xp.ones_like(log_k))
    return -1.0 / (safe * safe) * xp.astype(ok, log_k.dtype)


#: d log κ / d mu is zero outside the two extreme tie sets.
_BOTH = ("top", "bottom")


def _plain_raw(problem: Problem, hs: Any, task: Any, d: Array) -> Delta:
    """The unclipped plain step ``2η·K̃θG`` of ``d``."""
    return basis_step(task, hs, d, task.sc, 0.0, _BOTH).scaled(problem.lr * 2.0)


def _clipped(problem: Problem, step: Delta, theta: Array) -> Delta:
    """``step`` scaled down to relative size at most ``max_step``."""
    xp = problem.xp
    return step.scaled(clip_factor(rel_size(step, theta, xp), problem.max_step, xp))


def _opt_kappa_update(problem: Problem, theta: Array, hsP: Any, hsH: Any) -> Delta:
    xp = problem.xp
    total = Delta()
    if problem.lam_p > 0:
        d = problem.lam_p * _linalg.d_log_kappa(hsP, xp)
        total = total + _clipped(problem, _plain_raw(problem, hsP, problem.P, d), theta)
    if problem.lam_h > 0:
        d = problem.lam_h * _inv_log_kappa_coef(hsH, xp) * _linalg.d_log_kappa(hsH, xp)
        total = total + _clipped(problem, _plain_raw(problem, hsH, problem.H, d), theta)
    return total


def _opt_kappa_sizes(problem: Problem, theta: Array, hsP: Any, hsH: Any) -> tuple[float, float]:
    xp = problem.xp
    step = _plain_raw(problem, hsP, problem.P, _linalg.d_log_kappa(hsP, xp))
    size_p, size_h = float(rel_size(step, theta, xp)), 0.0
    kappa_h = float(_linalg.kappa(hsH, xp))
    if kappa_h > 1:
        d = _linalg.d_log_kappa(hsH, xp) / math.log(kappa_h) ** 2
        size_h = float(rel_size(_plain_raw(problem, hsH, problem.H, d), theta, xp))
    return size_p, size_h


# -- imma: ascent on the attacker's adapted harmful loss (bi-level, exact adjoint) -------------


def imma_gradient(
    theta: Array, X: Array, y: Array, task: str, steps: int, alpha: float, xp: Any
) -> tuple[Array, Array]:
    """The attacker's adapted loss ``Φ(θ) = L_H(w_J(θ), θ)`` and its exact gradient (adjoint).

    ``w_{j+1} = w_j − α Aᵀℓ'(Aw_j)/N`` from ``w_0 = 0``, ``A = Xθ``; ``Φ`` is the mean ``ℓ(Aw_J)``.

    Parameters
    ----------
    theta : array, shape (D, D)
        The immunized map.
    X, y : array, shape (N, D) and (N,)
        The harmful data and labels (``{0, 1}`` for classification).
    task : str
        ``"regression"`` (squared error) or ``"classification"`` (logistic loss ``ℓ``).
    steps, alpha : int, float
        ``J`` and ``α``, the attacker's inner steps and step size.
    xp : namespace
        The arrays' Array API namespace.

    Returns
    -------
    tuple of array
        ``(Φ(θ), ∇_θΦ)``: a 0-d array and a ``D×D`` array.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.algorithm import imma_gradient
    >>> X = np.random.default_rng(0).standard_normal((20, 3))
    >>> loss, grad = imma_gradient(np.eye(3), X, X[:, 0], "regression", 4, 0.1, np)
    >>> grad.shape
    (3, 3)
    """
    loss, L, R = _imma_factors(theta, X, y, task, steps, alpha, xp)
    return loss, L @ R


def _imma_factors(
    theta: Array, X: Array, y: Array, task: str, steps: int, alpha: float, xp: Any
) -> tuple[Array, Array, Array]:
    """:func:`imma_gradient` with the gradient as two factors ``(XᵀU)(Wᵀ)`` of rank ``2J+1``."""
    N = X.shape[0]  # A = Xθ is applied, never formed
    ws = [xp.zeros_like(theta[0, :])]
    for _ in range(steps):
        _, d1, _ = loss_parts(X @ (theta @ ws[-1]), y, task, xp)
        ws.append(ws[-1] - alpha * (theta.T @ (X.T @ (d1 / N))))
    loss, d1, _ = loss_parts(X @ (theta @ ws[-1]), y, task, xp)
    p = theta.T @ (X.T @ (d1 / N))
    us, vs = [d1 / N], [ws[-1]]  # dΦ/dA = Σ u_j v_jᵀ
    for j in range(steps - 1, -1, -1):
        _, d1, d2 = loss_parts(X @ (theta @ ws[j]), y, task, xp)
        Ap = X @ (theta @ p)
        us += [-alpha * d1 / N, -alpha * (d2 / N) * Ap]
        vs += [p, ws[j]]
        p = p - alpha * (theta.T @ (X.T @ ((d2 / N) * Ap)))
    return xp.mean(loss), X.T @ xp.stack(us, axis=1), xp.stack(vs, axis=1).T


def _imma_raw(problem: Problem, theta: Array) -> Delta:
    H = problem.H
    _, L, R = _imma_factors(
        theta, H.Xhat, problem.yh, problem.task, problem.imma_steps, problem.imma_lr, problem.xp
    )
    return Delta(outer=[(L, R)])


def _imma_update(problem: Problem, theta: Array, hsP: Any, hsH: Any) -> Delta:
    if not problem.lam_h > 0:
        return Delta()
    step = _imma_raw(problem, theta).scaled(-problem.lr * problem.lam_h)  # ascent on Φ
    return _clipped(problem, step, theta)


def _imma_sizes(problem: Problem, theta: Array, hsP: Any, hsH: Any) -> tuple[float, float]:
    step = _imma_raw(problem, theta).scaled(problem.lr)
    return 0.0, float(rel_size(step, theta, problem.xp))


def imma_default_lr(problem: Problem, theta: Array, hsH: Any) -> float:
    """``1/L``, ``L = curv·‖X̂_Hθ_0‖₂²/N`` the probe loss's smoothness (curv 2 or 1/4)."""
    H = problem.H
    top = float(hsH.mu[0]) / (H.c * H.c) * (H.scale * H.scale) / H.Xhat.shape[0]
    curvature = 2.0 if problem.task == "regression" else 0.25
    return 1.0 / (curvature * top)


REGISTRY = MappingProxyType(
    {
        "condreg": Method(
            "condreg",
            ("p", "h"),
            (True, True),
            _condreg_sizes,
            _condreg_update,
            "−ηλ_P K_P⁻¹∇R_well(H_P) − ηλ_H K_H⁻¹∇R_ill(H_H), K⁻¹ on the left (Algorithm 1)",
            "Ours (condreg)",
            min_rank_h=2,
            uses_theta=False,
        ),
        "r_ill_only": Method(
            "r_ill_only",
            ("h",),
            (False, True),
            _condreg_sizes,
            _condreg_update,
            "−ηλ_H K_H⁻¹∇R_ill(H_H)",
            "R_ill only",
            min_rank_h=2,
            uses_theta=False,
        ),
        "opt_kappa": Method(
            "opt_kappa",
            ("p", "h"),
            (True, True),
            _opt_kappa_sizes,
            _opt_kappa_update,
            "−η∇_θ[λ_H / log κ(H_H) + λ_P log κ(H_P)], plain gradient through κ",
            "Opt κ",
        ),
        "imma": Method(
            "imma",
            ("h",),
            (False, False),
            _imma_sizes,
            _imma_update,
            "+ηλ_H∇_θL_H(w_J(θ), θ): ascent on the harmful loss after J simulated probe steps",
            "IMMA",
            needs_y_h=True,
            default_inner_lr=imma_default_lr,
        ),
    }
)

#: Method names in the paper's table order (Ours last): how every experiment lists them.
METHODS: tuple[str, ...] = ("r_ill_only", "imma", "opt_kappa", "condreg")

#: Each method's name in tables and plots (``Method.label``), in :data:`METHODS` order.
METHOD_LABELS: Mapping[str, str] = MappingProxyType({m: REGISTRY[m].label for m in METHODS})
