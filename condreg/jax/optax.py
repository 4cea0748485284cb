"""Algorithm 1's regularizer as an ``optax`` gradient transformation.

Needs ``pip install 'condreg-ml[optax]'``.

:func:`condition_regularizer` returns an ``optax.GradientTransformationExtraArgs``: it adds
Algorithm 1's ``K⁻¹``-left-preconditioned regularizer gradient

    λ_P K_P⁺ ∇_θ R_well(θᵀK_Pθ) + λ_H K_H⁺ ∇_θ R_ill(θᵀK_Hθ),    K = xᵀx  of the batch,

(:func:`condreg.jax.train.preconditioned_update`, the closed form ``2θG`` of Theorem 4.2 projected
onto the row space of the batch) to the incoming updates (the gradients of the supervised loss,
un-preconditioned, as in Algorithm 1). It composes in ``optax.chain``: the batches travel as the
extra keyword arguments ``x_p`` and ``x_h`` of ``update``, which ``optax.chain`` passes to every
``GradientTransformationExtraArgs`` it holds (plain transformations such as ``optax.sgd`` do not
receive them)::

    import optax
    from condreg.jax.optax import condition_regularizer

    tx = optax.chain(condition_regularizer(1.0, 1e-3, key="theta"), optax.sgd(5e-3))
    state = tx.init(params)
    updates, state = tx.update(grads, state, params, x_p=x_p, x_h=x_h)
    params = optax.apply_updates(params, updates)

Put it *before* the optimizer: ``optax.sgd`` then takes exactly Algorithm 1's step
``θ ← θ − η(∇_θL + λ_P K_P⁺∇R_well + λ_H K_H⁺∇R_ill)``. Adaptive optimizers (``optax.adam``)
rescale the sum per entry, which changes the preconditioned direction; κ still moves the intended
way in our tests, but the theory (Theorem 4.3) is for SGD.

Every batch a nonzero weight needs must be given (``x_p`` for ``lam_p > 0``, ``x_h`` for
``lam_h > 0``) with ``D_in`` columns: a missing, misspelled (``X_p=``) or misshapen batch raises a
``ValueError`` instead of leaving the update unregularized.

Data parallelism: under ``jax.jit`` with the batches sharded over devices (``NamedSharding``) the
update is that of the whole batch as it is (XLA inserts the collectives). Inside ``shard_map`` or
``pmap``, where each device sees its own rows, pass ``axis_name``: the batches are all-gathered
over that axis (``N_total·D_in`` numbers per batch and step) and every device computes the update
of the global batch (the same on every device; docs/scaling.md).

Pure; ``update`` is jit-able. Enable float64 yourself (``jax_enable_x64``) for ill-conditioned
data; condreg never changes JAX's configuration.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, NamedTuple

import optax

__all__ = ["ConditionRegularizerState", "condition_regularizer"]


class ConditionRegularizerState(NamedTuple):
    """Empty state (the transformation is stateless)."""


def _path(key: Any) -> tuple[Hashable, ...]:
    if key is None:
        return ()
    if isinstance(key, tuple):
        return key
    return (key,)


def _get(tree: Any, path: tuple[Hashable, ...]) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def _set(tree: Any, path: tuple[Hashable, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        new = dict(tree)
        new[head] = _set(tree[head], rest, value)
        return new
    if isinstance(tree, (list, tuple)):
        items = list(tree)
        items[head] = _set(tree[head], rest, value)
        if isinstance(tree, list):
            return items
        return type(tree)(*items) if hasattr(tree, "_fields") else tuple(items)
    raise TypeError(f"cannot index {type(tree).__name__} with key {head!r}")


def _batch(name: str, lam: float, x: Any, extra: dict[str, Any]) -> Any:
    """The batch ``x`` of a term of weight ``lam`` (``None`` when the term is off)."""
    if lam == 0:
        return None
    if x is None:
        got = sorted(extra)
        hint = [k for k in got if k.lower() == name or k.lower().startswith(name[0])]
        raise ValueError(
            f"condition_regularizer: lam_{name[-1]}={lam} needs the batch {name}= in "
            f"update(updates, state, params, x_p=..., x_h=...); extra arguments received: "
            f"{got}" + (f" (did you mean {name} for {hint}?)" if hint else "")
        )
    return x


def condition_regularizer(
    lam_p: float = 1.0,
    lam_h: float = 1.0,
    *,
    key: Any = None,
    ridge: float | None = None,
    axis_name: Hashable | None = None,
) -> optax.GradientTransformationExtraArgs:
    """An ``optax`` transformation adding Algorithm 1's preconditioned regularizer gradient.

    ``update(updates, state, params, *, x_p=None, x_h=None, **extra)``: ``x_p`` (``N_P×D_in``)
    and ``x_h`` (``N_H×D_in``) are the batches entering θ (token batches ``(B, T, D_in)``: tokens
    as rows). The batch of each term with a nonzero weight is required; a term of weight 0 needs
    none. ``params`` is required (θ is read from it). Other extra arguments are ignored, as
    ``optax.chain`` requires (they are named in the error for a missing batch).

    Parameters
    ----------
    lam_p, lam_h : float
        Weights of ``R_well`` on the pre-training batch and ``R_ill`` on the harmful batch
        (``>= 0``; 0 leaves a term out).
    key : optional
        Where the immunized map ``θ`` (``D_in×D``, features ``F = xθ``) sits in the parameter
        pytree: ``None`` when the parameters *are* θ, a dict key / sequence index, or a tuple of
        them for a nested path (``("encoder", "theta")``). The other leaves pass through unchanged.
    ridge : float, optional
        ``None``: pseudo-inverse ``K⁺``; ``ε > 0``: ``(K + ε·λ_max(K)·I)⁻¹`` instead.
    axis_name : hashable, optional
        Inside ``shard_map`` / ``pmap``: the mapped axis the batches are split over; they are
        all-gathered over it, so the update is that of the global batch. ``None`` (default):
        the batches are whole (also when ``jax.jit`` shards them over devices).

    Returns
    -------
    optax.GradientTransformationExtraArgs
        Stateless (:class:`ConditionRegularizerState`); ``update`` is jit-able.

    Raises
    ------
    ValueError
        For negative weights or a ridge that is not ``> 0`` (``None`` is the pseudo-inverse);
        from ``update``: without ``params``, without the batch of a term of nonzero weight, or
        for a batch or θ of the wrong shape.

    Examples
    --------
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from condreg.jax.optax import condition_regularizer
    >>> params = {"theta": jnp.eye(3), "head": jnp.zeros(3)}
    >>> tx = optax.chain(condition_regularizer(1.0, 1.0, key="theta"), optax.sgd(1e-2))
    >>> grads = {"theta": jnp.zeros((3, 3)), "head": jnp.zeros(3)}
    >>> x = jnp.asarray([[1.0, 0, 0], [0, 2, 0], [0, 0, 3], [1, 1, 1]])
    >>> updates, state = tx.update(grads, tx.init(params), params, x_p=x, x_h=x)
    >>> tx.update(grads, state, params, X_p=x, X_h=x)
    Traceback (most recent call last):
    ...
    ValueError: condition_regularizer: lam_p=1.0 needs the batch x_p= ...
    """
    from condreg.jax.train import preconditioned_update

    if lam_p < 0 or lam_h < 0:
        raise ValueError(f"lam_p and lam_h must be >= 0, got {lam_p}, {lam_h}")
    if ridge is not None and not ridge > 0:
        raise ValueError(f"ridge must be > 0 (None: the pseudo-inverse), got {ridge}")
    path = _path(key)

    def init(params: Any) -> ConditionRegularizerState:
        del params
        return ConditionRegularizerState()

    def update(updates, state, params=None, *, x_p=None, x_h=None, **extra):
        if params is None:
            raise ValueError("condition_regularizer needs params (θ is read from them)")
        x_p, x_h = _batch("x_p", lam_p, x_p, extra), _batch("x_h", lam_h, x_h, extra)
        theta = _get(params, path)
        reg = preconditioned_update(theta, x_p, x_h, lam_p, lam_h, ridge=ridge, axis_name=axis_name)
        g = _get(updates, path)
        return _set(updates, path, g + reg.astype(g.dtype)), state

    return optax.GradientTransformationExtraArgs(init, update)
