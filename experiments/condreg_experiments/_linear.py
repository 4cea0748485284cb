"""Shared code of the linear experiments: :func:`condreg.immunize` per method, scored by Eq. 15 at
the run's rank tolerance (and 10×, 100× it; docs/math.md §10), cross-checked by NumPy SVDs."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import condreg
from condreg import metrics
from condreg_experiments.data import DataError

#: The verdict of every run is reported at rtol, 10·rtol and 100·rtol (docs/math.md §10.3).
TOLERANCE_FACTORS: tuple[int, ...] = (1, 10, 100)


def default_rtol(X_p: np.ndarray, X_h: np.ndarray) -> float:
    """Rank tolerance for numbers computed outside a run (θ = I): ``max(N_P, N_H, D)·eps``."""
    n = max(X_p.shape[0], X_h.shape[0], X_p.shape[1])
    return float(n * np.finfo(np.float64).eps)


def check_task_ranks(X_p: np.ndarray, X_h: np.ndarray, *, where: str) -> None:
    """Raise :class:`~condreg_experiments.data.DataError` unless both inputs have rank >= 2."""
    for X, task in ((X_p, "pre-training task D_P"), (X_h, "harmful task D_H")):
        rank = kappa_features(X)[1]
        if rank < 2:
            raise DataError(
                f"{where}: the {task}'s inputs ({X.shape[0]}×{X.shape[1]}) have rank {rank}; "
                f"condition numbers and R_ill need rank >= 2 (constant columns? too few rows?)"
            )


def _svdvals(F: np.ndarray) -> np.ndarray:
    """Singular values of ``F`` in float64, descending."""
    return np.linalg.svd(np.asarray(F, dtype=np.float64), compute_uv=False)


def _kappa_of(s: np.ndarray, shape: tuple[int, ...], rtol: float | None) -> tuple[float, int]:
    """:func:`kappa_features` from the singular values ``s`` of a matrix of ``shape``."""
    if s.size == 0 or s[0] == 0:
        return float("nan"), 0
    tol = max(shape) * np.finfo(np.float64).eps if rtol is None else float(rtol)
    keep = s > tol * s[0]
    s = s[keep]
    return float((s[0] / s[-1]) ** 2), int(keep.sum())


def kappa_features(F: np.ndarray, rtol: float | None = None) -> tuple[float, int]:
    """``(κ(FᵀF), rank)`` over the singular values above ``rtol·σ₁`` (default ``max(N, D)·eps``)."""
    F = np.asarray(F, dtype=np.float64)
    return _kappa_of(_svdvals(F), F.shape, rtol)


class PairSpectra:
    """One pair of tasks' spectra, shared by every method scored on it, computed on first use."""

    def __init__(self, X_p: np.ndarray, X_h: np.ndarray, tasks: Any = None) -> None:
        self.X_p, self.X_h = X_p, X_h
        self._tasks: dict[float, Any] = {} if tasks is None else {float(tasks.rtol): tasks}
        self._svd: tuple[np.ndarray, np.ndarray] | None = None

    def tasks(self, rtol: float) -> Any:
        """:class:`condreg.metrics.RIRSpectra` of θ = I at ``rtol`` (one per tolerance)."""
        rtol = float(rtol)
        if rtol not in self._tasks:
            self._tasks[rtol] = metrics.rir_spectra(None, self.X_p, self.X_h, rtol=rtol)
        return self._tasks[rtol]

    def svd(self) -> tuple[np.ndarray, np.ndarray]:
        """NumPy's singular values of ``X_p`` and ``X_h`` (float64, descending)."""
        if self._svd is None:
            self._svd = (_svdvals(self.X_p), _svdvals(self.X_h))
        return self._svd


def data_setup(X_p: np.ndarray, X_h: np.ndarray, options: Mapping[str, Any]) -> Any:
    """:func:`condreg.algorithm.setup_data` at the runs' ``rtol`` and ``ridge`` (for ``setup=``)."""
    from condreg.algorithm import setup_data

    return setup_data(X_p, X_h, rtol=options.get("rtol"), ridge=options.get("ridge"))


def _pair_of(pair: PairSpectra | None, X_p: np.ndarray, X_h: np.ndarray) -> PairSpectra:
    """``pair``, checked to be of these very arrays, or a new one."""
    if pair is None:
        return PairSpectra(X_p, X_h)
    if pair.X_p is not X_p or pair.X_h is not X_h:
        raise ValueError("pair: a PairSpectra of other arrays than X_p, X_h")
    return pair


