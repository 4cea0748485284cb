"""JAX training adapters for Algorithm 1: pure, jit-able functions (docs/immunization.md).
Batches are ``(N, D)`` rows or ``(B, T, D)`` token batches (tokens as rows)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

import condreg
from condreg import _core
from condreg import _precondition as _precondition_home
from condreg import algorithm as _alg
from condreg.jax.weights import normalized

__all__ = ["regularizer_loss", "precondition", "preconditioned_update", "algorithm1_step"]


def _rows(F: jax.Array, name: str = "features") -> jax.Array:
    """``(N, D)`` as is, ``(B, T, D)`` as ``(B·T, D)``; other shapes raise."""
    ndim = getattr(F, "ndim", None)
    if ndim == 2:
        return F
    if ndim == 3:
        return jnp.reshape(F, (-1, F.shape[-1]))
    raise ValueError(
        f"{name} must be (N, D) rows or (B, T, D) token features (tokens as rows), got "
        f"{'shape ' + str(tuple(F.shape)) if ndim is not None else type(F).__name__}"
    )


def regularizer_loss(
    features_p: jax.Array | None,
    features_h: jax.Array | None,
    lam_p: float = 1.0,
    lam_h: float = 1.0,
    *,
    normalize: bool = True,
) -> jax.Array:
    """``λ_P R_well(H_P) + λ_H R_ill(H_H)`` with ``H = FᵀF``, differentiable with ``jax.grad``.

    Parameters
    ----------
    features_p, features_h : jax.Array or None
        ``(N, D)`` or ``(B, T, D)`` features of each task (``None``: no term).
    lam_p, lam_h : float
        Their weights (0: no term).
    normalize : bool
        Use ``H / tr(H)`` (the norm under ``stop_gradient``) or the plain ``H`` of Eq. 11.

    Raises
    ------
    condreg.RankError
        For an all-zero batch (eagerly; under ``jax.jit`` the value checks are skipped).
    ValueError
        For non-finite features or a batch of another shape.

    Examples
    --------
    >>> import jax.numpy as jnp, condreg.jax.train
    >>> float(condreg.jax.train.regularizer_loss(jnp.eye(2), None))
    0.0
    """
    total = jnp.zeros(())
    for F, lam, name in ((features_p, lam_p, "features_p"), (features_h, lam_h, "features_h")):
        if F is None or lam == 0:
            continue
        F = normalized(_rows(F, name)) if normalize else _rows(F, name)
        fn = condreg.r_well if name == "features_p" else condreg.r_ill
        total = total + lam * fn(F, gram=True)
    return total


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _precondition(features: jax.Array, inputs: jax.Array, ridge: float) -> jax.Array:
    return features


def _precondition_bwd(ridge, inputs, g):
    pre = _precondition_home.sample_preconditioner(_rows(inputs, "inputs"), ridge=ridge, xp=jnp)
    out = pre.apply(jnp.reshape(g, (-1, g.shape[-1])))
    return jnp.reshape(out, g.shape).astype(g.dtype), jnp.zeros_like(inputs)


_precondition.defvjp(lambda features, inputs, ridge: (features, inputs), _precondition_bwd)


def precondition(features: jax.Array, inputs: jax.Array, ridge: float = 1e-4) -> jax.Array:
    """The dummy layer: ``features`` unchanged; its VJP left-multiplies ``∇_θ`` by
    ``(K + ε I)⁻¹``, ``K = xᵀx`` of this batch, ``ε = ridge·λ_max(K)``.

    Parameters
    ----------
    features, inputs : jax.Array
        ``F = x @ θ`` and ``x`` (no gradient), ``(N, ·)`` or ``(B, T, ·)`` with the same rows.
    ridge : float
        ``>= 0`` (0: the pseudo-inverse).

    Raises
    ------
    ValueError
        For ``ridge < 0`` or ``features`` and ``inputs`` with different rows.

    Examples
    --------
    >>> import jax, jax.numpy as jnp, condreg
    >>> from condreg.jax.train import precondition
    >>> x = jnp.asarray([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> jax.grad(lambda t: condreg.r_well(precondition(x @ t, x), gram=True))(jnp.eye(2)).shape
    (2, 2)
    """
    ridge = _core.check_ridge(ridge, where="precondition: ") or 0.0
    f, x = _rows(features, "features"), _rows(inputs, "inputs")
    if f.shape[0] != x.shape[0] or features.shape[:-1] != inputs.shape[:-1]:
        raise ValueError(
            "precondition: features and inputs must have the same rows, got shapes "
            f"{tuple(features.shape)} and {tuple(inputs.shape)}"
        )
    return _precondition(features, inputs, ridge)


def _input_rows(x: jax.Array, name: str, theta: jax.Array, axis_name: Any) -> jax.Array:
    x = _rows(x, name)
    if x.shape[1] != theta.shape[0]:
        raise ValueError(
            f"{name} has {x.shape[1]} columns, θ has {theta.shape[0]} rows: the batch must be "
            f"the input of the immunized map F = {name} @ θ, got {name} {tuple(x.shape)} and θ "
            f"{tuple(theta.shape)}"
        )
    if axis_name is not None:
        x = jax.lax.all_gather(x, axis_name, axis=0, tiled=True)
    return x


def preconditioned_update(
    theta: jax.Array,
    x_p: jax.Array | None,
    x_h: jax.Array | None,
    lam_p: float = 1.0,
    lam_h: float = 1.0,
    *,
    ridge: float | None = None,
    axis_name: Any = None,
) -> jax.Array:
    """Algorithm 1's regularizer step ``λ_P K_P⁺∇_θR_well(H_P) + λ_H K_H⁺∇_θR_ill(H_H)`` for the
    input batches ``x_p``, ``x_h`` of θ (:func:`condreg.algorithm.preconditioned_gradient`).

    Parameters
    ----------
    theta : jax.Array
        The immunized map, ``D_in×D`` (features ``F = xθ``); the result has its shape and dtype.
    x_p, x_h : jax.Array or None
        ``(N, D_in)`` or ``(B, T, D_in)`` input batches (``None``: no term).
    lam_p, lam_h : float
        Their weights (0: no term).
    ridge : float, optional
        ``None``: pseudo-inverse ``K⁺``; ``ε > 0``: ``(K + ε·λ_max(K)·I)⁻¹``.
    axis_name : hashable, optional
        Inside ``shard_map`` / ``pmap``: all-gather the batches over this axis first.

    Raises
    ------
    ValueError
        If ``theta`` is not 2-D or a batch does not have ``D_in`` columns.

    Examples
    --------
    >>> import jax.numpy as jnp, condreg.jax.train
    >>> x = jnp.asarray([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> condreg.jax.train.preconditioned_update(jnp.eye(2), x, x, 1.0, 0.5).shape
    (2, 2)
    """
    if getattr(theta, "ndim", None) != 2:
        raise ValueError(
            f"theta must be a D_in×D matrix, got shape {getattr(theta, 'shape', None)}"
        )
    total = jnp.zeros_like(theta)
    for x, lam, name, quantity in ((x_p, lam_p, "x_p", "r_well"), (x_h, lam_h, "x_h", "r_ill")):
        if x is None or lam == 0:
            continue
        x = _input_rows(x, name, theta, axis_name)
        g = _alg.preconditioned_gradient(theta, x, quantity, ridge=ridge)
        total = total + lam * g.astype(theta.dtype)
    return total


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
    """One epoch of :func:`condreg.immunize` as a jitted pure function: iterated from ``(I, 0)``
    it reproduces ``immunize(...).theta`` (the data are prepared once, eagerly).

    Parameters
    ----------
    X_p, y_p, X_h, lam_p, lam_h
        The data (``N_P×D``, ``N_P``, ``N_H×D``) and weights of :func:`condreg.immunize`.
    method : str
        As in :func:`condreg.immunize`.
    task : str
        As in :func:`condreg.immunize`.
    lr : float
        As in :func:`condreg.immunize`.
    max_step : float
        As in :func:`condreg.immunize`.
    ridge : float or None
        As in :func:`condreg.immunize`.
    y_h : jax.Array or None
        As in :func:`condreg.immunize`.
    seed : int
        As in :func:`condreg.immunize`.
    imma_steps : int
        As in :func:`condreg.immunize`.
    imma_lr, rtol : float or None
        As in :func:`condreg.immunize`.

    Returns
    -------
    callable
        ``step(theta, omega) -> (theta, omega, record)``, ``record = [κ(H_P), κ(H_H), R_well,
        R_ill, loss]`` at the input point.

    Raises
    ------
    ValueError, TypeError
        For invalid data or options, as :func:`condreg.algorithm.prepare`.

    Examples
    --------
    >>> import jax.numpy as jnp, numpy as np
    >>> from condreg.jax.train import algorithm1_step
    >>> X_p, X_h = (jnp.asarray(np.random.default_rng(s).normal(size=(20, 3))) for s in (0, 1))
    >>> step = algorithm1_step(X_p, X_p @ jnp.ones(3), X_h, lam_p=1.0, lam_h=1e-3)
    >>> step(jnp.eye(3), jnp.zeros(3))[2].shape
    (5,)
    """
    problem, _ = _alg.prepare(
        X_p,
        y_p,
        X_h,
        method=method,
        task=task,
        lam_p=lam_p,
        lam_h=lam_h,
        lr=lr,
        max_step=max_step,
        ridge=ridge,
        y_h=y_h,
        seed=seed,
        imma_steps=imma_steps,
        imma_lr=imma_lr,
        rtol=rtol,
    )

    @jax.jit
    def step(theta, omega):
        state, record = _alg.step(problem, problem.state(theta, omega))
        return state.theta, problem.raw_omega(state), record[:5]

    return step
