"""Shared code of the linear experiments (house prices, MNIST pairs, convergence).

Runs :func:`condreg.immunize` for each method on one (D_P, D_H) pair and measures Eq. 15 with
:func:`condreg.metrics.rir` at the run's rank tolerance ``rtol`` (one κ per run, docs/math.md
§10.2): the reported κ's, ranks, (i), (ii) and RIR all come from that one decomposition.
Independently of it (``cross_check``, on by default; ``condreg reproduce mnist-pairs`` turns it
on with ``--cross-check``), :func:`spectrum_numbers` recomputes every condition number from
NumPy's SVD of the features ``Xθ`` (κ(θᵀKθ) = κ(Xθ)², over the singular values above
``rtol·σ₁``), so, where it runs, the reported numbers are cross-checked.
:func:`tolerance_robustness` repeats the verdict at 10× and 100× the run's tolerance
(docs/math.md §10.3). Each matrix is decomposed once
per θ by each side (:func:`score`), the tasks' own ``X_p``, ``X_h`` once per pair
(:class:`PairSpectra`); the other tolerances re-threshold those singular values.
Definition 3.1 (c) is measured by :func:`best_loss`: the lowest D_P loss any linear head reaches
on ``X_pθ`` (least squares; a converged logistic probe for classification), beside the jointly
trained head's. NumPy, and SciPy for the logistic probe.
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
    "PairSpectra",
    "score",
    "spectrum_numbers",
    "tolerance_robustness",
    "immunize_method",
    "stopped_early",
    "summarise_runs",
    "success",
    "best_loss",
    "SEPARABLE_LOSS",
    "data_setup",
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
    """Raise :class:`condreg.experiments.data.DataError` unless both tasks' inputs have rank >= 2.

    κ needs two nonzero singular values, R_ill a rank >= 2: data that fail this (constant or
    duplicated columns, too few rows) are a problem of the data, reported before any run.
    """
    from condreg.experiments.data import DataError

    for X, task in ((X_p, "pre-training task D_P"), (X_h, "harmful task D_H")):
        rank = kappa_features(X)[1]
        if rank < 2:
            raise DataError(
                f"{where}: the {task}'s inputs ({X.shape[0]}×{X.shape[1]}) have rank {rank}; "
                f"condition numbers and R_ill need rank >= 2 (constant columns? too few rows?)"
            )


def _svdvals(F: np.ndarray) -> np.ndarray:
    """Singular values of ``F`` in float64 by NumPy's SVD (LAPACK ``gesdd``), descending."""
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
    """κ(FᵀF) over the nonzero singular values and the rank, from the SVD of ``F``.

    A singular value counts when it exceeds ``rtol·σ₁`` (default ``max(N, D)·eps``). Returns
    ``(nan, 0)`` for an empty or zero ``F``.
    """
    F = np.asarray(F, dtype=np.float64)
    return _kappa_of(_svdvals(F), F.shape, rtol)


