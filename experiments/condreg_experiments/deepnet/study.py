"""One architecture and seed: pre-training, the step sweep, immunization of every method and
evaluation (RIR_θ0 (Eq. 17), accuracy and linear probing (Eq. 16)), as plain JSON-able dicts."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F_

import condreg
from condreg_experiments.deepnet import models, training
from condreg_experiments.deepnet.data import Images
from condreg_experiments.deepnet.settings import SMALL_ARCHS, Settings

#: The errors that make one method fail (recorded; the other methods go on).
METHOD_FAILURES = (condreg.RankError, condreg.PoleError, FloatingPointError)

#: Tensors by split (``p_tr``, ``h_tr``, …) or by task (``p``, ``h``).
Tensors = dict[str, torch.Tensor]


@dataclasses.dataclass
class Prepared:
    """One arch and seed after pre-training: cached stem outputs ``S``, labels ``Y`` and the
    pre-trained features ``F0`` (keys ``p_tr``, ``p_val``, ``p_te``, ``h_tr``, ``h_te``)."""

    seed: int
    parts: models.Parts
    S: Tensors
    Y: Tensors
    F0: Tensors
    n_p: int
    n_h: int
    acc_before: float
    acc_before_val: float
    device: torch.device


def prepare(
    arch: str,
    s: Settings,
    images: Images,
    seed: int,
    progress: bool,
    parts: models.Parts | None = None,
) -> Prepared:
    """Split the tasks, build and pre-train the model on D_P, cache the frozen stem's outputs.
    ``parts``: a model this function pre-trained before on the same D_P and seed (reused as is,
    with another D_H)."""
    device, dtype = torch.device(s.device), getattr(torch, s.dtype)
    torch.manual_seed(seed)
    small = arch in SMALL_ARCHS
    P, H = images.tasks(seed)
    if parts is None:
        if small:
            parts = models.build_small(arch, s.feature_dim, P.n_classes)
        else:
            parts = models.build_large(arch, s.weights, P.n_classes)
        kw = dict(epochs=s.pretrain_epochs, lr=s.pretrain_lr, seed=seed, device=device)
        training.pretrain(parts, P.X_tr, P.y_tr, full=small, progress=progress, **kw)
    for p in parts.stem.parameters():
        p.requires_grad_(False)
    parts.stem.to(device).eval()
    parts.block.to(device, dtype).eval()
    parts.head.to(device, dtype)
    if s.target == "theta":
        parts = models.with_theta(parts)
        parts.block.to(device, dtype)
    arrays = {"p_tr": (P.X_tr, P.y_tr), "p_val": (P.X_val, P.y_val), "p_te": (P.X_te, P.y_te)}
    arrays.update(h_tr=(H.X_tr, H.y_tr), h_te=(H.X_te, H.y_te))
    S = _features(parts.stem, {k: X for k, (X, _) in arrays.items()}, device, dtype)
    Y = {k: torch.as_tensor(y) for k, (_, y) in arrays.items()}
    F0 = _features(parts.block, S, device)
    acc, acc_val = (_accuracy(parts.head, F0[k], Y[k], device) for k in ("p_te", "p_val"))
    return Prepared(seed, parts, S, Y, F0, P.n_classes, H.n_classes, acc, acc_val, device)


def _features(module, X: dict, device, dtype=None) -> Tensors:
    return {k: training.batched_apply(module, v, device=device, dtype=dtype) for k, v in X.items()}


def _accuracy(head, F: torch.Tensor, y: torch.Tensor, device) -> float:
    with torch.no_grad():
        return float((head(F.to(device)).argmax(1).cpu() == y.cpu()).float().mean())


def _immunize(prep: Prepared, method: str, s: Settings, reg_step: float, progress: bool):
    if method == "identity":
        return None
    d = (prep.S["p_tr"], prep.Y["p_tr"], prep.S["h_tr"], prep.Y["h_tr"])
    kw = dict(s=s, reg_step=reg_step, seed=prep.seed, device=prep.device, progress=progress)
    return training.immunize(method, prep.parts, d, **kw)


def sweep(prep: Prepared, s: Settings, progress: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every method at every ``s.reg_steps``; a method's chosen step is the largest whose D_P
    validation accuracy is within ``s.acc_tolerance`` of the pre-trained model's (else the
    smallest): D_P only, never RIR. Returns the sweep record and the chosen models."""
    record: dict[str, Any] = {"seed": prep.seed, "acc_before_val": prep.acc_before_val}
    chosen_models: dict[str, Any] = {}
    for method in s.methods:
        if method == "identity":
            continue
        accs, models_, fails = {}, {}, {}
        for step in s.reg_steps:
            try:
                imm = _immunize(prep, method, s, step, progress)
            except METHOD_FAILURES as exc:
                fails[str(step)] = f"{type(exc).__name__}: {exc}"
                continue
            F = training.batched_apply(imm.block, prep.S["p_val"], device=prep.device)
            accs[str(step)] = _accuracy(imm.head, F, prep.Y["p_val"], prep.device)
            models_[step] = imm
        ok = [st for st in models_ if accs[str(st)] >= prep.acc_before_val - s.acc_tolerance]
        best = max(ok) if ok else (min(models_) if models_ else None)
        record[method] = {"val_acc": accs, "failed": fails, "chosen": best}
        if best is not None:
            chosen_models[method] = models_[best]
    return record, chosen_models


