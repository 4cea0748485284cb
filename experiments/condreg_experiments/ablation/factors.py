"""What the ablation varies besides the released switches: the ``minibatch`` switch split into its
parts (:data:`FACTORS`), the step rule and Opt κ's variants (:data:`RULES`, each tuned by the
D_P-only rule) and the released MNIST protocol on its own data (:data:`RELEASED_MNIST_ROWS`)."""

from __future__ import annotations

import math
from typing import Any

from condreg_experiments.ablation.emulator import Protocol, minibatch_steps
from condreg_experiments.ablation.released import SWITCHES_BY_DATASET

#: The methods of the factored rows and the step-rule variants: the ranking in question.
FACTOR_METHODS: tuple[str, ...] = ("opt_kappa", "condreg")

#: The MNIST pairs of the factored rows and the step rules (both ways for 0-1); seeds (>= 3).
FACTOR_PAIRS: list[tuple[int, int]] = [(0, 1), (1, 0), (3, 8), (5, 6)]
FACTOR_SEEDS = 3

#: Batch sizes of the sweep: the released 64 (below D = 78 and 109), and one above D.
BATCH_BELOW_D, BATCH_ABOVE_D = 64, 256

#: The parts of the released ``minibatch`` switch, each a row of its own. Every row except
#: ``full_paired`` takes T = as many steps as ``minibatch`` takes (house 2, MNIST 9 per epoch)
#: with condreg's step rule (λ balanced at θ_0, each step at most ``max_step``), so the batch
#: rows share the step count and the step-length budget T·max_step; "D" is the input dimension.
FACTORS: dict[str, str] = {
    "default": "condreg's protocol (the reference): full batch, T₀ = epochs steps",
    "minibatch": "the released minibatch switch, all of its parts at once (house: 2 devices × "
    "64 rows per step)",
    "steps": "full batch, T steps (as many as minibatch takes; T·max_step of step length)",
    "steps_same_length": "full batch, T steps of at most max_step·T₀/T (the default's length "
    "T₀·max_step, T₀ = its epochs)",
    "batch_above_d": f"batches of {BATCH_ABOVE_D} rows (> D, full rank), T steps, the task's K⁺, "
    "D_H's rows drawn on their own",
    "batch_at_d": "batches of D rows, T steps, the task's K⁺",
    "batch_below_d": f"batches of {BATCH_BELOW_D} rows (< D: rank ≤ {BATCH_BELOW_D}), T steps, "
    "the task's K⁺",
    "batch_precond": f"batches of {BATCH_BELOW_D}, each batch's (BᵀB + ridge·I)⁻¹ instead of the "
    "task's K⁺ (the released preconditioner)",
    "batch_ridge_kappa": f"batches of {BATCH_BELOW_D}, the regularizers and Opt κ by the released "
    "ridge-floor κ (eigvalsh(S + 1e-6·I))",
    "batch_paired": f"batches of {BATCH_BELOW_D}, D_H's rows paired with D_P's by index (house: "
    "only D_H's first 309 of 1,151 rows)",
    "full_paired": "full batch and the default's steps, D_H cut to its first N_P rows as the "
    "pairing cuts it (house only: N_P = N_H on MNIST)",
}

#: Factors whose runs use no random numbers on house prices (one seed suffices there).
DETERMINISTIC_FACTORS = frozenset({"default", "steps", "steps_same_length", "full_paired"})


def factors_of(dataset: str) -> list[str]:
    """The factored rows that exist for ``dataset``."""
    return [f for f in FACTORS if f != "full_paired" or dataset == "house"]


def factor_fields(
    name: str, dataset: str, epochs: int, n_p: int, n_h: int, D: int, max_step: float = 0.3
) -> dict[str, Any]:
    """The :class:`~condreg_experiments.ablation.emulator.Protocol` fields of factor ``name``."""
    if name not in FACTORS:
        raise ValueError(f"unknown factor {name!r}; choose from {', '.join(FACTORS)}")
    if name in ("default", "minibatch"):
        return {"switches": [] if name == "default" else ["minibatch"]}
    probe = Protocol(dataset, frozenset({"minibatch"}), epochs, 0.0, "")
    T = epochs * minibatch_steps(n_p, n_h, probe)
    fields: dict[str, Any] = {"switches": [], "steps": T}
    if name == "full_paired":
        return {"switches": [], "paired_rows": True}
    if name == "steps_same_length":
        fields["max_step"] = max_step * epochs / T
    batch = {"batch_above_d": BATCH_ABOVE_D, "batch_at_d": D}.get(name)
    if name.startswith("batch_"):
        fields["batch"] = batch or BATCH_BELOW_D
    if name == "batch_precond":
        fields["batch_precond"] = True
    if name == "batch_ridge_kappa":
        fields["switches"] = ["ridge_kappa"]
    if name == "batch_paired":
        fields["paired_rows"] = True
    return fields


