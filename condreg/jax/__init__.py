"""JAX adapter: condreg's closed-form rules through ``jax.custom_vjp``.

``condreg.condition_number``, ``condreg.r_well`` and ``condreg.r_ill`` dispatch here for JAX
arrays: ``jax.grad`` uses the closed-form (sub)gradient (minimum-norm at tied extremes) and works
under ``jax.jit`` and ``jax.vmap``, in float32 and float64 (enable x64 yourself; condreg never
changes JAX's configuration). Reverse-over-reverse (``jax.grad(jax.grad(...))``, Hessians via
``jax.jacrev``) differentiates the closed form, exact at generic points (distinct singular values).

Forward mode (``jax.jvp``, ``jax.jacfwd``, ``jax.hessian``) is **not supported**: JAX does not
allow forward-mode differentiation of a ``custom_vjp`` function and raises a ``TypeError``; use
``jax.jacrev`` (and ``jacrev(jacrev(...))`` for Hessians).

Value checks (finite input, rank 0, R_ill's pole) run when values are concrete and are skipped
under tracing (``jax.jit``) without breaking it.
"""

from __future__ import annotations

from functools import partial

try:
    import jax
    import jax.numpy as jnp
except ImportError as exc:  # pragma: no cover - exercised only without jax
    raise ImportError("condreg.jax needs JAX: pip install 'condreg[jax]'") from exc

from condreg import _core

__all__ = ["concrete", "value"]


def concrete(x: jax.Array) -> bool | None:
    """Read a 0-d boolean array, or ``None`` under tracing."""
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
    tie = _core.resolve_tie_rtol(tie_rtol, S.shape, S.dtype, jnp)
    sp = _core.decompose(
        S, jnp, gram=gram, vectors=True, rtol=rtol, concrete=_concrete_or_skip(check)
    )
    out = _core.value_from_spectrum(quantity, sp, jnp, tie_rtol=tie)
    return out, (sp.U, sp.s, sp.Vh, sp.mask, sp.k)


def _bwd(quantity, rtol, tie_rtol, gram, check, residuals, g):
    U, s, Vh, mask, k = residuals
    shape = (U.shape[-2], Vh.shape[-1])
    sp = _core.Spectrum(
        U, s, Vh, s * s if gram else s, mask, k, shape[1] if gram else min(shape), gram
    )
    tie = _core.resolve_tie_rtol(tie_rtol, shape, s.dtype, jnp)
    G = _core.gradient_from_spectrum(
        quantity, sp, jnp, tie_rtol=tie, subgradient="min_norm", concrete=_concrete_or_skip(check)
    )
    return (g[..., None, None] * G,)


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
    """Differentiable value of ``quantity`` (validated ``S``; used by the top-level functions)."""
    return _spectral_value(quantity, S, rtol, tie_rtol, gram, check)
