"""Algorithm 1's regularizer as an ``optax`` gradient transformation
(the ``optax`` extra; docs/tutorials/jax.md, docs/scaling.md)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, NamedTuple

import optax

from condreg import _core

__all__ = ["ConditionRegularizerState", "condition_regularizer"]


class ConditionRegularizerState(NamedTuple):
    """Empty state (the transformation is stateless)."""


def _path(key: Any) -> tuple[Hashable, ...]:
    if key is None:
        return ()
    return key if isinstance(key, tuple) else (key,)


def _get(tree: Any, path: tuple[Hashable, ...]) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def _set(tree: Any, path: tuple[Hashable, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, head: _set(tree[head], rest, value)}
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
    """An ``optax`` transformation adding Algorithm 1's preconditioned regularizer gradient;
    ``update(updates, state, params, *, x_p=None, x_h=None)`` takes the input batches of θ.

    Parameters
    ----------
    lam_p, lam_h : float
        Weights (``>= 0``) of ``R_well`` (batch ``x_p``) and ``R_ill`` (batch ``x_h``).
    key : optional
        θ's key, index or tuple path in the parameter pytree (``None``: the parameters are θ).
    ridge, axis_name : float and hashable, optional
        As :func:`condreg.jax.train.preconditioned_update`.

    Returns
    -------
    optax.GradientTransformationExtraArgs
        Stateless (:class:`ConditionRegularizerState`); ``update`` is jit-able.

    Raises
    ------
    ValueError
        For a negative weight, ``ridge < 0``, or a missing ``params``/batch or wrong shape.
    TypeError
        For a ``ridge`` that is not a real number.

    Examples
    --------
    >>> import jax.numpy as jnp, optax, condreg.jax.optax
    >>> params, x = {"theta": jnp.eye(2)}, jnp.asarray([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> tx = optax.chain(condreg.jax.optax.condition_regularizer(key="theta"), optax.sgd(1e-2))
    >>> tx.update(params, tx.init(params), params, x_p=x, x_h=x)[0]["theta"].shape
    (2, 2)
    """
    from condreg.jax.train import preconditioned_update

    if lam_p < 0 or lam_h < 0:
        raise ValueError(f"lam_p and lam_h must be >= 0, got {lam_p}, {lam_h}")
    ridge = _core.check_ridge(ridge, where="condition_regularizer: ")
    path = _path(key)

    def update(updates, state, params=None, *, x_p=None, x_h=None, **extra):
        if params is None:
            raise ValueError("condition_regularizer needs params (θ is read from them)")
        x_p, x_h = _batch("x_p", lam_p, x_p, extra), _batch("x_h", lam_h, x_h, extra)
        theta = _get(params, path)
        reg = preconditioned_update(theta, x_p, x_h, lam_p, lam_h, ridge=ridge, axis_name=axis_name)
        g = _get(updates, path)
        return _set(updates, path, g + reg.astype(g.dtype)), state

    return optax.GradientTransformationExtraArgs(lambda params: ConditionRegularizerState(), update)
