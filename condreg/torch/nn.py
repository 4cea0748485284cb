"""PyTorch adapters for Algorithm 1: the regularizer as a loss term, the "dummy layer" that
preconditions the immunized map's update, and its per-layer form (docs/immunization.md,
docs/deepnet.md); under ``torch.distributed`` they use the global batch (docs/scaling.md)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F_
from torch import nn

from condreg import _backend, _core, _precondition, _spectrum
from condreg.torch import _data_parallel as dp

__all__ = ["ConditionRegularizer", "Precondition", "precondition", "rows"]
__all__ += ["layer_gram", "left_precondition"]


def rows(F: torch.Tensor, name: str = "features") -> torch.Tensor:
    """A feature batch as rows: ``(N, D)`` as is, token features ``(B, T, D)`` as ``(B·T, D)``.

    Parameters
    ----------
    F : torch.Tensor
        ``(N, D)`` or ``(B, T, D)``.
    name : str
        The argument's name in error messages.

    Returns
    -------
    torch.Tensor
        ``(N, D)`` or ``(B·T, D)`` (a view where possible).

    Raises
    ------
    TypeError
        If ``F`` is not a ``torch.Tensor``.
    ValueError
        For another number of dimensions.

    Examples
    --------
    >>> import torch, condreg.torch.nn
    >>> condreg.torch.nn.rows(torch.zeros(4, 5, 3)).shape
    torch.Size([20, 3])
    """
    if not isinstance(F, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor, got {_backend.kind(F)} "
            "(convert it with torch.as_tensor)"
        )
    if F.ndim == 2:
        return F
    if F.ndim == 3:
        return F.reshape(-1, F.shape[-1])
    raise ValueError(
        f"{name} must be (N, D) features or (B, T, D) token features (tokens as rows), got shape "
        f"{tuple(F.shape)}; reshape it yourself, e.g. F.flatten(1) (a row per example)"
    )


class ConditionRegularizer(nn.Module):
    """``λ_P R_well(H_P) + λ_H R_ill(H_H)`` of the probing Hessians ``H = FᵀF`` of feature batches
    (under a process group every rank calls it with the same terms).

    Parameters
    ----------
    lam_p, lam_h : float
        Weights of the two terms (``>= 0``; 0 leaves a term out).
    normalize : bool
        Divide each batch by its detached global Frobenius norm (terms of ``H / tr(H)``).
    rtol : float, optional
        Rank tolerance passed to :func:`condreg.r_ill`.
    local : bool
        ``True``: each process uses its own rows even under a process group.
    group : torch.distributed.ProcessGroup, optional
        The group whose rows form the batch (default: the world).

    Raises
    ------
    ValueError
        For negative weights.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.nn import ConditionRegularizer
    >>> F_p, F_h = torch.randn(32, 8, requires_grad=True), torch.randn(32, 8, requires_grad=True)
    >>> ConditionRegularizer(1.0, 1.0)(F_p, F_h).backward()  # a 0-d tensor: add it to the loss
    """

    def __init__(
        self,
        lam_p: float = 1.0,
        lam_h: float = 1.0,
        *,
        normalize: bool = True,
        rtol: float | None = None,
        local: bool = False,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        if lam_p < 0 or lam_h < 0:
            raise ValueError(f"lam_p and lam_h must be >= 0, got {lam_p}, {lam_h}")
        self.lam_p, self.lam_h, self.normalize = float(lam_p), float(lam_h), bool(normalize)
        self.rtol, self.local = _core.check_rtol(rtol, where="ConditionRegularizer: "), bool(local)
        self.group = group

    def forward(
        self, features_p: torch.Tensor | None = None, features_h: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The 0-d regularizer of the two feature batches.

        Parameters
        ----------
        features_p, features_h : torch.Tensor, optional
            ``(N, D)`` or ``(B, T, D)`` pre-training and harmful features; ``None``: no term.

        Returns
        -------
        torch.Tensor

        Raises
        ------
        ValueError
            If both batches are ``None`` or a batch has another shape.
        TypeError
            If a batch is not a ``torch.Tensor``.
        """
        if features_p is None and features_h is None:
            raise ValueError("ConditionRegularizer needs features_p and/or features_h")
        group = dp.process_group(self.local, self.group)
        Fp = None if features_p is None else rows(features_p, "features_p")
        Fh = None if features_h is None else rows(features_h, "features_h")
        total = (Fp if Fp is not None else Fh).new_zeros(())
        for F, lam, quantity in ((Fp, self.lam_p, "r_well"), (Fh, self.lam_h, "r_ill")):
            if F is not None and lam != 0:
                F = dp.normalized(F, group) if self.normalize else F
                total = total + lam * dp.global_quantity(quantity, F, group, self.rtol)
        return total

    def extra_repr(self) -> str:
        flags = f"normalize={self.normalize}, local={self.local}"
        return f"lam_p={self.lam_p}, lam_h={self.lam_h}, {flags}"


