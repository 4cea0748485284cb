"""Evaluation of released extractors: RIR_θ0 (Eq. 17), accuracy and linear probing (Eq. 16)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F_

__all__ = ["ATTACKERS", "attacker_steps", "converged_probe_accuracy"]
__all__ += ["linear_probe_curve", "norm_ratio_curve", "rir_by_group_size", "steps_to_accuracy"]


def _with_ones(F, dtype=torch.float64) -> torch.Tensor:
    return F_.pad(F.to(dtype), (0, 1), value=1.0)


def rir_by_group_size(
    F_I: dict[str, torch.Tensor],
    F_0: dict[str, torch.Tensor],
    *,
    groups: int,
    sizes: Sequence[int],
    seed: int,
    same: bool,
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
