"""PyTorch adapter: condreg's closed-form rules as the derivative of one autograd Function.

``condreg.condition_number``, ``condreg.r_well`` and ``condreg.r_ill`` dispatch here for
``torch.Tensor`` input, so they differentiate natively — ``.backward()``,
``torch.autograd.grad``, ``torch.func.grad``/``vjp``/``jacrev``/``vmap``, forward mode
(``torch.func.jvp``/``jacfwd``/``hessian``, ``torch.autograd.forward_ad``; not inside
``torch.compile``, whose tracer does not support a custom ``jvp``) and ``torch.compile``
(``fullgraph=True`` included, with backward; eager, aot_eager and inductor backends) — on every
device, for a single matrix or a batch ``(..., m, n)``, in float32/float64 and (computed in
float32, :mod:`condreg._api`) float16/bfloat16, also under ``torch.autocast``.

One route
---------
The forward is the engine's three steps with ``xp = torch`` — validated input →
:func:`condreg._spectrum.decompose` → :func:`condreg._core.value_from_spectrum` — and, when a
gradient may be asked for (grad mode on and ``S.requires_grad``), keeps the spectrum (the
singular values, the vectors the closed form needs, the error bound and tie tolerance). The
backward is :func:`condreg._core.gradient_from_spectrum`, the one gradient assembly the JAX
adapter and the ``*_grad`` functions use: ``grad_value · U diag(d) Vᵀ`` (with ``gram=True`` one
GEMM with ``F``), the minimum-norm subgradient at tied extremes, never differentiating through
singular vectors. Without a gradient the forward computes values only. Autocast is off inside
both (the engine computes in the dtype it was given). On the CPU, with checks on and not
compiling, a single matrix with ``min(N, D) >= EXTREME_MIN`` takes the engine's ``"extreme"``
route (:func:`condreg._spectrum.plan`).

The forward-mode rule (``jvp``) returns ``Σ G * Ṡ`` over the last two axes — the same linear map,
so forward and reverse mode agree, also at ties. It lives on a twin Function because dynamo
cannot trace a Function that defines ``jvp``: under ``torch.compile`` the one without it runs.

Second order
------------
When the backward itself is differentiated (``create_graph=True``, ``torch.func.hessian``,
``torch.func.grad`` of ``torch.func.grad``, ``gradgradcheck``; every ``torch.func`` transform
runs the backward with grad mode on) and in forward mode, the closed form ``G(S)`` is recomputed
with differentiable torch operations from ``S`` (thin SVD), so PyTorch's own SVD derivative
differentiates it: exact at generic points (distinct nonzero singular values, fixed rank). At
ties the second derivative does not exist and what double backward returns there is meaningless
(huge, basis-dependent, ``inf`` or ``NaN``); the first derivative stays the minimum-norm
subgradient.

Checks and host synchronisation
-------------------------------
Forward and backward read no tensor value except for the documented checks (finite input, not
the zero matrix, in the backward of ``r_ill`` not at its pole) and the engine's one accept
decision (Gram or exact). ``check_finite=False`` turns all of them off (the engine then takes
its exact path, without reading values); invalid input gives ``NaN``/``inf``. Under
``torch.compile`` and inside ``torch.func.vmap`` values cannot be read: the checks are skipped
without a graph break and the exact path is taken. ``torch.func.vmap`` uses a custom rule that
calls the batched engine directly, so the checks do run there on the whole batch. Eagerly:
``ValueError`` for NaN/Inf input, :class:`condreg.RankError` for a zero matrix,
:class:`condreg.PoleError` from the backward of ``r_ill`` at its pole.

Training adapters (a regularizer loss module, the preconditioning "dummy layer") live in
:mod:`condreg.torch.nn`.
"""

from __future__ import annotations

import contextlib

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "condreg.torch needs PyTorch: pip install 'condreg-ml[torch]' (or your own torch build)"
    ) from exc

from array_api_compat import array_namespace

from condreg import _core, _spectrum, _validation

__all__ = ["concrete", "value"]


def concrete(x: torch.Tensor) -> bool | None:
    """Read a 0-d boolean tensor (one host synchronisation on a GPU), or return ``None`` when its
    value cannot be read: under ``torch.compile`` (dynamo, fake or meta tensors) and inside
    ``torch.func.vmap`` (batched tensors). The value reader the public functions pass to the
    engine for tensors.

    Parameters
    ----------
    x : torch.Tensor
        A 0-d boolean tensor.

    Returns
    -------
    bool or None

    Examples
    --------
    >>> import torch, condreg.torch
    >>> condreg.torch.concrete(torch.tensor(True))
    True
    """
    if _spectrum.traced(x):
        return None
    try:
        return bool(x)
    except RuntimeError:  # functorch vmap: data-dependent control flow is not allowed
        return None


