"""The eager loop of :func:`condreg.immunize`: epochs, health checks, history, the result."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from condreg.algorithm._factored import Tracked, cross_basis, is_identity
from condreg.algorithm._prepare import prepare, run_options
from condreg.algorithm._problem import Problem, State
from condreg.algorithm._result import (
    HISTORY_KEYS,
    ImmunizationResult,
    ImmunizationWarning,
    ResumeState,
)
from condreg.algorithm._setup import DataSetup
from condreg.algorithm._step import advance, evaluate, is_linalg_error

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


class Outcome(NamedTuple):
    """What :func:`run` returns: the last healthy iterate, the history, why the run ended, the
    epoch of the iterate and the references of its health checks ``(loss, ranks)``."""

    kept: Tracked
    history: _History
    stopped: str
    epochs_run: int
    references: tuple[float, tuple[float, float] | None]


def run(
    problem: Problem,
    state: State | Tracked,
    epochs: int,
    report: Callable[[dict[str, float]], bool],
    references: tuple[float, tuple[float, float] | None] | None = None,
) -> Outcome:
    """Iterate :func:`condreg.algorithm.step` for ``epochs`` epochs, keeping the last healthy
    state.

    The iterate is kept factored (:class:`condreg.algorithm._step.Tracked`: the features
    ``Aθ`` of both tasks follow each step, θ's basis parts are summed apart), so an epoch pays
    no ``r×D×D`` product for the features nor ``D×r×D`` one for θ; the result is the same as
    iterating ``step`` up to rounding. Returns an :class:`Outcome`, its state a :class:`Tracked`
    (``.state()``: θ dense). A state is healthy when its κ's, loss and R_well are finite, R_ill
    is not NaN, the loss is at most :data:`LOSS_BLOWUP` times the reference loss and both ranks
    are the reference ranks; a decomposition error (the backend's LinAlgError) counts as
    unhealthy. The references are those of ``θ_0``, or ``references`` = ``(loss, ranks)`` of the
    run this one continues (``resume=``: the same checks as one longer run). One host
    synchronisation per epoch."""
    history = _History(problem)
    state = state if isinstance(state, Tracked) else Tracked.start(problem, state)
    cross = cross_basis(problem)
    zero_head = 1.0 if problem.task == "regression" else math.log(2.0)
    loss_ref, ranks = (zero_head, None) if references is None else references
    kept, kept_t = state, 0
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
        if t == 0 and references is None and math.isfinite(rec[4]):
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
    return Outcome(kept, history, stopped, kept_t, (loss_ref, ranks))


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
            stacklevel=3,
        )
    if not result.succeeded:
        warnings.warn(
            f"immunize ({result.method}): immunization did not succeed: (i) = {result.i:.4g}, "
            f"(ii) = {result.ii:.4g}, RIR = {result.rir:.4g} (success needs (i) > 1 and "
            "(ii) <= 1); try more epochs, a larger max_step or other lam_p/lam_h",
            ImmunizationWarning,
            stacklevel=3,
        )


def immunize(
    X_p: Array,
    y_p: Array,
    X_h: Array,
    *,
    method: str | None = None,
    task: str | None = None,
    lam_p: float | None = None,
    lam_h: float | None = None,
    lr: float | None = None,
    epochs: int = 100,
    theta0: Array | None = None,
    seed: int | None = None,
    omega0: Array | None = None,
    y_h: Array | None = None,
    max_step: float | None = None,
    ridge: float | None = None,
    imma_steps: int | None = None,
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

    Pre-trains ``f_θ(x) = xᵀθ`` and a head ω on ``(X_p, y_p)`` so that linear probing on the
    harmful inputs ``X_h`` is ill-conditioned while the pre-training task stays
    well-conditioned. One epoch of ``method="condreg"`` is

    ``ω ← ω − η∇_ωL``,
    ``θ ← θ − η∇_θL − ηλ_P K_P⁻¹∇_θR_well(H_P) − ηλ_H K_H⁻¹∇_θR_ill(H_H)``

    with ``H(θ) = θᵀKθ``, ``K = XᵀX`` and ``K⁻¹`` on the left; success is measured by the
    relative immunization ratio ``RIR = [κ(H_H(θ))/κ(K_H)] / [κ(H_P(θ))/κ(K_P)]``. Every default
    is explained in ``docs/immunization.md``. Options left ``None`` take the resumed run's value
    with ``resume=``, else the default written below.

    Parameters
    ----------
    X_p : array, shape (N_p, D)
        The pre-training inputs.
    y_p : array, shape (N_p,) or (N_p, 1)
        Its labels (in {0, 1} for ``task="classification"``).
    X_h : array, shape (N_h, D)
        The harmful inputs.
    method : str, default "condreg"
        An entry of :data:`condreg.algorithm.REGISTRY`: ``"condreg"``, ``"r_ill_only"``,
        ``"opt_kappa"`` or ``"imma"``.
    task : str, default "regression"
        ``"regression"`` (squared error) or ``"classification"`` (binary logistic loss of the
        head on ``D_P``).
    lam_p, lam_h : float >= 0, optional
        Regularizer weights; default: balanced at ``θ_0`` (each update of relative size
        ``max_step``). Terms a method does not use are 0.
    lr : float > 0, default 0.005
        Step size η (the paper's).
    epochs : int >= 0, default 100
        Number of full-batch iterations.
    theta0 : array, shape (D, D), optional
        Starting extractor (default ``I``).
    seed : int >= 0, default 0
        Seed of ``"imma"``'s surrogate harmful labels (N(0, 1) or coin flips) when ``y_h`` is
        None.
    omega0 : array, shape (D,), optional
        Starting head (default 0).
    y_h : array, shape (N_h,), optional
        Harmful labels, used by ``"imma"`` only.
    max_step : float in (0, 0.5), default 0.3
        Each regularizer step moves every eigenvalue of its Hessian by at most a factor
        ``(1 ± max_step)²``.
    ridge : float > 0, optional
        ``None``: ``K⁻¹`` is the pseudo-inverse; ``ε``: ``(K + ε·λ_max(K)·I)⁻¹``.
    imma_steps : int >= 1, default 5
        Inner probe steps of ``"imma"``.
    imma_lr : float > 0, optional
        Inner step of ``"imma"``; default ``1/L`` at ``θ_0`` (recorded as ``res.imma_lr``).
    rtol : float in (0, 1), optional
        The run's one rank tolerance: ``σ_i(Xθ)`` counts when ``> rtol·σ₁``, in the loop, the
        history and the final metrics alike; default ``max(N_P, N_H, D)·eps`` (``res.rtol``).
    resume : ImmunizationResult, optional
        A run to continue: its iterate (θ, the head, the factored parts), the references of its
        health checks and every option it recorded (``method``, ``task``, ``lam_p``,
        ``lam_h``, ``lr``, ``max_step``, ``ridge``, ``imma_steps``, ``imma_lr``, ``rtol``,
        ``paths``, ``seed``, ``y_h``) are reused where not given, so that ten epochs and ten
        more equal twenty bit for bit.
    progress : bool, default False
        Print one line per epoch to stderr.
    callback : callable, optional
        ``callback(epoch, row) -> bool | None`` with each history row; ``True`` stops the run.
    warn : bool, default True
        Emit :class:`ImmunizationWarning` when the run stopped early (diverged or lost rank)
        or did not succeed.
    xp : namespace, optional
        Array API namespace to use instead of the inputs'.
    setup : DataSetup, optional
        :func:`condreg.algorithm.setup_data` of these very arrays ``X_p``, ``X_h`` (same
        ``rtol`` and ``ridge``): the data are not decomposed again. The result is the same bit
        for bit.

    Returns
    -------
    ImmunizationResult
        ``res.theta``, ``res.omega`` (raw units), ``res.history``, ``res.metrics`` and ``rir``,
        ``i``, ``ii``, ``succeeded``; ``res.stopped`` is ``"completed"``, ``"stopped by
        callback at epoch t"``, ``"diverged: …"`` or ``"rank collapse: …"``. A run that
        diverges or loses rank keeps the last healthy θ (finite, full rank), warns, and
        reports finite metrics: diverging values never raise.

    Raises
    ------
    TypeError
        Arrays of different libraries, non-array data, non-real dtypes, non-numeric options, a
        ``resume`` that is not a result or a ``setup`` that is not a :class:`DataSetup`.
    ValueError
        Non-2-D or empty ``X``, mismatched shapes, NaN/Inf in the data, bad labels, an unknown
        method or task, a zero data matrix, ``X_h`` of rank < 2 for R_ill, bad options, a
        ``resume`` of another method or task, a ``setup`` of other data or options. All checks
        run before any decomposition.

    Warns
    -----
    ImmunizationWarning
        The run stopped early (``res.stopped`` starts with ``"diverged"`` or ``"rank
        collapse"``), or it did not succeed (``not res.succeeded``); with ``warn=True``.

    Examples
    --------
    >>> import numpy as np, condreg
    >>> rng = np.random.default_rng(0)
    >>> X_p = rng.standard_normal((60, 6)) @ np.diag(np.logspace(0, -1, 6))
    >>> y_p = X_p @ rng.standard_normal(6)
    >>> X_h = rng.standard_normal((60, 6)) @ np.linalg.qr(rng.standard_normal((6, 6)))[0]
    >>> res = condreg.immunize(X_p, y_p, X_h, epochs=20)
    >>> res.stopped, res.succeeded
    ('completed', True)
    >>> half = condreg.immunize(X_p, y_p, X_h, epochs=10)
    >>> rest = condreg.immunize(X_p, y_p, X_h, epochs=10, resume=half)
    >>> bool((rest.theta == res.theta).all())
    True
    """
    epochs = _validate_epochs(epochs)
    if callback is not None and not callable(callback):
        raise TypeError(f"immunize: callback must be callable, got {type(callback).__name__}")
    if resume is not None and (theta0 is not None or omega0 is not None):
        raise ValueError("immunize: pass either resume or theta0/omega0, not both")
    kw = run_options(
        resume, method=method, task=task, lam_p=lam_p, lam_h=lam_h, lr=lr, max_step=max_step,
        ridge=ridge, imma_steps=imma_steps, imma_lr=imma_lr, rtol=rtol, paths=None, seed=seed,
        y_h=y_h, theta0=theta0, omega0=omega0,
    )  # fmt: skip
    problem, state = prepare(X_p, y_p, X_h, warn=warn, xp=xp, setup=setup, **kw)
    start, references = _continued(problem, state, resume)
    report = _reporter(problem, epochs, progress, callback)
    out = run(problem, start, epochs, report, references)
    result = _result(problem, state.theta, out, X_p, X_h, kw)
    if warn:
        _warn(result)
    return result


def _continued(problem: Problem, state: State, resume: ImmunizationResult | None):
    """The start of a run and the references of its health checks: ``state``, or the exact
    iterate ``resume`` stopped at (its head in the algorithm's units and, on the same tasks,
    its factored parts and features) and its references, when it is a run on the same data."""
    saved = None if resume is None else resume.resume_state
    if saved is None or saved.head_scale != problem.head_scale:
        return state, None
    start: State | Tracked = State(state.theta, saved.iterate.omega)
    if saved.iterate.on(problem):  # the same tasks: its factored parts and features too
        start = saved.iterate._replace(P=problem.P, H=problem.H)
    return start, saved.references


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
    problem: Problem, theta0: Array, out: Outcome, X_p: Array, X_h: Array, kw: dict[str, Any]
) -> ImmunizationResult:
    """The result of the run ``out``: its θ and head, the metrics at ``θ_0`` and at θ (rows 0
    and -1 of the history), every option the run depended on and its exact iterate."""
    from condreg.metrics import rir_spectra

    xp, history = problem.xp, out.history
    state = out.kept.state()
    dtype = state.theta.dtype
    X_p, X_h = xp.astype(X_p, dtype), xp.astype(X_h, dtype)
    with np.errstate(all="ignore"):
        # the tasks' spectra from prepare (the same arrays), θ's decomposed once: exactly
        # condreg.metrics.rir(θ, X_p, X_h, rtol=res.rtol)
        tasks = _tasks(problem, X_p, X_h)
        spectra = rir_spectra(state.theta, X_p, X_h, rtol=problem.rtol, tasks=tasks)
        metrics = spectra.rir()
        if out.epochs_run == 0:
            first = metrics
        elif is_identity(theta0, xp):  # X·I = X exactly: rir(I) is the tasks' own
            first = tasks.rir()
        else:
            first = rir_spectra(theta0, X_p, X_h, rtol=problem.rtol, tasks=tasks).rir()
    history.finish(first, metrics)
    uses_inner = problem.method.default_inner_lr is not None
    saved = ResumeState(_detached(out.kept), problem.head_scale, out.references, kw["y_h"])
    return ImmunizationResult(
        theta=state.theta,
        omega=problem.raw_omega(state),
        method=problem.method.name,
        task=problem.task,
        lam_p=problem.lam_p,
        lam_h=problem.lam_h,
        lr=problem.lr,
        max_step=problem.max_step,
        epochs_run=out.epochs_run,
        history=history.rows,
        metrics=metrics,
        stopped=out.stopped,
        rtol=problem.rtol,
        imma_lr=problem.imma_lr if uses_inner else None,
        paths=problem.paths,
        resume_state=saved,
        spectra=spectra,
        ridge=problem.setup.ridge,
        imma_steps=problem.imma_steps,
        seed=kw["seed"],
    )
