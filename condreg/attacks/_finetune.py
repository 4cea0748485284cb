"""``finetune``: the public entry of the fine-tuning attackers — arguments checked here, without
a framework; the training itself runs in :mod:`condreg.torch._finetune`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from condreg.attacks._curves import FINETUNE_ATTACKERS, FinetuneResult

__all__ = ["LR_GRIDS", "OPTIMIZERS", "SCHEDULES", "finetune", "finetune_search"]

#: Optimizers of :func:`finetune`: SGD with momentum 0.9 and AdamW (weight decay 0.01).
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")

#: Learning-rate schedules: ``constant``, and ``warmup_cosine`` (linear warmup over the first
#: 10 % of the budget, then cosine decay to 0 at its end; torch's ``LinearLR``,
#: ``CosineAnnealingLR`` and ``SequentialLR``).
SCHEDULES: tuple[str, ...] = ("constant", "warmup_cosine")

#: The default learning-rate grid of each optimizer: 3 decades, 7 rates a factor √10 apart
#: (``10^(k/2)``), SGD 1e-4 … 1e-1, AdamW 1e-5 … 1e-2.
LR_GRIDS: dict[str, tuple[float, ...]] = {
    "sgd": tuple(10.0 ** (k / 2) for k in range(-8, -1)),
    "adamw": tuple(10.0 ** (k / 2) for k in range(-10, -3)),
}


def _int(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"finetune: {name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _rate(name: str, value: Any) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (ok and 0 < value < math.inf):
        raise ValueError(f"finetune: {name} must be a positive finite number, got {value!r}")
    return float(value)


def _grid(name: str, grid: Any) -> tuple[float, ...]:
    if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or not grid:
        raise ValueError(f"finetune: {name} must be a non-empty sequence, got {grid!r}")
    return tuple(sorted({_rate(f"{name} entry", g) for g in grid}))


def _common(attacker, block, val_fraction, weight_decay, momentum, schedules, sweep):
    if attacker not in FINETUNE_ATTACKERS:
        choices = ", ".join(FINETUNE_ATTACKERS)
        raise ValueError(f"finetune: unknown attacker {attacker!r}; choose one of {choices}")
    if attacker in ("lora", "finetune_block") and not isinstance(block, str):
        raise ValueError(
            f"finetune: attacker {attacker!r} needs block=, the name of the immunized submodule "
            "(as in extractor.named_modules())"
        )
    for schedule in schedules:
        if schedule not in SCHEDULES:
            raise ValueError(
                f"finetune: unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}"
            )
    if sweep:
        ok = isinstance(val_fraction, numbers.Real) and not isinstance(val_fraction, bool)
        if not (ok and 0 < val_fraction < 1):
            raise ValueError(f"finetune: val_fraction must be in (0, 1), got {val_fraction!r}")
    weight_decay = float(weight_decay) if weight_decay == 0 else _rate("weight_decay", weight_decay)
    ok = isinstance(momentum, numbers.Real) and not isinstance(momentum, bool)
    if not (ok and 0 <= momentum < 1):
        raise ValueError(f"finetune: momentum must be in [0, 1), got {momentum!r}")
    return weight_decay, float(momentum)


def _optimizer(optimizer: Any) -> str:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"finetune: unknown optimizer {optimizer!r}; choose sgd or adamw")
    return optimizer


def _sizes(steps, batch_size, eval_every, rank, seed, n_classes) -> dict[str, Any]:
    """The integer arguments shared by :func:`finetune` and :func:`finetune_search`, checked."""
    out = dict(steps=steps, batch_size=batch_size, eval_every=eval_every, rank=rank)
    out = {k: _int(k, v) for k, v in out.items()}
    out["seed"] = _int("seed", seed, low=0)
    out["n_classes"] = None if n_classes is None else _int("n_classes", n_classes, low=2)
    return out


def finetune(
    extractor: Any,
    train: tuple[Any, Any],
    test: tuple[Any, Any],
    *,
    attacker: str,
    block: str | None = None,
    optimizer: str = "adamw",
    schedule: str = "constant",
    steps: int = 100,
    lr: float | None = None,
    lr_grid: Sequence[float] | None = None,
    val_fraction: float = 0.2,
    batch_size: int = 64,
    eval_every: int = 10,
    rank: int = 8,
    n_classes: int | None = None,
    weight_decay: float = 0.01,
    momentum: float = 0.9,
    seed: int = 0,
    device: Any = None,
) -> FinetuneResult:
    """Attack a feature extractor by fine-tuning a copy of it, with a new linear head, on the
    harmful task (cross-entropy, mini-batches).

    Attackers (:data:`FINETUNE_ATTACKERS`), each with ``optimizer`` ``"sgd"`` (momentum) or
    ``"adamw"`` and a ``schedule`` of :data:`SCHEDULES`:

    - ``linear_probe``: only the new head trains; the extractor is frozen (eval mode).
    - ``whitened_probe``: a linear probe on the frozen features whitened with the attacker's own
      training split (less the held-out share when sweeping): ``(F − μ)(C + λI)^{-1/2}``, ``μ``
      and ``C`` the split's feature mean and covariance, ridge ``λ = 1e-6 · tr(C)/D`` (the mean
      eigenvalue of ``C``; ``settings["ridge"]``). The same whitening is applied to the
      held-out and test features.
    - ``lstsq_probe``: a linear probe whose head starts at the ridge least-squares fit of the
      training split's one-hot labels, ``W = (C + λI)^{-1} Cov(F, Y)``, ``b = ȳ − μW`` (the same
      ``λ``), then trains as ``linear_probe`` does.
    - ``lora``: LoRA adapters of rank ``rank`` (``lora_alpha = rank``, no dropout; the ``peft``
      library) on every ``nn.Linear`` / ``nn.Conv2d`` of ``block`` — and on every
      ``nn.MultiheadAttention`` there, whose projections are not called as modules — plus the
      head; the base weights stay frozen.
    - ``finetune_block``: the submodule ``block`` and the head train (train mode); the rest is
      frozen (eval mode).
    - ``finetune_all``: every parameter of the extractor and the head (train mode).

    With ``lr=None`` the rate is the attacker's best on a held-out split: each rate of
    ``lr_grid`` trains on the training data less a stratified ``val_fraction`` of it, and the
    one whose mean held-out accuracy over the evaluation steps is largest (ties: the larger final
    accuracy, then the smaller rate) is kept; its curves are returned (selection never sees the
    test data). The grid is not extended here (``settings["chosen_at_grid_edge"]`` flags a
    choice at its edge); :func:`finetune_search` extends it and searches optimizers and
    schedules too. With a given ``lr`` the whole training data is used. A run whose mini-batch loss
    or evaluation loss stops being finite stops there and keeps its last finite evaluation for
    the remaining steps (the attacker keeps its last good checkpoint); ``sweep`` records, per
    rate, the held-out score and that step (``diverged_at``: the number of updates made when
    it was seen).

    The caller's extractor is never modified, and neither is the global random state (the
    attack runs under ``torch.random.fork_rng`` seeded by ``seed``).

    Parameters
    ----------
    extractor : torch.nn.Module
        Maps a batch of inputs to features ``(n, D)``.
    train, test : tuple of (inputs, labels)
        Tensors or NumPy arrays; labels are integers ``0 … n_classes − 1``.
    attacker : str
        One of :data:`FINETUNE_ATTACKERS`.
    block : str, optional
        The name of the immunized submodule (``extractor.named_modules()``); needed by ``lora``
        and ``finetune_block``.
    optimizer : str
        ``"sgd"`` (with ``momentum``) or ``"adamw"`` (with ``weight_decay``).
    schedule : str
        ``"constant"`` or ``"warmup_cosine"`` (:data:`SCHEDULES`).
    steps : int
        Optimizer steps (the budget), ``≥ 1``.
    lr : float, optional
        A fixed learning rate (no sweep).
    lr_grid : sequence of float, optional
        Rates to sweep (default :data:`LR_GRIDS` ``[optimizer]``); not together with ``lr``.
    val_fraction : float
        The held-out share of ``train`` for the sweep, ``0 < val_fraction < 1``.
    batch_size : int
        Mini-batch size.
    eval_every : int
        Evaluate at steps ``0, eval_every, 2·eval_every, …`` and at ``steps``.
    rank : int
        LoRA rank.
    n_classes : int, optional
        Classes of the harmful task (default: the largest label + 1).
    weight_decay : float
        AdamW's decoupled weight decay.
    momentum : float
        SGD's momentum, ``0 ≤ momentum < 1``.
    seed : int
        Seeds the head, the adapters, the split and the batch order.
    device : torch.device or str, optional
        Where to train (default: the extractor's device).

    Returns
    -------
    FinetuneResult

    Raises
    ------
    ValueError
        Unknown attacker, optimizer or schedule, a missing or unknown ``block``, a block without
        ``Linear``/``Conv2d`` layers for ``lora``, bad numbers, both ``lr`` and ``lr_grid``,
        mismatched, empty or non-finite data, labels outside ``0 … n_classes − 1``.
    TypeError
        ``extractor`` is not a ``torch.nn.Module``.
    ImportError
        PyTorch (or, for ``lora``, ``peft``) is not installed.

    Examples
    --------
    >>> import torch
    >>> from condreg.attacks import finetune
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(200, 6, generator=g), torch.arange(200) % 2
    >>> X[:, 0] += 3 * y
    >>> net = torch.nn.Sequential(torch.nn.Linear(6, 4))
    >>> res = finetune(net, (X[:150], y[:150]), (X[150:], y[150:]), attacker="linear_probe",
    ...                optimizer="sgd", steps=40, lr=0.1, eval_every=20)
    >>> res.steps, res.test_acc[-1] > 0.8, res.changed
    ([0, 20, 40], True, ())
    """
    sizes = _sizes(steps, batch_size, eval_every, rank, seed, n_classes)
    _optimizer(optimizer)
    if lr is not None and lr_grid is not None:
        raise ValueError("finetune: give lr (a fixed rate) or lr_grid (a sweep), not both")
    sweep = lr is None
    if sweep:
        grid = _grid("lr_grid", LR_GRIDS[optimizer] if lr_grid is None else lr_grid)
    else:
        grid = (_rate("lr", lr),)
    weight_decay, momentum = _common(
        attacker, block, val_fraction, weight_decay, momentum, (schedule,), sweep
    )
    from condreg.torch import _finetune

    return _finetune.attack(
        extractor,
        train,
        test,
        optimizers=(optimizer,),
        schedules=(schedule,),
        grids={optimizer: grid},
        sweep=sweep,
        short_steps=sizes["steps"],
        keep=1,
        cap=0,
        attacker=attacker,
        block=block,
        val_fraction=float(val_fraction),
        weight_decay=weight_decay,
        momentum=momentum,
        device=device,
        **sizes,
    )


def finetune_search(
    extractor: Any,
    train: tuple[Any, Any],
    test: tuple[Any, Any],
    *,
    attacker: str,
    block: str | None = None,
    optimizers: Sequence[str] = OPTIMIZERS,
    schedules: Sequence[str] = SCHEDULES,
    lr_grids: Mapping[str, Sequence[float]] | None = None,
    steps: int = 100,
    short_steps: int | None = None,
    keep: int = 4,
    max_extend: int = 6,
    val_fraction: float = 0.2,
    batch_size: int = 64,
    eval_every: int = 10,
    rank: int = 8,
    n_classes: int | None = None,
    weight_decay: float = 0.01,
    momentum: float = 0.9,
    seed: int = 0,
    device: Any = None,
) -> FinetuneResult:
    """The attacker's best configuration — optimizer × schedule × learning rate — found on
    held-out data by successive halving, with rate grids that extend themselves beyond an edge.

    The attack is :func:`finetune`'s (same attackers, data, split, seeding and divergence rule);
    only the choice differs. The training data less a stratified ``val_fraction`` trains every
    configuration, the held-out share scores it (mean held-out accuracy over the evaluation
    steps; ties: the larger final accuracy, then the smaller rate), and the test data are never
    used for choosing. Two rungs:

    1. **Short runs.** Every *rate line* ``(optimizer, schedule)`` runs every rate of its grid
       (``lr_grids[optimizer]``, default :data:`LR_GRIDS`) for ``short_steps`` updates. While
       the line's best rate is its smallest or largest rate tried, the line is extended by the
       grid's step at that edge (the ratio of the two outermost rates there) — until the best
       has a tried rate on either side (``interior``), the best is the largest rate and diverged
       (``diverged``), the best scores exactly as its inner neighbour (``flat``: the score does
       not depend on the rate there), or ``max_extend`` rates have been added on that side
       (``cap``: with √10 steps, 6 is three decades beyond the grid). A line on which every
       rate scores the same (nothing learned) climbs towards larger rates until one diverges
       or the cap.
    2. **Full runs.** The ``keep`` best short runs over all lines run the full ``steps``; the
       line of the best of them is extended at the full budget by the same rule (the same cap,
       counted together with rung 1's), and the best full run is returned.

    A schedule runs over the budget of its own run (a short run warms up and decays within
    ``short_steps``). With ``short_steps = steps`` there is one rung: every configuration runs
    the full budget.

    **Cost**, in full-budget runs: ``L · (G + E₁) · short_steps / steps + keep + E₂`` for ``L``
    rate lines of ``G`` rates, ``E₁ ≤ 2 · max_extend · L`` rung-1 extensions and
    ``E₂ ≤ 2 · max_extend`` rung-2 ones. The defaults (2 optimizers × 2 schedules × 7 rates,
    ``short_steps = steps // 4``, ``keep = 4``) cost 11 full runs plus extensions, against 28
    for every configuration at the full budget.

    Parameters
    ----------
    extractor : torch.nn.Module
        Maps a batch of inputs to features ``(n, D)``.
    train, test : tuple of (inputs, labels)
        As for :func:`finetune`.
    attacker : str
        One of :data:`FINETUNE_ATTACKERS`.
    block : str, optional
        The immunized submodule (``lora``, ``finetune_block``).
    optimizers : sequence of str
        Optimizers to search (:data:`OPTIMIZERS`).
    schedules : sequence of str
        Schedules to search (:data:`SCHEDULES`).
    lr_grids : mapping of str to sequence of float, optional
        The starting rate grid per optimizer (default :data:`LR_GRIDS`); at least two rates to
        be extended.
    steps : int
        The full budget (optimizer steps), ``≥ 1``.
    short_steps : int, optional
        Rung 1's budget, ``1 ≤ short_steps ≤ steps`` (default ``max(1, steps // 4)``).
    keep : int
        Configurations promoted to the full budget, ``≥ 1``.
    max_extend : int
        The cap: rates added beyond each edge of each line, ``≥ 0``.
    val_fraction : float
        The held-out share of ``train``, ``0 < val_fraction < 1``.
    batch_size : int
        Mini-batch size.
    eval_every : int
        Evaluate at steps ``0, eval_every, …`` and at the end of every run.
    rank : int
        LoRA rank.
    n_classes : int, optional
        Classes of the harmful task (default: the largest label + 1).
    weight_decay : float
        AdamW's decoupled weight decay.
    momentum : float
        SGD's momentum, ``0 ≤ momentum < 1``.
    seed : int
        Seeds the head, the adapters, the split and the batch order (the same for every
        configuration).
    device : torch.device or str, optional
        Where to train (default: the extractor's device).

    Returns
    -------
    FinetuneResult
        The best full run's curves, with its ``optimizer``, ``schedule`` and ``lr``. ``sweep``
        holds every configuration tried, in the order tried (``optimizer``, ``schedule``,
        ``lr``, ``steps`` — its budget —, ``val_area``, ``val_final``, ``diverged_at``); the
        running maximum of ``val_area`` over the runs of one budget is the best-so-far curve.
        ``settings["lines"]`` reports each rate line's
        rung-1 choice: the rates tried, ``best_lr``, ``at_edge`` (its best is an outermost
        rate tried), ``capped`` (it stopped there because of the cap), ``stopped`` (why:
        ``interior``, ``diverged``, ``flat``, ``cap``, ``single``) and ``extended`` (rates added
        per side); ``settings["chosen_at_grid_edge"]``, ``["capped"]`` and ``["stopped"]`` the
        same for the returned choice.

    Raises
    ------
    ValueError
        As :func:`finetune`; an empty or unknown ``optimizers`` or ``schedules`` entry, a
        ``lr_grids`` without a grid for a searched optimizer, ``short_steps`` outside
        ``1 … steps``, ``keep < 1`` or ``max_extend < 0``.
    TypeError
        ``extractor`` is not a ``torch.nn.Module``.

    Examples
    --------
    >>> import torch
    >>> from condreg.attacks import finetune_search
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(200, 6, generator=g), torch.arange(200) % 2
    >>> X[:, 0] += 3 * y
    >>> net = torch.nn.Sequential(torch.nn.Linear(6, 4))
    >>> res = finetune_search(net, (X[:150], y[:150]), (X[150:], y[150:]),
    ...                       attacker="linear_probe", steps=40, eval_every=10, keep=2)
    >>> res.schedule in ("constant", "warmup_cosine"), res.settings["capped"]
    (True, False)
    >>> [r["steps"] for r in res.sweep][-2:]  # the last runs: the full budget
    [40, 40]
    """
    sizes = _sizes(steps, batch_size, eval_every, rank, seed, n_classes)
    for name, values in (("optimizers", optimizers), ("schedules", schedules)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"finetune: {name} must be a non-empty sequence, got {values!r}")
    optimizers = tuple(dict.fromkeys(_optimizer(o) for o in optimizers))
    schedules = tuple(dict.fromkeys(schedules))
    weight_decay, momentum = _common(
        attacker, block, val_fraction, weight_decay, momentum, schedules, True
    )
    grids = LR_GRIDS if lr_grids is None else lr_grids
    if not isinstance(grids, Mapping) or any(o not in grids for o in optimizers):
        raise ValueError(f"finetune: lr_grids needs a grid for each of {', '.join(optimizers)}")
    grids = {o: _grid(f"lr_grids[{o!r}]", grids[o]) for o in optimizers}
    short = max(1, sizes["steps"] // 4) if short_steps is None else _int("short_steps", short_steps)
    if short > sizes["steps"]:
        raise ValueError(f"finetune: short_steps must be at most steps, got {short}")
    from condreg.torch import _finetune

    return _finetune.attack(
        extractor,
        train,
        test,
        optimizers=optimizers,
        schedules=schedules,
        grids=grids,
        sweep=True,
        short_steps=short,
        keep=_int("keep", keep),
        cap=_int("max_extend", max_extend, low=0),
        attacker=attacker,
        block=block,
        val_fraction=float(val_fraction),
        weight_decay=weight_decay,
        momentum=momentum,
        device=device,
        **sizes,
    )
