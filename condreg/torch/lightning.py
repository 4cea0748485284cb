"""Algorithm 1 in PyTorch Lightning: a ``LightningModule`` that immunizes one linear map.

Needs ``pip install 'condreg-ml[lightning]'``. :class:`ImmunizationModule` wraps three parts of a
model — ``backbone`` (anything, possibly frozen or ``nn.Identity()``), ``immunized`` (the
``nn.Linear`` whose output features ``F = zθ``, ``θ = weight.T``, are regularized) and ``head``
(the pre-training task's head) — and trains them with

    loss = task(head(F_P), y_P) + λ_P R_well(F_PᵀF_P) + λ_H R_ill(F_HᵀF_H)

where the regularizer sees the features through :class:`condreg.torch.nn.Precondition`, so one
backward pass gives Algorithm 1's ``K⁻¹``-left-preconditioned update of ``θ``
(:mod:`condreg.torch.nn` explains why the dummy layer sits on the features). The supervised
gradient is not preconditioned. A batch is a mapping ``{"pretrain": (x_P, y_P), "harmful":
(x_H, ...)}``, e.g. from ``lightning.pytorch.utilities.CombinedLoader``::

    import lightning as L
    from lightning.pytorch.utilities import CombinedLoader
    from condreg.torch.lightning import ImmunizationModule

    module = ImmunizationModule(backbone, torch.nn.Linear(d, d, bias=False), head)
    loader = CombinedLoader({"pretrain": loader_p, "harmful": loader_h}, "max_size_cycle")
    L.Trainer(max_epochs=10).fit(module, loader)

Optionally ``lam_weights > 0`` adds :func:`condreg.torch.weights.weight_conditioning_loss` of
the backbone and head (Nenov et al.'s well-conditioned weights) with ``weights_kwargs``.
Logged per step: ``task``, ``reg`` (and ``weights``), and, with ``log_kappa=True``, κ of this
batch's ``H_P`` and ``H_H``.

Under data parallelism (``strategy="ddp"``, ``"ddp_spawn"``, any strategy that initialises
``torch.distributed``) the regularizer, the preconditioner's ``K`` and the logged κ's are those of
the **global** batch, the rows of every process together (:mod:`condreg.torch.distributed`;
docs/scaling.md says what is communicated), so ``devices=2`` with 32 rows each trains as one
device on the 64 rows. ``local=True`` keeps each process's own rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from torch import nn

import condreg
from condreg.torch._data_parallel import global_quantity, process_group
from condreg.torch.nn import ConditionRegularizer, Precondition, rows

__all__ = ["ImmunizationModule"]


class ImmunizationModule(L.LightningModule):
    """A LightningModule running Algorithm 1's update on ``immunized`` (see the module docs).

    Parameters
    ----------
    backbone, immunized, head : nn.Module
        ``z = backbone(x)``, ``F = immunized(z)`` (a linear map; its input ``z`` is the
        preconditioner's ``x``), ``logits = head(F)``.
    lam_p, lam_h : float
        Weights of R_well (pre-training features) and R_ill (harmful features), ``>= 0``.
    ridge : float
        Ridge of the preconditioner, ``ε = ridge·λ_max(K)`` (0: pseudo-inverse).
    normalize : bool
        Passed to :class:`~condreg.torch.nn.ConditionRegularizer` (scale-free terms).
    task_loss : callable
        ``task_loss(head(F_P), y_P)``; default ``torch.nn.functional.cross_entropy``.
    lr, momentum : float
        The SGD optimizer of :meth:`configure_optimizers` (override it for another one).
    lam_weights : float
        Weight of the weight-conditioning penalty of ``backbone`` and ``head`` (0: off).
    weights_kwargs : mapping, optional
        Keyword arguments of :func:`condreg.torch.weights.weight_conditioning_loss`.
    log_kappa : bool
        Also log ``kappa_hp`` and ``kappa_hh`` of the batch (one small SVD each per step).
    local : bool
        ``True``: under data parallelism each process regularizes and preconditions with its own
        rows (default: the global batch).

    Raises
    ------
    ValueError
        For ``lr <= 0``, negative weights or ridge; in :meth:`training_step`, for a batch that is
        not ``{"pretrain": (x_p, y_p), "harmful": x_h or (x_h, ...)}``.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.lightning import ImmunizationModule
    >>> module = ImmunizationModule(
    ...     torch.nn.Identity(), torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 2)
    ... )
    >>> batch = {"pretrain": (torch.randn(16, 8), torch.randint(0, 2, (16,))),
    ...          "harmful": (torch.randn(16, 8),)}
    >>> loss = module.training_step(batch, 0)
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
        self.lr, self.momentum = float(lr), float(momentum)
        self.lam_weights = float(lam_weights)
        self.weights_kwargs = dict(weights_kwargs or {})
        self.log_kappa = bool(log_kappa)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``head(immunized(backbone(x)))``."""
        return self.head(self.immunized(self.backbone(x)))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The immunized features ``F = immunized(backbone(x))`` as rows: ``(N, D)``, token
        features ``(B, T, D)`` as ``(B·T, D)`` (:func:`condreg.torch.nn.rows`)."""
        return rows(self.immunized(self.backbone(x)))

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

    def _kappas(self, f_p: torch.Tensor, f_h: torch.Tensor) -> dict[str, torch.Tensor]:
        group = process_group(self.local, None)
        with torch.no_grad():
            fp, fh = rows(f_p.detach()), rows(f_h.detach())
            if group is None:
                kp, kh = (condreg.condition_number(f, gram=True) for f in (fp, fh))
            else:
                kp, kh = (global_quantity("condition_number", f, group) for f in (fp, fh))
        return {"kappa_hp": kp, "kappa_hh": kh}

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        """Task loss plus the preconditioned regularizer of one combined batch (see the class)."""
        x_p, y_p, x_h = self._unpack(batch)
        z_p, z_h = self.backbone(x_p), self.backbone(x_h)
        f_p, f_h = self.immunized(z_p), self.immunized(z_h)
        task = self.task_loss(self.head(f_p), y_p)
        reg = self.reg(self.pre(f_p, z_p), self.pre(f_h, z_h))
        loss = task + reg
        logs = {"task": task.detach(), "reg": reg.detach()}
        if self.lam_weights:
            from condreg.torch.weights import weight_conditioning_loss

            w = weight_conditioning_loss(
                nn.ModuleDict({"backbone": self.backbone, "head": self.head}),
                **self.weights_kwargs,
            )
            loss = loss + self.lam_weights * w
            logs["weights"] = w.detach()
        if self.log_kappa:
            logs.update(self._kappas(f_p, f_h))
        self.log_dict(logs, batch_size=int(x_p.shape[0]))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with ``lr`` and ``momentum`` over every parameter."""
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
