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
    """The value and what the backward assembles from: the kept vectors, ``s / s_1``, ``h``,
    ``a``, ``s_1`` and R_ill's denominator (:func:`condreg._core.dmu_parts`, computed once)."""
    tie = _core.check_tie_rtol(tie_rtol)
    sp = _spectrum.decompose(
        S, jnp, gram=gram, vectors=True, rtol=rtol, concrete=_concrete_or_skip(check), method="auto"
    )
    p = _core.parts(quantity, sp, jnp, tie_rtol=tie)
    out = _core.value_of(quantity, p, jnp)
    # the pole is reported by the backward (the value there is +inf, not an error)
    a, h = _core.dmu_parts(quantity, p.unit, tie, "min_norm", jnp, _core.never, shared=p)
    den = jnp.zeros_like(p.s1[..., 0]) if p.den is None else p.den
    a = jnp.broadcast_to(jnp.asarray(a, dtype=p.s1.dtype), p.s1.shape)
    if gram:
        vectors = (S, sp.U if sp.U is not None else sp.Vh, None)
    else:
        vectors = (None, sp.U, sp.Vh)
    return out, (*vectors, p.unit.s, h, a, p.s1, den)


def _bwd(quantity, rtol, tie_rtol, gram, check, residuals, g):
    S, A, B, s, h, a, s1, den = residuals
    if quantity == "r_ill":
        _core.check_pole(jnp.any(den == 0), _concrete_or_skip(check))
    if gram:
        U, Vh = (A, None) if _spectrum.left_side(S.shape) else (None, A)
        unit = _core.Spectrum(U, s, Vh, s * s, None, None, S.shape[-1], True, 0.0, S)
    else:
        unit = _core.Spectrum(A, s, B, s, None, None, min(A.shape[-2], B.shape[-1]), False)
    return (_core.gradient_from_parts(quantity, _core.Parts(unit, s1), a, h, jnp, g),)


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
