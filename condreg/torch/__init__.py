"""PyTorch adapter: condreg's closed-form rules as the backward of ``torch.autograd.Function``.

``condreg.condition_number``, ``condreg.r_well`` and ``condreg.r_ill`` dispatch here for
``torch.Tensor`` input, so they differentiate natively (``.backward()``, ``torch.autograd.grad``,
``torch.func.grad``/``vmap``, ``torch.compile``) on CPU and CUDA. The backward is the verified
closed form of :mod:`condreg._core` (minimum-norm subgradient at tied extremes), never autodiff
through singular vectors.

Second order: the backward is built from differentiable torch operations, so
``create_graph=True`` (double backward, Hessian-vector products) differentiates the closed-form
gradient, which involves the singular vectors. That is exact at generic points (distinct singular
values); at tied singular values the derivative of the singular vectors does not exist and the
second derivative is undefined (PyTorch's SVD backward then returns inf/NaN) — second-order
methods should not rely on it there.

No host synchronisation happens in forward or backward except the documented value checks
(finite input, rank 0, R_ill's pole), which ``check_finite=False`` turns off; under
``torch.compile`` and ``torch.func.vmap`` they are skipped automatically.

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
    """Read a 0-d boolean tensor, or ``None`` when its value cannot be read (under tracing)."""
    if _untraceable(x):
        return None
    try:
        return bool(x)
    except RuntimeError:  # functorch vmap: data-dependent control flow is not allowed
        return None


def _concrete_or_skip(check: bool) -> _core.Concrete:
    return concrete if check else _core.never


class _SpectralValue(torch.autograd.Function):
    """value = quantity(S); backward = closed-form gradient × incoming gradient."""

    @staticmethod
    def forward(S, quantity, rtol, tie_rtol, gram, check):  # type: ignore[override]
        xp = array_namespace(S)
        return _core.value(
            quantity,
            S,
            xp,
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
        quantity, rtol, tie_rtol, gram, check = ctx.config
        G = _core.gradient(
            quantity,
            S,
            array_namespace(S),
            rtol=rtol,
            tie_rtol=tie_rtol,
            gram=gram,
            subgradient="min_norm",
            concrete=_concrete_or_skip(check),
        )
        return grad_value[..., None, None] * G, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, S, quantity, rtol, tie_rtol, gram, check):  # type: ignore[override]
        # The core is batched over leading axes: move the vmapped axis to the front.
        bdim = in_dims[0]
        if bdim is None:
            return _SpectralValue.apply(S, quantity, rtol, tie_rtol, gram, check), None
        S = S.movedim(bdim, 0)
        return _SpectralValue.apply(S, quantity, rtol, tie_rtol, gram, check), 0


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
    return _SpectralValue.apply(S, quantity, rtol, tie_rtol, gram, check)


