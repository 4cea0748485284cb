"""PyTorch adapter: condreg's closed-form rules as the derivative of a ``torch.autograd.Function``.

``condreg.condition_number``, ``condreg.r_well`` and ``condreg.r_ill`` dispatch here for
``torch.Tensor`` input, so they differentiate natively — ``.backward()``,
``torch.autograd.grad``, ``torch.func.grad``/``vjp``/``jacrev``/``vmap``, forward mode
(``torch.func.jvp``/``jacfwd``/``hessian``, ``torch.autograd.forward_ad``; not inside
``torch.compile``, whose tracer does not support a custom ``jvp``) and ``torch.compile``
(``fullgraph=True`` included) — on CPU and CUDA, for a single matrix or a batch ``(..., m, n)``.
The derivative is the verified closed form of :mod:`condreg._core`, ``G = U diag(d) Vᵀ`` with
the minimum-norm subgradient at tied extremes (the ``subgradient="min_norm"`` policy of the
``*_grad`` functions); it never differentiates through singular vectors. The backward returns
``grad_value[..., None, None] * G``; the forward-mode rule (``jvp``) returns ``Σ G * Ṡ`` over the
last two axes — the same linear map, so forward and reverse mode agree, also at ties.

Second order
------------
The closed form ``G(S)`` is computed with differentiable torch operations from ``S`` itself (the
decomposition is redone in ``backward``; nothing is cached from the forward pass), so
``create_graph=True`` (double backward, Hessian-vector products, ``torch.func.hessian``, second
order optimizers), ``gradgradcheck`` and ``torch.func.grad(torch.func.grad(...))`` differentiate
``G`` through PyTorch's own SVD derivative. That is exact wherever the quantity is twice
differentiable: at generic points (distinct nonzero singular values, fixed rank).

At ties the second derivative does not exist, and condreg does not detect this or substitute
anything: where singular values coincide — a tied extreme, but also any repeated value inside the
spectrum and repeated zeros of a rank-deficient matrix — the derivative of the singular vectors
has ``1 / (sigma_i² − sigma_j²)`` factors, so what double backward returns there is meaningless:
huge, basis-dependent, ``inf`` or ``NaN``. (The first derivative stays the basis-independent
minimum-norm subgradient.) Second-order methods should not rely on curvature at ties; near a tie
the curvature is correct but large, like ``1 / gap``.

Checks and host synchronisation
-------------------------------
Forward and backward run no ``.item()`` or other host synchronisation except the documented
value checks (the input is finite and not the zero matrix; in the backward of ``r_ill``, that it
is not at its pole). ``check_finite=False`` turns all of them off: the adapter then never reads a
tensor value (never calls :func:`concrete`), and invalid input gives ``NaN``/``inf``. Under
``torch.compile`` and inside ``torch.func.vmap`` (also ``vmap(grad(...))``) values cannot be read
and the checks are skipped automatically, without a graph break: there, as with
``check_finite=False``, a zero matrix or ``r_ill`` at its pole gives ``NaN``/``inf`` gradients
instead of an error. Eagerly (including ``torch.func.grad``), errors are raised: ``ValueError``
for NaN/Inf input, :class:`condreg.RankError` for a zero matrix, and, from the backward of
``r_ill`` at its pole (where the value is ``+inf``), :class:`condreg.PoleError` — never a NaN
gradient. ``torch.func.vmap`` of the value functions uses a custom rule that calls the batched
core directly, so the forward checks do run there on the whole batch.

Training adapters (a regularizer loss module, the preconditioning "dummy layer") live in
:mod:`condreg.torch.nn`.
"""

from __future__ import annotations

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "condreg.torch needs PyTorch: pip install 'condreg[torch]' (or your own torch build)"
    ) from exc

from array_api_compat import array_namespace

from condreg import _core

__all__ = ["concrete", "value"]


def _untraceable(x: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        return True
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor) or x.device.type == "meta"


def concrete(x: torch.Tensor) -> bool | None:
    """Read a 0-d boolean tensor (one host synchronisation on a GPU), or return ``None`` when its
    value cannot be read: under ``torch.compile`` (dynamo, fake or meta tensors) and inside
    ``torch.func.vmap`` (batched tensors)."""
    if _untraceable(x):
        return None
    try:
        return bool(x)
    except RuntimeError:  # functorch vmap: data-dependent control flow is not allowed
        return None


def _concrete_or_skip(check: bool) -> _core.Concrete:
    # Look ``concrete`` up at call time (not bound at import), so tests can watch it.
    return concrete if check else _core.never


def _closed_form(S: torch.Tensor, config: tuple) -> torch.Tensor:
    """The closed-form (sub)gradient ``G(S)``, from differentiable torch operations on ``S``."""
    quantity, rtol, tie_rtol, gram, check = config
    return _core.gradient(
        quantity,
        S,
        array_namespace(S),
        rtol=rtol,
        tie_rtol=tie_rtol,
        gram=gram,
        subgradient="min_norm",
        concrete=_concrete_or_skip(check),
        method="svd",
    )


class _SpectralValue(torch.autograd.Function):
    """value = quantity(S); backward: ``grad_value * G(S)``."""

    @staticmethod
    def forward(S, quantity, rtol, tie_rtol, gram, check):  # type: ignore[override]
        return _core.value(
            quantity,
            S,
            array_namespace(S),
            rtol=rtol,
            tie_rtol=tie_rtol,
            gram=gram,
            concrete=_concrete_or_skip(check),
        )

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        S, quantity, rtol, tie_rtol, gram, check = inputs
        ctx.save_for_backward(S)
        ctx.config = (quantity, rtol, tie_rtol, gram, check)

    @staticmethod
    def backward(ctx, grad_value):  # type: ignore[override]
        (S,) = ctx.saved_tensors
        G = _closed_form(S, ctx.config)
        return grad_value[..., None, None] * G, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, S, quantity, rtol, tie_rtol, gram, check):  # type: ignore[override]
        # The core is batched over leading axes: move the vmapped axis to the front.
        bdim = in_dims[0]
        if bdim is not None:
            S = S.movedim(bdim, 0)
        return _apply(S, quantity, rtol, tie_rtol, gram, check), None if bdim is None else 0


class _SpectralValueWithJvp(_SpectralValue):
    """:class:`_SpectralValue` plus forward mode: jvp ``Σ G(S) * Ṡ``.

    Separate because dynamo cannot trace a Function that defines ``jvp``: under
    ``torch.compile`` the class without it is used, so the compiled graph has no break.
    """

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        _SpectralValue.setup_context(ctx, inputs, output)
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def jvp(ctx, S_dot, *_):  # type: ignore[override]
        (S,) = ctx.saved_tensors
        G = _closed_form(S, ctx.config)
        return (G * S_dot).sum(dim=(-2, -1))


def _apply(S, quantity, rtol, tie_rtol, gram, check):
    if torch.compiler.is_compiling():
        return _SpectralValue.apply(S, quantity, rtol, tie_rtol, gram, check)
    return _SpectralValueWithJvp.apply(S, quantity, rtol, tie_rtol, gram, check)


def value(
    quantity: str,
    S: torch.Tensor,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    check: bool,
) -> torch.Tensor:
    """Differentiable value of ``quantity`` (validated ``S``; used by the top-level functions)."""
    return _apply(S, quantity, rtol, tie_rtol, gram, check)