class PairSpectra:
    """What scoring every method on one pair of tasks shares, computed once, on first use.

    ``tasks(rtol)``: the spectral engine's spectra of ``X_p`` and ``X_h`` at ``rtol``
    (:func:`condreg.metrics.rir_spectra` with θ = I), reused by each method's
    :func:`condreg.metrics.rir_spectra`; ``svd()``: NumPy's singular values of ``X_p`` and
    ``X_h``, for the independent cross-check (:func:`spectrum_numbers`). κ(K_P) and κ(K_H) do
    not depend on the method: without this every method decomposed both tasks twice more.
    ``tasks``: the :class:`condreg.metrics.RIRSpectra` of θ = I at its ``rtol`` where the caller
    has it already (:func:`data_setup`'s ``tasks``).
    """

    def __init__(self, X_p: np.ndarray, X_h: np.ndarray, tasks: Any = None) -> None:
        self.X_p, self.X_h = X_p, X_h
        # ``tasks``: the spectra of θ = I where the caller has them (a DataSetup's ``tasks``)
        self._tasks: dict[float, Any] = {} if tasks is None else {float(tasks.rtol): tasks}
        self._svd: tuple[np.ndarray, np.ndarray] | None = None

    def tasks(self, rtol: float) -> Any:
        """:class:`condreg.metrics.RIRSpectra` of θ = I at ``rtol`` (one per tolerance)."""
        from condreg import metrics

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
    """:func:`condreg.algorithm.setup_data` of ``X_p``, ``X_h`` at the runs' ``rtol`` and
    ``ridge`` (from ``options``, the keyword arguments for :func:`condreg.immunize`): the
    tasks decomposed once, for every :func:`immunize_method` on these very arrays
    (``setup=``; the runs equal runs without it)."""
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
) -> tuple[np.ndarray, ...]:
    """NumPy singular values of ``X_p``, ``X_h``, ``X_pθ``, ``X_hθ`` (θ = None: I)."""
    s_kp, s_kh = _pair_of(pair, X_p, X_h).svd()
    if theta is None:
        return s_kp, s_kh, s_kp, s_kh
    theta = np.asarray(theta, dtype=np.float64)
    return s_kp, s_kh, _svdvals(X_p @ theta), _svdvals(X_h @ theta)


def _numbers(svals: tuple[np.ndarray, ...], shapes, rtol: float | None) -> dict[str, Any]:
    (k_kp, r_kp), (k_kh, r_kh), (k_hp, r_hp), (k_hh, r_hh) = (
        _kappa_of(s, shape, rtol) for s, shape in zip(svals, shapes, strict=True)
    )
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


def _shapes(theta, X_p, X_h) -> tuple[tuple[int, int], ...]:
    d = X_p.shape[1] if theta is None else np.shape(theta)[1]
    return X_p.shape, X_h.shape, (X_p.shape[0], d), (X_h.shape[0], d)


def spectrum_numbers(
    theta: np.ndarray | None,
    X_p: np.ndarray,
    X_h: np.ndarray,
    *,
    rtol: float | None = None,
    pair: PairSpectra | None = None,
) -> dict[str, Any]:
    """κ(K_P), κ(K_H), κ(H_P(θ)), κ(H_H(θ)), (i), (ii), RIR and the ranks, from SVDs of Xθ.

    ``theta=None`` is θ = I (the reference: RIR = 1). ``rtol`` as in :func:`kappa_features`.
    ``pair``: the :class:`PairSpectra` of ``X_p``, ``X_h`` (their SVDs, computed once).
    """
    svals = _cross_check_svd(theta, X_p, X_h, pair)
    return _numbers(svals, _shapes(theta, X_p, X_h), rtol)


def _relative_difference(official: Mapping[str, float], check: Mapping[str, Any]) -> float:
    keys = ("i", "ii", "rir")
    return float(max(abs(official[k] - check[k]) / max(abs(check[k]), 1e-300) for k in keys))


def _entry(r: Any) -> dict[str, Any]:
    return {"i": float(r.i), "ii": float(r.ii), "rir": float(r.rir)}


