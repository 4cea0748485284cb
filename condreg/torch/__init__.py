"""PyTorch adapter: condreg's closed-form rules as the derivative of one autograd Function.

``condreg.condition_number``, ``condreg.r_well`` and ``condreg.r_ill`` dispatch here for
``torch.Tensor`` input, so they differentiate natively — ``.backward()``, ``torch.autograd.grad``,
``torch.func`` (``grad``, ``vjp``, ``jacrev``, ``vmap``; forward mode ``jvp``/``jacfwd``/
``hessian`` outside ``torch.compile``) and ``torch.compile`` (``fullgraph=True``, with backward;
eager, aot_eager and inductor backends) — on every device, for a matrix or a batch ``(..., m, n)``,
in float32/float64 and (computed in float32) float16/bfloat16, also under ``torch.autocast``.

The forward is the engine's one route with ``xp = torch`` (validated input →
``_spectrum.evaluate`` → ``_core.parts`` → value) and, when a gradient may be asked for, keeps
the gradient factor ``K = U diag(d value / d mu) Vᵀ`` (computed once with the value); the
backward is the engine's one gradient assembly, ``grad · K``
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
import inspect

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "condreg.torch needs PyTorch >= 2.3: pip install torch (or condreg's torch extra)"
    ) from exc

import array_api_compat.torch as xpt

from condreg import _core, _spectrum

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
    if torch.compiler.is_compiling():
        return None
    try:
        return bool(x)
    except RuntimeError:  # functorch vmap (data-dependent control flow); a meta or fake tensor
        return None


def _no_autocast(S: torch.Tensor):
    """Autocast off: the engine computes in the dtype it was given."""
    if torch.is_autocast_enabled(S.device.type):
        return torch.autocast(S.device.type, enabled=False)
    return contextlib.nullcontext()


def _closed_form(S: torch.Tensor, config: tuple) -> torch.Tensor:
    """``G(S)`` from a differentiable thin SVD (higher order and forward mode): the engine on the
    device, nothing read."""
    quantity, rtol, tie_rtol, gram, _ = config
    kw = {"rtol": rtol, "tie_rtol": tie_rtol, "gram": gram, "check": False, "host": False}
    ev = _spectrum.evaluate(quantity, S, xpt, vectors=True, method="svd", **kw)
    return _spectrum.assemble(ev, xpt)


def _forward(S, config):
    """``(value, K, A, n, pole)``: the engine's :class:`condreg._spectrum.Evaluation` (fresh
    empty tensors where absent: distinct outputs, as ``torch.compile`` needs; ``pole`` read on
    the host, else ``None``)."""
    quantity, rtol, tie_rtol, gram, check, vectors = config
    with _no_autocast(S):
        kw = {"rtol": rtol, "tie_rtol": tie_rtol, "check": check}
        ev = _spectrum.evaluate(quantity, S, xpt, gram=gram, vectors=vectors, **kw)
    K, A, n = ev.K, ev.A, ev.n  # fresh empty tensors where absent
    K = S.new_empty(0) if K is None else K
    A = S.new_empty(0) if A is None else A
    n = S.new_empty(0) if n is None else n
    return ev.value, K, A, n, ev.pole


def _backward(ctx, grad_value: torch.Tensor) -> torch.Tensor:
    """The gradient from what the forward kept (:func:`condreg._spectrum.assemble`), or (higher
    order, nothing kept) from :func:`_closed_form`; :class:`condreg.PoleError` at the pole."""
    if grad_value is None:
        return None
    S, K, A, n = ctx.saved_tensors
    quantity, vectors = ctx.config[0], ctx.config[5]
    if quantity == "r_ill":
        _core.check_pole(ctx.pole)
    if torch.is_grad_enabled() or not vectors:
        return grad_value[..., None, None] * _closed_form(S, ctx.config[:5])
    ev = _spectrum.Evaluation(None, K, A if A.numel() else None, None, n if n.numel() else None)
    with _no_autocast(S):
        return _spectrum.assemble(ev, xpt, grad_value.to(K.dtype))


class _SpectralValue(torch.autograd.Function):
    """value = quantity(S); backward: ``grad_value * G(S)`` from what the forward kept;
    ``config = (quantity, rtol, tie_rtol, gram, check, vectors)``."""

    @staticmethod
    def forward(S, config):  # type: ignore[override]
        return _forward(S, config)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        ctx.mark_non_differentiable(*output[1:4])
        ctx.set_materialize_grads(False)  # no zero gradients for the kept factors
        ctx.save_for_backward(inputs[0], *output[1:4])
        ctx.config, ctx.pole = inputs[1], output[4]

    @staticmethod
    def backward(ctx, grad_value, *_):  # type: ignore[override]
        return _backward(ctx, grad_value), None

    @staticmethod
    def vmap(info, in_dims, S, config):  # type: ignore[override]
        bdim = in_dims[0]
        if bdim is not None:
            S = S.movedim(bdim, 0)
        outs = _function().apply(S, config)  # a plain batch: its values can be read
        batched = bdim is not None
        dims = tuple(0 if batched and torch.is_tensor(o) and o.numel() else None for o in outs)
        return outs, dims


class _SpectralValueWithJvp(_SpectralValue):
    """:class:`_SpectralValue` plus forward mode: jvp ``Σ G(S) * Ṡ`` (not under compile)."""

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        _SpectralValue.setup_context(ctx, inputs, output)
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def jvp(ctx, S_dot, *_):  # type: ignore[override]
        if ctx.config[0] == "r_ill":
            _core.check_pole(ctx.pole)
        S = ctx.saved_tensors[0]
        G = _closed_form(S, ctx.config[:5])
        return (G * S_dot).sum(dim=(-2, -1)), None, None, None, None


# Function.apply binds its arguments to forward's signature on every call: computed once here.
_SpectralValue.forward.__signature__ = inspect.signature(_SpectralValue.forward)  # type: ignore[attr-defined]


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
    fn = _SpectralValue if torch.compiler.is_compiling() else _SpectralValueWithJvp
    return fn.apply(S, (quantity, rtol, tie_rtol, gram, check, vectors))[0]