#: The D_P-only rule's learning rates for the fixed-λ variants (decades; quick: fewer).
LR_GRID: tuple[float, ...] = tuple(10.0**k for k in range(-8, 1))
QUICK_LR_GRID: tuple[float, ...] = (1e-6, 1e-4, 1e-2)

#: The step rule as a switch, and Opt κ's variants: name -> (method, what it is, its switches,
#: K⁺ on Opt κ's gradient, the tuned knob: "max_step" (condreg's rule) or "lr" (fixed λ)).
RULES: dict[str, tuple[str, str, tuple[str, ...], bool, str]] = {
    "ours_clip": ("condreg", "condreg's rule: λ balanced at θ_0, steps ≤ max_step", (), False,
                  "max_step"),
    "ours_fixed_gd": ("condreg", "fixed λ (the configs'), plain GD", ("fixed_lambda",), False,
                      "lr"),
    "ours_fixed_adam": ("condreg", "fixed λ (the configs'), Adam", ("fixed_lambda", "adam"),
                        False, "lr"),
    "opt_clip": ("opt_kappa", "condreg's rule, plain gradient of κ", (), False, "max_step"),
    "opt_clip_precond": ("opt_kappa", "condreg's rule, K⁺ on the left", (), True, "max_step"),
    "opt_fixed_gd": ("opt_kappa", "κ-loss weights 1 / 1e-5, unclipped GD", ("fixed_lambda",),
                     False, "lr"),
    "opt_fixed_gd_precond": ("opt_kappa", "κ-loss weights, unclipped GD, K⁺ on the left",
                             ("fixed_lambda",), True, "lr"),
    "opt_fixed_adam": ("opt_kappa", "κ-loss weights, Adam", ("fixed_lambda", "adam"), False,
                       "lr"),
    "opt_fixed_adam_precond": ("opt_kappa", "κ-loss weights, Adam, K⁺ on the left",
                               ("fixed_lambda", "adam"), True, "lr"),
}  # fmt: skip
RULE_METHODS = FACTOR_METHODS


def rule_fields(name: str, value: float) -> tuple[dict[str, Any], float | None]:
    """``(Protocol fields, lr)`` of variant ``name`` at its tuned knob's ``value`` (lr None:
    the schedule's)."""
    _, _, switches, precond, knob = RULES[name]
    fields: dict[str, Any] = {"switches": list(switches), "precondition_opt_kappa": precond}
    if knob == "max_step":
        return fields | {"max_step": float(value)}, None
    return fields, float(value)


#: The released MNIST protocol on its own tasks (raw pixels, one digit per task, constant
#: labels), pair 0-1 as the authors logged it: row -> (what, its Protocol fields but ``steps``).
RELEASED_MNIST_ROWS: dict[str, str] = {
    "released_1_epoch": "every released switch, 1 epoch of the 500-image subset (7 steps)",
    "released_logged_steps": "every released switch, 92 steps (the authors' epoch on full MNIST)",
    "condreg": "condreg's protocol (the emulator, no switch), 30 full-batch epochs",
}
RELEASED_MNIST_PAIRS: list[tuple[int, int]] = [(0, 1)]


def released_mnist_fields(row: str, n_pairs: int, logged_steps: int) -> dict[str, Any]:
    """The Protocol fields of a :data:`RELEASED_MNIST_ROWS` row (``n_pairs`` rows per digit)."""
    if row == "condreg":
        return {"switches": []}
    switches = sorted(SWITCHES_BY_DATASET["mnist"])
    probe = Protocol("mnist", frozenset({"minibatch"}), 1, 0.0, "")
    per_epoch = minibatch_steps(n_pairs, n_pairs, probe)
    steps = per_epoch if row == "released_1_epoch" else logged_steps
    return {"switches": switches, "steps": max(1, int(math.ceil(steps)))}


def protocol_of(spec: dict[str, Any]) -> Protocol:
    """The Protocol of an emulated unit's ``spec`` (``dataset``, ``epochs``, ``lr``, ``task``,
    ``fields``)."""
    fields = dict(spec.get("fields", {}))
    switches = frozenset(fields.pop("switches", spec.get("switches", [])))
    task = "regression" if spec["dataset"] == "house" else "classification"
    return Protocol(spec["dataset"], switches, spec["epochs"], spec["lr"], task, **fields)
