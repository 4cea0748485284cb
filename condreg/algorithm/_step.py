"""One epoch of Algorithm 1 as pure Array API code (no host synchronisation: it traces under
``jax.jit``), and the pieces every method shares."""

from __future__ import annotations

import math
from typing import Any

from condreg import _core, _linalg, _spectrum
from condreg.algorithm._problem import Problem, State, TaskData

Array = Any

#: The entries of the record :func:`step` returns for ``θ_t``.
RECORD_FIELDS = ("kappa_hp", "kappa_hh", "r_well", "r_ill", "loss", "rank_p", "rank_h", "next_ok")


#: Decomposition paths of the engine a task may use (:func:`condreg._spectrum.decompose`).
PATHS = ("auto", "exact")


def spectrum(task: TaskData, theta: Array, rtol: float, xp: Any, *, vectors: bool, path: str):
    """Spectrum of ``H̃(θ) = θᵀK̃θ`` from the factor: ``F = Aθ`` (``r×D``), rank
    ``#{σ_i(F) > rtol·σ₁(F)}``, every counted value resolved (the engine's guarantee).

    ``path="auto"``: the eigh of the ``r×r`` Gram where it resolves them, else a QR of ``Fᵀ``
    and the SVD of its ``R``; ``"exact"``: the latter directly (no wasted eigh on data whose
    spectrum the Gram never resolves). The small side's vectors come back as ``W`` (``F = W S
    Vᵀ``; ``V`` instead when ``r = D``)."""
    F = task.A @ theta
    sp = _spectrum.decompose(
        F, xp, gram=True, vectors=vectors, rtol=rtol, concrete=_core.never, method=path
    )
    V = None if sp.Vh is None else sp.Vh.T
    return _linalg.HessianSpectrum(sp.mu, V, sp, None, sp.U, rtol)


def is_linalg_error(exc: BaseException) -> bool:
    """A backend's "decomposition did not converge" (numpy LinAlgError, torch _LinAlgError…)."""
    return any("LinAlgError" in c.__name__ for c in type(exc).__mro__)


def gram_was_used(hs: Any, xp: Any) -> bool:
    """Whether the engine took the Gram path (its error bound is then > 0; eager)."""
    err = hs.sp.mu_err
    return bool(err > 0) if isinstance(err, float) else bool(float(xp.max(err)) > 0)


def sigmoid(z: Array, xp: Any) -> Array:
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def loss_parts(z: Array, y: Array, task: str, xp: Any) -> tuple[Array, Array, Array]:
    """Per-sample loss, first and second derivative with respect to the logit/prediction ``z``."""
    if task == "regression":
        r = z - y
        return r * r, 2.0 * r, 2.0 * xp.ones_like(z)
    p = sigmoid(z, xp)
    loss = xp.logaddexp(xp.zeros_like(z), z) - y * z
    return loss, p - y, p * (1.0 - p)


def supervised(theta: Array, omega: Array, X: Array, y: Array, task: str, xp: Any):
    """Mean loss and its gradients with respect to θ and ω (the head sits on ``Xθ``)."""
    N = X.shape[0]
    z = X @ (theta @ omega)
    loss, d1, _ = loss_parts(z, y, task, xp)
    q = X.T @ (d1 / N)
    return xp.mean(loss), q[:, None] * omega[None, :], theta.T @ q


def clip_factor(rho: Array, max_step: float, xp: Any) -> Array:
    """``min(1, max_step / rho)`` without dividing by zero."""
    safe = xp.where(rho > max_step, rho, xp.full_like(rho, max_step))
    return max_step / safe


def rel_size(step: Array, theta: Array, xp: Any) -> Array:
    """Relative size ``‖Δ‖_F·√D/‖θ‖_F`` of an un-preconditioned step."""
    D = theta.shape[-1]
    return xp.sqrt(xp.sum(step * step)) * math.sqrt(D) / xp.sqrt(xp.sum(theta * theta))


