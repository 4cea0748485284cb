"""Algorithm 1 in PyTorch Lightning (the ``lightning`` extra): a
``LightningModule`` that immunizes one linear map (docs/immunization.md, docs/scaling.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from torch import nn

from condreg.torch._data_parallel import global_quantity, process_group
from condreg.torch.nn import ConditionRegularizer, Precondition, rows
from condreg.torch.weights import weight_conditioning_loss

__all__ = ["ImmunizationModule"]


class ImmunizationModule(L.LightningModule):
    """Algorithm 1 on ``immunized``: ``task(head(F_P), y_P) + λ_P R_well(F_PᵀF_P) +
    λ_H R_ill(F_HᵀF_H)``, the regularizer's ``F`` through :class:`~condreg.torch.nn.Precondition`.

    Parameters
    ----------
    backbone, immunized, head : nn.Module
        ``z = backbone(x)``, the linear map ``F = immunized(z)`` and ``logits = head(F)``.
    lam_p, lam_h : float
        Weights of R_well (pre-training features) and R_ill (harmful features), ``>= 0``.
    ridge : float
        Ridge of the preconditioner, ``ε = ridge·λ_max(K)`` (0: pseudo-inverse).
    normalize : bool
        Passed to :class:`~condreg.torch.nn.ConditionRegularizer` (scale-free terms).
    task_loss : callable
        ``task_loss(head(F_P), y_P)``; default ``torch.nn.functional.cross_entropy``.
    lr : float
        Learning rate of the SGD of :meth:`configure_optimizers` (override it for another one).
    momentum : float
        Its momentum.
    lam_weights : float
        Weight of the weight-conditioning penalty of ``backbone`` and ``head`` (0: off), logged.
    weights_kwargs : mapping, optional
        Keyword arguments of :func:`condreg.torch.weights.weight_conditioning_loss`.
    log_kappa : bool
        Also log ``kappa_hp`` and ``kappa_hh`` of the batch (``task``, ``reg`` always).
    local : bool
        ``True``: under data parallelism each process uses its own rows (default: global batch).

    Raises
    ------
    ValueError
        For ``lr <= 0``, negative weights or ridge; in :meth:`training_step`, a malformed batch.

    Examples
    --------
    >>> import torch, condreg.torch.lightning as cl
    >>> lin, x, y = torch.nn.Linear, torch.randn(16, 8), torch.randint(0, 2, (16,))
    >>> module = cl.ImmunizationModule(torch.nn.Identity(), lin(8, 8, bias=False), lin(8, 2))
    >>> loss = module.training_step({"pretrain": (x, y), "harmful": (torch.randn(16, 8),)}, 0)
    """

    def __init__(
        self,
        backbone: nn.Module,
        immunized: nn.Module,
        head: nn.Module,
        *,
        lam_p: float = 1.0,
        lam_h: float = 1.0,
        ridge: float = 1e-4,
        normalize: bool = True,
        task_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        lr: float = 5e-3,
        momentum: float = 0.9,
        lam_weights: float = 0.0,
        weights_kwargs: Mapping[str, Any] | None = None,
        log_kappa: bool = False,
        local: bool = False,
    ) -> None:
        super().__init__()
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if lam_weights < 0:
            raise ValueError(f"lam_weights must be >= 0, got {lam_weights}")
        self.backbone, self.immunized, self.head = backbone, immunized, head
        self.reg = ConditionRegularizer(lam_p, lam_h, normalize=normalize, local=local)
        self.pre = Precondition(ridge, local=local)
        self.local = bool(local)
        self.task_loss = task_loss or nn.functional.cross_entropy
        self.lr, self.momentum, self.lam_weights = float(lr), float(momentum), float(lam_weights)
        self.weights_kwargs, self.log_kappa = dict(weights_kwargs or {}), bool(log_kappa)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits ``head(immunized(backbone(x)))``.

        Parameters
        ----------
        x : torch.Tensor
            A batch of the backbone's inputs.

        Returns
        -------
        torch.Tensor
        """
        return self.head(self.immunized(self.backbone(x)))

    @staticmethod
    def _unpack(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        expected = (
            "ImmunizationModule expects batches {'pretrain': (x_p, y_p), 'harmful': x_h or "
            "(x_h, ...)} (e.g. a CombinedLoader of two loaders)"
        )
        if not isinstance(batch, Mapping):
            raise ValueError(f"{expected}, got a {type(batch).__name__}")
        missing = sorted({"pretrain", "harmful"} - set(batch))
        if missing:
            raise ValueError(f"{expected}; missing {missing}, got keys {sorted(map(str, batch))}")
        pre, x_h = batch["pretrain"], batch["harmful"]
        if not isinstance(pre, (tuple, list)) or len(pre) < 2:
            raise ValueError(f"{expected}; 'pretrain' is not a pair (x_p, y_p)")
        if isinstance(x_h, (tuple, list)):
            if not x_h:
                raise ValueError(f"{expected}; 'harmful' is empty")
            x_h = x_h[0]
        return pre[0], pre[1], x_h

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        """The 0-d loss of one combined batch (the class's formula and the weight penalty), logged.

        Parameters
        ----------
        batch : mapping
            ``{"pretrain": (x_p, y_p), "harmful": x_h or (x_h, ...)}``.
        batch_idx : int
            The batch's index (unused; Lightning passes it).

        Returns
        -------
        torch.Tensor

        Raises
        ------
        ValueError
            For a batch of another structure.
        """
        x_p, y_p, x_h = self._unpack(batch)
        z_p, z_h = self.backbone(x_p), self.backbone(x_h)
        f_p, f_h = self.immunized(z_p), self.immunized(z_h)
        task = self.task_loss(self.head(f_p), y_p)
        reg = self.reg(self.pre(f_p, z_p), self.pre(f_h, z_h))
        loss = task + reg
        logs = {"task": task.detach(), "reg": reg.detach()}
        if self.lam_weights:
            parts = nn.ModuleDict({"backbone": self.backbone, "head": self.head})
            w = weight_conditioning_loss(parts, **self.weights_kwargs)
            loss = loss + self.lam_weights * w
            logs["weights"] = w.detach()
        if self.log_kappa:
            group = process_group(self.local, None)
            with torch.no_grad():
                logs["kappa_hp"] = global_quantity("condition_number", rows(f_p.detach()), group)
                logs["kappa_hh"] = global_quantity("condition_number", rows(f_h.detach()), group)
        self.log_dict(logs, batch_size=int(x_p.shape[0]))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with ``lr`` and ``momentum`` over every parameter."""
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
