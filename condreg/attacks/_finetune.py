"""``finetune``: the public entry of the fine-tuning attackers — arguments checked here, without
a framework; the training itself runs in :mod:`condreg.torch._finetune`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from condreg.attacks._curves import FINETUNE_ATTACKERS, FinetuneResult

__all__ = ["LR_GRIDS", "OPTIMIZERS", "finetune"]

#: Optimizers of :func:`finetune`: SGD with momentum 0.9 and AdamW (weight decay 0.01).
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")

#: The default learning-rate grid of each optimizer (each rate a factor √10 apart).
LR_GRIDS: dict[str, tuple[float, ...]] = {
    "sgd": (1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
    "adamw": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
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


def _options(attacker, optimizer, block, lr, lr_grid, val_fraction, weight_decay, momentum):
    if attacker not in FINETUNE_ATTACKERS:
        choices = ", ".join(FINETUNE_ATTACKERS)
        raise ValueError(f"finetune: unknown attacker {attacker!r}; choose one of {choices}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"finetune: unknown optimizer {optimizer!r}; choose sgd or adamw")
    if attacker in ("lora", "finetune_block") and not isinstance(block, str):
        raise ValueError(
            f"finetune: attacker {attacker!r} needs block=, the name of the immunized submodule "
            "(as in extractor.named_modules())"
        )
    if lr is not None and lr_grid is not None:
        raise ValueError("finetune: give lr (a fixed rate) or lr_grid (a sweep), not both")
    if lr is not None:
        grid = (_rate("lr", lr),)
    else:
        grid = LR_GRIDS[optimizer] if lr_grid is None else lr_grid
        if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or not grid:
            raise ValueError(f"finetune: lr_grid must be a non-empty sequence, got {grid!r}")
        grid = tuple(sorted({_rate("lr_grid entry", g) for g in grid}))
        ok = isinstance(val_fraction, numbers.Real) and not isinstance(val_fraction, bool)
        if not (ok and 0 < val_fraction < 1):
            raise ValueError(f"finetune: val_fraction must be in (0, 1), got {val_fraction!r}")
    weight_decay = float(weight_decay) if weight_decay == 0 else _rate("weight_decay", weight_decay)
    ok = isinstance(momentum, numbers.Real) and not isinstance(momentum, bool)
    if not (ok and 0 <= momentum < 1):
        raise ValueError(f"finetune: momentum must be in [0, 1), got {momentum!r}")
    return grid, weight_decay, float(momentum)


def finetune(
    extractor: Any,
    train: tuple[Any, Any],
    test: tuple[Any, Any],
    *,
    attacker: str,
    block: str | None = None,
    optimizer: str = "adamw",
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
    ``"adamw"``:

    - ``linear_probe``: only the new head trains; the extractor is frozen (eval mode).
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
    test data). With a given ``lr`` the whole training data is used. A run whose mini-batch loss
    or evaluation loss stops being finite stops there and keeps its last finite evaluation for
    the remaining steps (the attacker keeps its last good checkpoint); ``sweep`` records the
    step (``diverged_at``: the number of updates made when it was seen).

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
        Unknown attacker or optimizer, a missing or unknown ``block``, a block without
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
    steps, batch_size = _int("steps", steps), _int("batch_size", batch_size)
    eval_every, rank = _int("eval_every", eval_every), _int("rank", rank)
    seed = _int("seed", seed, low=0)
    if n_classes is not None:
        n_classes = _int("n_classes", n_classes, low=2)
    grid, weight_decay, momentum = _options(
        attacker, optimizer, block, lr, lr_grid, val_fraction, weight_decay, momentum
    )
    from condreg.torch import _finetune

    return _finetune.attack(
        extractor,
        train,
        test,
        attacker=attacker,
        block=block,
        optimizer=optimizer,
        steps=steps,
        grid=grid,
        sweep=lr is None,
        val_fraction=float(val_fraction),
        batch_size=batch_size,
        eval_every=eval_every,
        rank=rank,
        n_classes=n_classes,
        weight_decay=weight_decay,
        momentum=momentum,
        seed=seed,
        device=device,
    )
