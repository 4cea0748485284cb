"""The eager loop of :func:`condreg.immunize`: epochs, health checks, history, the result."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from condreg.algorithm._prepare import prepare, result_defaults
from condreg.algorithm._problem import Problem, State
from condreg.algorithm._result import HISTORY_KEYS, ImmunizationResult, ImmunizationWarning
from condreg.algorithm._setup import DataSetup
from condreg.algorithm._step import (
    Tracked,
    advance,
    cross_basis,
    evaluate,
    is_identity,
    is_linalg_error,
)

Array = Any


#: A loss above this multiple of the zero head's loss (or of the starting loss, if larger) is a
#: divergence: relative MSE 10 for regression, 10·log 2 for the logistic loss.
LOSS_BLOWUP = 10.0


def _health(
    rec: list[float], ranks: tuple | None, loss_ref: float, t: int, rtol: float
) -> str | None:
    """Why ``θ_t`` with record ``rec`` cannot be kept (None: healthy)."""
    k_hp, k_hh, r_well, r_ill, loss, rank_p, rank_h = rec[:7]
    checks = (("kappa(H_P)", k_hp), ("kappa(H_H)", k_hh), ("loss", loss), ("R_well", r_well))
    bad = [name for name, value in checks if not math.isfinite(value)]
    if math.isnan(r_ill):
        bad.append("R_ill")
    if bad:
        return f"diverged: non-finite {', '.join(bad)} at epoch {t}"
    if loss > LOSS_BLOWUP * loss_ref:
        return (
            f"diverged: the loss grew to {loss:.3g} at epoch {t} (more than {LOSS_BLOWUP:g}x "
            f"{loss_ref:.3g}, the zero head's or the starting loss)"
        )
    if ranks is not None:
        for name, now, ref in (("H_P", rank_p, ranks[0]), ("H_H", rank_h, ranks[1])):
            if now < ref:
                return (
                    f"rank collapse: {name}(theta) lost rank at epoch {t} ({int(ref)} -> "
                    f"{int(now)} singular values above rtol = {rtol:.3g})"
                )
    return None


class _History:
    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.rows: dict[str, list[float]] = {key: [] for key in HISTORY_KEYS}

    def row(self, t: int, rec: list[float]) -> dict[str, float]:
        P, H = self.problem.P, self.problem.H
        i_ratio, ii_ratio = rec[1] / H.kappa_K, rec[0] / P.kappa_K
        values = (t, rec[0], rec[1], P.kappa_K, H.kappa_K, i_ratio, ii_ratio, i_ratio / ii_ratio)
        return dict(zip(HISTORY_KEYS, (*map(float, values), *rec[2:5]), strict=True))

    def add(self, row: dict[str, float]) -> None:
        for key in HISTORY_KEYS:
            self.rows[key].append(row[key])

    def finish(self, first: Any, last: Any) -> None:
        """Rows 0 and ``-1`` report :func:`condreg.metrics.rir` at ``θ_0`` and at the returned θ
        (the same κ rule as the loop, from one SVD per matrix): the reported figures."""
        for index, metrics in ((0, first), (-1, last)):
            fixed = {
                "kappa_hp": metrics.kappa_hp, "kappa_hh": metrics.kappa_hh,
                "kappa_kp": metrics.kappa_kp, "kappa_kh": metrics.kappa_kh,
                "i": metrics.i, "ii": metrics.ii, "rir": metrics.rir,
            }  # fmt: skip
            for key, value in fixed.items():
                self.rows[key][index] = float(value)


def run(
    problem: Problem,
    state: State | Tracked,
    epochs: int,
    report: Callable[[dict[str, float]], bool],
) -> tuple[Tracked, _History, str, int]:
    """Iterate :func:`condreg.algorithm.step` for ``epochs`` epochs, keeping the last healthy
    state.

    The iterate is kept factored (:class:`condreg.algorithm._step.Tracked`: the features
    ``Aθ`` of both tasks follow each step, θ's basis parts are summed apart), so an epoch pays
    no ``r×D×D`` product for the features nor ``D×r×D`` one for θ; the result is the same as
    iterating ``step`` up to rounding. Returns ``(state, history, stopped, epochs_run)``, the
    state a :class:`Tracked` (``.state()``: θ dense). A state is healthy when its κ's, loss and
    R_well are finite, R_ill is not NaN and both ranks are those of ``θ_0``; a decomposition
    error (the backend's LinAlgError) counts as unhealthy. One host synchronisation per epoch."""
    history = _History(problem)
    state = state if isinstance(state, Tracked) else Tracked.start(problem, state)
    cross = cross_basis(problem)
    kept, kept_t, ranks = state, 0, None
    zero_head = 1.0 if problem.task == "regression" else math.log(2.0)
    loss_ref = zero_head
    stopped = "completed"
    for t in range(epochs + 1):
        try:
            with np.errstate(all="ignore"):  # overflow is detected below, not warned about
                if t < epochs:
                    new, rec_array = advance(problem, state, cross)
                else:
                    rec_array = evaluate(problem, state)
                rec = [float(x) for x in rec_array]
        except Exception as exc:
            if not is_linalg_error(exc):
                raise
            stopped = f"diverged: decomposition failed at epoch {t} ({type(exc).__name__}: {exc})"
            break
        if t == 0 and math.isfinite(rec[4]):
            loss_ref = max(zero_head, rec[4])
        why = _health(rec, ranks, loss_ref, t, problem.rtol)
        if why is not None:
            stopped = why
            if t == 0:
                history.add(history.row(0, rec))
            break
        ranks = ranks or (rec[5], rec[6])
        kept, kept_t = state, t
        row = history.row(t, rec)
        history.add(row)
        if report(row):
            stopped = f"stopped by callback at epoch {t}"
            break
        if t == epochs:
            break
        if not rec[7]:
            stopped = f"diverged: non-finite theta or omega after epoch {t}"
            break
        state = new
    if not history.rows["epoch"]:  # θ_0 itself is unusable: report it, from the metrics
        history.add(dict.fromkeys(HISTORY_KEYS, float("nan")) | {"epoch": 0.0})
    return kept, history, stopped, kept_t


def _reporter(problem: Problem, epochs: int, progress: bool, callback: Any):
    name = problem.method.name

    def report(row: dict[str, float]) -> bool:
        if progress:
            print(
                f"[condreg {name}] epoch {int(row['epoch'])}/{epochs}  i={row['i']:.4g}  "
                f"ii={row['ii']:.4g}  RIR={row['rir']:.4g}  loss={row['loss']:.4g}",
                file=sys.stderr,
            )
        return bool(callback is not None and callback(int(row["epoch"]), row))

    return report


def _warn(result: ImmunizationResult) -> None:
    if not result.stopped.startswith(("completed", "stopped by callback")):
        warnings.warn(
            f"immunize ({result.method}): {result.stopped}; returned theta of epoch "
            f"{result.epochs_run} (lower lr, or check the data's scale)",
            ImmunizationWarning,
            stacklevel=4,
        )
    if not result.succeeded:
        warnings.warn(
            f"immunize ({result.method}): immunization did not succeed: (i) = {result.i:.4g}, "
            f"(ii) = {result.ii:.4g}, RIR = {result.rir:.4g} (success needs (i) > 1 and "
            "(ii) <= 1); try more epochs, a larger max_step or other lam_p/lam_h",
            ImmunizationWarning,
            stacklevel=4,
        )


def immunize(
    X_p: Array,
    y_p: Array,
    X_h: Array,
    *,
    method: str = "condreg",
    task: str = "regression",
    lam_p: float | None = None,
    lam_h: float | None = None,
    lr: float = 0.005,
    epochs: int = 100,
    theta0: Array | None = None,
    seed: int = 0,
    omega0: Array | None = None,
    y_h: Array | None = None,
    max_step: float = 0.3,
    ridge: float | None = None,
    imma_steps: int = 5,
    imma_lr: float | None = None,
    rtol: float | None = None,
    resume: ImmunizationResult | None = None,
    progress: bool = False,
    callback: Callable[[int, dict[str, float]], bool | None] | None = None,
    warn: bool = True,
    xp: Any = None,
    setup: DataSetup | None = None,
) -> ImmunizationResult:
    """Immunize a linear feature extractor θ against linear probing on ``X_h`` (Algorithm 1).

    Every default is explained in ``docs/immunization.md``.

    Parameters
    ----------
    X_p, y_p : arrays ``(N_p, D)``, ``(N_p,)`` (or ``(N_p, 1)``) — the pre-training task (labels in
        {0, 1} for ``task="classification"``). X_h : array ``(N_h, D)`` — the harmful inputs.
    method : an entry of :data:`condreg.algorithm.REGISTRY`: ``"condreg"``, ``"r_ill_only"``,
        ``"opt_kappa"`` or ``"imma"``. task : ``"regression"`` (squared error) or
        ``"classification"`` (binary logistic loss of the head on ``D_P``).
    lam_p, lam_h : regularizer weights; ``None``: balanced at ``θ_0`` (each update of relative
        size ``max_step``). Terms a method does not use are 0.
    lr, epochs : step size η (0.005, the paper's) and number of full-batch iterations.
    theta0, omega0 : starting point ``(D, D)``, ``(D,)`` (default ``I`` and 0).
    seed, y_h : ``"imma"`` trains on ``y_h``, or on labels drawn with ``seed`` (N(0, 1) or coin
        flips) when it is None. imma_steps, imma_lr : IMMA's inner loop (default step ``1/L`` at
        ``θ_0``, recorded as ``res.imma_lr``).
    max_step : in (0, 0.5), default 0.3 — each regularizer step moves every eigenvalue of its
        Hessian by at most a factor ``(1 ± max_step)²``.
    ridge : ``None``: ``K⁻¹`` is the pseudo-inverse; ``ε > 0``: ``(K + ε·λ_max(K)·I)⁻¹``.
    rtol : the run's one rank tolerance: ``σ_i(Xθ)`` counts when ``> rtol·σ₁``, in the loop, the
        history and the final metrics alike; default ``max(N_P, N_H, D)·eps``; ``res.rtol``.
    resume : a previous result to continue (its θ, ω and start-of-run values ``lam_p``,
        ``lam_h``, ``imma_lr``, ``rtol``, ``paths``): bit-identical to one longer run.
    progress : print one line per epoch to stderr. callback : ``(epoch, row) -> bool | None``,
        called with each history row; ``True`` stops the run there.
    warn : emit :class:`ImmunizationWarning` when the run did not succeed or stopped early.
    xp : Array API namespace to use instead of the inputs'.

    Returns
    -------
    ImmunizationResult — ``res.stopped`` is ``"completed"``, ``"stopped by callback at epoch t"``,
    ``"diverged: …"`` or ``"rank collapse: …"``; a run that diverges or loses rank keeps the last
    healthy θ (finite, full rank), warns, and reports finite metrics: diverging values never
    raise.

    Raises
    ------
    TypeError : arrays of different libraries, non-array data, non-real dtypes, non-numeric options.
    ValueError : non-2-D or empty ``X``, mismatched shapes, NaN/Inf in the data, bad labels, an
        unknown method or task, a zero data matrix, ``X_h`` of rank < 2 for R_ill, bad options.
        All checks run before any decomposition.
    """
    epochs = _validate_epochs(epochs)
    if callback is not None and not callable(callback):
        raise TypeError(f"immunize: callback must be callable, got {type(callback).__name__}")
    if resume is not None and (theta0 is not None or omega0 is not None):
        raise ValueError("immunize: pass either resume or theta0/omega0, not both")
    kw = result_defaults(
        resume, method=method, task=task, lam_p=lam_p, lam_h=lam_h, imma_lr=imma_lr, rtol=rtol,
        theta0=theta0, omega0=omega0, paths=None,
    )  # fmt: skip
    problem, state = prepare(
        X_p, y_p, X_h, lr=lr, seed=seed, y_h=y_h, max_step=max_step, ridge=ridge,
        imma_steps=imma_steps, warn=warn, xp=xp, setup=setup, **kw,
    )  # fmt: skip
    start: State | Tracked = state
    if resume is not None and resume.resume_state is not None:
        kept, head_scale = resume.resume_state
        if head_scale == problem.head_scale:  # the same data: continue from the exact iterate
            start = State(state.theta, kept.omega)
            if kept.on(problem):  # the same tasks: its factored parts and features too
                start = kept._replace(P=problem.P, H=problem.H)
    report = _reporter(problem, epochs, progress, callback)
    theta0 = state.theta
    kept, history, stopped, epochs_run = run(problem, start, epochs, report)
    return _result(problem, theta0, kept, history, stopped, epochs_run, X_p, X_h, warn)


def _tasks(problem: Problem, X_p: Any, X_h: Any) -> Any:
    """The setup's spectra of the data (``problem.setup.tasks``) when they are of these
    arrays."""
    from condreg.metrics import rir_spectra

    tasks = None if problem.setup is None else problem.setup.tasks
    if tasks is not None and X_p.dtype == tasks.s_kp.dtype:
        return tasks
    return rir_spectra(None, X_p, X_h, rtol=problem.rtol)


def _detached(kept: Tracked) -> Tracked:
    """The iterate without the setup's spectra at ``θ = I`` (a result keeps its own state
    only; ``resume=`` reattaches the tasks of its run's setup)."""
    P, H = (replace(task, at_identity=()) for task in (kept.P, kept.H))
    return kept._replace(P=P, H=H)


def _validate_epochs(epochs: Any) -> int:
    from condreg.algorithm._validate import integer

    return integer(epochs, "epochs", 0)


def _result(
    problem, theta0, kept, history, stopped, epochs_run, X_p, X_h, warn
) -> ImmunizationResult:
    from condreg.metrics import rir_spectra

    xp = problem.xp
    state = kept.state()
    dtype = state.theta.dtype
    X_p, X_h = xp.astype(X_p, dtype), xp.astype(X_h, dtype)
    with np.errstate(all="ignore"):
        # the tasks' spectra from prepare (the same arrays), θ's decomposed once: exactly
        # condreg.metrics.rir(θ, X_p, X_h, rtol=res.rtol)
        tasks = _tasks(problem, X_p, X_h)
        spectra = rir_spectra(state.theta, X_p, X_h, rtol=problem.rtol, tasks=tasks)
        metrics = spectra.rir()
        if epochs_run == 0:
            first = metrics
        elif is_identity(theta0, xp):  # X·I = X exactly: rir(I) is the tasks' own
            first = tasks.rir()
        else:
            first = rir_spectra(theta0, X_p, X_h, rtol=problem.rtol, tasks=tasks).rir()
    history.finish(first, metrics)
    uses_inner = problem.method.default_inner_lr is not None
    result = ImmunizationResult(
        theta=state.theta,
        omega=problem.raw_omega(state),
        method=problem.method.name,
        task=problem.task,
        lam_p=problem.lam_p,
        lam_h=problem.lam_h,
        lr=problem.lr,
        max_step=problem.max_step,
        epochs_run=epochs_run,
        history=history.rows,
        metrics=metrics,
        stopped=stopped,
        rtol=problem.rtol,
        imma_lr=problem.imma_lr if uses_inner else None,
        paths=problem.paths,
        resume_state=(_detached(kept), problem.head_scale),
        spectra=spectra,
    )
    if warn:
        _warn(result)
    return result