def _cross_check_svd(
    theta: np.ndarray | None, X_p: np.ndarray, X_h: np.ndarray, pair: PairSpectra | None
) -> tuple[tuple[np.ndarray, ...], tuple[tuple[int, int], ...]]:
    """NumPy singular values of ``X_p``, ``X_h``, ``X_pθ``, ``X_hθ`` (θ = None: I), and shapes."""
    s_kp, s_kh = _pair_of(pair, X_p, X_h).svd()
    if theta is None:
        return (s_kp, s_kh, s_kp, s_kh), (X_p.shape, X_h.shape) * 2
    theta = np.asarray(theta, dtype=np.float64)
    F_p, F_h = X_p @ theta, X_h @ theta
    return (s_kp, s_kh, _svdvals(F_p), _svdvals(F_h)), (X_p.shape, X_h.shape, F_p.shape, F_h.shape)


_KAPPAS = ("kappa_K_P", "kappa_K_H", "kappa_H_P", "kappa_H_H")
_KAPPAS += ("rank_K_P", "rank_K_H", "rank_H_P", "rank_H_H")


def _numbers(svals: tuple[np.ndarray, ...], shapes, rtol: float | None) -> dict[str, Any]:
    (k_kp, r_kp), (k_kh, r_kh), (k_hp, r_hp), (k_hh, r_hh) = (
        _kappa_of(s, shape, rtol) for s, shape in zip(svals, shapes, strict=True)
    )
    i, ii = k_hh / k_kh, k_hp / k_kp
    kappas = dict(zip(_KAPPAS, (k_kp, k_kh, k_hp, k_hh, r_kp, r_kh, r_hp, r_hh), strict=True))
    return {**kappas, "i": i, "ii": ii, "rir": i / ii}


def spectrum_numbers(
    theta: np.ndarray | None,
    X_p: np.ndarray,
    X_h: np.ndarray,
    *,
    rtol: float | None = None,
    pair: PairSpectra | None = None,
) -> dict[str, Any]:
    """κ's, ranks, (i), (ii) and RIR from NumPy SVDs of ``Xθ`` (``theta=None``: θ = I, RIR = 1)."""
    return _numbers(*_cross_check_svd(theta, X_p, X_h, pair), rtol)


def _engine_numbers(spectra: Any) -> dict[str, Any]:
    """κ's and ranks of the four matrices from the engine's spectra (one κ per run)."""
    r = spectra.rir()
    kappas = [float(k) for k in (r.kappa_kp, r.kappa_kh, r.kappa_hp, r.kappa_hh)]
    return dict(zip(_KAPPAS, (*kappas, *spectra.ranks()), strict=True))


def score(
    theta: np.ndarray,
    X_p: np.ndarray,
    X_h: np.ndarray,
    *,
    rtol: float,
    pair: PairSpectra | None = None,
    spectra: Any = None,
    cross_check: bool = True,
) -> dict[str, Any]:
    """Eq. 15 at ``rtol`` with κ's, ranks and :func:`tolerance_robustness`; ``cross_check`` adds
    the largest relative difference to NumPy SVDs (``check_rel_diff``) at each tolerance."""
    pair = _pair_of(pair, X_p, X_h)
    if spectra is None:
        spectra = metrics.rir_spectra(theta, X_p, X_h, rtol=rtol, tasks=pair.tasks(rtol))
    elif not isinstance(spectra, metrics.RIRSpectra) or spectra.rtol != float(rtol):
        raise ValueError("score: spectra must be the RIRSpectra of theta at this rtol")
    tolerance = tolerance_robustness(theta, X_p, X_h, rtol=rtol, spectra=spectra)
    keys = ("i", "ii", "rir")
    numbers = _engine_numbers(spectra) | {k: tolerance["1x"][k] for k in keys}
    svd = _cross_check_svd(theta, X_p, X_h, pair) if cross_check else None
    for f in TOLERANCE_FACTORS:
        entry, diff = tolerance[f"{f}x"], None
        if svd is not None:
            check = _numbers(*svd, f * rtol)
            diff = float(max(abs(entry[k] - check[k]) / max(abs(check[k]), 1e-300) for k in keys))
        entry["check_rel_diff"] = diff
    check_rel_diff = tolerance["1x"]["check_rel_diff"]
    return numbers | {"check_rel_diff": check_rel_diff, "rtol": float(rtol), "tolerance": tolerance}


