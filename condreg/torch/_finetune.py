"""The fine-tuning attackers behind :func:`condreg.attacks.finetune` (PyTorch; LoRA from
``peft``). Arguments arrive checked by :mod:`condreg.attacks._finetune`; the data are checked
here."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import warnings
from typing import Any

import torch
import torch.nn.functional as F_
from torch import nn

from condreg.attacks._curves import FinetuneResult, mean_over_steps

__all__ = ["attack", "lora_targets"]

#: How the sweep picks a rate (recorded in every result's settings).
SELECTION = (
    "largest mean held-out accuracy over the evaluation steps (trapezoids); ties: larger final "
    "held-out accuracy, then smaller rate"
)


def _tensors(data: Any, name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise ValueError(f"finetune: {name} must be a pair (inputs, labels)")
    X, y = (torch.as_tensor(a) for a in data)
    if X.ndim < 1 or X.shape[0] == 0 or tuple(y.shape) != (X.shape[0],):
        raise ValueError(
            f"finetune: {name} needs n >= 1 inputs and n labels, got shapes {tuple(X.shape)} "
            f"and {tuple(y.shape)}"
        )
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"finetune: {name} labels must be integers, got {y.dtype}")
    if X.is_complex():
        raise ValueError(f"finetune: {name} inputs must be real, got {X.dtype}")
    X = X.to(dtype) if X.is_floating_point() or X.dtype == torch.bool else X
    if X.is_floating_point() and not bool(torch.isfinite(X).all()):
        raise ValueError(f"finetune: {name} inputs contain NaN or Inf")
    return X, y.long()


def lora_targets(extractor: nn.Module, block: str) -> list[str]:
    """The names of the modules of ``block`` that get LoRA adapters: every ``nn.Linear`` /
    ``nn.Conv2d``, and every ``nn.MultiheadAttention`` in place of its projections (its
    forward does not call them as modules)."""
    mod = _block(extractor, block)
    names, inside = [], []
    for name, m in mod.named_modules(prefix=block):
        if any(name.startswith(p + ".") for p in inside):
            continue
        if isinstance(m, nn.MultiheadAttention):
            names.append(name)
            inside.append(name)
        elif isinstance(m, (nn.Linear, nn.Conv2d)):
            names.append(name)
    if not names:
        raise ValueError(f"finetune: block {block!r} has no Linear, Conv2d or attention layer")
    return names


def _block(extractor: nn.Module, block: str) -> nn.Module:
    mods = dict(extractor.named_modules())
    if block not in mods or block == "":
        known = ", ".join(n for n in mods if n and "." not in n) or "none"
        raise ValueError(f"finetune: extractor has no submodule {block!r} (top level: {known})")
    return mods[block]


@dataclasses.dataclass
class _Task:
    """What every rate of one attack shares: data (features for ``linear_probe``), sizes, and
    the ``FinetuneResult`` settings."""

    extractor: nn.Module
    attacker: str
    block: str | None
    optimizer: str
    steps: int
    evals: list[int]
    batch_size: int
    rank: int
    weight_decay: float
    momentum: float
    seed: int
    device: torch.device
    dtype: torch.dtype
    n_classes: int
    dim: int
    train: tuple[torch.Tensor, torch.Tensor]
    sets: dict[str, tuple[torch.Tensor, torch.Tensor]]  # "test" and, when sweeping, "val"
    targets: list[str]
    start: dict[str, tuple[float, float]] | None = None  # the evaluation at step 0


def _batched(net: nn.Module, X: torch.Tensor, device, batch: int = 512) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([net(X[i : i + batch].to(device)) for i in range(0, X.shape[0], batch)])


def _evaluate(net: nn.Module, task: _Task) -> dict[str, tuple[float, float]]:
    was = [m.training for m in net.modules()]
    net.eval()
    out = {}
    for key, (X, y) in task.sets.items():
        logits = _batched(net, X, task.device).float()
        yy = y.to(logits.device)
        out[key] = (
            float(F_.cross_entropy(logits, yy)),
            float((logits.argmax(1) == yy).float().mean()),
        )
    for m, w in zip(net.modules(), was, strict=True):
        m.train(w)
    return out


def _build(task: _Task) -> tuple[nn.Module, dict[str, nn.Parameter]]:
    """``(net, held)``: a fresh copy with its head and the attacker's trainable set; ``held``
    maps the copy's own parameter names to their tensors (for ``changed``)."""
    ext = copy.deepcopy(task.extractor).to(task.device)
    held = dict(ext.named_parameters())
    all_ = task.attacker == "finetune_all"
    for p in ext.parameters():
        p.requires_grad_(all_)
    ext.train(all_)
    if task.attacker == "finetune_block":
        part = _block(ext, task.block)
        part.train()
        for p in part.parameters():
            p.requires_grad_(True)
    if task.attacker == "lora":
        ext = _with_lora(ext, task)
    body = nn.Identity() if task.attacker == "linear_probe" else ext
    head = nn.Linear(task.dim, task.n_classes).to(task.device, task.dtype)
    return nn.Sequential(body, head), held


