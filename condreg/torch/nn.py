"""PyTorch training adapters for Algorithm 1 on real models.

Two pieces, meant to be used together (``docs/immunization.md`` shows a plain loop, a Lightning
``training_step`` and a Hugging Face ``Trainer.compute_loss``):

:class:`ConditionRegularizer`
    ``λ_P R_well(F_Pᵀ F_P) + λ_H R_ill(F_Hᵀ F_H)`` from batches of features (``gram=True``; the
    ``D×D`` Hessians are never formed), returned as a loss term to add to the task loss.

:class:`Precondition` / :func:`precondition`
    The paper's "dummy layer": identity in the forward pass; in the backward pass it turns the
    regularizer's gradient into the ``K⁻¹``-**left**-preconditioned update of the immunized linear
    map. Where it sits matters. For an immunized map ``F = xθ`` (``x``: ``N×D_in`` inputs of the
    map, e.g. the output of the frozen/earlier part of the network; ``θ``: ``D_in×D``, i.e.
    ``nn.Linear.weight.T``) the parameter gradient is ``∇_θ = xᵀ ḡ`` with ``ḡ = ∂ℓ/∂F``. Putting
    the layer on the *inputs* would not change ``∇_θ`` at all, and putting a ``D×D`` output
    covariance on the feature axis of ``ḡ`` gives ``∇_θ K_F⁻¹`` — a *right* multiplication, the
    defect of the public code (docs/math.md §9.2). The dummy layer therefore sits on the *features*
    ``F`` on the regularizer's path only, and acts on the **sample** axis:

        ḡ  ↦  (x xᵀ + ε I)⁻¹ ḡ          so that   xᵀ (x xᵀ + ε I)⁻¹ ḡ = (xᵀx + ε I)⁻¹ xᵀ ḡ
                                                                = K_ε⁻¹ ∇_θ          (push-through)

    i.e. one backward pass gives exactly ``K_ε⁻¹∇_θR`` on the left with ``K = xᵀx`` the input
    covariance of the immunized map, for the same batch; with ``ridge=0`` it is the
    pseudo-inverse ``K⁺∇_θR`` (= Algorithm 1's ``K⁻¹`` when ``K`` is invertible). Computed from
    one thin SVD ``x = U S Vᵀ`` as ``U diag(1/(s² + ε)) Uᵀ ḡ`` (``ε = ridge·s₁²``, components
    outside the row space dropped). The supervised loss must use ``F`` directly, not the
    preconditioned copy, so its gradient stays un-preconditioned, as in Algorithm 1.

Gradients that flow *below* ``x`` (into earlier trainable layers) through the regularizer's path
are the preconditioned ones too; feed ``x.detach()`` to the immunized map on the regularizer path
if earlier layers should not receive them.

Feature batches are ``(N, D)`` rows or ``(B, T, D)`` token features, tokens as rows
(:func:`rows`). Under an initialised ``torch.distributed`` process group (DDP, FSDP, Lightning,
the Hugging Face ``Trainer`` on several processes) :class:`ConditionRegularizer` and
:class:`Precondition` work on the **global** batch, the rows of every process (``local=True``:
each process's own); docs/scaling.md says what is communicated.

:func:`layer_gram` / :func:`left_precondition`
    The same left preconditioner for the weights of a real network's own layers (``nn.Linear``,
    ``nn.Conv2d``, any number of them): ``K`` is the Gram matrix of the layer's *input* on the
    batch (for a convolution, of its im2col patches at every output position, one ``K`` per
    group) and the weight gradient ``G`` becomes ``G K⁺`` (or ``G (K + ridge·I)⁻¹``) on its
    input side. Compute the regularizer's weight gradients with :func:`torch.autograd.grad`,
    precondition them, and add them to the supervised gradients (docs/deepnet.md shows the loop).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

import condreg
from condreg import _precondition
from condreg.torch._data_parallel import (
    global_norm,
    global_quantity,
    global_sample_precondition,
    process_group,
)

__all__ = [
    "ConditionRegularizer",
    "Precondition",
    "layer_gram",
    "left_precondition",
    "precondition",
    "rows",
]


def rows(F: torch.Tensor, name: str = "features") -> torch.Tensor:
    """A feature batch as the rows of the probing Hessian's factor: ``(N, D)`` as is,
    token features ``(B, T, D)`` as ``(B·T, D)`` (tokens as rows).

    The probing Hessian of a linear probe ``w`` on token features sums ``f fᵀ`` over every token
    (``Σ_{b,t} (fᵀw − y)²`` has Hessian ``2 Σ_{b,t} f fᵀ``), so each token is a row; the same rule
    as :func:`layer_gram` for an ``nn.Linear`` applied to tokens and as the Hugging Face trainer.

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
        If ``F`` is not a ``torch.Tensor`` (convert NumPy arrays with ``torch.as_tensor``).
    ValueError
        For another number of dimensions: reshape other layouts yourself (``F.flatten(1)`` for
        one row per example, ``F.movedim(1, -1).reshape(-1, C)`` for one row per pixel).

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.nn import rows
    >>> rows(torch.zeros(4, 5, 3)).shape
    torch.Size([20, 3])
    """
    if not isinstance(F, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor, got {type(F).__module__}.{type(F).__name__} "
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
    """``λ_P R_well(H_P) + λ_H R_ill(H_H)`` of the probing Hessians ``H = FᵀF`` of feature batches.

    Under an initialised ``torch.distributed`` process group (DDP, Lightning's ``"ddp"``, the
    Hugging Face ``Trainer`` on several processes) ``F`` is the **global** batch: the rows of every
    rank, through :mod:`condreg.torch.distributed` (a ``D×D`` Gram all-reduce or a feature
    all-gather, chosen there), with the gradient scale DDP's averaging expects (docs/scaling.md).
    Every rank must then call it with the same terms. ``local=True`` keeps each rank's own rows.

    Parameters
    ----------
    lam_p, lam_h : float
        Weights of the two terms (``>= 0``; 0 leaves a term out).
    normalize : bool
        If True (default), each feature batch is divided by its (detached, global) Frobenius
        norm, so the terms are those of ``H / tr(H)``: independent of the feature scale (R_well is
        homogeneous of degree 2 and R_ill of degree −2 in ``H``, so without this the weights
        would have to be retuned whenever the features grow). The direction of each term's
        gradient is unchanged; only its size adapts. ``False`` gives the plain terms of Eq. 11.
    rtol : float, optional
        Rank tolerance passed to :func:`condreg.r_ill`.
    local : bool
        ``True``: each process regularizes its own rows even under a process group.
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
    >>> reg = ConditionRegularizer(1.0, 1.0)
    >>> F_p = torch.randn(32, 8, dtype=torch.float64, requires_grad=True)
    >>> F_h = torch.randn(32, 8, dtype=torch.float64, requires_grad=True)
    >>> loss = reg(F_p, F_h)          # a 0-d tensor to add to the task loss
    >>> loss.backward()
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
        self.lam_p = float(lam_p)
        self.lam_h = float(lam_h)
        self.normalize = bool(normalize)
        self.rtol = rtol
        self.local = bool(local)
        self.group = group

    def _term(self, F: torch.Tensor, quantity: str, group) -> torch.Tensor:
        if self.normalize:
            norm = global_norm(F, group)
            # A zero batch stays zero (condreg then raises RankError), not 0/0 = NaN.
            F = F / torch.where(norm > 0, norm, torch.ones_like(norm))
        kw = {"rtol": self.rtol} if quantity == "r_ill" else {}
        if group is None:
            return getattr(condreg, quantity)(F, gram=True, **kw)
        return global_quantity(quantity, F, group, self.rtol)

    def forward(
        self, features_p: torch.Tensor | None = None, features_h: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The regularizer of the two feature batches.

        Parameters
        ----------
        features_p, features_h : torch.Tensor, optional
            ``(N, D)`` features or ``(B, T, D)`` token features (tokens as rows, see
            :func:`rows`) of the pre-training and the harmful batch; ``None`` leaves a term out.

        Returns
        -------
        torch.Tensor
            A 0-d tensor (0 when both terms are left out).

        Raises
        ------
        ValueError
            If both batches are ``None`` or a batch has another shape.
        TypeError
            If a batch is not a ``torch.Tensor``.
        """
        if features_p is None and features_h is None:
            raise ValueError("ConditionRegularizer needs features_p and/or features_h")
        group = process_group(self.local, self.group)
        Fp = None if features_p is None else rows(features_p, "features_p")
        Fh = None if features_h is None else rows(features_h, "features_h")
        total = (Fp if Fp is not None else Fh).new_zeros(())
        for F, lam, quantity in ((Fp, self.lam_p, "r_well"), (Fh, self.lam_h, "r_ill")):
            if F is not None and lam != 0:
                total = total + lam * self._term(F, quantity, group)
        return total

    def extra_repr(self) -> str:
        return (
            f"lam_p={self.lam_p}, lam_h={self.lam_h}, normalize={self.normalize}, "
            f"local={self.local}"
        )


class _Precondition(torch.autograd.Function):
    """Identity forward; backward ``ḡ ↦ U diag(1/(s² + ε)) Uᵀ ḡ`` with ``x = U S Vᵀ`` (of the
    rows of every rank when ``group`` is a process group)."""

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
        if ctx.group is None:
            pre = _precondition.sample_preconditioner(x, ridge=ctx.ridge, rtol=ctx.rtol)
            out = pre.apply(g.to(x.dtype))
        else:
            out = global_sample_precondition(x, g, ridge=ctx.ridge, rtol=ctx.rtol, group=ctx.group)
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
    """The dummy layer as a function: ``features`` unchanged; its backward left-multiplies the
    immunized map's parameter gradient by ``(K + ε I)⁻¹``.

    ``K = xᵀx`` is the covariance of ``inputs`` in this batch — of the global batch (every rank's
    rows, :mod:`condreg.torch._data_parallel`) under an initialised ``torch.distributed`` process
    group unless ``local=True`` —, ``ε = ridge·λ_max(K)``. ``features`` must be the output
    ``F = inputs @ θ`` of the immunized linear map, row for row; see the module documentation
    for why it sits here.

    Parameters
    ----------
    features : torch.Tensor
        ``(N, D)`` or ``(B, T, D)`` (tokens as rows, :func:`rows`).
    inputs : torch.Tensor
        ``(N, D_in)`` or ``(B, T, D_in)``, the same rows.
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
        For ``ridge < 0`` or ``features`` and ``inputs`` with different rows.
    TypeError
        If either is not a ``torch.Tensor``.

    Examples
    --------
    >>> import torch
    >>> import condreg
    >>> from condreg.torch.nn import precondition
    >>> x = torch.randn(32, 6, dtype=torch.float64)
    >>> theta = torch.eye(6, dtype=torch.float64, requires_grad=True)
    >>> F = x @ theta
    >>> condreg.r_well(precondition(F, x), gram=True).backward()   # theta.grad: K⁻¹-left
    """
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    f, x = rows(features, "features"), rows(inputs, "inputs")
    if f.shape[0] != x.shape[0] or features.shape[:-1] != inputs.shape[:-1]:
        raise ValueError(
            "precondition: features and inputs must have the same rows, got shapes "
            f"{tuple(features.shape)} and {tuple(inputs.shape)}"
        )
    group = process_group(local, group)
    return _Precondition.apply(features, inputs, float(ridge), rtol, group)


class Precondition(nn.Module):
    """Module form of :func:`precondition`: ``Precondition(ridge)(features, inputs)``.

    Parameters
    ----------
    ridge : float
        ``>= 0`` (0: the pseudo-inverse).
    rtol : float, optional
        Rank tolerance on the singular values of the inputs.
    local : bool
        ``True``: each process preconditions with its own rows' ``K`` under a process group.
    group : torch.distributed.ProcessGroup, optional
        The group whose rows form the batch (default: the world).

    Raises
    ------
    ValueError
        For ``ridge < 0``.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.nn import ConditionRegularizer, Precondition
    >>> layer = torch.nn.Linear(6, 6, bias=False).double()
    >>> x = torch.randn(32, 6, dtype=torch.float64)
    >>> F = layer(x)
    >>> ConditionRegularizer(1.0, 0.0)(Precondition()(F, x)).backward()
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
        if ridge < 0:
            raise ValueError(f"ridge must be >= 0, got {ridge}")
        self.ridge = float(ridge)
        self.rtol = rtol
        self.local = bool(local)
        self.group = group

    def forward(self, features: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """:func:`precondition` of ``features`` with the covariance ``K = xᵀx`` of ``inputs``.

        Parameters
        ----------
        features, inputs : torch.Tensor
            ``F = inputs @ θ`` and ``x``, the same rows; returns ``features``, whose backward is
            preconditioned (:func:`precondition`).
        """
        return precondition(
            features, inputs, ridge=self.ridge, rtol=self.rtol, local=self.local, group=self.group
        )

    def extra_repr(self) -> str:
        return f"ridge={self.ridge}, local={self.local}"


# ---------------------------------------------------------------------------------------------
# per-layer left preconditioning of weight gradients (Linear, Conv2d)
# ---------------------------------------------------------------------------------------------


def _conv_pad(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``x`` padded as ``layer`` pads it (any ``padding_mode``, ``"same"`` / ``"valid"``)."""
    import torch.nn.functional as F_

    kh, kw = layer.kernel_size
    dh, dw = layer.dilation
    if isinstance(layer.padding, str):
        if layer.padding == "valid":
            return x
        th, tw = dh * (kh - 1), dw * (kw - 1)  # "same": torch puts the extra pixel last
        pad = (tw // 2, tw - tw // 2, th // 2, th - th // 2)
    else:
        ph, pw = layer.padding
        pad = (pw, pw, ph, ph)
    if not any(pad):
        return x
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    return F_.pad(x, pad, mode=mode)


def layer_gram(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The input Gram matrix ``K`` of an ``nn.Linear`` or ``nn.Conv2d`` for the input batch ``x``.

    - ``nn.Linear(in, out)``: ``x`` of shape ``(..., in)`` is flattened to ``X`` of shape
      ``(M, in)`` and ``K = XᵀX`` (summed over the batch, like the paper's ``K = XᵀX``), shape
      ``(in, in)``.
    - ``nn.Conv2d(C, out, (kh, kw), groups=g)``: ``x`` of shape ``(N, C, H, W)`` (or
      ``(C, H, W)``) is padded as the layer pads it (its ``padding``, ``padding_mode``) and cut
      into the im2col patches the layer sees (its ``stride`` and ``dilation``); the patch
      vectors ``p`` of group ``j`` are the ``C/g · kh · kw`` entries of channels
      ``j·C/g … (j+1)·C/g − 1`` in the order of ``layer.weight[o].reshape(-1)``. Then
      ``K[j] = Σ_{n, positions} p pᵀ``, shape ``(g, C/g·kh·kw, C/g·kh·kw)`` (``g = 1``
      included). The weight gradient of output channel ``o`` of group ``j`` is
      ``Σ ḡ_o p`` over the same patches, so ``K[j]`` is the ``K`` of Theorem 4.2 for the
      reshaped weight ``(out, C/g·kh·kw)``.

    Computed without gradient, in ``x``'s dtype, from this process's batch only (under data
    parallelism, ``torch.distributed.all_reduce(K)`` makes it the global batch's).

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
    >>> import torch
    >>> from condreg.torch.nn import layer_gram
    >>> layer_gram(torch.nn.Linear(3, 2), torch.randn(10, 3)).shape
    torch.Size([3, 3])
    """
    import torch.nn.functional as F_

    with torch.no_grad():
        x = x.detach()
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
    """``G K⁺`` or ``G (K + ridge·I)⁻¹``; ``K`` symmetric PSD ``(d, d)`` or a stack
    ``(g, d, d)`` with ``G`` of shape ``(g, o, d)``. The pseudo-inverse keeps the directions
    whose ``σ_i = √λ_i(K)`` (the singular values of the factor ``X``, ``K = XᵀX``) pass condreg's
    rank rule ``σ_i > rtol·σ₁`` (:func:`condreg._precondition.rank_mask`); default
    ``rtol = √(d·eps(K.dtype))``, the finest an eigendecomposition of ``K`` resolves. Computed
    in float64, returned in ``G``'s dtype."""
    from condreg._precondition import rank_mask

    Kd, Gd = K.to(torch.float64), G.to(torch.float64)
    d = K.shape[-1]
    if ridge is not None:
        eye = torch.eye(d, dtype=torch.float64, device=K.device)
        L = torch.linalg.cholesky(Kd + ridge * eye)
        # G (K + rI)^-1 = ((K + rI)^-1 Gᵀ)ᵀ
        return torch.cholesky_solve(Gd.mT, L).mT.to(G.dtype)
    lam, V = torch.linalg.eigh(Kd)
    lam, V = lam.flip(-1), V.flip(-1)  # descending, as the rank rule expects
    tol = rtol if rtol is not None else math.sqrt(d * torch.finfo(K.dtype).eps)
    keep = rank_mask(lam.clamp(min=0).sqrt(), tol)
    inv = torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), 0.0)
    return (((Gd @ V) * inv[..., None, :]) @ V.mT).to(G.dtype)


def left_precondition(
    layer: nn.Module,
    grad_weight: torch.Tensor,
    K: torch.Tensor,
    ridge: float | None = None,
    *,
    rtol: float | None = None,
) -> torch.Tensor:
    """A weight gradient of ``layer`` multiplied on its **input** side by ``K⁺`` (Algorithm 1's
    ``K⁻¹``, docs/math.md §4–5), ``K`` from :func:`layer_gram` on the same batch.

    - ``nn.Linear``: ``grad_weight`` ``(out, in)`` ↦ ``grad_weight · K⁺``. With ``θ = weightᵀ``
      this is ``K⁺ ∇_θ`` of Theorem 4.2: for a loss ``f(FᵀF)`` of the outputs ``F = xθ`` it gives
      exactly ``(2 P θ ∇_H f)ᵀ`` (``P`` the projector on ``range(K)``).
    - ``nn.Conv2d``: ``grad_weight`` ``(out, C/g, kh, kw)`` is reshaped per group ``j`` to
      ``(out/g, C/g·kh·kw)``, multiplied by ``K[j]⁺`` and reshaped back.

    ``ridge=None`` (default) uses the pseudo-inverse: directions with ``√λ_i ≤ rtol·√λ_max`` are
    dropped, never amplified (condreg's rank rule on the singular values of the factor ``X``,
    ``K = XᵀX``; default ``rtol = √(d·eps(K.dtype))``, the finest an eigendecomposition of ``K``
    resolves). ``ridge > 0`` uses ``(K + ridge·I)⁻¹`` instead (absolute ridge). Computed in
    float64, returned in ``grad_weight``'s dtype and shape. Apply it to the *regularizer's*
    gradient only; the supervised gradient is not preconditioned.

    Parameters
    ----------
    layer : nn.Linear or nn.Conv2d
        The layer.
    grad_weight : torch.Tensor
        A gradient of ``layer.weight`` (its shape).
    K : torch.Tensor
        :func:`layer_gram` of the layer's input batch.
    ridge : float, optional
        ``None``: the pseudo-inverse; ``> 0``: ``(K + ridge·I)⁻¹``.
    rtol : float, optional
        The rank tolerance of the pseudo-inverse.

    Returns
    -------
    torch.Tensor
        The preconditioned gradient, ``grad_weight``'s shape and dtype.

    Raises
    ------
    TypeError
        For another layer type.
    ValueError
        For mismatched shapes or ``ridge <= 0``.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.nn import layer_gram, left_precondition
    >>> layer, x = torch.nn.Linear(3, 2), torch.randn(10, 3)
    >>> G = left_precondition(layer, torch.ones(2, 3), layer_gram(layer, x))
    """
    if ridge is not None and not ridge > 0:
        raise ValueError(f"ridge must be > 0 (or None for the pseudo-inverse), got {ridge}")
    with torch.no_grad():
        if tuple(grad_weight.shape) != tuple(layer.weight.shape):
            raise ValueError(
                f"left_precondition: grad_weight has shape {tuple(grad_weight.shape)}, the "
                f"layer's weight {tuple(layer.weight.shape)}"
            )
        if isinstance(layer, nn.Linear):
            d = layer.in_features
            if tuple(K.shape) != (d, d):
                raise ValueError(f"left_precondition: K must be ({d}, {d}), got {tuple(K.shape)}")
            return _inverse_apply(grad_weight, K, ridge, rtol)
        if isinstance(layer, nn.Conv2d):
            g, out = layer.groups, layer.out_channels
            d = grad_weight[0].numel()
            if tuple(K.shape) != (g, d, d):
                raise ValueError(
                    f"left_precondition: K must be ({g}, {d}, {d}) for this Conv2d, got "
                    f"{tuple(K.shape)}"
                )
            G = grad_weight.reshape(g, out // g, d)
            return _inverse_apply(G, K, ridge, rtol).reshape(grad_weight.shape)
        raise TypeError(
            f"left_precondition supports nn.Linear and nn.Conv2d, got {type(layer).__name__}"
        )
