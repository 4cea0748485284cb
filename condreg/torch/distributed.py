"""Scaling condreg's regularizers out with ``torch.distributed`` (docs/scaling.md).

The probing Hessian of a data-parallel batch is ``H = Σ_r F_rᵀF_r = FᵀF``, ``F`` every rank's rows
stacked. Its spectrum comes from one all-reduce of the ``D×D`` Grams (``"gram"``; the backward is
local) or, when ``N_total < D`` or that eigh does not resolve it, from :func:`gather_features`
(``"gather"``). The gradient reaching a rank's rows is ``world_size ×`` that of the replicated loss,
which DDP's averaging turns into the full gradient (without DDP, divide by ``world_size``).
Without an initialised process group every function is the single-process one.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
from array_api_compat import array_namespace

import condreg
from condreg import _core, _spectrum, _validation

__all__ = ["gather_features", "condition_number", "r_well", "r_ill", "choose_strategy"]

Strategy = Literal["auto", "gram", "gather"]


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def gather_features(features: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Differentiable all-gather of a feature batch along axis 0 over ``group`` (its backward sums
    the gradients over ranks); every rank must pass the same number of rows.

    Parameters
    ----------
    features : torch.Tensor
        This rank's rows, ``(N, ...)``.
    group : torch.distributed.ProcessGroup, optional
        The ranks to gather from (default: the world).

    Returns
    -------
    torch.Tensor
        Every rank's rows in rank order, ``(world·N, ...)``; ``features`` without a process group.

    Examples
    --------
    >>> import torch, condreg.torch.distributed
    >>> F = torch.ones(4, 3)
    >>> condreg.torch.distributed.gather_features(F) is F   # no process group
    True
    """
    if not _initialised():
        return features
    group = dist.group.WORLD if group is None else group
    from torch.distributed.nn.functional import all_gather
    return torch.cat(all_gather(features.contiguous(), group=group), dim=0)


def choose_strategy(n_total: int, d: int) -> str:
    """The automatic strategy: ``"gram"`` if ``n_total >= d``, else ``"gather"``.

    Parameters
    ----------
    n_total : int
        Rows of the global batch, ``N_total = Σ_r N_r``.
    d : int
        The feature dimension ``D``.

    Returns
    -------
    str
        ``"gram"`` or ``"gather"``.

    Examples
    --------
    >>> from condreg.torch.distributed import choose_strategy
    >>> choose_strategy(1024, 768), choose_strategy(64, 768)
    ('gram', 'gather')
    """
    return "gram" if n_total >= d else "gather"


def _global_rows(F: torch.Tensor, group) -> int:
    n = torch.tensor([F.shape[0]], dtype=torch.int64, device=F.device)
    dist.all_reduce(n, group=group)
    return int(n.item())


class _GramValue(torch.autograd.Function):
    """``quantity`` of ``H = Σ_r F_rᵀF_r`` from its accepted eigh; backward ``world · 2 F_r G``."""

    @staticmethod
    def forward(ctx, F, s, W, err_rel, n_total, quantity, rtol, tie_rtol, world):  # type: ignore[override]
        xp = array_namespace(F)
        N, D = n_total, F.shape[-1]
        tol = _spectrum.resolve_rtol(rtol, (N, D), F.dtype, xp)
        mask, k = _spectrum.rank(s, tol, xp)
        tie = _spectrum.default_tie_rtol((N, D), F.dtype, xp)  # s is rounded to F's dtype
        sp = _core.Spectrum(None, s, W.mT, s * s, mask, k, D, True, err_rel, F, tie)
        ctx.sp, ctx.cfg, ctx.world = sp, (quantity, tie_rtol), world
        ctx.save_for_backward(F)
        return _core.value_from_spectrum(quantity, sp, xp, tie_rtol=_core.check_tie_rtol(tie_rtol))

    @staticmethod
    def backward(ctx, grad_value):  # type: ignore[override]
        (F,) = ctx.saved_tensors
        quantity, tie_rtol = ctx.cfg
        sp = ctx.sp._replace(F=F)
        G = _core.gradient_from_spectrum(
            quantity,
            sp,
            array_namespace(F),
            tie_rtol=_core.check_tie_rtol(tie_rtol),
            subgradient="min_norm",
            concrete=_core.eager,
            weight=grad_value * ctx.world,
        )
        return G, None, None, None, None, None, None, None, None


