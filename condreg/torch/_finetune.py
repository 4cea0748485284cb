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

__all__ = ["attack", "lora_targets", "scheduler"]

#: How the sweep picks a rate (recorded in every result's settings).
SELECTION = (
    "largest mean held-out accuracy over the evaluation steps (trapezoids); ties: larger final "
    "held-out accuracy, then smaller rate"
)
#: The attackers that train a head on the frozen extractor's features (computed once).
PROBES = ("linear_probe", "whitened_probe", "lstsq_probe")
#: The ridge of ``whitened_probe`` and ``lstsq_probe``, relative to the mean eigenvalue of the
#: training split's feature covariance.
RIDGE = 1e-6
#: Why a rate line stopped extending with its best rate at an edge of the rates tried.
EDGE = ("diverged", "flat", "cap")
#: ``warmup_cosine``: the share of the budget spent in linear warmup.
WARMUP = 0.1


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
    eval_every: int
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
    head_init: tuple[torch.Tensor, torch.Tensor] | None = None  # lstsq_probe's (weight, bias)
    start: dict[str, tuple[float, float]] | None = None  # the evaluation at step 0

    def evals(self, steps: int) -> list[int]:
        """The evaluation steps of a run of ``steps`` updates."""
        return sorted({*range(0, steps, self.eval_every), steps})


def _batched(net: nn.Module, X: torch.Tensor, device, batch: int = 512) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([net(X[i : i + batch].to(device)) for i in range(0, X.shape[0], batch)])


def _evaluate(net: nn.Module, task: _Task, keys) -> dict[str, tuple[float, float]]:
    was = [m.training for m in net.modules()]
    net.eval()
    out = {}
    for key, (X, y) in task.sets.items():
        if key not in keys:
            continue
        logits = _batched(net, X, task.device).float()
        yy = y.to(logits.device)
        out[key] = (
            float(F_.cross_entropy(logits, yy)),
            float((logits.argmax(1) == yy).float().mean()),
        )
    for m, w in zip(net.modules(), was, strict=True):
        m.train(w)
    return out


def _head(task: _Task) -> nn.Linear:
    head = nn.Linear(task.dim, task.n_classes).to(task.device, task.dtype)
    if task.head_init is not None:
        with torch.no_grad():
            head.weight.copy_(task.head_init[0])
            head.bias.copy_(task.head_init[1])
    return head


def _build(task: _Task) -> tuple[nn.Module, dict[str, nn.Parameter]]:
    """``(net, held)``: a fresh copy with its head and the attacker's trainable set; ``held``
    maps the copy's own parameter names to their tensors (for ``changed``)."""
    if task.attacker in PROBES:  # the features are computed: no copy of the extractor
        return nn.Sequential(nn.Identity(), _head(task)), {}
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
    return nn.Sequential(ext, _head(task)), held


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


def _optimizer(task: _Task, name: str, params: list, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=task.momentum)
    return torch.optim.AdamW(params, lr=lr, weight_decay=task.weight_decay)


def scheduler(opt: torch.optim.Optimizer, schedule: str, steps: int):
    """The rate schedule of a run of ``steps`` updates, stepped after every update: ``None`` for
    ``"constant"``; for ``"warmup_cosine"`` torch's ``LinearLR`` from ``1/w`` to 1 over the first
    ``w = max(1, round(WARMUP · steps))`` updates, then ``CosineAnnealingLR`` down to 0 at
    ``steps`` (joined by ``SequentialLR``)."""
    if schedule == "constant":
        return None
    lr_s = torch.optim.lr_scheduler
    warm = max(1, round(WARMUP * steps))
    up = lr_s.LinearLR(opt, start_factor=1.0 / warm, end_factor=1.0, total_iters=warm)
    down = lr_s.CosineAnnealingLR(opt, T_max=max(1, steps - warm), eta_min=0.0)
    return lr_s.SequentialLR(opt, [up, down], milestones=[warm])


