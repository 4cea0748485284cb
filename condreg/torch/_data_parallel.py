"""The global batch of a data-parallel step for :mod:`condreg.torch.nn` (docs/scaling.md); each
function is the single-process one for ``group=None``."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F_
from array_api_compat import array_namespace

import condreg
from condreg import _precondition, _spectrum
from condreg.torch import distributed as cdist

__all__ = ["process_group", "normalized", "global_quantity", "global_sample_precondition"]


def process_group(local: bool, group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The process group to reduce over, or ``None`` for a single-process computation
    (``local=True``, or no initialised ``torch.distributed``)."""
    if local or not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.group.WORLD if group is None else group


def normalized(F: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``F`` over the detached Frobenius norm of every rank's rows (a zero batch stays zero)."""
    sq = torch.linalg.vector_norm(F.detach()).square()
    if group is not None:
        sq = sq.clone()
        dist.all_reduce(sq, group=group)
    norm = sq.sqrt()
    return F / torch.where(norm > 0, norm, torch.ones_like(norm))


def global_quantity(
    quantity: str, F: torch.Tensor, group: dist.ProcessGroup | None, rtol: float | None = None
) -> torch.Tensor:
    """``condreg.torch.distributed.<quantity>`` of the rows ``F`` (``N_r×D``) of every rank,
    uneven row counts included."""
    kw = {} if quantity == "r_well" else {"rtol": rtol}
    if group is None:
        return getattr(condreg, quantity)(F, gram=True, **kw)
    return getattr(cdist, quantity)(F, group=group, **kw)


def _gram_route(
    x: torch.Tensor, g: torch.Tensor, ridge: float, tol: float, group: dist.ProcessGroup
) -> torch.Tensor | None:
    """``x_r V diag(1/(λ(λ+ε))) Vᵀ M`` from the all-reduced ``[K | M]``, or ``None`` where the
    eigh of ``K`` does not resolve its spectrum (``λ_min < max(√eps, tol²)·λ_max``)."""
    d = x.shape[1]
    KM = torch.cat([x.mT @ x, x.mT @ g], dim=1)
    dist.all_reduce(KM, group=group)
    K, M = KM[:, :d], KM[:, d:]
    if not bool(torch.isfinite(KM).all()):
        return None
    lam, V = torch.linalg.eigh(K)
    floor = max(math.sqrt(torch.finfo(torch.float64).eps), tol * tol)
    if not bool(lam[-1] > 0) or not bool(lam[0] >= floor * lam[-1]):
        return None
    f = 1.0 / (lam * (lam + ridge * lam[-1]))
    return x @ ((V * f) @ (V.mT @ M))


def _gather_route(
    x: torch.Tensor, g: torch.Tensor, counts: list[int], ridge: float, rtol: float | None, group
) -> torch.Tensor:
    rank, top = dist.get_rank(group), max(counts)
    pad = F_.pad(torch.cat([x, g], dim=1), (0, 0, 0, top - x.shape[0]))  # zero rows up to top
    parts = [torch.empty_like(pad) for _ in counts]
    dist.all_gather(parts, pad, group=group)
    stacked = torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)], dim=0)
    xs, gs = stacked.split([x.shape[1], g.shape[1]], dim=1)
    pre = _precondition.sample_preconditioner(xs, ridge=ridge, rtol=rtol)
    start = sum(counts[:rank])
    return pre.apply(gs)[start : start + counts[rank]]


def global_sample_precondition(
    x: torch.Tensor,
    g: torch.Tensor,
    ridge: float,
    rtol: float | None,
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """This rank's rows of ``(x xᵀ + ε I)⁻¹ ḡ`` for the batch stacked over ``group``: an all-reduce
    of ``[xᵀx | xᵀḡ]`` when that resolves the spectrum, else an all-gather of ``[x | ḡ]``."""
    if group is None:
        return _precondition.sample_preconditioner(x, ridge=ridge, rtol=rtol).apply(g.to(x.dtype))
    counts = cdist.row_counts(x.shape[0], x.device, group)
    n_total, d = sum(counts), x.shape[1]
    if cdist.choose_strategy(n_total, d) == "gram":
        tol = _spectrum.resolve_rtol(rtol, (n_total, d), x.dtype, array_namespace(x))
        out = _gram_route(x.to(torch.float64), g.to(torch.float64), float(ridge), tol, group)
        if out is not None:
            return out.to(x.dtype)
    return _gather_route(x, g.to(x.dtype), counts, float(ridge), rtol, group)
