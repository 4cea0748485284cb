"""Scaling condreg's regularizers out with ``torch.distributed`` (nothing home-made).

The probing Hessian of a data-parallel batch is that of all ranks' features together,
``H = Σ_r F_rᵀF_r = FᵀF`` with ``F`` the rows of every rank stacked. Two ways to get its
spectrum, chosen automatically by :func:`r_ill`, :func:`r_well` and :func:`condition_number`
from the global batch size ``N_total = Σ_r N_r`` and the feature dimension ``D``:

``"gram"`` (``N_total >= D``)
    Each rank forms its ``D×D`` Gram ``F_rᵀF_r`` (float64 for float32 features) and one
    all-reduce sums them: ``D²`` numbers per rank, whatever the batch size. Every rank then
    decomposes the same ``H`` (the engine's eigh, :mod:`condreg._spectrum`) and the backward is
    local, ``∇F_r = 2 F_r G`` with ``G = ∇_H`` — no communication. If that eigh does not resolve
    the spectrum (the engine's one accept rule, :func:`condreg._spectrum.accept_gram`, decided
    identically on every rank), the call falls back to ``"gather"``.
``"gather"`` (``N_total < D``)
    :func:`gather_features` all-gathers the rows (``N_total·D`` numbers, plus a reduce-scatter
    of the same size in the backward) and every rank evaluates ``condreg.<quantity>(F, gram=True)``
    on the stacked batch — the engine then takes the ``N_total×N_total`` Gram.

Communication per step and rank, in numbers: ``"gram"`` ``D² + 1``; ``"gather"``
``2·N_total·D + 1`` (the ``+1`` is the all-reduce of the batch size that picks the strategy).
Where the all-reduced ``H`` is not finite, one more number tells NaN/Inf features (an error on
every rank) from finite ones whose ``H`` overflows (then the gather strategy, as when ``H`` does
not resolve the spectrum).

Gradient scale (both strategies, so the automatic switch changes nothing): every rank holds the
same replicated loss, and the gradient reaching ``F_local`` is ``world_size ×`` the gradient of
that loss with respect to those rows (the all-gather's backward sums over ranks; the Gram path
multiplies its local gradient by ``world_size`` to match). Under ``DistributedDataParallel`` —
which averages parameter gradients over ranks — this is exactly right: the averaged parameter
gradient is the full gradient of the regularizer. Without DDP, divide by ``world_size``.

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
    """Differentiable all-gather of a feature batch along axis 0 over ``group``.

    Uses ``torch.distributed.nn.functional.all_gather`` (autograd-aware: its backward sums the
    incoming gradients over ranks). Every rank must pass the same number of rows (use the quantity
    functions of this module for uneven batches).

    Parameters
    ----------
    features : torch.Tensor
        This rank's rows, ``(N, ...)``.
    group : torch.distributed.ProcessGroup, optional
        The ranks to gather from (default: the world).

    Returns
    -------
    torch.Tensor
        Every rank's rows stacked in rank order, ``(world·N, ...)``; ``features`` itself when
        ``torch.distributed`` is not initialised, so the same training code runs on one process.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.distributed import gather_features
    >>> F = torch.ones(4, 3)
    >>> gather_features(F) is F   # no process group
    True
    """
    if not _initialised():
        return features
    group = dist.group.WORLD if group is None else group
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(features.contiguous(), group=group), dim=0)


def choose_strategy(n_total: int, d: int) -> str:
    """The automatic strategy: ``"gram"`` if ``n_total >= d``, else ``"gather"``.

    With at least as many rows as features the ``D×D`` all-reduce is no larger than the gather.

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
    """value of ``quantity`` of ``H = Σ_r F_rᵀF_r`` from its accepted eigh (``s``, ``W``,
    ``err_rel``: :func:`condreg._spectrum.accept_gram`); backward ``world · 2 F_r G`` (local,
    the engine's one gradient assembly)."""

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
        Fv, _ = _validation.compute_dtype(F, array_namespace(F), None, where=quantity)
        xp = array_namespace(Fv)
        gdtype = _spectrum.gram_dtype(Fv, xp)
        A = Fv.detach().to(gdtype)
        H = A.mT @ A
        dist.all_reduce(H, group=group)
        if not bool(torch.isfinite(H).all()):
            # NaN/Inf features on some rank, or finite ones whose Gram overflows: one more
            # collective (a flag) tells them apart, on this rare path only
            bad = (~torch.isfinite(A).all()).to(A.dtype).reshape(1)
            dist.all_reduce(bad, group=group)
            if bool(bad[0] > 0):
                raise ValueError(f"{quantity}: the features contain NaN or Inf (on some rank)")
            # an overflowing H: eigh_gram refuses it (never decomposed), the gather path decides
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
    """κ(H) of the data-parallel probing Hessian ``H = Σ_r F_rᵀF_r = FᵀF``, differentiable.

    ``κ(H) = σ_1(F)²/σ_k(F)²`` over the nonzero spectrum; see the module documentation for the
    strategies and the gradient scale. Without an initialised process group it is
    ``condreg.condition_number(features, gram=True, rtol=rtol)``.

    Parameters
    ----------
    features : torch.Tensor
        This rank's features ``F_r``, flattened to ``(N_r, D)``; ``N_r`` may differ between ranks
        (the ``"gather"`` strategy needs equal ``N_r``).
    group : torch.distributed.ProcessGroup, optional
        The ranks whose rows form the batch (default: the world).
    strategy : {"auto", "gram", "gather"}
        How to get the spectrum of ``H`` (module documentation); ``"auto"``:
        :func:`choose_strategy`.
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
    features: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    strategy: Strategy = "auto",
) -> torch.Tensor:
    """R_well(H) of the data-parallel probing Hessian ``H = Σ_r F_rᵀF_r``, differentiable.

    ``R_well(H) = ½ λ_1² − ‖H‖_F² / (2D)`` (:func:`condreg.r_well` with ``gram=True``); strategies
    and gradient scale as in :func:`condition_number`.

    Parameters
    ----------
    features : torch.Tensor
        This rank's features ``F_r``, flattened to ``(N_r, D)``; ``N_r`` may differ between ranks
        (the ``"gather"`` strategy needs equal ``N_r``).
    group : torch.distributed.ProcessGroup, optional
        The ranks whose rows form the batch (default: the world).
    strategy : {"auto", "gram", "gather"}
        How to get the spectrum of ``H`` (module documentation); ``"auto"``:
        :func:`choose_strategy`.

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
    """R_ill(H) of the data-parallel probing Hessian ``H = Σ_r F_rᵀF_r``, differentiable.

    ``R_ill(H) = 1 / (‖H‖_F² / (2k) − ½ λ_k²)``, ``k`` the numerical rank (:func:`condreg.r_ill`
    with ``gram=True``); strategies and gradient scale as in :func:`condition_number`.

    Parameters
    ----------
    features : torch.Tensor
        This rank's features ``F_r``, flattened to ``(N_r, D)``; ``N_r`` may differ between ranks
        (the ``"gather"`` strategy needs equal ``N_r``).
    group : torch.distributed.ProcessGroup, optional
        The ranks whose rows form the batch (default: the world).
    strategy : {"auto", "gram", "gather"}
        How to get the spectrum of ``H`` (module documentation); ``"auto"``:
        :func:`choose_strategy`.
    rtol : float, optional
        Rank tolerance on the singular values of ``F`` (default ``max(N_total, D)·eps``).
    tie_rtol : float, optional
        Tie tolerance of the subgradient relative to ``σ_1``.

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