def _run(task: _Task, cfg: tuple[str, str, float], steps: int, test: bool = True) -> dict:
    """One configuration ``(optimizer, schedule, lr)`` for ``steps`` updates, evaluated at
    ``task.evals(steps)``: the curves, where it diverged, ``changed``. ``test=False`` (a run
    that can only be a step of the search, never the result) skips the test curves."""
    optimizer, schedule, lr = cfg
    keys = set(task.sets) if test else {"val"}
    evals = task.evals(steps)
    torch.manual_seed(task.seed)
    net, held = _build(task)
    params = [p for p in net.parameters() if p.requires_grad]
    opt = _optimizer(task, optimizer, params, lr)
    sched = scheduler(opt, schedule, steps)
    X, y = task.train
    gen = torch.Generator().manual_seed(task.seed + 1)
    n, perm, pos = X.shape[0], None, X.shape[0]
    curves: dict[str, list[float]] = {k: [] for k in ("train_loss", "test_loss", "test_acc")}
    curves["val_acc"] = []
    running, count, diverged = 0.0, 0, None
    for t in range(steps + 1):
        if t in evals:
            # every run starts from the same copy, head and adapters: step 0 is evaluated once
            if t == 0:
                task.start = task.start or _evaluate(net, task, task.sets)
            ev = task.start if t == 0 else _evaluate(net, task, keys)
            if t > 0 and not all(math.isfinite(loss) for loss, _ in ev.values()):
                diverged = t  # the weights blew up: this evaluation is not a checkpoint
                break
            if test:
                curves["test_loss"].append(ev["test"][0])
                curves["test_acc"].append(ev["test"][1])
            if "val" in ev:
                curves["val_acc"].append(ev["val"][1])
            if t > 0:
                curves["train_loss"].append(running / max(count, 1))
                running, count = 0.0, 0
        if t == steps:
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
        if sched is not None:
            sched.step()
        running, count = running + value, count + 1
    if diverged is not None:  # keep the last evaluation for the rest of the budget
        for vals in curves.values():
            if vals:
                vals.extend([vals[-1]] * (len(evals) - len(vals)))
    original = dict(task.extractor.named_parameters())
    changed = tuple(
        name
        for name, p in held.items()
        if not torch.equal(p.detach().cpu(), original[name].detach().cpu())
    )
    c = curves
    return {
        "record": {
            "optimizer": optimizer,
            "schedule": schedule,
            "lr": lr,
            "steps": steps,
            "val_area": mean_over_steps(c["val_acc"], evals) if c["val_acc"] else None,
            "val_final": c["val_acc"][-1] if c["val_acc"] else None,
            "diverged_at": diverged,
        },
        "evals": evals,
        "curves": curves,
        "changed": changed,
    }


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


def _probe_features(task_sets, X, y, attacker: str, n_classes: int):
    """``whitened_probe``: every set's features whitened with the training split's mean ``μ``
    and covariance ``C``, ``(F − μ)(C + λI)^{-1/2}``; ``lstsq_probe``: the head's start, the
    ridge least-squares fit of the one-hot labels, ``W = (F_cᵀF_c + nλI)^{-1} F_cᵀY_c``,
    ``b = ȳ − μW``. ``λ = RIDGE · tr(C)/D``; computed in float64."""
    F = X.double()
    mu = F.mean(0)
    Fc = F - mu
    C = Fc.T @ Fc / F.shape[0]
    lam = RIDGE * float(torch.trace(C)) / C.shape[0] or RIDGE  # all-equal features: λ = RIDGE
    eye = torch.eye(C.shape[0], dtype=C.dtype)
    if attacker == "whitened_probe":
        evals, V = torch.linalg.eigh(C)
        W = (V * (evals.clamp_min(0) + lam).rsqrt()) @ V.T
        white = {k: (((Xs.double() - mu) @ W).to(X.dtype), ys) for k, (Xs, ys) in task_sets.items()}
        return ((Fc @ W).to(X.dtype), y), white, None
    Y = F_.one_hot(y, n_classes).double()
    ybar = Y.mean(0)
    W = torch.linalg.solve(C + lam * eye, Fc.T @ (Y - ybar) / F.shape[0])
    return (X, y), task_sets, (W.T.to(X.dtype), (ybar - mu @ W).to(X.dtype))


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
    head_init = None
    if kw["attacker"] in PROBES:  # the frozen extractor's features, computed once
        X = _batched(body, X, device).cpu()
        sets = {k: (_batched(body, Xs, device).cpu(), ys) for k, (Xs, ys) in sets.items()}
        if kw["attacker"] != "linear_probe":
            (X, y), sets, head_init = _probe_features(sets, X, y, kw["attacker"], n_classes)
    fields = dict(sets=sets, device=device, dtype=dtype, train=(X, y), head_init=head_init)
    fields.update(n_classes=n_classes, dim=int(dim.shape[1]), targets=targets)
    return _Task(extractor, **fields, **kw)