def _reader(check: bool) -> _core.Concrete:
    # Look ``concrete`` up at call time (not bound at import), so tests can watch it.
    return concrete if check else _core.never


def _no_autocast(S: torch.Tensor):
    """Autocast off: the engine computes in the dtype it was given (a Gram matrix formed in
    bfloat16 would swamp the spectrum, and the backward's GEMM must match ``F``'s dtype)."""
    if torch.is_autocast_enabled(S.device.type):
        return torch.autocast(S.device.type, enabled=False)
    return contextlib.nullcontext()


def _closed_form(S: torch.Tensor, config: tuple) -> torch.Tensor:
    """The closed-form (sub)gradient ``G(S)`` recomputed with differentiable torch operations on
    ``S`` (thin SVD): used for higher order (``create_graph``) and forward mode."""
    quantity, rtol, tie_rtol, gram, check = config
    return _core.gradient(
        quantity,
        S,
        array_namespace(S),
        rtol=rtol,
        tie_rtol=tie_rtol,
        gram=gram,
        subgradient="min_norm",
        concrete=_reader(check),
        method="svd",
    )


def _extreme_ok(S: torch.Tensor, check: bool) -> bool:
    """The engine may take its ``"extreme"`` route (it reads values): on the CPU, checks on, not
    traced (its size rule is the engine's, :func:`condreg._spectrum.plan`)."""
    return check and S.device.type == "cpu" and not _spectrum.traced(S)


def _forward(S, quantity, rtol, tie_rtol, gram, check, vectors):
    """``(value, A, B, s, tols)``: the value and, with ``vectors``, the spectrum the backward
    needs: ``A``, ``B`` = ``U``, ``Vh`` (``gram=False``), the small side's vectors and an empty
    ``B`` (``gram``), or an empty ``A`` and the unit Gram matrix ``B`` (``"extreme"`` route);
    ``s``; ``tols`` = ``[mu_err, tie]`` of shape ``(..., 2)``. Fresh empty tensors without
    ``vectors`` (every output a distinct tensor: what ``torch.compile`` needs)."""
    xp = array_namespace(S)
    tie = _core.check_tie_rtol(tie_rtol)
    with _no_autocast(S):
        sp = _spectrum.decompose(
            S,
            xp,
            gram=gram,
            vectors=vectors,
            rtol=rtol,
            concrete=_reader(check),
            extreme=vectors and gram and _extreme_ok(S, check),
        )
        value = _core.value_from_spectrum(quantity, sp, xp, tie_rtol=tie)
    if not vectors:
        return value, S.new_empty(0), S.new_empty(0), S.new_empty(0), S.new_empty(0)
    one = torch.ones_like(sp.s[..., :1])
    tols = torch.cat([one * sp.mu_err, one * sp.tie], dim=-1)
    if sp.M is not None:
        return value, S.new_empty(0), sp.M, sp.s, tols
    if gram:
        Q = sp.U if sp.U is not None else sp.Vh.mT
        return value, Q, S.new_empty(0), sp.s, tols
    return value, sp.U, sp.Vh, sp.s, tols


def _spectrum_of(S, A, B, s, tols, config) -> _spectrum.Spectrum:
    """The :class:`condreg._spectrum.Spectrum` the forward kept (:func:`_forward`)."""
    quantity, rtol, tie_rtol, gram, check = config
    xp = array_namespace(S)
    tol = _spectrum.resolve_rtol(rtol, S.shape, S.dtype, xp)
    mask, k = _spectrum.rank(s, tol, xp)
    mu_err, tie = tols[..., :1], tols[..., 1:]
    m, n = S.shape[-2], S.shape[-1]
    if not gram:
        return _spectrum.Spectrum(A, s, B, s, mask, k, min(m, n), False, 0.0, None, tie)
    U, Vh, M = None, None, None
    if A.numel() == 0:
        M = B
    elif _spectrum.left_side(S.shape):
        U = A
    else:
        Vh = A.mT
    return _spectrum.Spectrum(U, s, Vh, s * s, mask, k, n, True, mu_err, S, tie, M)


