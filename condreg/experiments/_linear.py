"""Shared code of the linear experiments (house prices, MNIST pairs, convergence).

Runs :func:`condreg.immunize` for each method on one (D_P, D_H) pair and measures Eq. 15 with
:func:`condreg.metrics.rir`. Independently of it, :func:`spectrum_numbers` recomputes every
condition number from the SVD of the features ``Xθ`` (κ(θᵀKθ) = κ(Xθ)², over the nonzero singular
values, rank tolerance ``max(N, D)·eps``), so the reported numbers are cross-checked.
NumPy only.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from condreg.experiments._report import mean_std

__all__ = [
    "kappa_features",
    "spectrum_numbers",
    "rir_numbers",
    "immunize_method",
    "summarise_runs",
]


def kappa_features(F: np.ndarray) -> tuple[float, int]:
    """κ(FᵀF) over the nonzero singular values and the rank (SVD of F; tol max(N, D)·eps·σ₁)."""
    s = np.linalg.svd(np.asarray(F, dtype=np.float64), compute_uv=False)
    if s.size == 0 or s[0] == 0:
        return float("nan"), 0
    keep = s > max(F.shape) * np.finfo(np.float64).eps * s[0]
    s = s[keep]
    return float((s[0] / s[-1]) ** 2), int(keep.sum())


def spectrum_numbers(theta: np.ndarray | None, X_p: np.ndarray, X_h: np.ndarray) -> dict[str, Any]:
    """κ(K_P), κ(K_H), κ(H_P(θ)), κ(H_H(θ)), (i), (ii), RIR and the ranks, from SVDs of Xθ."""
    k_kp, r_kp = kappa_features(X_p)
    k_kh, r_kh = kappa_features(X_h)
    if theta is None:
        k_hp, r_hp, k_hh, r_hh = k_kp, r_kp, k_kh, r_kh
    else:
        k_hp, r_hp = kappa_features(X_p @ theta)
        k_hh, r_hh = kappa_features(X_h @ theta)
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


def _get(obj: Any, *names: str) -> Any:
    for name in names:
        if isinstance(obj, Mapping) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    if isinstance(obj, Sequence) and not isinstance(obj, str) and len(obj) == 3:
        return obj[{"i": 0, "ii": 1, "rir": 2}[names[0]]]
    raise KeyError(names[0])


def rir_numbers(theta: np.ndarray, X_p: np.ndarray, X_h: np.ndarray) -> dict[str, Any]:
    """Eq. 15 via :func:`condreg.metrics.rir`, plus the SVD cross-check of :func:`spectrum_numbers`.

    The returned ``i``, ``ii``, ``rir`` are condreg.metrics' numbers; ``check_rel_diff`` is the
    largest relative difference to the independent recomputation.
    """
    numbers = spectrum_numbers(theta, X_p, X_h)
    try:
        from condreg import metrics

        r = metrics.rir(theta, X_p, X_h)
        official = {k: float(_get(r, k)) for k in ("i", "ii", "rir")}
    except (ImportError, AttributeError, KeyError) as exc:  # pragma: no cover - API in flux
        warnings.warn(
            f"condreg.metrics.rir unavailable ({exc}); using the SVD recomputation", stacklevel=2
        )
        official = {k: numbers[k] for k in ("i", "ii", "rir")}
    diffs = [abs(official[k] - numbers[k]) / max(abs(numbers[k]), 1e-300) for k in official]
    numbers.update(official)
    numbers["check_rel_diff"] = float(max(diffs))
    return numbers


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
    """One :func:`condreg.immunize` run: RIR numbers, history, runtime, warnings, the seed and
    :func:`success`.

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
    out = rir_numbers(theta, X_p, X_h)
    out["runtime_s"] = runtime
    out["warnings"] = sorted({str(w.message) for w in caught})
    history = getattr(result, "history", None)
    out["history"] = _history_to_lists(history)
    # task loss on D_P at (θ_t, ω_t): first and last epoch (Definition 3.1 (c))
    losses = out["history"].get("loss") or [float("nan")]
    out["loss_initial"], out["loss_final"] = float(losses[0]), float(losses[-1])
    out["theta_finite"] = bool(np.all(np.isfinite(theta)))
    for attr in ("lam_p", "lam_h", "epochs_run", "stopped", "max_step"):
        if hasattr(result, attr):
            out[attr] = getattr(result, attr)
    out["seed"] = seed
    out["success"] = success(out)
    out["_theta"] = theta  # removed before writing results.json
    return out


def _history_to_lists(history: Any) -> dict[str, list[float]]:
    if history is None:
        return {}
    if isinstance(history, Mapping):
        items = history.items()
    elif hasattr(history, "__dataclass_fields__"):
        items = ((k, getattr(history, k)) for k in history.__dataclass_fields__)
    elif hasattr(history, "_asdict"):
        items = history._asdict().items()
    elif isinstance(history, Sequence) and history and isinstance(history[0], Mapping):
        keys = history[0].keys()
        items = ((k, [h.get(k) for h in history]) for k in keys)
    else:
        return {}
    out = {}
    for key, values in items:
        try:
            out[str(key)] = np.asarray(values, dtype=np.float64).reshape(-1).tolist()
        except (TypeError, ValueError):
            continue
    return out


def summarise_runs(
    runs: Sequence[Mapping[str, Any]], keys: Sequence[str] = ("i", "ii", "rir")
) -> dict[str, Any]:
    """mean ± std over seeds of each key (:func:`condreg.experiments._report.mean_std`)."""
    return {k: mean_std([r[k] for r in runs]) for k in keys}


def success(numbers: Mapping[str, Any]) -> bool:
    """Definition 3.1 (a)+(b) as the paper counts it: RIR > 1 and (ii) <= 1."""
    return bool(np.isfinite(numbers["rir"]) and numbers["rir"] > 1 and numbers["ii"] <= 1)