def _key(run: dict[str, Any]) -> tuple[float, float, float]:
    """The selection order of ``SELECTION`` (larger is better)."""
    r = run["record"]
    return (r["val_area"] or 0.0, r["val_final"] or 0.0, -r["lr"])


def _extend(task, line, rates, runs, steps, used, cap, tried, test) -> str:
    """Extend a rate line ``(optimizer, schedule)`` by its grid's step beyond an edge while the
    best of ``runs`` (its runs at ``steps``, by rate) sits at an edge of ``rates`` (every rate of
    the line tried so far, sorted; both grow here); ``used`` counts the extensions per side
    (at most ``cap`` each). A line whose every rate scores the same (nothing learned, say) is
    extended towards larger rates. Returns why it stopped: ``interior`` (the best has a tried
    rate on either side), ``diverged`` (the best — or, on a line that scores the same
    everywhere, the largest rate — diverged), ``flat`` (the best scores exactly as its inner
    neighbour: the score does not depend on the rate there), ``cap``, or ``single`` (one rate:
    no step to extend by). ``test``: whether the new runs record test curves (:func:`_run`)."""
    while True:
        best = max(runs, key=lambda lr: _key(runs[lr]))
        if len(rates) < 2:
            return "single"
        if best not in (rates[0], rates[-1]):
            return "interior"
        high = best == rates[-1]
        if high and runs[best]["record"]["diverged_at"] is not None:
            return "diverged"
        score, inner = _key(runs[best])[:2], rates[-2] if high else rates[1]
        if all(lr in runs and _key(runs[lr])[:2] == score for lr in rates):
            if runs[rates[-1]]["record"]["diverged_at"] is not None:
                return "diverged"
            high, best = True, rates[-1]  # nothing tried differs (all at chance?): look up
        elif inner in runs and _key(runs[inner])[:2] == score:
            return "flat"
        side = "high" if high else "low"
        if used[side] >= cap:
            return "cap"
        new = best * rates[-1] / rates[-2] if high else best * rates[0] / rates[1]
        new = float(f"{new:.12g}")  # 1.0, not 1.0000000000000002
        runs[new] = _run(task, (*line, new), steps, test)
        tried.append(runs[new]["record"])
        rates.insert(len(rates) if high else 0, new)
        used[side] += 1