def _backward(ctx, grad_value: torch.Tensor) -> torch.Tensor:
    """The gradient with respect to ``S`` from the kept spectrum (the engine's one assembly),
    or, for higher order (grad mode on in the backward) and without a kept spectrum, the
    differentiable recomputation."""
    S, A, B, s, tols = ctx.saved_tensors
    quantity, rtol, tie_rtol, gram, check = ctx.config
    if torch.is_grad_enabled() or not ctx.vectors:
        return grad_value[..., None, None] * _closed_form(S, ctx.config)
    with _no_autocast(S):
        sp = _spectrum_of(S, A, B, s, tols, ctx.config)
        return _core.gradient_from_spectrum(
            quantity,
            sp,
            array_namespace(S),
            tie_rtol=_core.check_tie_rtol(tie_rtol),
            subgradient="min_norm",
            concrete=_reader(check),
            weight=grad_value.to(S.dtype),
        )


class _SpectralValue(torch.autograd.Function):
    """value = quantity(S); backward: ``grad_value * G(S)`` from the spectrum the forward kept."""

    @staticmethod
    def forward(S, quantity, rtol, tie_rtol, gram, check, vectors):  # type: ignore[override]
        return _forward(S, quantity, rtol, tie_rtol, gram, check, vectors)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        S, quantity, rtol, tie_rtol, gram, check, vectors = inputs
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(S, *output[1:])
        ctx.config = (quantity, rtol, tie_rtol, gram, check)
        ctx.vectors = vectors

    @staticmethod
    def backward(ctx, grad_value, *_):  # type: ignore[override]
        return _backward(ctx, grad_value), None, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, S, quantity, rtol, tie_rtol, gram, check, vectors):  # type: ignore[override]
        # The engine is batched over leading axes: move the vmapped axis to the front.
        bdim = in_dims[0]
        if bdim is not None:
            S = S.movedim(bdim, 0)
        # The top-level finite check saw a batched tensor and could not read it; the batch is
        # concrete here, so the documented ValueError comes before any decomposition.
        if check and _reader(check)(torch.all(torch.isfinite(S))) is False:
            raise _validation.nonfinite_error(quantity)
        outs = _function().apply(S, quantity, rtol, tie_rtol, gram, check, vectors)
        dims = tuple(None if (bdim is None or o.numel() == 0) else 0 for o in outs)
        return outs, dims


class _SpectralValueWithJvp(_SpectralValue):
    """:class:`_SpectralValue` plus forward mode: jvp ``Σ G(S) * Ṡ`` (not under
    ``torch.compile``, whose tracer cannot trace a Function that defines ``jvp``)."""

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        _SpectralValue.setup_context(ctx, inputs, output)
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def jvp(ctx, S_dot, *_):  # type: ignore[override]
        S = ctx.saved_tensors[0]
        G = _closed_form(S, ctx.config)
        return (G * S_dot).sum(dim=(-2, -1)), None, None, None, None


def _function() -> type[torch.autograd.Function]:
    return _SpectralValue if torch.compiler.is_compiling() else _SpectralValueWithJvp


def value(
    quantity: str,
    S: torch.Tensor,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    check: bool,
) -> torch.Tensor:
    """Differentiable value of ``quantity`` for a validated tensor ``S`` (the public functions
    :func:`condreg.r_ill` etc. call this for tensors, after validation and the compute-dtype
    cast). The spectrum is kept for the backward when a gradient may be asked for (grad mode on
    and ``S.requires_grad``).

    Parameters
    ----------
    quantity : {"condition_number", "r_well", "r_ill"}
        The quantity.
    S : torch.Tensor, shape (..., m, n)
        A float32/float64 matrix or batch (``(B, N, D)``: B matrices, value shape ``(B,)``).
    rtol, tie_rtol : float or None
        Rank and tie tolerances (``None``: the defaults of :mod:`condreg._api`).
    gram : bool
        The quantity of ``H = SᵀS`` (a feature batch ``S``).
    check : bool
        Run the value checks (``check_finite`` of the public functions).

    Returns
    -------
    torch.Tensor, shape S.shape[:-2]
        The value, differentiable (backward, ``torch.func``, forward mode, ``torch.compile``).

    Raises
    ------
    RankError
        A zero matrix (when ``check`` and values can be read).

    Examples
    --------
    >>> import torch, condreg.torch
    >>> F = torch.eye(3, dtype=torch.float64, requires_grad=True)
    >>> condreg.torch.value("r_well", F, rtol=None, tie_rtol=None, gram=True, check=True)
    tensor(0., dtype=torch.float64, grad_fn=<_SpectralValueWithJvpBackward>)
    """
    vectors = torch.is_grad_enabled() and S.requires_grad
    return _function().apply(S, quantity, rtol, tie_rtol, gram, check, vectors)[0]
