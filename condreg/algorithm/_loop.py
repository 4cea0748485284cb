"""The eager loop of :func:`condreg.immunize`: epochs, health checks, history, the result."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from condreg.algorithm import _problem
from condreg.algorithm._factored import Tracked, cross_basis, is_identity
from condreg.algorithm._prepare import prepare, run_options
from condreg.algorithm._problem import ImmunizationResult, ImmunizationWarning, Problem, State
from condreg.algorithm._setup import DataSetup, integer
from condreg.algorithm._step import advance, evaluate, is_linalg_error
from condreg.metrics import rir_spectra

Array = Any


#: A loss above this multiple of the zero head's loss (or the starting loss, if larger) diverged.
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


def _append_row(history: dict, problem: Problem, t: int, rec: list[float]) -> dict[str, float]:
    """Append the history row of ``θ_t`` from its record, and return it."""
    kp, kh = problem.P.kappa_K, problem.H.kappa_K
    i_ratio, ii_ratio = rec[1] / kh, rec[0] / kp
    values = (t, rec[0], rec[1], kp, kh, i_ratio, ii_ratio, i_ratio / ii_ratio)
    row = dict(zip(_problem.HISTORY_KEYS, (*map(float, values), *rec[2:5]), strict=True))
    for key, value in row.items():
        history[key].append(value)
    return row


class Outcome(NamedTuple):
    """What :func:`run` returns (``references``: ``(loss, ranks)`` of the health checks)."""

    kept: Tracked
    history: dict[str, list[float]]
    stopped: str
    epochs_run: int
    references: tuple[float, tuple[float, float] | None]


def run(
    problem: Problem,
    state: State | Tracked,
    epochs: int,
    references: tuple[float, tuple[float, float] | None] | None = None,
    progress: bool = False,
    callback: Callable[[int, dict[str, float]], bool | None] | None = None,
) -> Outcome:
    """Iterate :func:`advance` on the factored iterate, keeping the last healthy state
    (:func:`_health`); a decomposition error counts as unhealthy."""
    history: dict[str, list[float]] = {key: [] for key in _problem.HISTORY_KEYS}
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
                _append_row(history, problem, 0, rec)
            break
        ranks = ranks or (rec[5], rec[6])
        kept, kept_t = state, t
        row = _append_row(history, problem, t, rec)
        if progress:
            print(
                f"[condreg {problem.method.name}] epoch {t}/{epochs}  i={row['i']:.4g}  "
                f"ii={row['ii']:.4g}  RIR={row['rir']:.4g}  loss={row['loss']:.4g}",
                file=sys.stderr,
            )
        if callback is not None and callback(t, row):
            stopped = f"stopped by callback at epoch {t}"
            break
        if t == epochs:
            break
        if not rec[7]:
            stopped = f"diverged: non-finite theta or omega after epoch {t}"
            break
        state = new
    if not history["epoch"]:  # θ_0 itself is unusable: report it, from the metrics
        for key in _problem.HISTORY_KEYS:
            history[key].append(0.0 if key == "epoch" else float("nan"))
    return Outcome(kept, history, stopped, kept_t, (loss_ref, ranks))


def _warn(result: ImmunizationResult) -> None:
    messages = []
    if not result.stopped.startswith(("completed", "stopped by callback")):
        messages.append(
            f"{result.stopped}; returned theta of epoch {result.epochs_run} (lower lr, or check "
            "the data's scale)"
        )
    if not result.succeeded:
        messages.append(
            f"immunization did not succeed: (i) = {result.i:.4g}, (ii) = {result.ii:.4g}, "
            f"RIR = {result.rir:.4g} (success needs (i) > 1 and (ii) <= 1); try more epochs, a "
            "larger max_step or other lam_p/lam_h"
        )
    for message in messages:
        warnings.warn(f"immunize ({result.method}): {message}", ImmunizationWarning, stacklevel=3)


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

    One epoch of ``method="condreg"``: ``ω ← ω − η∇_ωL``,
    ``θ ← θ − η∇_θL − ηλ_P K_P⁻¹∇_θR_well(H_P) − ηλ_H K_H⁻¹∇_θR_ill(H_H)``, ``H(θ) = θᵀKθ``,
    ``K = XᵀX``. Options left ``None`` take the resumed run's value, else the default below
    (all explained in ``docs/immunization.md``).

    Parameters
    ----------
    X_p, X_h : array, shape (N_p, D) and (N_h, D)
        The pre-training and the harmful inputs.
    y_p : array, shape (N_p,) or (N_p, 1)
        The pre-training labels (in {0, 1} for ``task="classification"``).
    method : str, default "condreg"
        ``"condreg"``, ``"r_ill_only"``, ``"opt_kappa"`` or ``"imma"`` (:data:`REGISTRY`).
    task : str, default "regression"
        ``"regression"`` (squared error) or ``"classification"`` (binary logistic loss).
    lam_p, lam_h : float >= 0, optional
        Regularizer weights; default: balanced at ``θ_0`` (steps of relative size ``max_step``).
    lr : float > 0, default 0.005
        Step size η (the paper's).
    epochs : int >= 0, default 100
        Number of full-batch iterations.
    theta0, omega0 : array, shape (D, D) and (D,), optional
        Starting extractor and head (default ``I`` and 0).
    seed : int >= 0, default 0
        Seed of ``"imma"``'s surrogate harmful labels when ``y_h`` is None.
    y_h : array, shape (N_h,), optional
        Harmful labels, used by ``"imma"`` only.
    max_step : float in (0, 0.5), default 0.3
        A regularizer step moves each eigenvalue by at most a factor ``(1 ± max_step)²``.
    ridge : float > 0, optional
        ``None``: ``K⁻¹`` is the pseudo-inverse; ``ε``: ``(K + ε·λ_max(K)·I)⁻¹``.
    imma_steps, imma_lr : int >= 1 (default 5), float > 0 (default ``1/L`` at ``θ_0``)
        Inner probe steps and step size of ``"imma"``.
    rtol : float in (0, 1), optional
        The one rank tolerance (``σ_i(Xθ) > rtol·σ₁`` counts); default ``max(N_P, N_H, D)·eps``.
    resume : ImmunizationResult, optional
        A run to continue exactly: ten epochs and ten more equal twenty bit for bit.
    progress : bool, default False
        Print one line per epoch to stderr.
    callback : callable, optional
        ``callback(epoch, row) -> bool | None`` with each history row; ``True`` stops the run.
    warn : bool, default True
        Emit :class:`ImmunizationWarning` when the run stopped early or did not succeed.
    xp : namespace, optional
        Array API namespace to use instead of the inputs'.
    setup : DataSetup, optional
        :func:`condreg.algorithm.setup_data` of these very arrays: the same result, bit for bit.

    Returns
    -------
    ImmunizationResult
        θ, the head, history and metrics; a diverging run keeps the last healthy θ and warns.

    Raises
    ------
    TypeError
        Mixed libraries, non-array or non-real data, non-numeric options, bad ``resume``/``setup``.
    ValueError
        Bad shapes, values or options, ``X_h`` of rank < 2 for R_ill, a mismatched ``resume`` or
        ``setup``; all checked before any decomposition.

    Examples
    --------
    >>> import numpy as np, condreg
    >>> X_p, X_h = np.random.default_rng(0).standard_normal((2, 60, 6))
    >>> X_p = X_p * np.logspace(0, -1, 6)
    >>> res = condreg.immunize(X_p, X_p[:, 0], X_h, epochs=20)
    >>> half = condreg.immunize(X_p, X_p[:, 0], X_h, epochs=10)
    >>> rest = condreg.immunize(X_p, X_p[:, 0], X_h, epochs=10, resume=half)
    >>> res.stopped, res.succeeded, bool((rest.theta == res.theta).all())
    ('completed', True, True)
    """
    epochs = integer(epochs, "epochs", 0)
    if callback is not None and not callable(callback):
        raise TypeError(f"immunize: callback must be callable, got {type(callback).__name__}")
    if resume is not None and (theta0 is not None or omega0 is not None):
        raise ValueError("immunize: pass either resume or theta0/omega0, not both")
    kw = run_options(
        resume,
        method=method,
        task=task,
        lam_p=lam_p,
        lam_h=lam_h,
        lr=lr,
        max_step=max_step,
        ridge=ridge,
        imma_steps=imma_steps,
        imma_lr=imma_lr,
        rtol=rtol,
        seed=seed,
        y_h=y_h,
        theta0=theta0,
        omega0=omega0,
    )
    problem, state = prepare(X_p, y_p, X_h, warn=warn, xp=xp, setup=setup, **kw)
    start, references = _continued(problem, state, resume)
    out = run(problem, start, epochs, references, progress, callback)
    result = _result(problem, state.theta, out, X_p, X_h, kw)
    if warn:
        _warn(result)
    return result


