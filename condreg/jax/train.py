"""JAX training adapters for Algorithm 1: pure, jit-able functions and an optax transformation.

- :func:`regularizer_loss` — ``λ_P R_well(F_PᵀF_P) + λ_H R_ill(F_HᵀF_H)`` from feature batches
  (differentiable with ``jax.grad`` through condreg's closed-form ``custom_vjp``).
- :func:`precondition` — the paper's "dummy layer" as a ``jax.custom_vjp`` identity whose backward
  maps ``ḡ ↦ (xxᵀ + εI)⁻¹ḡ`` on the sample axis, so the immunized map's parameter gradient becomes
  ``(K + εI)⁻¹∇_θ`` — ``K⁻¹`` on the **left** (see :mod:`condreg.torch.nn` for why it sits on the
  features of the regularizer's path and acts on the sample axis).
- :func:`preconditioned_update` — the same update in closed form,
  ``λ_P K_P⁺∇R_well + λ_H K_H⁺∇R_ill`` (Theorem 4.2: ``2θG`` projected onto the row space of the
  batch).
- :func:`condition_regularizer` — that update as a real ``optax.GradientTransformationExtraArgs``
  (:func:`condreg.jax.optax.condition_regularizer`; needs ``pip install condreg[optax]``), which
  composes in ``optax.chain``.
- :func:`algorithm1_step` — one epoch of :func:`condreg.immunize` (any method) as a jitted pure
  function of ``(theta, omega)``.

Nothing here changes JAX's configuration; enable float64 yourself (``jax_enable_x64``) for
ill-conditioned data.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

import condreg
from condreg import _precondition as _precondition_home
from condreg import algorithm as _alg

__all__ = [
    "regularizer_loss",
    "precondition",
    "preconditioned_update",
    "condition_regularizer",
    "algorithm1_step",
]


def _flat(F: jax.Array) -> jax.Array:
    if F.ndim < 2:
        raise ValueError(f"expected a batch of features (N, ...), got shape {F.shape}")
    return jnp.reshape(F, (F.shape[0], -1))


def regularizer_loss(
    features_p: jax.Array | None,
    features_h: jax.Array | None,
    lam_p: float = 1.0,
    lam_h: float = 1.0,
    *,
    normalize: bool = True,
) -> jax.Array:
    """``λ_P R_well(H_P) + λ_H R_ill(H_H)`` with ``H = FᵀF`` (features flattened to ``(N, -1)``).

    ``normalize=True`` divides each batch by its Frobenius norm (under ``stop_gradient``), i.e.
    uses ``H / tr(H)``, as :class:`condreg.torch.nn.ConditionRegularizer` does. Pure and jit-able.

    Raises :class:`condreg.RankError` for an all-zero batch (eagerly; under ``jax.jit`` the value
    checks are skipped, as everywhere in condreg) and ``ValueError`` for non-finite features.
    """
    total = jnp.zeros(())
    for F, lam, name in ((features_p, lam_p, "r_well"), (features_h, lam_h, "r_ill")):
        if F is None or lam == 0:
            continue
        F = _flat(F)
        if normalize:
            nrm = jax.lax.stop_gradient(jnp.linalg.norm(F))
            # a zero batch stays zero (the core raises RankError for it), never 0/0 = NaN
            F = F / jnp.where(nrm > 0, nrm, jnp.ones_like(nrm))
        fn = condreg.r_well if name == "r_well" else condreg.r_ill
        total = total + lam * fn(F, gram=True)
    return total


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _precondition(features: jax.Array, inputs: jax.Array, ridge: float) -> jax.Array:
    return features


def _precondition_fwd(features, inputs, ridge):
    return features, inputs


def _precondition_bwd(ridge, inputs, g):
    x = _flat(inputs)
    pre = _precondition_home.sample_preconditioner(x, ridge=ridge, xp=jnp)
    out = pre.apply(jnp.reshape(g, (g.shape[0], -1)))
    return jnp.reshape(out, g.shape).astype(g.dtype), jnp.zeros_like(inputs)


_precondition.defvjp(_precondition_fwd, _precondition_bwd)


def precondition(features: jax.Array, inputs: jax.Array, ridge: float = 1e-4) -> jax.Array:
    """Identity on ``features`` (``= inputs @ θ``); its VJP left-multiplies ``∇_θ`` by
    ``(K + ε I)⁻¹``, ``K = xᵀx`` of this batch, ``ε = ridge·λ_max(K)`` (``ridge=0``:
    pseudo-inverse).
    ``inputs`` receives no gradient from this function."""
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    return _precondition(features, inputs, float(ridge))


def preconditioned_update(
    theta: jax.Array,
    x_p: jax.Array | None,
    x_h: jax.Array | None,
    lam_p: float = 1.0,
    lam_h: float = 1.0,
    *,
    ridge: float | None = None,
) -> jax.Array:
    """``λ_P K_P⁺∇_θR_well(H_P) + λ_H K_H⁺∇_θR_ill(H_H)`` for the batches ``x_p``, ``x_h``
    (inputs of the immunized map ``θ``); see :func:`condreg.algorithm.preconditioned_gradient`.
    Subtract ``η·`` this from θ (together with the supervised step) for Algorithm 1's update."""
    total = jnp.zeros_like(theta)
    if x_p is not None and lam_p != 0:
        g = _alg.preconditioned_gradient(theta, _flat(x_p), "r_well", ridge=ridge)
        total = total + lam_p * g
    if x_h is not None and lam_h != 0:
        g = _alg.preconditioned_gradient(theta, _flat(x_h), "r_ill", ridge=ridge)
        total = total + lam_h * g
    return total