def _with_lora(ext: nn.Module, task: _Task) -> nn.Module:
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - peft ships with the test extra
        raise ImportError("finetune(attacker='lora') needs peft: pip install peft") from exc
    pattern = "^(" + "|".join(re.escape(n) for n in task.targets) + ")$"
    config = peft.LoraConfig(
        r=task.rank, lora_alpha=task.rank, lora_dropout=0.0, target_modules=pattern
    )
    with warnings.catch_warnings():  # adapters are never merged here
        warnings.filterwarnings("ignore", message=".*[Mm]erging is not supported")
        model = peft.get_peft_model(ext, config)
    return model.eval()


def _optimizer(task: _Task, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if task.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=task.momentum)
    return torch.optim.AdamW(params, lr=lr, weight_decay=task.weight_decay)


def _run(task: _Task, lr: float) -> dict[str, Any]:
    """One rate: train, evaluate at ``task.evals``; the curves, where it diverged, ``changed``."""
    torch.manual_seed(task.seed)
    net, held = _build(task)
    params = [p for p in net.parameters() if p.requires_grad]
    opt = _optimizer(task, params, lr)
    X, y = task.train
    gen = torch.Generator().manual_seed(task.seed + 1)
    n, perm, pos = X.shape[0], None, X.shape[0]
    curves: dict[str, list[float]] = {k: [] for k in ("train_loss", "test_loss", "test_acc")}
    curves["val_acc"] = []
    running, count, diverged = 0.0, 0, None
    for t in range(task.steps + 1):
        if t in task.evals:
            # every rate starts from the same copy, head and adapters: step 0 is evaluated once
            ev = task.start if t == 0 and task.start else _evaluate(net, task)
            if t > 0 and not all(math.isfinite(loss) for loss, _ in ev.values()):
                diverged = t  # the weights blew up: this evaluation is not a checkpoint
                break
            task.start = task.start or ev
            curves["test_loss"].append(ev["test"][0])
            curves["test_acc"].append(ev["test"][1])
            if "val" in ev:
                curves["val_acc"].append(ev["val"][1])
            if t > 0:
                curves["train_loss"].append(running / max(count, 1))
                running, count = 0.0, 0
        if t == task.steps:
            break
        if pos + task.batch_size > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos : pos + task.batch_size]
        pos += task.batch_size
        loss = F_.cross_entropy(net(X[idx].to(task.device)), y[idx].to(task.device))
        value = float(loss.detach())  # one host read per step: stop at the first non-finite loss
        if t == 0:
            curves["train_loss"].append(value)
        if not math.isfinite(value):
            diverged = t
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running, count = running + value, count + 1
    if diverged is not None:  # keep the last evaluation for the rest of the budget
        for vals in curves.values():
            if vals:
                vals.extend([vals[-1]] * (len(task.evals) - len(vals)))
    original = dict(task.extractor.named_parameters())
    changed = tuple(
        name
        for name, p in held.items()
        if not torch.equal(p.detach().cpu(), original[name].detach().cpu())
    )
    return {"lr": lr, "curves": curves, "diverged_at": diverged, "changed": changed}


