"""JAX adapter: condreg's closed-form (sub)gradients through ``jax.custom_vjp`` (reverse mode,
under ``jit`` and ``vmap``; forward mode raises JAX's ``TypeError``). Details: docs/autodiff.md."""

from __future__ import annotations

from functools import partial

try:
    import jax
    import jax.numpy as jnp
except ImportError as exc:  # pragma: no cover - exercised only without jax
    raise ImportError("condreg.jax needs JAX: pip install jax (or condreg's jax extra)") from exc

from condreg import _core, _spectrum

__all__ = ["concrete", "value"]


def concrete(x: jax.Array) -> bool | None:
    """Read a 0-d boolean array, or ``None`` when it is abstract (a tracer: checks are skipped).

    Parameters
    ----------
    x : jax.Array
        A 0-d boolean array.

    Examples
    --------
    >>> import jax.numpy as jnp, condreg.jax
    >>> condreg.jax.concrete(jnp.asarray(True))
    True
    """
    try:
        return bool(x)
    except jax.errors.ConcretizationTypeError:
        return None


@partial(jax.custom_vjp, nondiff_argnums=(0, 2, 3, 4, 5))
def _spectral_value(quantity, S, rtol, tie_rtol, gram, check):
    kw = {"rtol": rtol, "tie_rtol": tie_rtol, "gram": gram, "check": check}
    return _spectrum.evaluate(quantity, S, jnp, vectors=False, **kw).value


def _fwd(quantity, S, rtol, tie_rtol, gram, check):
    """The value and what the backward assembles from: the engine's gradient factor ``K``, the
    rescaled input ``A`` (``gram``) and R_ill's pole where it was read."""
    kw = {"rtol": rtol, "tie_rtol": tie_rtol, "gram": gram, "check": check}
    ev = _spectrum.evaluate(quantity, S, jnp, vectors=True, **kw)
    return ev.value, (ev.K, ev.A, ev.n, jnp.asarray(bool(ev.pole)))


def _bwd(quantity, rtol, tie_rtol, gram, check, residuals, g):
    K, A, n, pole = residuals
    if quantity == "r_ill" and check:
        _core.check_pole(pole, concrete)
    return (_spectrum.assemble(_spectrum.Evaluation(None, K, A, None, n), jnp, g),)


_spectral_value.defvjp(_fwd, _bwd)


def value(
    quantity: str,
    S: jax.Array,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    check: bool,
) -> jax.Array:
    """Differentiable ``quantity`` (shape ``S.shape[:-2]``) of a validated JAX array ``S`` with the
    closed-form backward (what :func:`condreg.r_ill` etc. call for JAX arrays).

    Parameters
    ----------
    quantity : str
        ``"condition_number"``, ``"r_well"`` or ``"r_ill"``.
    S, rtol, tie_rtol, gram
        As in :func:`condreg.r_ill` (``S`` validated, ``(..., m, n)``).
    check : bool
        Run the value checks where values are concrete (``check_finite``).

    Raises
    ------
    RankError
        A zero matrix (when ``check`` and values are concrete).

    Examples
    --------
    >>> import jax.numpy as jnp, condreg.jax
    >>> kw = {"rtol": None, "tie_rtol": None, "gram": True, "check": True}
    >>> float(condreg.jax.value("r_well", jnp.eye(3), **kw))
    0.0
    """
    return _spectral_value(quantity, S, rtol, tie_rtol, gram, check)
