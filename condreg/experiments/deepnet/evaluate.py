"""Evaluation of released extractors: RIR_θ0 (Eq. 17, and its group-size sensitivity), D_P
accuracy, and linear probing on D_H (steps to a target accuracy, converged accuracy, Eq. 16)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F_

from condreg.experiments import _report

__all__ = ["ATTACKERS", "attacker_steps", "converged_probe_accuracy", "features"]
__all__ += ["linear_probe_curve", "norm_ratio_curve", "rir_by_group_size", "steps_to_accuracy"]


def features(block, S: torch.Tensor, *, device, batch: int = 512) -> torch.Tensor:
    """``block(S)`` in batches, no gradient, as a CPU tensor."""
    out = []
    with torch.no_grad():
        for i in range(0, S.shape[0], batch):
            out.append(block(S[i : i + batch].to(device)).cpu())
    return torch.cat(out)


def _with_ones(F, dtype=torch.float64) -> torch.Tensor:
    """``[F, 1]`` in ``dtype``: the features with a bias column."""
    return torch.cat([F.to(dtype), torch.ones(F.shape[0], 1, dtype=dtype)], 1)


def accuracy(logits, y) -> float:
    return float((logits.argmax(1).cpu() == y.cpu()).float().mean())


def rir_by_group_size(
    F_I: dict[str, torch.Tensor],
    F_0: dict[str, torch.Tensor],
    *,
    groups: int,
    sizes: Sequence[int],
    seed: int,
    same: bool,
) -> dict[int, dict[str, Any]]:
    """Eq. 17 via :func:`condreg.metrics.rir_theta0` on precomputed features (``F["p"]``,
    ``F["h"]``: the D_P / D_H training sets through the extractor) for each group size in
    ``sizes``. The "inputs" handed to ``rir_theta0`` are row numbers into ``[F_p; F_h]``, so the
    same groups are drawn as from the images."""
    from condreg.metrics import rir_theta0

    n_p, n_h = F_I["p"].shape[0], F_I["h"].shape[0]
    rows_p, rows_h = torch.arange(n_p), torch.arange(n_p, n_p + n_h)
    all_I = torch.cat([F_I["p"], F_I["h"]])
    all_0 = torch.cat([F_0["p"], F_0["h"]])
    out = {}
    for size in sizes:
        with warnings.catch_warnings():
            if same:  # identity: f_I returns f_0's features by construction (RIR_θ0 = 1)
                warnings.filterwarnings("ignore", message="rir_theta0: f_I and f_0 return")
            f_I, f_0 = (lambda ix: all_I[ix]), (lambda ix: all_0[ix])
            kw = dict(groups=int(groups), group_size=int(size), seed=seed)
            res = rir_theta0(f_I, f_0, rows_p, rows_h, **kw)
        out[int(size)] = {"i": res.i, "ii": res.ii, "rir_theta0": res.rir, "ratios": res.ratios}
    return out


def linear_probe_curve(
    F_tr,
    y_tr,
    F_te,
    y_te,
    *,
    n_classes: int,
    steps: int,
    every: int = 5,
    progress: bool = False,
    desc: str | None = None,
) -> dict[str, list[float]]:
    """Linear probing of frozen features by full-batch gradient descent on cross-entropy.

    A fresh head ``[W; b]`` (zeros) on ``[F, 1]``; step ``1 / λ_max(AᵀA / N)`` with
    ``A = [F_tr, 1]`` — the attacker's largest safe step for each extractor, so that the speed
    of probing is governed by the conditioning of the features, not by their scale (docs/math.md
    Eq. 2). Returns ``steps`` (the recorded step numbers), ``test_acc``, ``train_loss``, ``lr``.
    """
    dtype = torch.float64
    A, At = _with_ones(F_tr, dtype), _with_ones(F_te, dtype)
    y_tr, y_te = y_tr.long(), y_te.long()
    n = A.shape[0]
    lr = 1.0 / max(float(torch.linalg.matrix_norm(A, ord=2)) ** 2 / n, 1e-30)
    W = torch.zeros(A.shape[1], n_classes, dtype=dtype)
    onehot = F_.one_hot(y_tr, n_classes).to(dtype)
    rec_steps, accs, losses = [], [], []
    for t in _report.progress(range(steps + 1), enabled=progress, desc=desc, total=steps + 1):
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
    """Held-out accuracy of a (nearly) converged linear probe: multinomial logistic regression
    on standardised features ``[F, 1]`` minimised by L-BFGS (``iters`` iterations, strong-Wolfe
    line search, a tiny L2 term 1e-4·‖W‖² so the minimum exists on separable data). Whitening-
    free but scale-free: this is what an attacker with a second-order optimiser reaches."""
    dtype = torch.float64
    mu, sd = F_tr.to(dtype).mean(0), F_tr.to(dtype).std(0).clamp(min=1e-12)
    A, At = _with_ones((F_tr.to(dtype) - mu) / sd), _with_ones((F_te.to(dtype) - mu) / sd)
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
    for s, a in zip(curve["steps"], curve["test_acc"], strict=True):
        if a >= level:
            return int(s)
    return None


def norm_ratio_curve(F, y, n_classes: int, steps: int) -> list[float]:
    """Eq. 16 on D_H: ‖w_t − w*‖²/‖w_0 − w*‖² of least-squares probing with exact line search
    (:func:`condreg.metrics.probe_convergence`) on ``A = [F, 1]``, averaged over the one-vs-rest
    targets of the classes."""
    from condreg.metrics import probe_convergence

    A = _with_ones(F)
    curves = [probe_convergence(A, (y == c).to(A.dtype), steps) for c in range(n_classes)]
    return torch.stack(curves).mean(0).tolist()


#: The attackers of :func:`condreg.attacks.probe` run on every released extractor (the
#: paper's exact-line-search GD is Eq. 16's curve, :func:`norm_ratio_curve`).
ATTACKERS: tuple[str, ...] = ("gd", "momentum", "adam", "lbfgs")


def attacker_steps(F, y, *, steps: int, fraction: float = 0.99) -> dict[str, dict[str, Any]]:
    """Each attacker of :mod:`condreg.attacks` on the least-squares probe ``‖[F, 1]w − y₀‖²``
    of D_H (``y₀``: one-vs-rest target of the first class): ``steps_to`` (the first step that
    reaches ``fraction`` of the achievable loss reduction, ``None`` if not within ``steps``) and
    ``reduction`` (the fraction reached after ``steps``)."""
    from condreg.attacks import probe

    A = _with_ones(F)
    target = (y == 0).to(A.dtype)
    out = {}
    for a in ATTACKERS:
        res = probe(None, A, target, attacker=a, steps=steps)
        out[a] = {"steps_to": res.steps_to(fraction), "reduction": float(res.reduction()[-1])}
    return out