def _continued(problem: Problem, state: State, resume: ImmunizationResult | None):
    """``(start, references)``: ``resume``'s exact iterate where it fits, else ``state``."""
    saved = None if resume is None else resume.resume_state
    if saved is None or saved.head_scale != problem.head_scale:
        return state, None
    if saved.iterate.on(problem):  # the same tasks: its factored parts and features too
        return saved.iterate._replace(P=problem.P, H=problem.H), saved.references
    return State(state.theta, saved.iterate.omega), saved.references


def _result(
    problem: Problem, theta0: Array, out: Outcome, X_p: Array, X_h: Array, kw: dict[str, Any]
) -> ImmunizationResult:
    """The :class:`ImmunizationResult` of the run ``out``."""
    xp, history, theta = problem.xp, out.history, out.kept.dense()
    X_p, X_h = xp.astype(X_p, theta.dtype), xp.astype(X_h, theta.dtype)
    with np.errstate(all="ignore"):
        # exactly condreg.metrics.rir(θ, X_p, X_h, rtol=res.rtol), the tasks' spectra reused
        tasks = problem.setup.tasks  # the data's own spectra, unless of another dtype
        if X_p.dtype != tasks.s_kp.dtype:
            tasks = rir_spectra(None, X_p, X_h, rtol=problem.rtol)
        spectra = rir_spectra(theta, X_p, X_h, rtol=problem.rtol, tasks=tasks)
        metrics = spectra.rir()
        if out.epochs_run == 0:
            first = metrics
        elif is_identity(theta0, xp):  # X·I = X exactly: rir(I) is the tasks' own
            first = tasks.rir()
        else:
            first = rir_spectra(theta0, X_p, X_h, rtol=problem.rtol, tasks=tasks).rir()
    for index, m in ((0, first), (-1, metrics)):  # rows 0 and -1 report metrics.rir exactly
        for key in _problem.RIR_KEYS:
            history[key][index] = float(getattr(m, key))
    P, H = (replace(task, at_identity=()) for task in (out.kept.P, out.kept.H))  # re-attached
    saved = _problem.ResumeState(
        out.kept._replace(P=P, H=H), problem.head_scale, out.references, kw["y_h"]
    )
    same = ("task", "lam_p", "lam_h", "lr", "max_step", "rtol", "paths", "imma_steps")
    return ImmunizationResult(
        theta=theta,
        omega=problem.raw_omega(State(theta, out.kept.omega)),
        method=problem.method.name,
        epochs_run=out.epochs_run,
        history=history,
        metrics=metrics,
        stopped=out.stopped,
        imma_lr=None if problem.method.default_inner_lr is None else problem.imma_lr,
        resume_state=saved,
        spectra=spectra,
        ridge=problem.setup.ridge,
        seed=kw["seed"],
        **{key: getattr(problem, key) for key in same},
    )
