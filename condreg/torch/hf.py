"""Algorithm 1 in the Hugging Face ``Trainer``: immunize one ``nn.Linear`` of any model.

Needs ``pip install condreg[hf]`` (``transformers``, ``accelerate``). :class:`ImmunizationTrainer`
is a ``transformers.Trainer`` whose loss is

    model(**inputs).loss + λ_P R_well(F_PᵀF_P) + λ_H R_ill(F_HᵀF_H)

where ``F`` are the outputs of the immunized linear map (named by ``immunized``, e.g.
``"bert.pooler.dense"``), captured with a forward hook on the pre-training batch and on a
harmful batch drawn from ``harmful_dataset``; the map's inputs ``z`` feed
:class:`condreg.torch.nn.Precondition`, so the update of the map's weight is Algorithm 1's
``K⁻¹``-left-preconditioned one (the supervised gradient is not preconditioned). Token features
``(batch, tokens, d)`` become ``(tokens, d)`` rows; with an ``attention_mask`` in the batch,
padding tokens are left out. The model itself is unchanged (no wrapper, no new parameters)::

    from condreg.torch.hf import ImmunizationTrainer

    trainer = ImmunizationTrainer(
        model=model, args=training_args, train_dataset=pretrain, harmful_dataset=harmful,
        immunized="bert.pooler.dense", lam_p=1.0, lam_h=1.0,
    )
    trainer.train()

The harmful batches are drawn with the trainer's collator and batch size
(``per_device_train_batch_size``), reshuffled every pass; their labels, if any, are dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
import transformers
from torch import nn
from torch.utils.data import DataLoader, Dataset

from condreg.torch.nn import ConditionRegularizer, Precondition

__all__ = ["ImmunizationTrainer"]


class ImmunizationTrainer(transformers.Trainer):
    """A ``transformers.Trainer`` adding condreg's preconditioned regularizer to the model's loss.

    The model must return a ``loss`` when given ``labels`` (any ``*ForSequenceClassification``
    model does). ``self.last_terms`` holds the detached ``(task, reg)`` of the last step. The
    ``Trainer``'s own arguments are passed through.

    Parameters
    ----------
    harmful_dataset : torch.utils.data.Dataset
        Examples of the harmful task (model inputs; labels are ignored).
    immunized : str or torch.nn.Module
        The ``nn.Linear`` (or any module whose first positional input ``z`` and output ``F``
        satisfy ``F = zθ``) whose features are regularized: a module of the model or its name in
        ``model.named_modules()``.
    lam_p, lam_h : float
        Weights of R_well (pre-training features) and R_ill (harmful features), ``>= 0``.
    ridge : float
        Ridge of the preconditioner (0: pseudo-inverse).
    normalize : bool
        Scale-free terms (see :class:`condreg.torch.nn.ConditionRegularizer`).

    Raises
    ------
    ValueError
        If ``immunized`` names no module of the model.
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
        self.reg = ConditionRegularizer(lam_p, lam_h, normalize=normalize)
        self.pre = Precondition(ridge)
        self._captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._harmful: Iterator[Any] | None = None
        self.last_terms: tuple[float, float] | None = None
        immunized.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        if module.training and torch.is_grad_enabled():
            self._captured.append((inputs[0], output))

    def _harmful_batches(self) -> Iterator[Any]:
        loader = DataLoader(
            self.harmful_dataset,
            batch_size=self.args.per_device_train_batch_size,
            shuffle=True,
            collate_fn=self.data_collator,
        )
        return itertools.chain.from_iterable(iter(loader) for _ in itertools.count())

    def _next_harmful(self) -> dict[str, torch.Tensor]:
        if self._harmful is None:
            self._harmful = self._harmful_batches()
        batch = dict(next(self._harmful))
        for key in ("labels", "label", "label_ids"):
            batch.pop(key, None)
        return {k: v.to(self.args.device) if torch.is_tensor(v) else v for k, v in batch.items()}

    @staticmethod
    def _rows(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if t.ndim > 2 and mask is not None and mask.shape == t.shape[:-1]:
            return t[mask.bool()]
        return t.reshape(-1, t.shape[-1])

    def _features(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self._captured) != 1:
            raise RuntimeError(
                f"the immunized module ran {len(self._captured)} times in one forward pass; "
                "ImmunizationTrainer needs exactly one call per forward"
            )
        z, f = self._captured.pop()
        mask = inputs.get("attention_mask")
        return self._rows(z, mask), self._rows(f, mask)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        if not model.training:  # evaluation: the model's own loss
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._captured.clear()
        out_p = model(**inputs)
        if getattr(out_p, "loss", None) is None:
            raise ValueError("the model returned no loss: give it labels")
        z_p, f_p = self._features(inputs)
        x_h = self._next_harmful()
        model(**x_h)
        z_h, f_h = self._features(x_h)
        reg = self.reg(self.pre(f_p, z_p), self.pre(f_h, z_h))
        loss = out_p.loss + reg
        self.last_terms = (float(out_p.loss.detach()), float(reg.detach()))
        return (loss, out_p) if return_outputs else loss
