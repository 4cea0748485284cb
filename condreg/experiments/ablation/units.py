"""The ablation's units of work and their scoring (run in worker processes; NumPy only).

A unit is one (kind, dataset, protocol, seed, pair): every method trained once and scored two
ways — κ over the nonzero singular values (condreg's, at the rank tolerance of
:func:`condreg.experiments._linear.default_rtol`) and the released ridge-floor κ
(:func:`~.released.ridge_floor_kappa`). Kinds: ``"default"`` (``condreg.immunize`` with the
experiment's defaults: the θ whose nonzero-κ numbers the default experiment reports),
``"emulated"`` (:func:`~.emulator.emulate` under a protocol) and ``"sweep"`` (``condreg.immunize``
at another ``max_step``).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np

from condreg.experiments.ablation.emulator import Protocol, emulate
from condreg.experiments.ablation.released import ridge_floor_kappa

__all__ = ["METHODS", "score_two_ways", "input_kappas", "run_unit", "head_only_loss"]

#: The methods, in the paper's table order (Ours last).
METHODS: tuple[str, ...] = ("r_ill_only", "imma", "opt_kappa", "condreg")


def _features(X: np.ndarray, theta: np.ndarray | None, bias: np.ndarray | None) -> np.ndarray:
    F = X if theta is None else X @ theta
    return F if bias is None else F + bias


def input_kappas(X_p: np.ndarray, X_h: np.ndarray) -> dict[str, dict[str, float]]:
    """κ(K_P), κ(K_H) at θ = I under both scorings (``"nonzero"`` with its ranks, ``"ridge"``)."""
    from condreg.experiments._linear import default_rtol, kappa_features

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
    """Eq. 15 of ``f(x) = xᵀθ + b`` under both scorings: ``{"nonzero": …, "ridge": …}``, each with
    κ(H_P), κ(H_H), (i), (ii), RIR and success ((i) > 1 and (ii) ≤ 1). ``inputs``:
    :func:`input_kappas` of the same ``X_p``, ``X_h``. Non-finite θ scores NaN (a failure)."""
    from condreg.experiments._linear import default_rtol, kappa_features

    rtol = default_rtol(X_p, X_h)
    out = {}
    finite = bool(np.all(np.isfinite(theta))) and (bias is None or bool(np.all(np.isfinite(bias))))
    for way in ("nonzero", "ridge"):
        if not finite:
            k_hp = k_hh = float("nan")
        elif way == "nonzero":
            k_hp = kappa_features(_features(X_p, theta, bias), rtol)[0]
            k_hh = kappa_features(_features(X_h, theta, bias), rtol)[0]
        else:
            k_hp = ridge_floor_kappa(_features(X_p, theta, bias))
            k_hh = ridge_floor_kappa(_features(X_h, theta, bias))
        i, ii = k_hh / inputs[way]["kappa_K_H"], k_hp / inputs[way]["kappa_K_P"]
        ok = math.isfinite(i) and math.isfinite(ii) and i > 1 and ii <= 1
        out[way] = {"kappa_H_P": k_hp, "kappa_H_H": k_hh, "i": i, "ii": ii, "rir": i / ii,
                    "success": bool(ok)}  # fmt: skip
    return out


def head_only_loss(X: np.ndarray, y: np.ndarray, task: str, epochs: int, lr: float) -> float:
    """The D_P loss of the head alone trained as ``condreg.immunize`` trains it (θ = I fixed,
    ω from 0, ``epochs`` gradient steps of size ``lr`` on the scaled loss): the reference of
    the D_P-only ``max_step`` rule. Relative squared error (regression) or mean logistic loss."""
    _, s, _ = np.linalg.svd(X, full_matrices=False)
    Xs = X * (math.sqrt(X.shape[0]) / s[0])
    ys = y / (math.sqrt(float(np.mean(y * y))) or 1.0) if task == "regression" else y
    w = np.zeros(X.shape[1])

    def loss_grad(w):
        z = Xs @ w
        if task == "regression":
            return float(np.mean((z - ys) ** 2)), Xs.T @ (2.0 * (z - ys)) / len(ys)
        p = 0.5 * (1.0 + np.tanh(0.5 * z))
        return float(np.mean(np.logaddexp(0.0, z) - ys * z)), Xs.T @ (p - ys) / len(ys)

    for _ in range(epochs):
        w = w - lr * loss_grad(w)[1]
    return loss_grad(w)[0]


def _default_unit(data: dict[str, Any], spec: dict[str, Any], methods) -> dict[str, Any]:
    """``condreg.immunize`` exactly as the default experiment calls it; θ scored both ways."""
    from condreg.experiments._linear import immunize_method

    out = {}
    for m in methods:
        res = immunize_method(
            m, data["X_p"], data["y_p"], data["X_h"], y_h=data["y_h"], task=data["task"],
            epochs=spec["epochs"], lr=spec["lr"], seed=spec["seed"],
            **({"max_step": spec["max_step"]} if spec.get("max_step") else {}),
        )  # fmt: skip
        entry = score_two_ways(res["_theta"], None, data["X_p"], data["X_h"], data["inputs"])
        entry["condreg_rir"] = res["rir"]
        entry["history_rir"] = res["history"].get("rir", [])
        entry["loss_final"] = res["loss_final"]
        entry["stopped"] = res["stopped"]
        out[m] = entry
    return out


def _emulated_unit(data: dict[str, Any], spec: dict[str, Any], methods) -> dict[str, Any]:
    protocol = Protocol(
        spec["dataset"], frozenset(spec["switches"]), spec["epochs"], spec["lr"], data["task"]
    )
    out = {}
    for m in methods:
        tr = emulate(m, data["X_p"], data["y_p"], data["X_h"], data["y_h"], protocol,
                     seed=spec["seed"])  # fmt: skip
        entry = score_two_ways(tr.theta, tr.bias, data["X_p"], data["X_h"], data["inputs"])
        entry.update(stopped=tr.stopped, lam=tr.lam, epochs_run=tr.epochs_run)
        out[m] = entry
    return out


def run_unit(data: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Run one unit (``spec["kind"]``) on ``data`` (``X_p``, ``y_p``, ``X_h``, ``y_h``, ``task``,
    ``inputs``); returns ``{"spec", "methods", "seconds"}``. Warnings of the runs are dropped
    (each result records why it stopped)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    methods = spec["methods"]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if spec["kind"] == "emulated":
            result = _emulated_unit(data, spec, methods)
        else:
            result = _default_unit(data, spec, methods)
        if spec["kind"] == "default":
            result["head_only_loss"] = head_only_loss(
                data["X_p"], data["y_p"], data["task"], spec["epochs"], spec["lr"]
            )
    return {
        "spec": spec,
        "methods": result,
        "seconds": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu_start,
    }


def run_unit_packed(args: tuple) -> dict[str, Any]:
    """:func:`run_unit` with its arguments in one tuple (for a process pool)."""
    return run_unit(*args)