def condition_regularizer(
    lam_p: float = 1.0,
    lam_h: float = 1.0,
    *,
    key: Any = None,
    ridge: float | None = None,
) -> Any:
    """Algorithm 1's preconditioned regularizer gradient as an ``optax`` transformation.

    The same as :func:`condreg.jax.optax.condition_regularizer` (see there): a real
    ``optax.GradientTransformationExtraArgs`` whose ``update(updates, state, params, *, x_p,
    x_h)`` adds :func:`preconditioned_update` to the supervised gradients; it composes in
    ``optax.chain`` (e.g. ``optax.chain(condition_regularizer(...), optax.sgd(lr))``). Needs
    optax (``pip install condreg[optax]``); raises ``ImportError`` saying so otherwise.
    """
    try:
        from condreg.jax import optax as _optax
    except ImportError as exc:  # pragma: no cover - exercised only without optax
        raise ImportError(
            "condition_regularizer is an optax transformation and needs optax: "
            "pip install 'condreg[optax]' (or use preconditioned_update directly)"
        ) from exc
    return _optax.condition_regularizer(lam_p, lam_h, key=key, ridge=ridge)


def __getattr__(name: str) -> Any:
    if name == "GradientTransformation":
        import warnings

        warnings.warn(
            "condreg.jax.train.GradientTransformation is gone: condition_regularizer returns "
            "optax.GradientTransformationExtraArgs (condreg.jax.optax)",
            DeprecationWarning,
            stacklevel=2,
        )
        import optax

        return optax.GradientTransformationExtraArgs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def algorithm1_step(
    X_p: jax.Array,
    y_p: jax.Array,
    X_h: jax.Array,
    *,
    lam_p: float,
    lam_h: float,
    method: str = "condreg",
    task: str = "regression",
    lr: float = 0.005,
    max_step: float = 0.3,
    ridge: float | None = None,
    y_h: jax.Array | None = None,
    seed: int = 0,
    imma_steps: int = 5,
    imma_lr: float | None = None,
    rtol: float | None = None,
) -> Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]:
    """One epoch of :func:`condreg.immunize` as a jitted pure function.

    Built on the public :func:`condreg.algorithm.prepare` / :func:`condreg.algorithm.step`: the
    data are validated, scaled and decomposed once, eagerly (as in ``immunize``); the returned
    ``step(theta, omega) -> (theta, omega, record)`` is ``jax.jit``-compiled and has no host
    synchronisation. ``omega`` is in raw-data units (as ``ImmunizationResult.omega``);
    ``record = [κ(H_P), κ(H_H), R_well, R_ill, loss]`` at the input point. ``lam_p``/``lam_h``
    must be given (take them, and ``imma_lr``/``rtol``, from an ``immunize`` result to reproduce
    its defaults). Iterating ``step`` from ``(I, 0)`` reproduces ``immunize(...).theta`` (without
    its health checks: a diverging step gives non-finite values instead of stopping).
    """
    problem, _ = _alg.prepare(
        X_p, y_p, X_h, method=method, task=task, lam_p=lam_p, lam_h=lam_h, lr=lr,
        max_step=max_step, ridge=ridge, y_h=y_h, seed=seed, imma_steps=imma_steps,
        imma_lr=imma_lr, rtol=rtol,
    )  # fmt: skip

    @jax.jit
    def step(theta, omega):
        state, record = _alg.step(problem, problem.state(theta, omega))
        return state.theta, problem.raw_omega(state), record[:5]

    return step