def _value(
    quantity: str,
    features: torch.Tensor,
    *,
    group: dist.ProcessGroup | None,
    strategy: Strategy,
    rtol: float | None,
    tie_rtol: float | None,
) -> torch.Tensor:
    if strategy not in ("auto", "gram", "gather"):
        raise ValueError(f"strategy must be 'auto', 'gram' or 'gather', got {strategy!r}")
    fn = getattr(condreg, quantity)
    kw = {} if quantity == "r_well" else {"rtol": rtol}
    if quantity == "r_ill":
        kw["tie_rtol"] = tie_rtol
    if not _initialised():
        return fn(features, gram=True, **kw)
    F = features.reshape(features.shape[0], -1)
    group = dist.group.WORLD if group is None else group
    n_total = _global_rows(F, group)
    D = F.shape[-1]
    chosen = choose_strategy(n_total, D) if strategy == "auto" else strategy
    if chosen == "gram":
        xp = array_namespace(F)
        Fv, _ = _validation.compute_dtype(F, xp, None, where=quantity)
        A = Fv.detach().to(_spectrum.gram_dtype(Fv, xp))
        H = A.mT @ A
        dist.all_reduce(H, group=group)
        if not bool(torch.isfinite(H).all()):
            # NaN/Inf features on some rank, or an overflowing Gram: a flag tells them apart
            bad = (~torch.isfinite(A).all()).to(A.dtype).reshape(1)
            dist.all_reduce(bad, group=group)
            if bool(bad[0] > 0):
                raise ValueError(f"{quantity}: the features contain NaN or Inf (on some rank)")
            # an overflowing H: accept_gram refuses it, the gather path decides
        tol = _spectrum.resolve_rtol(rtol, (n_total, D), Fv.dtype, xp)
        s, W, err_rel, ok = _spectrum.accept_gram(H, (n_total, D), xp, True, Fv.dtype, tol)
        if bool(ok):
            world = dist.get_world_size(group)
            args = (n_total, quantity, rtol, tie_rtol, world)
            return _GramValue.apply(Fv, s, W, err_rel, *args).to(features.dtype)
    return fn(gather_features(F, group), gram=True, **kw)


def condition_number(
    features: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    strategy: Strategy = "auto",
    rtol: float | None = None,
) -> torch.Tensor:
    """κ(H) = σ_1(F)²/σ_k(F)² of the data-parallel ``H = Σ_r F_rᵀF_r``, differentiable.

    Parameters
    ----------
    features : torch.Tensor
        This rank's features ``F_r``, flattened to ``(N_r, D)`` (``"gather"`` needs equal ``N_r``).
    group : torch.distributed.ProcessGroup, optional
        The ranks whose rows form the batch (default: the world).
    strategy : {"auto", "gram", "gather"}
        How to get the spectrum of ``H``; ``"auto"``: :func:`choose_strategy`.
    rtol : float, optional
        Rank tolerance on the singular values of ``F`` (default ``max(N_total, D)·eps``).

    Returns
    -------
    torch.Tensor
        0-d, the same on every rank, in the features' dtype.

    Raises
    ------
    ValueError
        For an unknown ``strategy`` or NaN/Inf features (on any rank).
    condreg.RankError
        For all-zero features.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.distributed import condition_number
    >>> condition_number(torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
    tensor(4., dtype=torch.float64)
    """
    return _value(
        "condition_number", features, group=group, strategy=strategy, rtol=rtol, tie_rtol=None
    )


def r_well(
    features: torch.Tensor, *, group: dist.ProcessGroup | None = None, strategy: Strategy = "auto"
) -> torch.Tensor:
    """R_well(H) = ½ λ_1² − ‖H‖_F² / (2D) of ``H = Σ_r F_rᵀF_r``, differentiable.

    Parameters
    ----------
    features : torch.Tensor
        This rank's features ``F_r``, flattened to ``(N_r, D)`` (``"gather"`` needs equal ``N_r``).
    group : torch.distributed.ProcessGroup, optional
        The ranks whose rows form the batch (default: the world).
    strategy : {"auto", "gram", "gather"}
        How to get the spectrum of ``H``; ``"auto"``: :func:`choose_strategy`.

    Returns
    -------
    torch.Tensor
        0-d, the same on every rank, in the features' dtype.

    Raises
    ------
    ValueError
        For an unknown ``strategy`` or NaN/Inf features (on any rank).
    condreg.RankError
        For all-zero features.
    """
    return _value("r_well", features, group=group, strategy=strategy, rtol=None, tie_rtol=None)


def r_ill(
    features: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    strategy: Strategy = "auto",
    rtol: float | None = None,
    tie_rtol: float | None = None,
) -> torch.Tensor:
    """R_ill(H) = 1 / (‖H‖_F² / (2k) − ½ λ_k²) of ``H = Σ_r F_rᵀF_r``, differentiable.

    Parameters
    ----------
    features : torch.Tensor
        This rank's features ``F_r``, flattened to ``(N_r, D)`` (``"gather"`` needs equal ``N_r``).
    group : torch.distributed.ProcessGroup, optional
        The ranks whose rows form the batch (default: the world).
    strategy : {"auto", "gram", "gather"}
        How to get the spectrum of ``H``; ``"auto"``: :func:`choose_strategy`.
    rtol, tie_rtol : float, optional
        Rank tolerance on the singular values of ``F`` (default ``max(N_total, D)·eps``) and tie
        tolerance of the subgradient relative to ``σ_1``.

    Returns
    -------
    torch.Tensor
        0-d, the same on every rank, in the features' dtype.

    Raises
    ------
    ValueError
        For an unknown ``strategy`` or NaN/Inf features (on any rank).
    condreg.RankError
        For all-zero features.
    """
    return _value("r_ill", features, group=group, strategy=strategy, rtol=rtol, tie_rtol=tie_rtol)
