"""Algorithm 1 in the Hugging Face ``Trainer`` (the ``hf`` extra): immunize one
``nn.Linear`` of any model (docs/immunization.md; several processes: docs/scaling.md)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
import transformers
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

from condreg.torch.nn import ConditionRegularizer, Precondition, rows

__all__ = ["ImmunizationTrainer"]


class ImmunizationTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` training on ``model(**inputs).loss + λ_P R_well(F_PᵀF_P) +
    λ_H R_ill(F_HᵀF_H)``, ``F`` the immunized map's preconditioned outputs on the training batch and
    on a harmful batch; ``self.last_terms`` is the last step's ``(task, reg)``.

    Parameters
    ----------
    harmful_dataset : torch.utils.data.Dataset
        The harmful task's model inputs (labels are dropped), drawn with the trainer's collator.
    immunized : str or torch.nn.Module
        The ``nn.Linear`` (or any ``F = zθ`` of its first input) or its name in the model.
    lam_p, lam_h : float
        Weights of R_well (pre-training features) and R_ill (harmful features), ``>= 0``.
    ridge : float
        Ridge of the preconditioner (0: pseudo-inverse).
    normalize : bool
        Scale-free terms (see :class:`condreg.torch.nn.ConditionRegularizer`).
    local : bool
        ``True``: on several processes each uses its own rows (default: the global batch).
    *args, **kwargs
        Passed to ``transformers.Trainer`` (``model``, ``args``, ``train_dataset``, …).

    Raises
    ------
    ValueError
        If ``immunized`` names no module of the model (training errors: :meth:`compute_loss`).
    TypeError
        If ``immunized`` is neither a module nor a name.
    """

    def __init__(
        self,
        *args: Any,
        harmful_dataset: Dataset,
        immunized: str | nn.Module,
        lam_p: float = 1.0,
        lam_h: float = 1.0,
        ridge: float = 1e-4,
        normalize: bool = True,
        local: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(immunized, str):
            modules = dict(self.model.named_modules())
            if immunized not in modules:
                raise ValueError(f"the model has no module named {immunized!r}")
            immunized = modules[immunized]
        if not isinstance(immunized, nn.Module):
            raise TypeError(f"immunized must be a module or its name, got {type(immunized)}")
        self.immunized_module = immunized
        self.harmful_dataset = harmful_dataset
        self.reg = ConditionRegularizer(lam_p, lam_h, normalize=normalize, local=local)
        self.pre = Precondition(ridge, local=local)
        self._captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._harmful: Iterator[Any] | None = None
        self.last_terms: tuple[float, float] | None = None
        immunized.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        if module.training and torch.is_grad_enabled():
            self._captured.append((inputs[0], output))

    def _harmful_batches(self) -> Iterator[Any]:
        data, seed = self.harmful_dataset, int(self.args.seed)
        kw = {"batch_size": self.args.per_device_train_batch_size, "collate_fn": self.data_collator}
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        for epoch in itertools.count():
            if world > 1:  # each process its share of every pass, as the training data
                sampler: Any = DistributedSampler(data, shuffle=True, seed=seed)
                sampler.set_epoch(epoch)
            else:
                sampler = RandomSampler(data, generator=torch.Generator().manual_seed(seed + epoch))
            yield from DataLoader(data, sampler=sampler, **kw)

    def _next_harmful(self) -> dict[str, torch.Tensor]:
        if self._harmful is None:
            self._harmful = self._harmful_batches()
        batch = next(self._harmful)
        if not isinstance(batch, Mapping):
            raise TypeError(
                "harmful_dataset must give mappings of model inputs (e.g. {'input_ids': ..., "
                f"'attention_mask': ...}}), the collator gave a {type(batch).__name__}"
            )
        batch = dict(batch)
        for key in ("labels", "label", "label_ids"):
            batch.pop(key, None)
        return {k: v.to(self.args.device) if torch.is_tensor(v) else v for k, v in batch.items()}

    def _features(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        if len(self._captured) != 1:
            raise RuntimeError(
                f"the immunized module ran {len(self._captured)} times in one forward pass; "
                "ImmunizationTrainer needs exactly one call per forward"
            )
        mask, out = inputs.get("attention_mask"), []
        for t in self._captured.pop():
            if t.ndim == 3 and mask is not None and mask.shape == t.shape[:-1]:
                out.append(t[mask.bool()])
            else:
                out.append(rows(t, "the immunized module's input/output"))
        return out

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """The model's loss plus the regularizer (training), or the model's loss (evaluation).

        Parameters
        ----------
        model : torch.nn.Module
            The model being trained.
        inputs : dict
            The batch: the model's inputs and ``labels``.
        return_outputs : bool
            Also return the model's outputs on ``inputs``.
        num_items_in_batch : optional
            Passed by ``transformers.Trainer``; used only in evaluation (the model's own loss).

        Returns
        -------
        torch.Tensor or tuple
            The 0-d loss, or ``(loss, outputs)`` with ``return_outputs=True``.

        Raises
        ------
        TypeError
            If a training or harmful batch is not a mapping.
        ValueError
            If the model returns no loss (the batch has no ``labels``).
        RuntimeError
            If the immunized module does not run exactly once per forward pass.
        """
        if not model.training:  # evaluation: the model's own loss
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if not isinstance(inputs, Mapping):
            raise TypeError(f"a training batch must be a mapping, got {type(inputs).__name__}")
        self._captured.clear()
        out_p = model(**inputs)
        if getattr(out_p, "loss", None) is None:
            raise ValueError(
                "the model returned no loss: a training batch needs 'labels' (the model's inputs "
                f"and 'labels'), got keys {sorted(inputs)}"
            )
        z_p, f_p = self._features(inputs)
        x_h = self._next_harmful()
        model(**x_h)
        z_h, f_h = self._features(x_h)
        reg = self.reg(self.pre(f_p, z_p), self.pre(f_h, z_h))
        loss = out_p.loss + reg
        self.last_terms = (float(out_p.loss.detach()), float(reg.detach()))
        return (loss, out_p) if return_outputs else loss