def attack(
    extractor, train, test, *, optimizers, schedules, grids, sweep, short_steps, keep, cap, **kw
) -> FinetuneResult:
    """The search of :func:`condreg.attacks.finetune_search` (and, with one optimizer, one
    schedule, ``short_steps = steps`` and ``cap = 0``, :func:`condreg.attacks.finetune`'s sweep;
    without ``sweep`` its one given rate): every rate line ``(optimizer, schedule)`` is run over
    its grid at ``short_steps`` and extended beyond its edges (:func:`_extend`); when
    ``short_steps < steps`` the ``keep`` best configurations run the full budget, and the
    winner's line is extended at the full budget as well. The best full-budget run is kept."""
    steps = kw.pop("steps")
    # torch.manual_seed reseeds every CUDA device too: restore them all afterwards
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        task = _task(extractor, train, test, sweep=sweep, **kw)
        tried: list[dict[str, Any]] = []
        lines, short = {}, {}
        final = short_steps == steps  # one rung: any run may be the result
        for line in ((o, s) for o in optimizers for s in schedules):
            runs = {}
            for lr in grids[line[0]]:
                runs[lr] = _run(task, (*line, lr), short_steps, test=final)
                tried.append(runs[lr]["record"])
            rates, used = sorted(runs), {"low": 0, "high": 0}
            stopped = (
                _extend(task, line, rates, runs, short_steps, used, cap, tried, final)
                if sweep
                else "given"
            )
            best_lr = max(runs, key=lambda lr: _key(runs[lr]))
            lines[line] = {"rates": rates, "used": used, "stopped": stopped, "best_lr": best_lr}
            short.update({(*line, lr): r for lr, r in runs.items()})
        if final:
            full = short
        else:  # successive halving: the keep best short runs get the full budget
            promoted = sorted(short, key=lambda c: _key(short[c]), reverse=True)[:keep]
            full = {}
            for cfg in promoted:
                full[cfg] = _run(task, cfg, steps)
                tried.append(full[cfg]["record"])
            line = max(full, key=lambda c: _key(full[c]))[:2]
            runs = {c[2]: r for c, r in full.items() if c[:2] == line}
            ln = lines[line]
            ln["stopped_full"] = _extend(
                task, line, ln["rates"], runs, steps, ln["used"], cap, tried, True
            )
            full.update({(*line, lr): r for lr, r in runs.items()})
    best = max(full, key=lambda c: _key(full[c]))
    chosen, ln = full[best], lines[best[:2]]
    stopped = ln.get("stopped_full", ln["stopped"])  # the winner is its line's best
    settings = {
        "attacker": task.attacker,
        "block": task.block,
        "optimizers": list(optimizers),
        "schedules": list(schedules),
        "steps": steps,
        "batch_size": task.batch_size,
        "lr_grid": list(grids[best[0]]),  # the chosen optimizer's starting grid
        "lr_grids": {o: list(grids[o]) for o in optimizers},
        "selection": SELECTION if sweep else "given",
        "chosen_at_grid_edge": stopped in EDGE,
        "capped": stopped == "cap",
        "stopped": stopped,
        "lines": [
            {
                "optimizer": o,
                "schedule": s,
                "rates": v["rates"],
                "best_lr": v["best_lr"],
                "at_edge": v["stopped"] in EDGE,
                "capped": v["stopped"] == "cap",
                "stopped": v["stopped"],
                "extended": dict(v["used"]),
            }
            for (o, s), v in lines.items()
        ],
        "short_steps": short_steps,
        "keep": keep if short_steps < steps else None,
        "cap": cap,
        "n_train": int(task.train[1].shape[0]),
        "n_val": int(task.sets["val"][1].shape[0]) if sweep else 0,
        "n_test": int(task.sets["test"][1].shape[0]),
        "n_classes": task.n_classes,
        "feature_dim": task.dim,
        "seed": task.seed,
        "device": str(task.device),
    }
    if "sgd" in optimizers:
        settings["momentum"] = task.momentum
    if "adamw" in optimizers:
        settings["weight_decay"] = task.weight_decay
    if task.attacker in ("whitened_probe", "lstsq_probe"):
        settings["ridge"] = RIDGE
    if task.attacker == "lora":
        settings.update(rank=task.rank, lora_alpha=task.rank, lora_targets=task.targets)
    c = chosen["curves"]
    return FinetuneResult(
        attacker=task.attacker,
        optimizer=best[0],
        lr=best[2],
        steps=chosen["evals"],
        test_acc=c["test_acc"],
        test_loss=c["test_loss"],
        train_loss=c["train_loss"],
        val_acc=c["val_acc"],
        sweep=tried,
        changed=chosen["changed"],
        settings=settings,
        schedule=best[1],
    )