def _with_ones(F, dtype=torch.float64) -> torch.Tensor:
    return F_.pad(F.to(dtype), (0, 1), value=1.0)


def rir_by_group_size(
    F_I: Tensors, F_0: Tensors, *, groups: int, sizes: Sequence[int], seed: int, same: bool
) -> dict[int, dict[str, Any]]:
    """Eq. 17 (:func:`condreg.metrics.rir_theta0`) for each group size in ``sizes``, on the
    features ``F["p"]`` / ``F["h"]`` (rows of ``[F_p; F_h]`` are its "inputs")."""
    from condreg.metrics import rir_theta0

    n_p, n_h = F_I["p"].shape[0], F_I["h"].shape[0]
    rows_p, rows_h = torch.arange(n_p), torch.arange(n_p, n_p + n_h)
    all_I, all_0 = torch.cat([F_I["p"], F_I["h"]]), torch.cat([F_0["p"], F_0["h"]])
    f_I, f_0 = (lambda ix: all_I[ix]), (lambda ix: all_0[ix])
    out = {}
    for size in sizes:
        with warnings.catch_warnings():
            if same:  # identity: f_I returns f_0's features by construction (RIR_θ0 = 1)
                warnings.filterwarnings("ignore", message="rir_theta0: f_I and f_0 return")
            kw = dict(groups=int(groups), group_size=int(size), seed=seed)
            res = rir_theta0(f_I, f_0, rows_p, rows_h, **kw)
        out[int(size)] = {"i": res.i, "ii": res.ii, "rir_theta0": res.rir, "ratios": res.ratios}
    return out


def linear_probe_curve(
    F_tr, y_tr, F_te, y_te, *, n_classes: int, steps: int, every: int = 5
) -> dict[str, list[float]]:
    """Linear probing by full-batch GD on cross-entropy from a zero head on ``A = [F_tr, 1]``, step
    ``1 / λ_max(AᵀA / N)``: ``steps`` (recorded), ``test_acc``, ``train_loss``, ``lr``."""
    dtype = torch.float64
    A, At = _with_ones(F_tr, dtype), _with_ones(F_te, dtype)
    y_tr, y_te = y_tr.long(), y_te.long()
    n = A.shape[0]
    lr = 1.0 / max(float(torch.linalg.matrix_norm(A, ord=2)) ** 2 / n, 1e-30)
    W = torch.zeros(A.shape[1], n_classes, dtype=dtype)
    onehot = F_.one_hot(y_tr, n_classes).to(dtype)
    rec_steps, accs, losses = [], [], []
    for t in range(steps + 1):
        logits = A @ W
        if t % every == 0 or t == steps:
            rec_steps.append(t)
            losses.append(float(F_.cross_entropy(logits, y_tr)))
            accs.append(float(((At @ W).argmax(1) == y_te).to(dtype).mean()))
        if t == steps:
            break
        W = W - lr * (A.T @ (torch.softmax(logits, dim=1) - onehot)) / n
    return {"steps": rec_steps, "test_acc": accs, "train_loss": losses, "lr": lr}