def tolerance_robustness(
    theta: np.ndarray, X_p: np.ndarray, X_h: np.ndarray, *, rtol: float, spectra: Any = None
) -> dict[str, Any]:
    """The verdict at ``f·rtol`` for f in :data:`TOLERANCE_FACTORS`:
    ``{"1x": {rtol, i, ii, rir, success}, "10x": …, "100x": …, "flips": bool}``."""
    if spectra is None:
        spectra = metrics.rir_spectra(theta, X_p, X_h, rtol=rtol)
    out: dict[str, Any] = {}
    for f in TOLERANCE_FACTORS:
        r = spectra.rir(f * rtol)
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
    pair: PairSpectra | None = None,
    cross_check: bool = True,
    **kwargs: Any,
) -> dict[str, Any]:
    """One :func:`condreg.immunize` run: :func:`score`, history, runtimes, warnings, stop reason,
    :func:`success` and the D_P losses. ``y_h`` reaches ``"imma"`` only."""
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
    start = time.perf_counter()
    spectra = getattr(result, "spectra", None)
    if not (isinstance(spectra, metrics.RIRSpectra) and spectra.rtol == rtol):
        spectra = None
    out = score(theta, X_p, X_h, rtol=rtol, pair=pair, spectra=spectra, cross_check=cross_check)
    history = {
        str(k): np.asarray(v, dtype=np.float64).reshape(-1).tolist()
        for k, v in (result.history or {}).items()
    }
    losses = history.get("loss") or [float("nan")]  # on D_P at (θ_t, ω_t), Definition 3.1 (c)
    out.update(
        rir_reported_by_immunize=float(result.rir),  # one κ per run: equal to out["rir"]
        runtime_s=runtime,
        warnings=sorted({str(w.message) for w in caught}),
        history=history,
        loss_initial=float(losses[0]),
        loss_final=float(losses[-1]),
        loss_best=best_loss(X_p @ theta, y_p, task=task, rtol=rtol, rank=out["rank_H_P"]),
        theta_finite=bool(np.all(np.isfinite(theta))),
        lam_p=float(result.lam_p),
        lam_h=float(result.lam_h),
        epochs_run=int(result.epochs_run),
        stopped=str(result.stopped),
        max_step=float(result.max_step),
        imma_lr=None if result.imma_lr is None else float(result.imma_lr),
        seed=seed,
    )
    out.update(success=success(out), scoring_s=time.perf_counter() - start)
    out["_theta"] = theta  # removed before writing results.json
    return out


#: A best attainable logistic loss below this counts as "D_P linearly separable on Xθ" (the
#: infimum is then 0; the converged probe stops at a gradient norm of 1e-9).
SEPARABLE_LOSS = 1e-6


def best_loss(
    F: np.ndarray, y: np.ndarray, *, task: str, rtol: float, rank: int | None = None
) -> float:
    """Definition 3.1 (c)'s ``min_ω L(D_P; Fω)`` over the column space of ``F = X_pθ`` (singular
    values above ``rtol·σ₁``; ``rank`` lets a full-rank ``F`` use QR): least squares or logistic."""
    F = np.asarray(F, dtype=np.float64)
    if rank is not None and rank == F.shape[1] <= F.shape[0]:
        Q = np.linalg.qr(F)[0]
    else:
        U, s, _ = np.linalg.svd(F, full_matrices=False)
        Q = U[:, s > float(rtol) * s[0]] if s.size and s[0] > 0 else U[:, :0]
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if task == "regression":
        scale = float(np.mean(y * y))
        r = y - Q @ (Q.T @ y)
        return float(np.mean(r * r) / scale) if scale > 0 else 0.0
    from scipy.optimize import minimize

    def loss_and_gradient(v: np.ndarray) -> tuple[float, np.ndarray]:
        z = Q @ v
        p = 0.5 * (1.0 + np.tanh(0.5 * z))  # the sigmoid, without overflow
        loss = np.mean(np.logaddexp(0.0, z) - y * z)
        return float(loss), Q.T @ (p - y) / y.size

    x0, options = np.zeros(Q.shape[1]), {"maxiter": 1000, "gtol": 1e-9}
    res = minimize(loss_and_gradient, x0, jac=True, method="L-BFGS-B", options=options)
    return float(res.fun)


#: Definition 3.1 (c) in words when every run kept the rank of X_P (the tables' explanation).
RANK_KEPT_TEXT = (
    "Every run kept the rank of X_P (θ invertible on its row space), so X_Pθ spans what X_P spans "
    "and the best attainable loss is the input's: θ takes nothing from the pre-training task that "
    "a head could use"
)


def success(numbers: Mapping[str, Any]) -> bool:
    """Definition 3.1 (a) and (b): (i) > 1 and (ii) <= 1 (non-finite numbers fail)."""
    i, ii = float(numbers["i"]), float(numbers["ii"])
    return bool(np.isfinite(i) and np.isfinite(ii) and i > 1 and ii <= 1)


def stopped_early(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"total", "early", "reasons"}``: how many runs ended before their last epoch, and why."""
    reasons = [str(r["stopped"]) for r in runs if r["stopped"] != "completed"]
    return {"total": len(runs), "early": len(reasons), "reasons": sorted(set(reasons))}
