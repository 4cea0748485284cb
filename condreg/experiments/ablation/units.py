"""The ablation's units (run in worker processes): one (kind, dataset, protocol, seed, pair), every
method trained by ``condreg.immunize`` or (``emulated``) the emulator and scored both ways."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np

from condreg.experiments._linear import default_rtol, immunize_method, kappa_features
from condreg.experiments.ablation.emulator import Protocol, emulate, head_only_loss
from condreg.experiments.ablation.released import ridge_floor_kappa

__all__ = ["METHODS", "score_two_ways", "input_kappas", "run_unit", "head_only_loss"]

#: The methods, in the paper's table order (Ours last), and their names in tables and plots.
METHODS: tuple[str, ...] = ("r_ill_only", "imma", "opt_kappa", "condreg")
LABELS = {"condreg": "Ours", "r_ill_only": "R_ill only", "opt_kappa": "Opt κ", "imma": "IMMA"}


def input_kappas(X_p: np.ndarray, X_h: np.ndarray) -> dict[str, dict[str, float]]:
    """κ(K_P), κ(K_H) at θ = I under both scorings (``"nonzero"`` with its ranks, ``"ridge"``)."""
    rtol = default_rtol(X_p, X_h)
    (kp, rp), (kh, rh) = kappa_features(X_p, rtol), kappa_features(X_h, rtol)
    return {
        "nonzero": {"kappa_K_P": kp, "kappa_K_H": kh, "rank_K_P": rp, "rank_K_H": rh},
        "ridge": {"kappa_K_P": ridge_floor_kappa(X_p), "kappa_K_H": ridge_floor_kappa(X_h)},
    }


def score_two_ways(
    theta: np.ndarray,
    bias: np.ndarray | None,
    X_p: np.ndarray,
    X_h: np.ndarray,
    inputs: dict[str, dict[str, float]],
) -> dict[str, dict[str, Any]]:
    """Eq. 15 of ``f(x) = xᵀθ + b`` under both scorings (``{"nonzero": …, "ridge": …}``, each
    κ(H_P), κ(H_H), (i), (ii), RIR, success) given :func:`input_kappas`; non-finite θ: NaN."""
    rtol = default_rtol(X_p, X_h)
    kappa = {"nonzero": lambda F: kappa_features(F, rtol)[0], "ridge": ridge_floor_kappa}
    out = {}
    finite = bool(np.all(np.isfinite(theta))) and (bias is None or bool(np.all(np.isfinite(bias))))
    F_p, F_h = (X @ theta if bias is None else X @ theta + bias for X in (X_p, X_h))
    for way in ("nonzero", "ridge"):
        k_hp, k_hh = (kappa[way](F_p), kappa[way](F_h)) if finite else (math.nan, math.nan)
        i, ii = k_hh / inputs[way]["kappa_K_H"], k_hp / inputs[way]["kappa_K_P"]
        ok = math.isfinite(i) and math.isfinite(ii) and i > 1 and ii <= 1
        out[way] = dict(kappa_H_P=k_hp, kappa_H_H=k_hh, i=i, ii=ii, rir=i / ii, success=bool(ok))
    return out


def _method(m: str, data: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """One method trained by the emulator (kind ``emulated``) or, as the default experiment
    calls it, by ``condreg.immunize``; θ scored both ways."""
    X_p, y_p, X_h, y_h, task = (data[k] for k in ("X_p", "y_p", "X_h", "y_h", "task"))
    if spec["kind"] == "emulated":
        protocol = Protocol(
            spec["dataset"], frozenset(spec["switches"]), spec["epochs"], spec["lr"], task
        )
        tr = emulate(m, X_p, y_p, X_h, y_h, protocol, seed=spec["seed"])
        entry = score_two_ways(tr.theta, tr.bias, X_p, X_h, data["inputs"])
        entry.update(stopped=tr.stopped, lam=tr.lam, epochs_run=tr.epochs_run)
        return entry
    options = {k: spec[k] for k in ("epochs", "lr", "seed")}
    if spec.get("max_step"):
        options["max_step"] = spec["max_step"]
    res = immunize_method(m, X_p, y_p, X_h, y_h=y_h, task=task, **options)
    entry = score_two_ways(res["_theta"], None, X_p, X_h, data["inputs"])
    entry.update(condreg_rir=res["rir"], history_rir=res["history"].get("rir", []))
    entry.update(loss_final=res["loss_final"], stopped=res["stopped"])
    return entry


def run_unit(data: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Run one unit on ``data``, warnings dropped: ``{"spec", "methods", "seconds", "cpu_s"}``."""
    start, cpu_start = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        result = {m: _method(m, data, spec) for m in spec["methods"]}
        if spec["kind"] == "default":
            args = data["X_p"], data["y_p"], data["task"], spec["epochs"], spec["lr"]
            result["head_only_loss"] = head_only_loss(*args)
    seconds = time.perf_counter() - start
    return dict(spec=spec, methods=result, seconds=seconds, cpu_s=time.process_time() - cpu_start)


def run_unit_packed(args: tuple) -> dict[str, Any]:
    """:func:`run_unit` with its arguments in one tuple (for a process pool)."""
    return run_unit(*args)
