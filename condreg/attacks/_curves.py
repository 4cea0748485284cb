"""What a fine-tuning attack returns, and the two scalars that compare an immunized extractor's
attack with the un-immunized one's: the fine-tuning deficit and the steps to a target accuracy.
Plain Python and NumPy (no framework)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["FINETUNE_ATTACKERS", "FinetuneResult", "finetune_deficit", "steps_to_target"]

#: Attackers of :func:`condreg.attacks.finetune`, from the weakest access to the strongest.
FINETUNE_ATTACKERS: tuple[str, ...] = (
    "linear_probe",
    "whitened_probe",
    "lstsq_probe",
    "lora",
    "finetune_block",
    "finetune_all",
)


@dataclass(frozen=True)
class FinetuneResult:
    """What :func:`condreg.attacks.finetune` returns (plain floats and lists, JSON-able).

    ``steps`` are the evaluation steps (``0, eval_every, …, steps``); at each one ``test_acc`` and
    ``test_loss`` (cross-entropy) on the test data, ``val_acc`` on the held-out split (empty when
    ``lr`` was given), and ``train_loss``, the mean mini-batch loss since the previous evaluation
    (at step 0: the loss before any update, on the first batch). ``optimizer``, ``schedule`` and
    ``lr``: the configuration the curves ran with; ``sweep``: every configuration tried, in the
    order tried (``optimizer``, ``schedule``, ``lr``, ``steps`` — the run's budget —,
    ``val_area``, ``val_final``, ``diverged_at``); ``settings``: everything else the attacker
    ran with, and how the choice was made (``chosen_at_grid_edge``, ``capped``, ``stopped``,
    ``lines``); ``changed``: the names (as in ``extractor.named_parameters()``) of the
    extractor's parameters whose values differ after the attack, found by comparison (LoRA
    adapters are not merged into the weights).
    """

    attacker: str
    optimizer: str
    lr: float
    steps: list[int]
    test_acc: list[float]
    test_loss: list[float]
    train_loss: list[float]
    val_acc: list[float]
    sweep: list[dict[str, Any]]
    changed: tuple[str, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    schedule: str = "constant"

    def deficit(self, reference: FinetuneResult, *, chance: float = 0.0) -> float:
        """:func:`finetune_deficit` of this attack against ``reference``.

        Parameters
        ----------
        reference : FinetuneResult
            The same attacker on the un-immunized extractor (the same evaluation steps).
        chance : float
            The chance accuracy ``c``.
        """
        _same_steps(self, reference)
        return finetune_deficit(self.test_acc, reference.test_acc, self.steps, chance=chance)

    def steps_to(self, reference: FinetuneResult, fraction: float = 0.9) -> int | None:
        """:func:`steps_to_target` of this attack.

        Parameters
        ----------
        reference : FinetuneResult
            The same attacker on the un-immunized extractor (the same evaluation steps).
        fraction : float
            The share of ``reference``'s final accuracy to reach, ``0 < fraction ≤ 1``.
        """
        _same_steps(self, reference)
        return steps_to_target(self.test_acc, reference.test_acc[-1], self.steps, fraction)

    def to_json(self) -> dict[str, Any]:
        """The result as a plain dict (``changed`` as a list)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {**out, "changed": list(self.changed), "settings": dict(self.settings)}


def _same_steps(a: FinetuneResult, b: FinetuneResult) -> None:
    if list(a.steps) != list(b.steps):
        raise ValueError(
            "the two attacks were evaluated at different steps; compare runs with the same "
            "steps and eval_every"
        )


