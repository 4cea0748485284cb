"""Typed settings of the fine-tuning attack study, checked by :func:`resolve` before any work."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from typing import Any

from condreg.attacks import OPTIMIZERS
from condreg_experiments import UsageError
from condreg_experiments.deepnet import settings as deep

__all__ = ["ATTACKERS", "ATTACK_LR_GRIDS", "DOMAINS", "OPTIMIZERS", "QUICK", "Settings", "resolve"]

#: The study's attackers: :data:`condreg.attacks.FINETUNE_ATTACKERS`, LoRA at ranks 8 and 32.
ATTACKERS: tuple[str, ...] = (
    "linear_probe",
    "lora_r8",
    "lora_r32",
    "finetune_block",
    "finetune_all",
)

#: Harmful tasks: MNIST digits 5–9 ("same" domain as D_P = digits 0–4) or scikit-learn's 8×8
#: handwritten digits 5–9 brought to MNIST's format ("cross").
DOMAINS: tuple[str, ...] = ("same", "cross")

#: The study's learning-rate grid per attacker and optimizer (keys ``attacker/optimizer``, LoRA
#: at every rank; the optimizers are :data:`condreg.attacks.OPTIMIZERS`): half-decade steps
#: around the rates that attacker is used with — larger for a head or adapters alone, smaller
#: for the whole network — the same for every method. (:data:`condreg.attacks.LR_GRIDS`, one
#: grid per optimizer for every attacker, is ``finetune``'s default; the study passes these.)
ATTACK_LR_GRIDS: dict[str, tuple[float, ...]] = {
    "linear_probe/sgd": (0.01, 0.03, 0.1, 0.3),
    "linear_probe/adamw": (3e-3, 1e-2, 3e-2),
    "lora/sgd": (0.01, 0.03, 0.1, 0.3),
    "lora/adamw": (3e-3, 1e-2, 3e-2),
    "finetune_block/sgd": (3e-3, 0.01, 0.03, 0.1),
    "finetune_block/adamw": (1e-3, 3e-3, 1e-2),
    "finetune_all/sgd": (1e-3, 3e-3, 0.01, 0.03),
    "finetune_all/adamw": (3e-4, 1e-3, 3e-3),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The attack matrix's own knobs; ``base`` holds pre-training and immunization (the deep-net
    study's :class:`condreg_experiments.deepnet.Settings`)."""

    base: deep.Settings = deep.Settings()
    domains: tuple[str, ...] = DOMAINS
    attackers: tuple[str, ...] = ATTACKERS
    optimizers: tuple[str, ...] = OPTIMIZERS
    attack_steps: int = 100  # the budget: optimizer steps of every attacker
    attack_batch: int = 32
    eval_every: int = 20
    lr_grids: Mapping[str, tuple[float, ...]] = dataclasses.field(
        default_factory=lambda: dict(ATTACK_LR_GRIDS)
    )  # SGD with momentum 0.9, AdamW with weight decay 0.01
    lr_grid_sgd: tuple[float, ...] | None = None  # if given: every attacker's SGD grid
    lr_grid_adamw: tuple[float, ...] | None = None  # if given: every attacker's AdamW grid
    attack_val_fraction: float = 0.2  # of D_H's training split: the rate sweep's held-out data
    target_fraction: float = 0.9  # steps to target: this share of the identity's final accuracy
    holds_at: float = 0.1  # "held": the deficit is at least this on every seed …
    utility_drop: float = 0.05  # … and D_P test accuracy fell by at most this (mean over seeds)

    def grid(self, attacker: str, optimizer: str) -> tuple[float, ...]:
        """The learning-rate grid swept for ``attacker`` (``lora_r8`` … count as ``lora``) with
        ``optimizer``."""
        fixed = self.lr_grid_sgd if optimizer == "sgd" else self.lr_grid_adamw
        family = "lora" if attacker.startswith("lora") else attacker
        return fixed if fixed is not None else tuple(self.lr_grids[f"{family}/{optimizer}"])

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values; ``base`` as its own dict."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "base"}
        return {"base": self.base.to_json(), **out}