def _split(y: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified ``(train, held-out)`` indices: ``round(fraction · count)`` of each class (at
    least one where the class has two or more examples)."""
    gen = torch.Generator().manual_seed(seed + 2)
    keep, held_out = [], []
    for c in torch.unique(y):
        idx = torch.nonzero(y == c).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=gen)]
        k = min(max(int(round(fraction * idx.numel())), int(idx.numel() >= 2)), idx.numel() - 1)
        held_out.append(idx[:k])
        keep.append(idx[k:])
    return torch.sort(torch.cat(keep)).values, torch.sort(torch.cat(held_out)).values


def _task(extractor, train, test, *, sweep, val_fraction, n_classes, device, **kw) -> _Task:
    if not isinstance(extractor, nn.Module):
        raise TypeError(f"finetune: extractor must be a torch.nn.Module, got {type(extractor)}")
    first = next(extractor.parameters(), None)
    dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
    if device is None:
        device = first.device if first is not None else "cpu"
    device = torch.device(device)
    (X, y), (Xt, yt) = _tensors(train, "train", dtype), _tensors(test, "test", dtype)
    n_classes = int(max(int(y.max()), int(yt.max())) + 1) if n_classes is None else n_classes
    if min(int(y.min()), int(yt.min())) < 0 or max(int(y.max()), int(yt.max())) >= n_classes:
        raise ValueError(f"finetune: labels must lie in 0 … {n_classes - 1}")
    sets = {"test": (Xt, yt)}
    if sweep:
        keep, held_out = _split(y, val_fraction, kw["seed"])
        if keep.numel() == 0 or held_out.numel() == 0:
            raise ValueError("finetune: too few training examples to hold out a validation split")
        sets["val"] = (X[held_out], y[held_out])
        X, y = X[keep], y[keep]
    targets = lora_targets(extractor, kw["block"]) if kw["attacker"] == "lora" else []
    if kw["attacker"] == "finetune_block":
        _block(extractor, kw["block"])
    body = copy.deepcopy(extractor).to(device).eval()
    dim = _batched(body, X[:1], device)
    if dim.ndim != 2:
        raise ValueError(f"finetune: the extractor must return (n, D) features, got {dim.shape}")
    steps = kw["steps"]
    evals = sorted({*range(0, steps, kw.pop("eval_every")), steps})
    if kw["attacker"] == "linear_probe":  # the frozen extractor's features, computed once
        X = _batched(body, X, device).cpu()
        sets = {k: (_batched(body, Xs, device).cpu(), ys) for k, (Xs, ys) in sets.items()}
    fields = dict(sets=sets, evals=evals, device=device, dtype=dtype, train=(X, y))
    fields.update(n_classes=n_classes, dim=int(dim.shape[1]), targets=targets)
    return _Task(extractor, **fields, **kw)


def attack(extractor, train, test, *, grid, sweep, **kw) -> FinetuneResult:
    """Every rate of ``grid`` (one when not ``sweep``), the best kept (see ``SELECTION``)."""
    # torch.manual_seed reseeds every CUDA device too: restore them all afterwards
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        task = _task(extractor, train, test, sweep=sweep, **kw)
        runs = [_run(task, lr) for lr in grid]
    evals = task.evals
    sweep_rec = [
        {
            "lr": r["lr"],
            "val_area": mean_over_steps(r["curves"]["val_acc"], evals) if sweep else None,
            "val_final": r["curves"]["val_acc"][-1] if sweep else None,
            "diverged_at": r["diverged_at"],
        }
        for r in runs
    ]
    best = max(
        range(len(runs)),
        key=lambda i: (sweep_rec[i]["val_area"] or 0.0, sweep_rec[i]["val_final"] or 0.0, -i),
    )
    chosen = runs[best]
    settings = {
        "attacker": task.attacker,
        "block": task.block,
        "optimizer": task.optimizer,
        "steps": task.steps,
        "batch_size": task.batch_size,
        "lr_grid": list(grid),
        "selection": SELECTION if sweep else "given",
        "chosen_at_grid_edge": sweep and len(grid) > 1 and best in (0, len(grid) - 1),
        "n_train": int(task.train[1].shape[0]),
        "n_val": int(task.sets["val"][1].shape[0]) if sweep else 0,
        "n_test": int(task.sets["test"][1].shape[0]),
        "n_classes": task.n_classes,
        "feature_dim": task.dim,
        "seed": task.seed,
        "device": str(task.device),
    }
    if task.optimizer == "sgd":
        settings["momentum"] = task.momentum
    else:
        settings["weight_decay"] = task.weight_decay
    if task.attacker == "lora":
        settings.update(rank=task.rank, lora_alpha=task.rank, lora_targets=task.targets)
    c = chosen["curves"]
    return FinetuneResult(
        attacker=task.attacker,
        optimizer=task.optimizer,
        lr=chosen["lr"],
        steps=list(evals),
        test_acc=c["test_acc"],
        test_loss=c["test_loss"],
        train_loss=c["train_loss"],
        val_acc=c["val_acc"],
        sweep=sweep_rec,
        changed=chosen["changed"],
        settings=settings,
    )
