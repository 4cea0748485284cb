"""Keep the weight matrices of a JAX model well-conditioned: a penalty over a parameter pytree,
the JAX counterpart of :mod:`condreg.torch.weights` (docs/immunization.md). Pure and jit-able."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

import condreg

__all__ = ["weight_condition_numbers", "weight_conditioning_loss", "weight_matrices"]

_PENALTIES = ("r_well", "condition_number", "log_condition_number")
Filter = Callable[[str, Any], bool]


def weight_matrices(
    params: Any,
    *,
    filter: Filter | None = None,
    matrix: Callable[[jax.Array], jax.Array] | None = None,
) -> list[tuple[str, jax.Array]]:
    """``[(path, matrix(W))]`` for the selected leaves of ``params``, in tree order.

    Parameters
    ----------
    params : pytree
        The model's parameters.
    filter : callable, optional
        ``filter(keystr_path, leaf) -> bool``; default ``leaf.ndim >= 2``.
    matrix : callable, optional
        ``matrix(W)`` → a 2-D array; default ``W.reshape(-1, W.shape[-1])``.

    Raises
    ------
    ValueError
        If ``matrix`` returns an array that is not 2-D.

    Examples
    --------
    >>> import jax.numpy as jnp, condreg.jax.weights
    >>> params = {"dense": {"kernel": jnp.ones((3, 3, 2, 4)), "bias": jnp.zeros(4)}}
    >>> [(p, W.shape) for p, W in condreg.jax.weights.weight_matrices(params)]
    [("['dense']['kernel']", (18, 4))]
    """
    keep = filter or (lambda path, leaf: getattr(leaf, "ndim", 0) >= 2)
    to_matrix = matrix or (lambda W: jnp.reshape(W, (-1, W.shape[-1])))
    out = []
    for keypath, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        path = jax.tree_util.keystr(keypath)
        if keep(path, leaf):
            M = to_matrix(jnp.asarray(leaf))
            if M.ndim != 2:
                raise ValueError(f"matrix() must return a 2-D array; got shape {M.shape} at {path}")
            out.append((path, M))
    return out


def normalized(W: jax.Array) -> jax.Array:
    """``W / ‖W‖_F``, the norm under ``stop_gradient``; a zero ``W`` stays zero (never 0/0)."""
    nrm = jax.lax.stop_gradient(jnp.linalg.norm(W))
    return W / jnp.where(nrm > 0, nrm, jnp.ones_like(nrm))


def _penalty(W: jax.Array, penalty: str, normalize: bool) -> jax.Array:
    if penalty == "r_well":
        return condreg.r_well(normalized(W) if normalize else W)
    if penalty == "condition_number":
        return condreg.condition_number(W)
    return jnp.log(condreg.condition_number(W))


def weight_conditioning_loss(
    params: Any,
    penalty: Literal["r_well", "condition_number", "log_condition_number"] = "r_well",
    *,
    filter: Filter | None = None,
    matrix: Callable[[jax.Array], jax.Array] | None = None,
    normalize: bool = True,
    reduction: Literal["sum", "mean"] = "sum",
) -> jax.Array:
    """Sum (or mean) of ``penalty`` over :func:`weight_matrices` of ``params``: a 0-d array,
    differentiable with ``jax.grad``.

    Parameters
    ----------
    params, filter, matrix
        As in :func:`weight_matrices`.
    penalty : {"r_well", "condition_number", "log_condition_number"}
        ``R_well(W)``, ``κ(W)`` or ``log κ(W)`` per matrix.
    normalize : bool
        ``"r_well"`` of ``W/‖W‖_F`` (the norm under ``stop_gradient``): scale-free.
    reduction : {"sum", "mean"}
        Over the selected matrices.

    Raises
    ------
    ValueError
        When no leaf is selected or for an unknown ``penalty``/``reduction``.
    condreg.RankError
        For a zero weight (eagerly).

    Examples
    --------
    >>> import jax, jax.numpy as jnp, condreg.jax.weights
    >>> params = {"w1": jnp.asarray([[2.0, 0.0], [0.0, 1.0]]), "b": jnp.zeros(2)}
    >>> jax.grad(condreg.jax.weights.weight_conditioning_loss)(params)["b"]
    Array([0., 0.], dtype=float32)
    """
    if penalty not in _PENALTIES:
        raise ValueError(f"penalty must be one of {_PENALTIES}, got {penalty!r}")
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    selected = weight_matrices(params, filter=filter, matrix=matrix)
    terms = [_penalty(W, penalty, normalize) for _, W in selected]
    if not terms:
        raise ValueError(
            "weight_conditioning_loss: no leaf selected (no leaf with ndim >= 2, or the filter "
            "matches nothing)"
        )
    total = jnp.sum(jnp.stack(terms))
    return total / len(terms) if reduction == "mean" else total


def weight_condition_numbers(
    params: Any,
    *,
    filter: Filter | None = None,
    matrix: Callable[[jax.Array], jax.Array] | None = None,
) -> dict[str, float]:
    """``{path: κ(W)}`` of the selected leaves, as Python floats (for logging, not under jit).

    Parameters
    ----------
    params, filter, matrix
        As in :func:`weight_matrices`.

    Raises
    ------
    condreg.RankError
        For a zero weight.

    Examples
    --------
    >>> import jax.numpy as jnp, condreg.jax.weights
    >>> condreg.jax.weights.weight_condition_numbers({"w": jnp.diag(jnp.asarray([2.0, 1.0]))})
    {"['w']": 2.0}
    """
    return {
        path: float(condreg.condition_number(W))
        for path, W in weight_matrices(params, filter=filter, matrix=matrix)
    }
