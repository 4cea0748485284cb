"""The global batch of a data-parallel step for condreg's PyTorch training adapters.

Under an initialised ``torch.distributed`` process group (plain DDP, Lightning's ``"ddp"``
strategies, the Hugging Face ``Trainer`` under ``torchrun`` / ``accelerate launch``) the adapters
of :mod:`condreg.torch.nn` compute on the rows of every rank together:

- the regularizer's values through :mod:`condreg.torch.distributed` (a ``D×D`` Gram all-reduce or
  a feature all-gather, chosen there), :func:`global_quantity`: ranks with fewer rows (token
  features after their padding is dropped) add zero rows up to the largest rank's count (zero rows
  change no Gram ``FᵀF``; the default rank tolerance is that of the true ``N_total``), so the
  gather also works for uneven rows — one more all-gather of ``W`` row counts;
- the feature normalisation from the global Frobenius norm (one all-reduced number);
- the dummy layer's sample-axis preconditioner from the global ``K = Σ_r x_rᵀx_r`` (below).

Preconditioner, per backward (``N_r`` rows of ``x`` (``D_in`` columns) and of the incoming
gradient ``ḡ`` (``D`` columns) on rank ``r``, ``W`` ranks): the row counts are all-gathered
(``W`` numbers); then

``"gram"`` (``N_total ≥ D_in``)
    one all-reduce of ``[K | M]``, ``K = Σ x_rᵀx_r``, ``M = Σ x_rᵀḡ_r`` (``D_in·(D_in + D)``
    numbers, float64); with ``K = V diag(λ) Vᵀ`` every rank returns
    ``x_r V diag(1/(λ(λ + ε))) Vᵀ M`` — the rows of ``U diag(1/(s² + ε)) Uᵀ ḡ`` of the stacked
    batch (``x = U S Vᵀ``, ``λ = s²``). An eigendecomposition of ``K`` is accurate to
    ``eps·κ(K)``, so this route is taken only when ``λ_min ≥ √eps·λ_max`` (float64) and the rank
    rule drops no direction; otherwise (rank-deficient or ill-conditioned inputs) the gather route
    decides — the same decision on every rank, as ``K`` is the same.
``"gather"``
    one all-gather of ``[x_r | ḡ_r]`` (``W·max_r N_r·(D_in + D)`` numbers, rows padded to the
    largest rank's); every rank applies the single-process preconditioner to the stacked batch and
    keeps its own rows.

Both give each rank the rows the single process would compute on the stacked batch, so the
parameter gradient summed over ranks (DDP averages it, times the ``W`` of the regularizer's
gradient, :mod:`condreg.torch.distributed`) is the single-process one.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from array_api_compat import array_namespace

from condreg import _precondition
from condreg.torch import distributed as cdist
from condreg.torch.distributed import choose_strategy

__all__ = ["process_group", "global_norm", "global_quantity", "global_sample_precondition"]


def process_group(local: bool, group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The process group to reduce over, or ``None`` for a single-process computation
    (``local=True``, or no initialised ``torch.distributed``)."""
    if local or not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.group.WORLD if group is None else group


def global_norm(F: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The detached Frobenius norm of the rows of every rank (of ``F`` alone for ``group=None``)."""
    sq = torch.linalg.vector_norm(F.detach()).square()
    if group is not None:
        sq = sq.clone()
        dist.all_reduce(sq, group=group)
    return sq.sqrt()


def _row_counts(n: int, device: torch.device, group: dist.ProcessGroup) -> list[int]:
    world = dist.get_world_size(group)
    mine = torch.tensor([n], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(counts, mine, group=group)
    return [int(c.item()) for c in counts]


def global_quantity(
    quantity: str, F: torch.Tensor, group: dist.ProcessGroup, rtol: float | None = None
) -> torch.Tensor:
    """``condreg.torch.distributed.<quantity>`` of the rows ``F`` (``N_r×D``) of every rank,
    uneven row counts included (see the module documentation)."""
    counts = _row_counts(F.shape[0], F.device, group)
    top, n_total = max(counts), sum(counts)
    if F.shape[0] < top:
        F = torch.cat([F, F.new_zeros((top - F.shape[0], F.shape[1]))], dim=0)
    fn = getattr(cdist, quantity)
    if quantity == "r_well":
        return fn(F, group=group)
    if rtol is None:
        rtol = _precondition.resolve_rtol(None, (n_total, F.shape[1]), F.dtype, array_namespace(F))
    return fn(F, group=group, rtol=rtol)


def _gram_route(
    x: torch.Tensor, g: torch.Tensor, ridge: float, tol: float, group: dist.ProcessGroup
) -> torch.Tensor | None:
    """``x_r V diag(1/(λ(λ+ε))) Vᵀ M`` from the all-reduced ``[K | M]``, or ``None`` where an
    eigendecomposition of ``K`` does not resolve its spectrum (decided alike on every rank)."""
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
    local = torch.cat([x, g], dim=1)
    pad = local.new_zeros((top, local.shape[1]))
    pad[: local.shape[0]] = local
    parts = [torch.empty_like(pad) for _ in counts]
    dist.all_gather(parts, pad, group=group)
    stacked = torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)], dim=0)
    d = x.shape[1]
    xs, gs = stacked[:, :d], stacked[:, d:]
    pre = _precondition.sample_preconditioner(xs, ridge=ridge, rtol=rtol)
    start = sum(counts[:rank])
    return pre.apply(gs)[start : start + counts[rank]]


def global_sample_precondition(
    x: torch.Tensor,
    g: torch.Tensor,
    *,
    ridge: float,
    rtol: float | None,
    group: dist.ProcessGroup,
) -> torch.Tensor:
    """This rank's rows of ``(x xᵀ + ε I)⁻¹ ḡ`` for the batch stacked over ``group``
    (``x``: ``N_r×D_in``, ``g``: ``N_r×D``; the dtype of ``x`` is that of the single-process
    computation, whose rank rule applies; see the module documentation)."""
    counts = _row_counts(x.shape[0], x.device, group)
    n_total, d = sum(counts), x.shape[1]
    if choose_strategy(n_total, d) == "gram":
        tol = _precondition.resolve_rtol(rtol, (n_total, d), x.dtype, array_namespace(x))
        x64, g64 = x.to(torch.float64), g.to(torch.float64)
        out = _gram_route(x64, g64, float(ridge), tol, group)
        if out is not None:
            return out.to(x.dtype)
    return _gather_route(x, g.to(x.dtype), counts, float(ridge), rtol, group)