def through_basis(task: TaskData, hs: Any, d: Array, left: Array) -> Array:
    """``V_x diag(left) (F G)`` with ``G = V diag(d) Vᵀ`` the gradient's right factor.

    ``FG = (W diag(d) Wᵀ) F`` from the left vectors (``FV = W diag(s)``; no division by ``s``,
    so tiny singular values cost no accuracy), or ``F (V diag(d) Vᵀ)`` when the engine returned
    the right ones. ``left = task.pinv``: the preconditioned ``K̃⁺K̃θG`` (= ``θG`` for
    invertible ``K``); ``left = task.sc``: the plain ``K̃θG``. Two ``r×D``-sized products."""
    F = hs.sp.F  # the engine keeps F = Aθ with the vectors
    if hs.W is not None:
        FG = ((hs.W * d[None, :]) @ hs.W.T) @ F
    else:
        FG = F @ ((hs.V * d[None, :]) @ hs.V.T)
    return task.basis @ (left[:, None] * FG)


def record(problem: Problem, hsP: Any, hsH: Any, loss: Array, next_ok: Array) -> Array:
    xp = problem.xp
    return xp.stack(
        [
            _linalg.kappa(hsP, xp),
            _linalg.kappa(hsH, xp),
            _linalg.r_well(hsP, xp),
            _linalg.r_ill(hsH, xp),
            loss,
            xp.astype(hsP.sp.k, loss.dtype),
            xp.astype(hsH.sp.k, loss.dtype),
            next_ok,
        ]
    )


def _all_finite(a: Array, xp: Any) -> Array:
    return xp.isfinite(xp.sum(xp.abs(a)))


def step(problem: Problem, state: State) -> tuple[State, Array]:
    """One epoch of ``problem.method`` from ``state = (θ_t, ω̂_t)``.

    Returns ``(State(θ_{t+1}, ω̂_{t+1}), record_t)`` with ``record_t`` the entries
    :data:`RECORD_FIELDS` at ``θ_t``: κ(H_P), κ(H_H), R_well(H̃_P), R_ill(H̃_H), the reported
    loss, the two ranks at ``problem.rtol`` and ``next_ok`` (1.0 when ``θ_{t+1}`` and ``ω_{t+1}``
    are finite). The head's step and the supervised θ step are taken from ``(θ_t, ω_t)``; the
    method adds its regularizer step (:data:`condreg.algorithm.REGISTRY`). Pure and jit-able:
    it never raises on the values (a diverged state gives a non-finite record).
    """
    xp, method = problem.xp, problem.method
    theta, omega = state
    vec_p, vec_h = method.vectors(problem)
    path_p, path_h = problem.paths
    hsP = spectrum(problem.P, theta, problem.rtol, xp, vectors=vec_p, path=path_p)
    hsH = spectrum(problem.H, theta, problem.rtol, xp, vectors=vec_h, path=path_h)
    loss, g_theta, g_omega = supervised(theta, omega, problem.P.Xhat, problem.yp, problem.task, xp)
    new_theta = theta - problem.lr * g_theta - method.update(problem, theta, hsP, hsH)
    new_omega = omega - problem.lr * g_omega
    ok = _all_finite(new_theta, xp) & _all_finite(new_omega, xp)
    rec = record(problem, hsP, hsH, loss, xp.astype(ok, loss.dtype))
    return State(new_theta, new_omega), rec


def evaluate(problem: Problem, state: State) -> Array:
    """The record of ``state`` without taking a step (eigenvalues only)."""
    xp = problem.xp
    theta, omega = state
    path_p, path_h = problem.paths
    hsP = spectrum(problem.P, theta, problem.rtol, xp, vectors=False, path=path_p)
    hsH = spectrum(problem.H, theta, problem.rtol, xp, vectors=False, path=path_h)
    loss, _, _ = supervised(theta, omega, problem.P.Xhat, problem.yp, problem.task, xp)
    return record(problem, hsP, hsH, loss, xp.ones_like(loss))