def _engine_numbers(spectra: Any) -> dict[str, Any]:
    """κ's and ranks of the four matrices from the engine's spectra at their ``rtol``: the
    same decomposition as the reported ``i``, ``ii``, ``rir`` (one κ per run)."""
    r = spectra.rir()
    r_kp, r_kh, r_hp, r_hh = spectra.ranks()
    return {
        "kappa_K_P": float(r.kappa_kp),
        "kappa_K_H": float(r.kappa_kh),
        "kappa_H_P": float(r.kappa_hp),
        "kappa_H_H": float(r.kappa_hh),
        "rank_K_P": r_kp,
        "rank_K_H": r_kh,
        "rank_H_P": r_hp,
        "rank_H_H": r_hh,
    }


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
    """Everything :func:`immunize_method` reports about θ, from one decomposition per matrix.

    Eq. 15 by :func:`condreg.metrics.rir_spectra` at ``rtol`` (``i``, ``ii``, ``rir``: exactly
    :func:`condreg.metrics.rir` there) with the four κ's and ranks of that same decomposition,
    ``rtol``, and ``"tolerance"``: :func:`tolerance_robustness`. With ``cross_check`` (default)
    the independent NumPy SVDs of :func:`spectrum_numbers` recompute Eq. 15 at the same
    tolerances: ``check_rel_diff`` is the largest relative difference of ``i``, ``ii``, ``rir``
    between the two (and each ``tolerance`` entry has its own, both sets of singular values
    re-thresholded there); without it no SVD is computed and every ``check_rel_diff`` is None.
    ``pair`` shares the spectra of ``X_p``, ``X_h`` between the methods of a pair (default:
    computed here); ``spectra``: the :class:`condreg.metrics.RIRSpectra` of θ at ``rtol``
    where the caller has it already (then only the cross-check decomposes anything).
    """
    from condreg import metrics

    pair = _pair_of(pair, X_p, X_h)
    if spectra is None:
        spectra = metrics.rir_spectra(theta, X_p, X_h, rtol=rtol, tasks=pair.tasks(rtol))
    elif not isinstance(spectra, metrics.RIRSpectra) or spectra.rtol != float(rtol):
        raise ValueError("score: spectra must be the RIRSpectra of theta at this rtol")
    tolerance = tolerance_robustness(theta, X_p, X_h, rtol=rtol, spectra=spectra)
    numbers = _engine_numbers(spectra)
    numbers.update({k: tolerance["1x"][k] for k in ("i", "ii", "rir")})
    numbers["check_rel_diff"] = None
    for f in TOLERANCE_FACTORS:
        tolerance[f"{f}x"]["check_rel_diff"] = None
    if cross_check:
        svals, shapes = _cross_check_svd(theta, X_p, X_h, pair), _shapes(theta, X_p, X_h)
        for f in TOLERANCE_FACTORS:
            entry = tolerance[f"{f}x"]
            check = _numbers(svals, shapes, f * rtol)
            entry["check_rel_diff"] = _relative_difference(entry, check)
        numbers["check_rel_diff"] = tolerance["1x"]["check_rel_diff"]
    numbers["rtol"] = float(rtol)
    numbers["tolerance"] = tolerance
    return numbers


def tolerance_robustness(
    theta: np.ndarray,
    X_p: np.ndarray,
    X_h: np.ndarray,
    *,
    rtol: float,
    spectra: Any = None,
) -> dict[str, Any]:
    """The verdict at ``f·rtol`` for f in :data:`TOLERANCE_FACTORS` (docs/math.md §10.3).

    Returns ``{"1x": {...}, "10x": {...}, "100x": {...}, "flips": bool}``; each entry holds
    ``rtol``, ``i``, ``ii``, ``rir`` (:func:`condreg.metrics.rir` at that tolerance, here the
    re-thresholding of one :class:`condreg.metrics.RIRSpectra` at ``rtol``: ``spectra``, or
    decomposed here) and ``success`` (:func:`success`). ``flips`` is True when the verdict
    differs between tolerances.
    """
    from condreg import metrics

    if spectra is None:
        spectra = metrics.rir_spectra(theta, X_p, X_h, rtol=rtol)
    out: dict[str, Any] = {}
    for f in TOLERANCE_FACTORS:
        entry = {"rtol": f * rtol, **_entry(spectra.rir(f * rtol))}
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
    """One :func:`condreg.immunize` run: RIR numbers at the run's ``rtol`` (and at 10×, 100×:
    ``"tolerance"``; :func:`score`), history, runtime (``runtime_s``: the immunization;
    ``scoring_s``: the scoring after it), warnings, why it stopped, the seed,
    :func:`success`, the trained head's D_P loss (``loss_initial``, ``loss_final``) and the best
    attainable one on ``X_pθ`` (``loss_best``: :func:`best_loss`, Definition 3.1 (c)).

    ``y_h`` (the harmful task's labels) is given to ``"imma"`` only, whose inner loop simulates
    the attacker's fine-tuning on D_H; the other methods never see harmful labels. ``pair``: a
    :class:`PairSpectra` of ``X_p``, ``X_h`` shared by the methods run on them; ``setup=`` (in
    ``kwargs``): their :func:`data_setup`, likewise shared.
    ``cross_check``: recompute the numbers from independent NumPy SVDs (:func:`score`).
    """
    import condreg
    from condreg import metrics

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
    # where the result keeps the decomposition its metrics came from, score from it
    spectra = getattr(result, "spectra", None)
    if not (isinstance(spectra, metrics.RIRSpectra) and spectra.rtol == rtol):
        spectra = None
    out = score(theta, X_p, X_h, rtol=rtol, pair=pair, spectra=spectra, cross_check=cross_check)
    # the loop's own final report must be the same number (one κ per run)
    out["rir_reported_by_immunize"] = float(result.rir)
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
    # the best any head reaches on X_pθ (Definition 3.1 (c), min over ω; :func:`best_loss`)
    out["loss_best"] = best_loss(X_p @ theta, y_p, task=task, rtol=rtol, rank=out["rank_H_P"])
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
    out["scoring_s"] = time.perf_counter() - start
    out["_theta"] = theta  # removed before writing results.json
    return out