def _curve(values: Sequence[float], name: str, where: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or a.size < 1:
        raise ValueError(f"{where}: {name} must be a non-empty 1-d sequence, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{where}: {name} contains NaN or Inf")
    return a


def _steps(steps: Sequence[float] | None, n: int, where: str) -> np.ndarray:
    if steps is None:
        return np.arange(n, dtype=np.float64)
    t = _curve(steps, "steps", where)
    if t.size != n:
        raise ValueError(f"{where}: steps has {t.size} entries, the curves {n}")
    if n > 1 and not np.all(np.diff(t) > 0):
        raise ValueError(f"{where}: steps must be strictly increasing")
    return t


def _area(y: np.ndarray, t: np.ndarray) -> float:
    if t.size == 1:
        return float(y[0])
    return float(np.sum((y[1:] + y[:-1]) * np.diff(t)) / 2.0)


def mean_over_steps(values: Sequence[float], steps: Sequence[float]) -> float:
    """The mean of a curve over its evaluation steps: its trapezoid area / the budget."""
    t = np.asarray(steps, dtype=np.float64)
    area = _area(np.asarray(values, dtype=np.float64), t)
    return area if t.size == 1 else area / float(t[-1] - t[0])


def finetune_deficit(
    acc: Sequence[float],
    reference: Sequence[float],
    steps: Sequence[float] | None = None,
    *,
    chance: float = 0.0,
) -> float:
    """The fine-tuning deficit of an attack against the same attack on the un-immunized model.

    ``deficit = 1 − ∫ (acc(t) − c) dt / ∫ (ref(t) − c) dt`` over the budget (trapezoids on the
    evaluation steps), ``c`` the chance accuracy: 0 = no protection (the curves' areas agree), 1 =
    the attacker stayed at chance for the whole budget, negative = the immunized model is learned
    faster, above 1 = the attacker ended below chance. With ``c = 0`` it is one minus the plain
    ratio of the areas under the accuracy curves. Identical curves (the un-immunized model
    against itself) give 0 exactly.

    Parameters
    ----------
    acc : sequence of float
        Test accuracy at the evaluation steps of the attack on the immunized extractor.
    reference : sequence of float
        The same for the un-immunized extractor, under the same attacker and budget.
    steps : sequence of float, optional
        The evaluation steps, strictly increasing (default ``0, 1, …``).
    chance : float
        The accuracy of guessing, ``c`` (e.g. ``1 / n_classes``); ``0 ≤ c < 1``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Curves of different lengths, empty or non-finite; ``steps`` not increasing; ``chance``
        outside ``[0, 1)``; different curves whose reference never rises above ``chance`` (no
        learning to compare against).

    Examples
    --------
    >>> from condreg.attacks import finetune_deficit
    >>> round(finetune_deficit([0.2, 0.5, 0.9], [0.2, 0.9, 0.95], [0, 50, 100], chance=0.2), 3)
    0.395
    >>> finetune_deficit([0.2, 0.9, 0.95], [0.2, 0.9, 0.95], [0, 50, 100])
    0.0
    """
    where = "finetune_deficit"
    a, r = _curve(acc, "acc", where), _curve(reference, "reference", where)
    if a.size != r.size:
        raise ValueError(f"{where}: acc has {a.size} entries, reference {r.size}")
    if not (_real(chance) and 0.0 <= chance < 1.0):
        raise ValueError(f"{where}: chance must be in [0, 1), got {chance!r}")
    t = _steps(steps, a.size, where)
    if np.array_equal(a, r):
        return 0.0  # the same curve: no deficit, whatever its area
    ref_area = _area(r - chance, t)
    if not ref_area > 0:
        raise ValueError(
            f"{where}: the reference never rises above chance ({chance}); there is no learning "
            "to compare against"
        )
    return 1.0 - _area(a - chance, t) / ref_area


def steps_to_target(
    acc: Sequence[float],
    reference_final: float,
    steps: Sequence[float] | None = None,
    fraction: float = 0.9,
) -> int | None:
    """The first evaluation step whose accuracy reaches ``fraction`` of the un-immunized model's
    final accuracy; ``None`` when the budget ends first ("never").

    Parameters
    ----------
    acc : sequence of float
        Test accuracy of the attack at the evaluation steps.
    reference_final : float
        The un-immunized model's final accuracy under the same attacker and budget.
    steps : sequence of float, optional
        The evaluation steps (default ``0, 1, …``).
    fraction : float
        ``0 < fraction ≤ 1``.

    Returns
    -------
    int or None

    A reference that never learned (``reference_final`` at or below the attack's first
    accuracy) is reached at the first step.

    Raises
    ------
    ValueError
        Empty or non-finite ``acc``; a non-finite ``reference_final``; ``steps`` of another
        length than ``acc`` or not increasing; ``fraction`` outside ``(0, 1]``.

    Examples
    --------
    >>> from condreg.attacks import steps_to_target
    >>> steps_to_target([0.2, 0.5, 0.9], 0.95, [0, 50, 100], fraction=0.9)
    100
    >>> steps_to_target([0.2, 0.3, 0.4], 0.95, [0, 50, 100]) is None
    True
    """
    where = "steps_to_target"
    a = _curve(acc, "acc", where)
    t = _steps(steps, a.size, where)
    if not (_real(fraction) and 0 < fraction <= 1):
        raise ValueError(f"{where}: fraction must be in (0, 1], got {fraction!r}")
    if not (_real(reference_final) and math.isfinite(reference_final)):
        raise ValueError(f"{where}: reference_final must be a finite number")
    hit = np.flatnonzero(a >= fraction * float(reference_final))
    return int(t[hit[0]]) if hit.size else None


def _real(value: Any) -> bool:
    """A real number (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
