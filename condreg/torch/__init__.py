"""PyTorch adapter: condreg's closed-form rules as the derivative of one autograd Function.

``condreg.condition_number``, ``condreg.r_well`` and ``condreg.r_ill`` dispatch here for
``torch.Tensor`` input, so they differentiate natively — ``.backward()``, ``torch.autograd.grad``,
``torch.func`` (``grad``, ``vjp``, ``jacrev``, ``vmap``; forward mode ``jvp``/``jacfwd``/
``hessian`` outside ``torch.compile``) and ``torch.compile`` (``fullgraph=True``, with backward;
eager, aot_eager and inductor backends) — on every device, for a matrix or a batch ``(..., m, n)``,
in float32/float64 and (computed in float32) float16/bfloat16, also under ``torch.autocast``.

The forward is the engine's one route with ``xp = torch`` (validated input →
``_spectrum.decompose`` → ``_core.value_from_spectrum``) and keeps the spectrum when a gradient
may be asked for; the backward is the engine's one gradient assembly, ``grad · U diag(d) Vᵀ``
(with ``gram=True`` one GEMM with ``F``), the minimum-norm subgradient at tied extremes. Autocast
is off inside both. Forward mode uses a twin Function (dynamo cannot trace one that defines
``jvp``). Higher order (``create_graph=True``, ``torch.func.hessian``) recomputes ``G(S)`` from a
differentiable thin SVD: exact at generic points; at ties the second derivative does not exist.

Values are read only for the documented checks (finite input, not the zero matrix, not at
R_ill's pole in its backward) and the engine's accept decision (Gram or exact):
``ValueError``, :class:`condreg.RankError`, :class:`condreg.PoleError`. ``check_finite=False``,
``torch.compile`` and ``torch.func.vmap`` read nothing (the exact path is taken; invalid input
gives NaN/inf), except that ``vmap``'s rule checks the whole batch. Training adapters live in
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
    """Read a 0-d boolean tensor (one host synchronisation on a GPU), or ``None`` when it cannot
    be read (under ``torch.compile`` or inside ``torch.func.vmap``).

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
    return concrete if check else _core.never


def _no_autocast(S: torch.Tensor):
    """Autocast off: the engine computes in the dtype it was given."""
    if torch.is_autocast_enabled(S.device.type):
        return torch.autocast(S.device.type, enabled=False)
    return contextlib.nullcontext()


def _closed_form(S: torch.Tensor, config: tuple) -> torch.Tensor:
    """``G(S)`` from a differentiable thin SVD (higher order and forward mode)."""
    quantity, rtol, tie_rtol, gram, check = config
    options = {"rtol": rtol, "tie_rtol": tie_rtol, "gram": gram, "concrete": _reader(check)}
    xp = array_namespace(S)
    return _core.gradient(quantity, S, xp, subgradient="min_norm", method="svd", **options)


def _extreme_ok(S: torch.Tensor, check: bool) -> bool:
    """The ``"extreme"`` route may be taken: CPU, checks on, not traced."""
    return check and S.device.type == "cpu" and not _spectrum.traced(S)


def _forward(S, quantity, rtol, tie_rtol, gram, check, vectors):
    """``(value, A, B, s, tols)``: with ``vectors`` the kept spectrum (``U, Vh``; the small
    side's vectors and empty; or empty and the unit Gram), ``tols = [mu_err, tie]``; else fresh
    empty tensors (distinct outputs, as ``torch.compile`` needs)."""
    xp = array_namespace(S)
    tie = _core.check_tie_rtol(tie_rtol)
    with _no_autocast(S):
        extreme = vectors and gram and _extreme_ok(S, check)
        options = {"gram": gram, "vectors": vectors, "rtol": rtol, "extreme": extreme}
        sp = _spectrum.decompose(S, xp, concrete=_reader(check), **options)
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
    """The gradient from the kept spectrum, or (higher order, nothing kept) from
    :func:`_closed_form`."""
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
        bdim = in_dims[0]
        if bdim is not None:
            S = S.movedim(bdim, 0)
        # the top-level check could not read the batched tensor; this one can
        if check and _reader(check)(torch.all(torch.isfinite(S))) is False:
            raise _validation.nonfinite_error(quantity)
        outs = _function().apply(S, quantity, rtol, tie_rtol, gram, check, vectors)
        dims = tuple(None if (bdim is None or o.numel() == 0) else 0 for o in outs)
        return outs, dims


class _SpectralValueWithJvp(_SpectralValue):
    """:class:`_SpectralValue` plus forward mode: jvp ``Σ G(S) * Ṡ`` (not under compile)."""

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
    """Differentiable value of ``quantity`` for a validated tensor ``S`` (what
    :func:`condreg.r_ill` etc. call for tensors).

    Parameters
    ----------
    quantity : str
        ``"condition_number"``, ``"r_well"`` or ``"r_ill"``.
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
