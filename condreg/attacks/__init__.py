"""Attacks on an immunized extractor, so the κ a defense buys reads as steps and accuracy.

- :func:`probe`: linear probing of fixed features ``A = Xθ`` by named optimizers
  (:data:`ATTACKERS`); eager, on any Array API library (docs/attacks.md).
- :func:`finetune`: fine-tuning attackers on a ``torch.nn.Module`` — a new linear head (also
  on whitened features, or started at the least-squares fit), LoRA adapters on the immunized
  block, the block, or every parameter (:data:`FINETUNE_ATTACKERS`), with SGD or AdamW, a
  constant or warmup + cosine schedule, at a rate swept on held-out data; compared with the
  un-immunized model by :func:`finetune_deficit` and :func:`steps_to_target` (docs/tamper.md).
- :func:`finetune_search`: the attacker's best optimizer × schedule × rate on held-out data,
  by successive halving, its rate grids extended beyond their edges (docs/attacks.md).
- :func:`tangent_condition`: κ of the empirical tangent kernel of the parameters an attacker
  trains, the condition number of its own problem (docs/attacks.md).
"""

from condreg.attacks._curves import (
    FINETUNE_ATTACKERS,
    FinetuneResult,
    finetune_deficit,
    steps_to_target,
)
from condreg.attacks._finetune import (
    LR_GRIDS,
    OPTIMIZERS,
    SCHEDULES,
    finetune,
    finetune_search,
)
from condreg.attacks._probe import ATTACKERS, ProbeResult, probe, steps_to_reduction
from condreg.attacks._tangent import tangent_condition

__all__ = [
    "ATTACKERS",
    "FINETUNE_ATTACKERS",
    "LR_GRIDS",
    "OPTIMIZERS",
    "SCHEDULES",
    "FinetuneResult",
    "ProbeResult",
    "finetune",
    "finetune_deficit",
    "finetune_search",
    "probe",
    "steps_to_reduction",
    "steps_to_target",
    "tangent_condition",
]