class _Precondition(torch.autograd.Function):
    """Identity forward; backward ``ḡ ↦ U diag(1/(s² + ε)) Uᵀ ḡ`` with ``x = U S Vᵀ``."""

    @staticmethod
    def forward(features, inputs, ridge, rtol, group):  # type: ignore[override]
        return features.view_as(features)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        _, x, ridge, rtol, group = inputs
        ctx.save_for_backward(x)
        ctx.ridge, ctx.rtol, ctx.group = ridge, rtol, group

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        x = rows(x.detach(), "inputs")
        g = grad.reshape(-1, grad.shape[-1])
        out = dp.global_sample_precondition(x, g, ctx.ridge, ctx.rtol, ctx.group)
        return out.reshape(grad.shape).to(grad.dtype), None, None, None, None


def precondition(
    features: torch.Tensor,
    inputs: torch.Tensor,
    *,
    ridge: float = 1e-4,
    rtol: float | None = None,
    local: bool = False,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """The dummy layer: ``features`` unchanged; its backward left-multiplies the parameter gradient
    of ``F = inputs @ θ`` by ``(K + ε I)⁻¹``, ``K = xᵀx`` of ``inputs``, ``ε = ridge·λ_max(K)``.

    Parameters
    ----------
    features, inputs : torch.Tensor
        ``F`` and ``x``, ``(N, D)`` and ``(N, D_in)`` or ``(B, T, ·)``: the same rows.
    ridge : float
        ``>= 0``; 0 gives the pseudo-inverse (directions with ``s_i ≤ rtol·s_1`` dropped).
    rtol : float, optional
        Rank tolerance on the singular values of ``x`` (default ``max(N, D_in)·eps``).
    local : bool
        ``True``: each process preconditions with its own rows' ``K``.
    group : torch.distributed.ProcessGroup, optional
        The group whose rows form the batch (default: the world).

    Returns
    -------
    torch.Tensor
        ``features`` (a view), carrying the preconditioning backward.

    Raises
    ------
    ValueError
        For ``ridge < 0``, ``rtol`` outside ``[0, 1)`` or ``features`` and ``inputs`` with
        different rows.
    TypeError
        If either is not a ``torch.Tensor``, or ``ridge``/``rtol`` is not a real number.

    Examples
    --------
    >>> import torch, condreg
    >>> from condreg.torch.nn import precondition
    >>> x, theta = torch.randn(32, 6), torch.eye(6, requires_grad=True)
    >>> condreg.r_well(precondition(x @ theta, x), gram=True).backward()  # theta.grad: K⁻¹-left
    """
    ridge = _core.check_ridge(ridge, where="precondition: ") or 0.0
    rtol = _core.check_rtol(rtol, where="precondition: ")
    f, x = rows(features, "features"), rows(inputs, "inputs")
    if f.shape[0] != x.shape[0] or features.shape[:-1] != inputs.shape[:-1]:
        raise ValueError(
            "precondition: features and inputs must have the same rows, got shapes "
            f"{tuple(features.shape)} and {tuple(inputs.shape)}"
        )
    group = dp.process_group(local, group)
    return _Precondition.apply(features, inputs, ridge, rtol, group)


class Precondition(nn.Module):
    """Module form of :func:`precondition`: ``Precondition(ridge)(features, inputs)``.

    Parameters
    ----------
    ridge : float
        ``>= 0`` (0: the pseudo-inverse).
    rtol : float, optional
        Rank tolerance on the singular values of the inputs.
    local : bool
        ``True``: each process preconditions with its own rows' ``K``.
    group : torch.distributed.ProcessGroup, optional
        The group whose rows form the batch (default: the world).

    Raises
    ------
    ValueError
        For ``ridge < 0`` or ``rtol`` outside ``[0, 1)``.
    TypeError
        For a ``ridge`` or ``rtol`` that is not a real number.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.nn import ConditionRegularizer, Precondition
    >>> layer, x = torch.nn.Linear(6, 6, bias=False), torch.randn(32, 6)
    >>> ConditionRegularizer(1.0, 0.0)(Precondition()(layer(x), x)).backward()
    """

    def __init__(
        self,
        ridge: float = 1e-4,
        rtol: float | None = None,
        *,
        local: bool = False,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        ridge = _core.check_ridge(ridge, where="Precondition: ") or 0.0
        self.ridge, self.rtol = ridge, _core.check_rtol(rtol, where="Precondition: ")
        self.local, self.group = bool(local), group

    def forward(self, features: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """:func:`precondition` of ``features`` with the covariance ``K = xᵀx`` of ``inputs``.

        Parameters
        ----------
        features, inputs : torch.Tensor
            ``F = inputs @ θ`` and ``x``, the same rows.

        Returns
        -------
        torch.Tensor
        """
        return precondition(
            features, inputs, ridge=self.ridge, rtol=self.rtol, local=self.local, group=self.group
        )

    def extra_repr(self) -> str:
        return f"ridge={self.ridge}, local={self.local}"


def _conv_pad(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``x`` padded as ``layer`` pads it (any ``padding_mode``, ``"same"`` / ``"valid"``)."""
    if layer.padding == "same":
        (kh, kw), (dh, dw) = layer.kernel_size, layer.dilation
        th, tw = dh * (kh - 1), dw * (kw - 1)  # torch puts the extra pixel last
        pad = (tw // 2, tw - tw // 2, th // 2, th - th // 2)
    else:
        ph, pw = (0, 0) if layer.padding == "valid" else layer.padding
        pad = (pw, pw, ph, ph)
    if not any(pad):
        return x
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    return F_.pad(x, pad, mode=mode)


@torch.no_grad()
def layer_gram(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The input Gram matrix ``K`` (no gradient, this process's batch) of an ``nn.Linear``,
    ``XᵀX``, or per group of an ``nn.Conv2d``, ``Σ p pᵀ`` over its im2col patches ``p``.

    Parameters
    ----------
    layer : nn.Linear or nn.Conv2d
        The layer whose weight gradient is to be preconditioned.
    x : torch.Tensor
        The layer's input batch.

    Returns
    -------
    torch.Tensor
        ``(in, in)`` for a Linear, ``(g, C/g·kh·kw, C/g·kh·kw)`` for a Conv2d.

    Raises
    ------
    TypeError
        For another layer type.
    ValueError
        For an input whose feature/channel size does not match the layer.

    Examples
    --------
    >>> import torch, condreg.torch.nn
    >>> condreg.torch.nn.layer_gram(torch.nn.Linear(3, 2), torch.randn(10, 3)).shape
    torch.Size([3, 3])
    """
    if isinstance(layer, nn.Linear):
        if x.shape[-1:] != (layer.in_features,):
            raise ValueError(
                f"layer_gram: Linear({layer.in_features}, …) needs inputs (..., "
                f"{layer.in_features}), got shape {tuple(x.shape)}"
            )
        X = x.reshape(-1, layer.in_features)
        return X.T @ X
    if isinstance(layer, nn.Conv2d):
        if x.ndim == 3:
            x = x[None]
        if x.ndim != 4 or x.shape[1] != layer.in_channels:
            raise ValueError(
                f"layer_gram: Conv2d({layer.in_channels}, …) needs inputs (N, "
                f"{layer.in_channels}, H, W), got shape {tuple(x.shape)}"
            )
        x = _conv_pad(layer, x)
        P = F_.unfold(x, layer.kernel_size, dilation=layer.dilation, stride=layer.stride)
        g = layer.groups
        d = P.shape[1] // g  # (N, C·kh·kw, L), channel-major: group j is a contiguous slice
        P = P.reshape(P.shape[0], g, d, P.shape[2]).permute(1, 2, 0, 3).reshape(g, d, -1)
        return P @ P.mT
    raise TypeError(f"layer_gram supports nn.Linear and nn.Conv2d, got {type(layer).__name__}")


def _inverse_apply(G: torch.Tensor, K: torch.Tensor, ridge: float | None, rtol: float | None):
    """``G K⁺`` (condreg's rank rule on ``√λ_i(K)``) or ``G (K + ridge·I)⁻¹`` (``ridge``
    absolute), in float64; ``K`` ``(d, d)`` or ``(g, d, d)`` with ``G`` ``(g, o, d)``."""
    Kd, Gd = K.to(torch.float64), G.to(torch.float64)
    d = K.shape[-1]
    if ridge is not None:
        eye = torch.eye(d, dtype=torch.float64, device=K.device)
        L = torch.linalg.cholesky(Kd + ridge * eye)
        # G (K + rI)^-1 = ((K + rI)^-1 Gᵀ)ᵀ
        return torch.cholesky_solve(Gd.mT, L).mT.to(G.dtype)
    lam, V = torch.linalg.eigh(Kd)
    lam, V = lam.flip(-1), V.flip(-1)  # descending, as the rank rule expects
    tol = _spectrum.gram_rtol(d, K.dtype, torch) if rtol is None else rtol
    keep = _precondition.rank_mask(lam.clamp(min=0).sqrt(), tol)
    inv = torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), 0.0)
    return (((Gd @ V) * inv[..., None, :]) @ V.mT).to(G.dtype)


@torch.no_grad()
def left_precondition(
    layer: nn.Module,
    grad_weight: torch.Tensor,
    K: torch.Tensor,
    absolute_ridge: float | None = None,
    *,
    rtol: float | None = None,
) -> torch.Tensor:
    """``grad_weight · K⁺``: a weight gradient preconditioned on its **input** side (Algorithm 1's
    ``K⁻¹``; per group for a Conv2d), ``K`` from :func:`layer_gram` on the same batch.

    Parameters
    ----------
    layer : nn.Linear or nn.Conv2d
        The layer.
    grad_weight, K : torch.Tensor
        A gradient of ``layer.weight`` (the regularizer's only) and :func:`layer_gram` of its input.
    absolute_ridge : float, optional
        ``None``: the pseudo-inverse; ``> 0``: ``(K + absolute_ridge·I)⁻¹`` (in ``K``'s units,
        unlike the ``ridge`` elsewhere, which is relative to ``λ_max``).
    rtol : float, optional
        Rank tolerance of the pseudo-inverse on ``√λ_i``, in ``[0, 1)`` (default
        ``√(d·eps(K.dtype))``, the resolution of a formed Gram matrix's eigenvalues).

    Returns
    -------
    torch.Tensor
        The preconditioned gradient (computed in float64), ``grad_weight``'s shape and dtype.

    Raises
    ------
    TypeError
        For another layer type.
    ValueError
        For mismatched shapes, ``absolute_ridge <= 0`` or ``rtol`` outside ``[0, 1)``.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.nn import layer_gram, left_precondition
    >>> layer, x = torch.nn.Linear(3, 2), torch.randn(10, 3)
    >>> G = left_precondition(layer, torch.ones(2, 3), layer_gram(layer, x))
    """
    where = "left_precondition: "
    ridge = _core.check_ridge(absolute_ridge, "absolute_ridge", where, zero=False)
    rtol = _core.check_rtol(rtol, where=where)
    if tuple(grad_weight.shape) != tuple(layer.weight.shape):
        raise ValueError(
            f"left_precondition: grad_weight has shape {tuple(grad_weight.shape)}, the "
            f"layer's weight {tuple(layer.weight.shape)}"
        )
    if not isinstance(layer, (nn.Linear, nn.Conv2d)):
        raise TypeError(
            f"left_precondition supports nn.Linear and nn.Conv2d, got {type(layer).__name__}"
        )
    d = grad_weight.shape[1:].numel()
    shape = (d, d) if isinstance(layer, nn.Linear) else (layer.groups, d, d)
    if tuple(K.shape) != shape:
        raise ValueError(
            f"left_precondition: K must be {shape} for this {type(layer).__name__}, got "
            f"{tuple(K.shape)}"
        )
    G = grad_weight.reshape(*shape[:-2], -1, d)
    return _inverse_apply(G, K, ridge, rtol).reshape(grad_weight.shape)
