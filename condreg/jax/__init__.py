"""JAX adapter: condreg's closed-form rules through ``jax.custom_vjp``.

``condreg.condition_number``, ``condreg.r_well`` and ``condreg.r_ill`` dispatch here for JAX
arrays: ``jax.grad``/``jax.vjp``/``jax.jacrev`` use the closed-form (sub)gradient
``G = U diag(d) Vᵀ`` of :mod:`condreg._core` (minimum-norm at tied extremes, the
``subgradient="min_norm"`` policy of the ``*_grad`` functions), never autodiff through singular
vectors. They work under ``jax.jit`` and ``jax.vmap``, on a single matrix or a batch
``(..., m, n)``, in float32 and float64 (enable x64 yourself; condreg never changes JAX's
configuration). The forward pass decomposes once — the engine's cheapest exact path
(:mod:`condreg._spectrum`: with ``gram=True`` the eigh of the smaller Gram matrix where it resolves
the spectrum, a ``lax.cond`` under ``jax.jit``) — and keeps what the backward pass needs; the value
alone (no differentiation) needs only the singular values.

Forward mode is not supported
-----------------------------
Forward-mode differentiation of the value functions themselves — ``jax.jvp``, ``jax.jacfwd``,
or applying the linear function returned by ``jax.linearize`` — raises JAX's
``TypeError: can't apply forward-mode autodiff (jvp) to a custom_vjp function``. Use reverse mode
(``jax.grad``, ``jax.vjp``, ``jax.jacrev``). Forward-over-reverse does work, because only the
backward rule (built from differentiable ``jax.numpy`` operations) is differentiated in forward
mode: ``jax.hessian`` (``jacfwd(jacrev(f))``) and ``jax.jvp`` of ``jax.grad(f)`` (Hessian-vector
products) are supported, like ``jax.jacrev(jax.jacrev(f))`` and ``jax.grad`` of a ``jax.grad``.

Second order
------------
Second derivatives (``jax.grad(jax.grad(...))``, ``jacrev(jacrev(...))``, ``jax.hessian``)
differentiate the closed form ``G(S)`` through JAX's own SVD derivative (the residuals of the
forward pass are differentiable functions of ``S``). That is exact wherever the quantity is twice
differentiable: at generic points (distinct nonzero singular values, fixed rank). At ties the
second derivative does not exist and condreg does not detect this: where singular values
coincide — a tied extreme, any repeated value inside the spectrum, repeated zeros of a
rank-deficient matrix — the derivative of the singular vectors has ``1 / (sigma_i² − sigma_j²)``
factors and the result is meaningless (huge, basis-dependent, ``inf`` or ``NaN``). The first
derivative stays the basis-independent minimum-norm subgradient.

Checks
------
The value checks (finite input, not the zero matrix, and in the backward of ``r_ill`` not at its
pole) run whenever values are concrete — eagerly, including eager ``jax.grad`` — and raise
``ValueError``, :class:`condreg.RankError` and :class:`condreg.PoleError` (the value at the pole is
``+inf``; its gradient raises, it is never silently NaN). Under ``jax.jit`` and ``jax.vmap``
values are abstract and the checks are skipped without breaking the trace; there, as with
``check_finite=False``, invalid input gives ``NaN``/``inf`` instead of an error.
"""

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
    """Read a 0-d boolean array, or ``None`` when it is abstract.

    Abstract under ``jax.jit``, ``jax.vmap`` and other tracing: the engine's checks are then
    skipped.

    Parameters
    ----------
    x : jax.Array
        A 0-d boolean array.

    Returns
    -------
    bool or None
        Its value, or ``None`` for a tracer.

    Examples
    --------
    >>> import jax.numpy as jnp
    >>> from condreg.jax import concrete
    >>> concrete(jnp.asarray(True))
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
        Q = sp.U if sp.U is not None else sp.Vh
        return out, (S, sp.s, Q, None, tols)
    return out, (None, sp.s, sp.U, sp.Vh, tols)


def _bwd(quantity, rtol, tie_rtol, gram, check, residuals, g):
    S, s, A, B, tols = residuals
    mu_err, tie_default = tols[..., :1], tols[..., 1:]
    if gram:
        m, n = S.shape[-2], S.shape[-1]
        U, Vh = (A, None) if _spectrum.left_side(S.shape) else (None, A)
        shape = (m, n)
    else:
        U, Vh = A, B
        shape = (U.shape[-2], Vh.shape[-1])
    tol = _spectrum.resolve_rtol(rtol, shape, s.dtype, jnp)
    mask, k = _spectrum.rank(s, tol, jnp)
    if gram:
        sp = _core.Spectrum(U, s, Vh, s * s, mask, k, shape[1], True, mu_err, S, tie_default)
    else:
        sp = _core.Spectrum(U, s, Vh, s, mask, k, min(shape), False, 0.0, None, tie_default)
    tie = _core.check_tie_rtol(tie_rtol)
    G = _core.gradient_from_spectrum(
        quantity,
        sp,
        jnp,
        tie_rtol=tie,
        subgradient="min_norm",
        concrete=_concrete_or_skip(check),
        weight=g,
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
    """Differentiable value of ``quantity`` for a validated JAX array ``S`` (the public functions
    :func:`condreg.r_ill` etc. call this for JAX arrays): ``jax.custom_vjp`` around the engine's
    decompose → value, the engine's gradient assembly as the backward.

    Parameters
    ----------
    quantity : {"condition_number", "r_well", "r_ill"}
        The quantity.
    S : jax.Array, shape (..., m, n)
        A matrix or batch (``(B, N, D)``: B matrices, value shape ``(B,)``).
    rtol, tie_rtol : float or None
        Rank and tie tolerances (``None``: the defaults of :mod:`condreg._api`).
    gram : bool
        The quantity of ``H = SᵀS`` (a feature batch ``S``).
    check : bool
        Run the value checks where values are concrete.

    Returns
    -------
    jax.Array, shape S.shape[:-2]

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
