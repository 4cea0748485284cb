"""JAX adapter: condreg's closed-form (sub)gradients through ``jax.custom_vjp`` (reverse mode,
under ``jit`` and ``vmap``; forward mode raises JAX's ``TypeError``). Details: docs/autodiff.md."""

from __future__ import annotations

from functools import partial

try:
    import jax
    import jax.numpy as jnp
except ImportError as exc:  # pragma: no cover - exercised only without jax
    raise ImportError("condreg.jax needs JAX: pip install 'condreg-ml[jax]'") from exc

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


def _concrete_or_skip(check: bool) -> _core.Concrete:
    return concrete if check else _core.never


@partial(jax.custom_vjp, nondiff_argnums=(0, 2, 3, 4, 5))
def _spectral_value(quantity, S, rtol, tie_rtol, gram, check):
    return _core.value(
        quantity, S, jnp, rtol=rtol, tie_rtol=tie_rtol, gram=gram, concrete=_concrete_or_skip(check)
    )


def _fwd(quantity, S, rtol, tie_rtol, gram, check):
    tie = _core.check_tie_rtol(tie_rtol)
    sp = _spectrum.decompose(
        S, jnp, gram=gram, vectors=True, rtol=rtol, concrete=_concrete_or_skip(check), method="auto"
    )
    out = _core.value_from_spectrum(quantity, sp, jnp, tie_rtol=tie)
    one = jnp.ones_like(sp.s[..., :1])
    tols = jnp.concatenate([one * sp.mu_err, one * sp.tie], axis=-1)
    if gram:
        return out, (S, sp.s, sp.U if sp.U is not None else sp.Vh, None, tols)
    return out, (None, sp.s, sp.U, sp.Vh, tols)


def _bwd(quantity, rtol, tie_rtol, gram, check, residuals, g):
    S, s, A, B, tols = residuals
    mu_err, tie_default = tols[..., :1], tols[..., 1:]
    shape = tuple(S.shape[-2:]) if gram else (A.shape[-2], B.shape[-1])
    mask, k = _spectrum.rank(s, _spectrum.resolve_rtol(rtol, shape, s.dtype, jnp), jnp)
    if gram:
        U, Vh = (A, None) if _spectrum.left_side(S.shape) else (None, A)
        sp = _core.Spectrum(U, s, Vh, s * s, mask, k, shape[1], True, mu_err, S, tie_default)
    else:
        sp = _core.Spectrum(A, s, B, s, mask, k, min(shape), False, 0.0, None, tie_default)
    tie, read = _core.check_tie_rtol(tie_rtol), _concrete_or_skip(check)
    G = _core.gradient_from_spectrum(
        quantity, sp, jnp, tie_rtol=tie, subgradient="min_norm", concrete=read, weight=g
    )
    return (G,)


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