def converged_probe_accuracy(F_tr, y_tr, F_te, y_te, *, n_classes: int, iters: int) -> float:
    """Held-out accuracy of a linear probe on standardised ``[F, 1]`` after ``iters`` L-BFGS
    iterations (cross-entropy + 1e-4·‖W‖²): what a second-order attacker reaches."""
    dtype = torch.float64
    F_tr, F_te = F_tr.to(dtype), F_te.to(dtype)
    mu, sd = F_tr.mean(0), F_tr.std(0).clamp(min=1e-12)
    A, At = _with_ones((F_tr - mu) / sd), _with_ones((F_te - mu) / sd)
    W = torch.zeros(A.shape[1], n_classes, dtype=dtype, requires_grad=True)
    opt = torch.optim.LBFGS([W], max_iter=int(iters), line_search_fn="strong_wolfe")
    y = y_tr.long()

    def closure():
        opt.zero_grad()
        loss = F_.cross_entropy(A @ W, y) + 1e-4 * (W**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(((At @ W).argmax(1) == y_te.long()).to(dtype).mean())


def steps_to_accuracy(curve: dict[str, list[float]], level: float) -> int | None:
    """First recorded probe step whose test accuracy reaches ``level`` (None if never)."""
    reached = (int(s) for s, a in zip(curve["steps"], curve["test_acc"], strict=True) if a >= level)
    return next(reached, None)


def norm_ratio_curve(F, y, n_classes: int, steps: int) -> list[float]:
    """Eq. 16: ‖w_t − w*‖²/‖w_0 − w*‖² of :func:`condreg.metrics.probe_convergence` on
    ``[F, 1]``, averaged over the one-vs-rest targets of the classes."""
    from condreg.metrics import probe_convergence

    A = _with_ones(F)
    curves = [probe_convergence(A, (y == c).to(A.dtype), steps) for c in range(n_classes)]
    return torch.stack(curves).mean(0).tolist()


#: The attackers of :func:`condreg.attacks.probe` run on every released extractor.
ATTACKERS: tuple[str, ...] = ("gd", "momentum", "adam", "lbfgs")


def attacker_steps(F, y, *, steps: int, fraction: float = 0.99) -> dict[str, dict[str, Any]]:
    """Each attacker on the least-squares probe ``‖[F, 1]w − y₀‖²`` (``y₀``: class 0 vs rest):
    ``steps_to`` ``fraction`` of the achievable loss reduction (or ``None``) and the
    ``reduction`` reached after ``steps``."""
    from condreg.attacks import probe

    A = _with_ones(F)
    target = (y == 0).to(A.dtype)
    out = {}
    for a in ATTACKERS:
        res = probe(None, A, target, attacker=a, steps=steps)
        out[a] = {"steps_to": res.steps_to(fraction), "reduction": float(res.reduction()[-1])}
    return out


def _probe(prep: Prepared, F: Tensors, task: str, s: Settings):
    n = prep.n_h if task == "h" else prep.n_p
    data = (F[f"{task}_tr"], prep.Y[f"{task}_tr"], F[f"{task}_te"], prep.Y[f"{task}_te"])
    curve = linear_probe_curve(*data, n_classes=n, steps=s.probe_steps, every=s.probe_every)
    return curve, converged_probe_accuracy(*data, n_classes=n, iters=s.probe_converge_iters)


def _kappa(F) -> float:
    return float(condreg.condition_number(F, gram=True))


def evaluate(prep: Prepared, method: str, imm, s: Settings, target_acc: float | None) -> dict:
    """Every reported number of one method on one seed (``imm`` None: the identity)."""
    F = prep.F0 if imm is None else _features(imm.block, prep.S, prep.device)
    head = prep.parts.head if imm is None else imm.head
    acc_after = _accuracy(head, F["p_te"], prep.Y["p_te"], prep.device)
    sizes = sorted({*s.rir_group_sizes, s.rir_group_size})
    F_I, F_0 = {"p": F["p_tr"], "h": F["h_tr"]}, {"p": prep.F0["p_tr"], "h": prep.F0["h_tr"]}
    kw = dict(groups=s.rir_groups, sizes=sizes, seed=prep.seed, same=imm is None)
    by_size = rir_by_group_size(F_I, F_0, **kw)
    main = by_size[s.rir_group_size]
    probe_h, conv_h = _probe(prep, F, "h", s)
    probe_p, conv_p = _probe(prep, F, "p", s)
    target = probe_h["test_acc"][-1] * s.probe_target if target_acc is None else target_acc
    return {
        **{k: main[k] for k in ("rir_theta0", "i", "ii")},
        "ratios": list(main["ratios"]),
        "rir_by_group_size": {
            str(k): {kk: v[kk] for kk in ("i", "ii", "rir_theta0")} for k, v in by_size.items()
        },
        "kappa_h_full": {"theta0": _kappa(prep.F0["h_tr"]), "immunized": _kappa(F["h_tr"])},
        "kappa_p_full": {"theta0": _kappa(prep.F0["p_tr"]), "immunized": _kappa(F["p_tr"])},
        "acc_p_before": prep.acc_before,
        "acc_p_after": acc_after,
        "probe_h": probe_h,
        "probe_p": probe_p,
        **{f"probe_{t}_final_acc": c["test_acc"][-1] for t, c in (("h", probe_h), ("p", probe_p))},
        "probe_h_converged": conv_h,
        "probe_p_converged": conv_p,
        "probe_target": target,
        "probe_h_steps_to_target": steps_to_accuracy(probe_h, target),
        "norm_ratio_h": norm_ratio_curve(F["h_tr"], prep.Y["h_tr"], prep.n_h, s.probe_steps),
        "attacker_steps_h": attacker_steps(F["h_tr"], prep.Y["h_tr"], steps=s.attack_steps),
        **{f"lam_{t}": 0.0 if imm is None else imm.lam.get(t, 0.0) for t in ("p", "h")},
        "history": [] if imm is None else imm.history,
    }


def run_seed(
    arch: str,
    s: Settings,
    images: Images,
    seed: int,
    steps: dict[str, float] | None,
    progress: bool,
):
    """One seed of one arch: returns ``(record, sweep_record)``. ``steps`` None: this is the
    sweep seed; the sweep runs first and its chosen models are this seed's results."""
    t0 = time.perf_counter()
    prep = prepare(arch, s, images, seed, progress)
    sweep_record, ready = None, {}
    methods, failed, target = {}, {}, None
    if steps is None:
        sweep_record, ready = sweep(prep, s, progress)
        steps = {m: r["chosen"] for m, r in sweep_record.items() if isinstance(r, dict)}
    for method in s.methods:
        t1 = time.perf_counter()
        step = steps.get(method)
        if method != "identity" and step is None:
            failed[method] = "failed at every swept step"
            continue
        try:
            imm = ready.get(method) or _immunize(prep, method, s, step, progress)
        except METHOD_FAILURES as exc:
            failed[method] = f"{type(exc).__name__}: {exc}"
            continue
        res = evaluate(prep, method, imm, s, target)
        if method == "identity":
            target = res["probe_target"]
        res.update(reg_step=step, seconds=time.perf_counter() - t1)
        methods[method] = res
    targets = models.precond_targets(getattr(prep.parts.block, "theta", prep.parts.block))
    record = {
        "arch": arch,
        "seed": seed,
        "acc_p_before": prep.acc_before,
        "methods": methods,
        "failed": failed,
        "feature_dim": prep.parts.feature_dim,
        "immunized": prep.parts.immunized,
        "immunized_weights": [t.name for t in targets],
        "immunized_parameters": sum(t.param.numel() for t in targets),
        "n_train": {"p": int(prep.S["p_tr"].shape[0]), "h": int(prep.S["h_tr"].shape[0])},
        "seconds": time.perf_counter() - t0,
    }
    return record, sweep_record