#: A best attainable logistic loss below this counts as "D_P linearly separable on Xθ" (the
#: infimum is then 0; the converged probe stops at a gradient norm of 1e-9).
SEPARABLE_LOSS = 1e-6


def best_loss(
    F: np.ndarray, y: np.ndarray, *, task: str, rtol: float, rank: int | None = None
) -> float:
    """Definition 3.1 (c)'s ``min_ω L(D_P; Fω)``: the lowest D_P loss a linear head reaches on
    the features ``F = X_pθ``, in the units of the trained head's loss.

    The head ranges over the column space of ``F`` (its left singular vectors with
    ``σ_i > rtol·σ₁``, the rank of the run's κ's), fitted in that orthonormal basis, so the
    value does not depend on how ill-conditioned θ is, only on what ``Xθ`` can express: for an
    invertible θ (the same rank as ``X``) it equals the input's. ``task="regression"``: the
    least-squares relative error ``min mean((Fω − y)²)/mean(y²)`` (exact); ``"classification"``:
    the mean logistic loss of a converged probe (SciPy's L-BFGS-B to a gradient norm of 1e-9),
    about 0 (below :data:`SEPARABLE_LOSS`) when D_P is linearly separable on ``F``. ``rank``:
    the rank of ``F`` at ``rtol`` where the caller knows it; at full column rank the basis comes
    from a QR factorization (the same column space, half the cost of the SVD).

    Examples
    --------
    >>> X = np.random.default_rng(0).standard_normal((20, 3)); y = X @ [1.0, 2.0, 3.0]
    >>> best_loss(X, y, task="regression", rtol=1e-12) < 1e-20
    True
    """
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

    res = minimize(
        loss_and_gradient,
        np.zeros(Q.shape[1]),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 1000, "gtol": 1e-9},
    )
    return float(res.fun)


def summarise_runs(
    runs: Sequence[Mapping[str, Any]], keys: Sequence[str] = ("i", "ii", "rir")
) -> dict[str, Any]:
    """mean ± std over seeds of each key (:func:`condreg.experiments._report.mean_std`)."""
    return {k: mean_std([r[k] for r in runs]) for k in keys}


def success(numbers: Mapping[str, Any]) -> bool:
    """Definition 3.1 (a) and (b): (i) > 1 (κ on D_H went up) and (ii) <= 1 (not up on D_P).

    Both together imply RIR = (i)/(ii) > 1; a large RIR alone (e.g. (i) <= 1 with (ii) falling
    further) is not success. The paper does not state the rule behind its own success counts.
    Non-finite numbers fail.
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
