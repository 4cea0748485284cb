"""Scaling condreg's regularizers out with ``torch.distributed`` (nothing home-made).

The probing Hessian of a data-parallel batch is that of all ranks' features together,
``H = Σ_r F_rᵀF_r = FᵀF`` with ``F`` the rows of every rank stacked. :func:`gather_features`
stacks them with PyTorch's own differentiable all-gather, so

    loss_reg = lam_h * condreg.r_ill(gather_features(F_local), gram=True)

has the same value on every rank and its backward sends each rank the gradient for its own rows.

Gradient scale. The all-gather's backward sums the incoming gradients of all ranks
(reduce-scatter), and every rank holds the same replicated loss: the gradient reaching ``F_local``
is ``world_size ×`` the gradient of that loss with respect to those rows. Under
``DistributedDataParallel`` — which averages parameter gradients over ranks — this is exactly
right: the averaged parameter gradient is the full gradient of the regularizer. Without DDP (a
hand-rolled loop that sums, or no reduction at all), divide the regularizer by ``world_size``.

Cost: one all-gather of ``N_local × D`` features per step; the SVD then runs on the gathered
``(world_size·N_local) × D`` matrix on every rank (``O(N²D)``, small next to the network for the
batch sizes probing Hessians are estimated from).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["gather_features"]


def gather_features(features: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Differentiable all-gather of a feature batch along axis 0 over ``group`` (default: the
    world). Returns ``features`` itself when ``torch.distributed`` is not initialised, so the same
    training code runs on one process.

    Uses ``torch.distributed``'s autograd-aware functional collectives
    (``all_gather_single_autograd`` on recent PyTorch, ``all_gather_tensor_autograd`` before it),
    falling back to ``torch.distributed.nn.functional.all_gather``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return features
    group = dist.group.WORLD if group is None else group
    from torch.distributed import _functional_collectives as fc

    for name in ("all_gather_single_autograd", "all_gather_tensor_autograd"):
        gather = getattr(fc, name, None)
        if gather is not None:
            out = gather(features.contiguous(), gather_dim=0, group=group)
            wait = getattr(out, "wait", None)
            return wait() if callable(wait) else out
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(features.contiguous(), group=group), dim=0)