#: ``--quick``: one seed, one domain, a short budget (about two minutes on 2 cores).
QUICK: dict[str, Any] = dict(domains=("same",), attack_steps=20, eval_every=10)
QUICK["lr_grids"] = {k: v[1:3] for k, v in ATTACK_LR_GRIDS.items()}  # the middle rates
#: ``--quick``'s pre-training and immunization (beside the deep-net study's own quick values).
QUICK_BASE: dict[str, Any] = dict(n_per_digit=150, pretrain_epochs=4, immunize_steps=30)
QUICK_BASE.update(reg_steps=(0.003, 0.01), rir_groups=5)

_OWN = {f.name for f in dataclasses.fields(Settings)} - {"base"}
_TUPLES = {"domains": str, "attackers": str, "optimizers": str}
_TUPLES |= {"lr_grid_sgd": float, "lr_grid_adamw": float}


def _coerce(key: str, value: Any) -> Any:
    return deep.as_tuple(key, value, _TUPLES[key], "tamper") if key in _TUPLES else value


def _subset(name: str, values: tuple[str, ...], known: tuple[str, ...]) -> None:
    bad = [v for v in values if v not in known]
    if bad or not values or len(set(values)) != len(values):
        raise UsageError(
            f"--{name.replace('_', '-')} {','.join(values) or '(empty)'}: choose distinct "
            f"values among {','.join(known)}"
        )


def _check(s: Settings) -> None:
    _subset("domains", s.domains, DOMAINS)
    _subset("attackers", s.attackers, ATTACKERS)
    _subset("optimizers", s.optimizers, OPTIMIZERS)
    if s.base.large and s.domains != ("same",):
        raise UsageError(
            "a large --arch attacks its own --harmful-dir: use --domains same (the cross-domain "
            "task is the MNIST study's)"
        )
    if s.base.target != "block":
        raise UsageError("the attack study immunizes the block itself (target=block)")
    for key in ("attack_steps", "attack_batch", "eval_every"):
        v = getattr(s, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{key} must be a positive integer, got {v!r}")
    grids = {k: getattr(s, k) for k in ("lr_grid_sgd", "lr_grid_adamw")} | dict(s.lr_grids)
    if set(s.lr_grids) != set(ATTACK_LR_GRIDS):
        raise UsageError(f"lr_grids needs exactly the keys {', '.join(ATTACK_LR_GRIDS)}")
    for key, grid in grids.items():
        if grid is not None and (not grid or min(grid) <= 0):
            raise UsageError(f"{key} must be positive learning rates, got {grid}")
    if not 0 < s.attack_val_fraction < 1:
        raise UsageError(f"attack_val_fraction must be in (0, 1), got {s.attack_val_fraction!r}")
    if not 0 < s.target_fraction <= 1:
        raise UsageError(f"target_fraction must be in (0, 1], got {s.target_fraction!r}")


def resolve(quick: bool, options: Mapping[str, Any]) -> Settings:
    """The checked :class:`Settings`: defaults, :data:`QUICK` (if ``quick``), then ``options``
    (``None`` ignored); options that are not the study's own go to ``base`` (the deep-net
    study's :func:`~condreg_experiments.deepnet.settings.resolve`, which raises for unknown
    names)."""
    own = {k: v for k, v in options.items() if k in _OWN and v is not None}
    rest = {k: v for k, v in options.items() if k not in _OWN}
    values: dict[str, Any] = dict(QUICK) if quick else {}
    values.update({k: _coerce(k, v) for k, v in own.items()})
    base = {**(QUICK_BASE if quick else {}), **{k: v for k, v in rest.items() if v is not None}}
    if "target" not in base:
        base["target"] = "block"
    try:
        values["base"] = deep.resolve(False, base)
    except UsageError as exc:
        raise UsageError(str(exc).replace("deepnet option", "tamper option")) from None
    s = Settings(**values)
    _check(s)
    _check_libraries(s)
    return s


def _check_libraries(s: Settings) -> None:
    """The libraries the chosen attackers and tasks need, checked before any work (the workers
    would otherwise fail one by one)."""
    needs = {"peft": any(a.startswith("lora") for a in s.attackers)}
    needs["sklearn"] = "cross" in s.domains
    hints = {
        "peft": "the LoRA attackers need peft (the finetune extra: pip install peft)",
        "sklearn": "the cross-domain task needs scikit-learn (pip install scikit-learn)",
    }
    for name, needed in needs.items():
        if needed and not _importable(name):
            raise UsageError(hints[name])


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules
        return False
