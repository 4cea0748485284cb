"""condreg's quantities of ``H = Σ_r F_rᵀF_r``, every rank's rows, by an all-reduce of the Grams
or an all-gather of the rows (docs/scaling.md). A rank's gradient is ``world_size ×`` that of the
replicated loss (DDP averages; without DDP, divide). Without a process group: single-process."""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
from array_api_compat import array_namespace

import condreg
from condreg import _backend, _core, _spectrum, _validation

__all__ = ["gather_features", "condition_number", "r_well", "r_ill", "choose_strategy"]

Strategy = Literal["auto", "gram", "gather"]


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def gather_features(features: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Differentiable all-gather of every rank's rows (the backward sums over ranks); the ranks
    may hold different numbers of rows (each is padded with zero rows to the largest count for
    the collective, as the trainers' batches are, and the padding is dropped again).

    Parameters
    ----------
    features : torch.Tensor
        This rank's rows, ``(N_r, ...)``; the trailing shape is the same on every rank.
    group : torch.distributed.ProcessGroup, optional
        The ranks to gather from (default: the world).

    Returns
    -------
    torch.Tensor
        Every rank's rows in rank order, ``(Σ_r N_r, ...)``; ``features`` without a process group.

    Examples
    --------
    >>> import torch, condreg.torch.distributed as cd
    >>> F = torch.ones(4, 3)
    >>> cd.gather_features(F) is F   # no process group
    True
    """
    if not _initialised():
        return features
    group = dist.group.WORLD if group is None else group
    return _gather_rows(features, group, row_counts(features.shape[0], features.device, group))


def row_counts(n: int, device: torch.device, group: dist.ProcessGroup) -> list[int]:
    """Every rank's number of rows, in rank order (one all-gather of an integer)."""
    mine = torch.tensor([n], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(counts, mine, group=group)
    return [int(c.item()) for c in counts]


def _gather_rows(features: torch.Tensor, group, counts: list[int]) -> torch.Tensor:
    """The differentiable gather of :func:`gather_features` given every rank's row count."""
    from torch.distributed.nn.functional import all_gather

    pad = max(counts) - features.shape[0]
    if pad:
        features = torch.cat([features, features.new_zeros((pad, *features.shape[1:]))])
    parts = all_gather(features.contiguous(), group=group)
    return torch.cat([part[:n] for part, n in zip(parts, counts, strict=True)], dim=0)


def choose_strategy(n_total: int, d: int) -> str:
    """The automatic strategy: ``"gram"`` if ``n_total >= d``, else ``"gather"``.

    Parameters
    ----------
    n_total, d : int
        Rows of the global batch, ``N_total = Σ_r N_r``, and the feature dimension ``D``.

    Returns
    -------
    str

    Examples
    --------
    >>> from condreg.torch.distributed import choose_strategy
    >>> choose_strategy(1024, 768), choose_strategy(64, 768)
    ('gram', 'gather')
    """
    return "gram" if n_total >= d else "gather"


class _GramValue(torch.autograd.Function):
    """``quantity`` of ``H = Σ_r F_rᵀF_r`` from its accepted eigh; backward ``world · 2 F_r G``."""

    @staticmethod
    def forward(ctx, F, s, W, err_rel, n_total, quantity, rtol, tie_rtol, world):  # type: ignore[override]
        xp = array_namespace(F)
        N, D = n_total, F.shape[-1]
        tol = _spectrum.resolve_rtol(rtol, (N, D), F.dtype, xp)
        mask, k = _core.rank(s, tol, xp)
        tie = _spectrum.default_tie_rtol((N, D), F.dtype, xp)  # s is rounded to F's dtype
        sp = _core.Spectrum(None, s, W.mT, s * s, mask, k, D, True, err_rel, F, tie)
        ctx.sp, ctx.quantity, ctx.world = sp, quantity, world
        ctx.tie_rtol = _core.check_rtol(tie_rtol, "tie_rtol")
        ctx.save_for_backward(F)
        return _core.value_from_spectrum(quantity, sp, xp, tie_rtol=ctx.tie_rtol)

    @staticmethod
    def backward(ctx, grad_value):  # type: ignore[override]
        (F,) = ctx.saved_tensors
        sp, xp, w = ctx.sp._replace(F=F), array_namespace(F), grad_value * ctx.world
        kw = {"subgradient": "min_norm", "concrete": _backend.eager, "weight": w}
        G = _core.gradient_from_spectrum(ctx.quantity, sp, xp, tie_rtol=ctx.tie_rtol, **kw)
        return G, None, None, None, None, None, None, None, None


def _value(
    quantity: str,
    features: torch.Tensor,
    group: dist.ProcessGroup | None,
    strategy: Strategy,
    **kw: float | None,
) -> torch.Tensor:
    """``quantity`` of the data-parallel batch; ``kw``: its ``rtol`` / ``tie_rtol``."""
    if strategy not in ("auto", "gram", "gather"):
        raise ValueError(f"strategy must be 'auto', 'gram' or 'gather', got {strategy!r}")
    fn = getattr(condreg, quantity)
    if not _initialised():
        return fn(features, gram=True, **kw)
    F = features.reshape(features.shape[0], -1)
    group = dist.group.WORLD if group is None else group
    counts = row_counts(F.shape[0], F.device, group)
    n_total, D = sum(counts), F.shape[-1]
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
        rtol = kw.get("rtol")
        tol = _spectrum.resolve_rtol(rtol, (n_total, D), Fv.dtype, xp)
        s, W, err_rel, ok = _spectrum.accept_gram(H, (n_total, D), xp, True, Fv.dtype, tol)
        if bool(ok):
            args = (n_total, quantity, rtol, kw.get("tie_rtol"), dist.get_world_size(group))
            return _GramValue.apply(Fv, s, W, err_rel, *args).to(features.dtype)
    return fn(_gather_rows(F, group, counts), gram=True, **kw)


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
        This rank's features ``F_r``, flattened to ``(N_r, D)``; ``N_r`` may differ between
        ranks.
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
    >>> import torch, condreg.torch.distributed as cd
    >>> cd.condition_number(torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
    tensor(4., dtype=torch.float64)
    """
    return _value("condition_number", features, group, strategy, rtol=rtol)


def r_well(
    features: torch.Tensor, *, group: dist.ProcessGroup | None = None, strategy: Strategy = "auto"
) -> torch.Tensor:
    """R_well(H) = ½ λ_1² − ‖H‖_F² / (2D) of ``H = Σ_r F_rᵀF_r``, differentiable.

    Parameters
    ----------
    features : torch.Tensor
        This rank's features ``F_r``, ``(N_r, D)``, as in :func:`condition_number`.
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
    return _value("r_well", features, group, strategy)


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
        This rank's features ``F_r``, ``(N_r, D)``, as in :func:`condition_number`.
    group : torch.distributed.ProcessGroup, optional
        The ranks whose rows form the batch (default: the world).
    strategy : {"auto", "gram", "gather"}
        How to get the spectrum of ``H``; ``"auto"``: :func:`choose_strategy`.
    rtol, tie_rtol : float, optional
        Rank tolerance on the singular values of ``F`` and tie tolerance relative to ``σ_1``.

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
    return _value("r_ill", features, group, strategy, rtol=rtol, tie_rtol=tie_rtol)
