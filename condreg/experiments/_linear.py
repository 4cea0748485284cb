"""Shared code of the linear experiments (house prices, MNIST pairs, convergence).

Runs :func:`condreg.immunize` for each method on one (D_P, D_H) pair and measures Eq. 15 with
:func:`condreg.metrics.rir` at the run's rank tolerance ``rtol`` (one κ per run, docs/math.md
§10.2). Independently of it, :func:`spectrum_numbers` recomputes every condition number from the
SVD of the features ``Xθ`` (κ(θᵀKθ) = κ(Xθ)², over the singular values above ``rtol·σ₁``), so
the reported numbers are cross-checked. :func:`tolerance_robustness` repeats the verdict at 10×
and 100× the run's tolerance (docs/math.md §10.3). NumPy only.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from condreg.experiments._report import mean_std

__all__ = [
    "TOLERANCE_FACTORS",
    "check_task_ranks",
    "default_rtol",
    "kappa_features",
    "spectrum_numbers",
    "rir_numbers",
    "tolerance_robustness",
    "immunize_method",
    "stopped_early",
    "summarise_runs",
    "success",
]

#: The verdict of every run is reported at rtol, 10·rtol and 100·rtol (docs/math.md §10.3).
TOLERANCE_FACTORS: tuple[int, ...] = (1, 10, 100)


def default_rtol(X_p: np.ndarray, X_h: np.ndarray) -> float:
    """A rank tolerance on σ(Xθ) for reference numbers computed outside a run (θ = I):
    ``max(N_P, N_H, D)·eps(float64)``, the rule ``max(N, D)·eps`` of
    :func:`condreg.condition_number` taken over both tasks. Runs use the ``rtol`` that
    :func:`condreg.immunize` records."""
    n = max(X_p.shape[0], X_h.shape[0], X_p.shape[1])
    return float(n * np.finfo(np.float64).eps)


def check_task_ranks(X_p: np.ndarray, X_h: np.ndarray, *, where: str) -> None:
    """Raise :class:`condreg.data.DataError` unless both tasks' inputs have rank >= 2.

    κ needs two nonzero singular values, R_ill a rank >= 2: data that fail this (constant or
    duplicated columns, too few rows) are a problem of the data, reported before any run.
    """
    from condreg.data import DataError

    for X, task in ((X_p, "pre-training task D_P"), (X_h, "harmful task D_H")):
        rank = kappa_features(X)[1]
        if rank < 2:
            raise DataError(
                f"{where}: the {task}'s inputs ({X.shape[0]}×{X.shape[1]}) have rank {rank}; "
                f"condition numbers and R_ill need rank >= 2 (constant columns? too few rows?)"
            )


def kappa_features(F: np.ndarray, rtol: float | None = None) -> tuple[float, int]:
    """κ(FᵀF) over the nonzero singular values and the rank, from the SVD of ``F``.

    A singular value counts when it exceeds ``rtol·σ₁`` (default ``max(N, D)·eps``). Returns
    ``(nan, 0)`` for an empty or zero ``F``.
    """
    F = np.asarray(F, dtype=np.float64)
    s = np.linalg.svd(F, compute_uv=False)
    if s.size == 0 or s[0] == 0:
        return float("nan"), 0
    tol = max(F.shape) * np.finfo(np.float64).eps if rtol is None else float(rtol)
    keep = s > tol * s[0]
    s = s[keep]
    return float((s[0] / s[-1]) ** 2), int(keep.sum())


def spectrum_numbers(
    theta: np.ndarray | None, X_p: np.ndarray, X_h: np.ndarray, *, rtol: float | None = None
) -> dict[str, Any]:
    """κ(K_P), κ(K_H), κ(H_P(θ)), κ(H_H(θ)), (i), (ii), RIR and the ranks, from SVDs of Xθ.

    ``theta=None`` is θ = I (the reference: RIR = 1). ``rtol`` as in :func:`kappa_features`.
    """
    k_kp, r_kp = kappa_features(X_p, rtol)
    k_kh, r_kh = kappa_features(X_h, rtol)
    if theta is None:
        k_hp, r_hp, k_hh, r_hh = k_kp, r_kp, k_kh, r_kh
    else:
        k_hp, r_hp = kappa_features(X_p @ theta, rtol)
        k_hh, r_hh = kappa_features(X_h @ theta, rtol)
    i, ii = k_hh / k_kh, k_hp / k_kp
    return {
        "kappa_K_P": k_kp,
        "kappa_K_H": k_kh,
        "kappa_H_P": k_hp,
        "kappa_H_H": k_hh,
        "rank_K_P": r_kp,
        "rank_K_H": r_kh,
        "rank_H_P": r_hp,
        "rank_H_H": r_hh,
        "i": i,
        "ii": ii,
        "rir": i / ii,
    }


def rir_numbers(
    theta: np.ndarray, X_p: np.ndarray, X_h: np.ndarray, *, rtol: float
) -> dict[str, Any]:
    """Eq. 15 via :func:`condreg.metrics.rir` at ``rtol``, plus the SVD cross-check of
    :func:`spectrum_numbers` at the same ``rtol``.

    The returned ``i``, ``ii``, ``rir`` are condreg.metrics' numbers; ``check_rel_diff`` is the
    largest relative difference to the independent recomputation; ``rtol`` is recorded.
    """
    from condreg import metrics

    numbers = spectrum_numbers(theta, X_p, X_h, rtol=rtol)
    r = metrics.rir(theta, X_p, X_h, rtol=rtol)
    official = {"i": float(r.i), "ii": float(r.ii), "rir": float(r.rir)}
    diffs = [abs(official[k] - numbers[k]) / max(abs(numbers[k]), 1e-300) for k in official]
    numbers.update(official)
    numbers["check_rel_diff"] = float(max(diffs))
    numbers["rtol"] = float(rtol)
    return numbers


def tolerance_robustness(
    theta: np.ndarray, X_p: np.ndarray, X_h: np.ndarray, *, rtol: float
) -> dict[str, Any]:
    """The verdict at ``f·rtol`` for f in :data:`TOLERANCE_FACTORS` (docs/math.md §10.3).

    Returns ``{"1x": {...}, "10x": {...}, "100x": {...}, "flips": bool}``; each entry holds
    ``rtol``, ``i``, ``ii``, ``rir`` (:func:`condreg.metrics.rir` at that tolerance) and
    ``success`` (:func:`success`). ``flips`` is True when the verdict differs between tolerances.
    """
    from condreg import metrics

    out: dict[str, Any] = {}
    for f in TOLERANCE_FACTORS:
        r = metrics.rir(theta, X_p, X_h, rtol=f * rtol)
        entry = {"rtol": f * rtol, "i": float(r.i), "ii": float(r.ii), "rir": float(r.rir)}
        entry["success"] = success(entry)
        out[f"{f}x"] = entry
    out["flips"] = len({out[f"{f}x"]["success"] for f in TOLERANCE_FACTORS}) > 1
    return out


def immunize_method(
    method: str,
    X_p: np.ndarray,
    y_p: np.ndarray,
    X_h: np.ndarray,
    *,
    task: str,
    epochs: int,
    lr: float,
    seed: int,
    y_h: np.ndarray | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """One :func:`condreg.immunize` run: RIR numbers at the run's ``rtol`` (and at 10×, 100×:
    ``"tolerance"``), history, runtime, warnings, why it stopped, the seed and :func:`success`.

    ``y_h`` (the harmful task's labels) is given to ``"imma"`` only, whose inner loop simulates
    the attacker's fine-tuning on D_H; the other methods never see harmful labels.
    """
    import condreg

    if method == "imma" and y_h is not None:
        kwargs = {**kwargs, "y_h": y_h}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = condreg.immunize(
            X_p, y_p, X_h, method=method, task=task, lr=lr, epochs=epochs, seed=seed, **kwargs
        )
    runtime = time.perf_counter() - start
    theta = np.asarray(result.theta, dtype=np.float64)
    rtol = float(result.rtol)  # the run's one rank tolerance (docs/math.md §10.2)
    out = rir_numbers(theta, X_p, X_h, rtol=rtol)
    # the loop's own final report must be the same number (one κ per run)
    out["rir_reported_by_immunize"] = float(result.rir)
    out["tolerance"] = tolerance_robustness(theta, X_p, X_h, rtol=rtol)
    out["runtime_s"] = runtime
    # every warning is kept; "did not succeed" is also in ``success`` and the tables' counts
    out["warnings"] = sorted({str(w.message) for w in caught})
    out["history"] = {
        str(k): np.asarray(v, dtype=np.float64).reshape(-1).tolist()
        for k, v in (result.history or {}).items()
    }
    # task loss on D_P at (θ_t, ω_t): first and last epoch (Definition 3.1 (c))
    losses = out["history"].get("loss") or [float("nan")]
    out["loss_initial"], out["loss_final"] = float(losses[0]), float(losses[-1])
    out["theta_finite"] = bool(np.all(np.isfinite(theta)))
    out.update(
        lam_p=float(result.lam_p),
        lam_h=float(result.lam_h),
        epochs_run=int(result.epochs_run),
        stopped=str(result.stopped),
        max_step=float(result.max_step),
        imma_lr=None if result.imma_lr is None else float(result.imma_lr),
    )
    out["seed"] = seed
    out["success"] = success(out)
    out["_theta"] = theta  # removed before writing results.json
    return out


def summarise_runs(
    runs: Sequence[Mapping[str, Any]], keys: Sequence[str] = ("i", "ii", "rir")
) -> dict[str, Any]:
    """mean ± std over seeds of each key (:func:`condreg.experiments._report.mean_std`)."""
    return {k: mean_std([r[k] for r in runs]) for k in keys}


def success(numbers: Mapping[str, Any]) -> bool:
    """Definition 3.1 (a) and (b): (i) > 1 (κ on D_H went up) and (ii) <= 1 (not up on D_P).

    Both together imply RIR = (i)/(ii) > 1. (The paper's count, RIR > 1 and (ii) <= 1, also
    accepts (i) <= 1 when (ii) fell further; :func:`success` does not.) Non-finite numbers fail.
    """
    i, ii = float(numbers["i"]), float(numbers["ii"])
    return bool(np.isfinite(i) and np.isfinite(ii) and i > 1 and ii <= 1)


def stopped_early(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How many of ``runs`` (:func:`immunize_method` outputs) ended before their last epoch:
    ``{"total", "early", "reasons"}``, ``reasons`` the distinct ``stopped`` texts (e.g.
    ``"diverged at epoch 3 …"``). ``condreg reproduce`` exits with status 2 when every run of an
    experiment diverged (a step size far too large, say)."""
    reasons = [str(r["stopped"]) for r in runs if r["stopped"] != "completed"]
    return {"total": len(runs), "early": len(reasons), "reasons": sorted(set(reasons))}
