"""From the user's arrays to a :class:`Problem` and the starting :class:`State`."""

from __future__ import annotations

import math
import warnings
from types import MappingProxyType
from typing import Any

import numpy as np
from array_api_compat import device as _device

from condreg.algorithm import _setup
from condreg.algorithm._factored import initial_features
from condreg.algorithm._methods import REGISTRY
from condreg.algorithm._problem import ImmunizationResult, ImmunizationWarning, Problem, State
from condreg.algorithm._setup import DataSetup, build_setup
from condreg.algorithm._step import PATHS, is_linalg_error, probe_path, spectrum
from condreg.metrics import run_rtol

Array = Any


def robust_rms(y: Array, xp: Any) -> float:
    """``sqrt(mean(y²))`` without overflow or underflow (0 for y = 0)."""
    m = float(xp.max(xp.abs(y)))
    if not m > 0:
        return 0.0
    z = y / m
    return m * math.sqrt(float(xp.mean(z * z)))


def _harmful_labels(y_h: Array | None, X_h: Array, task: str, seed: Any, xp: Any) -> Array:
    """``y_h`` scaled (regression), or the seeded surrogate: N(0, 1) or fair coin flips."""
    if y_h is None:
        rng = np.random.default_rng(seed)
        n = X_h.shape[0]
        draw = rng.standard_normal(n) if task == "regression" else rng.integers(0, 2, n)
        return xp.asarray(np.asarray(draw, dtype=np.float64), dtype=X_h.dtype, device=_device(X_h))
    if task == "regression":
        return y_h / (robust_rms(y_h, xp) or 1.0)
    return y_h


def _at_start(problem: Problem, which: int, theta: Array, vectors: bool) -> Any:
    """The engine's spectrum of task ``which`` (0: P, 1: H) at ``θ_0`` on the run's path."""
    task, path = (problem.P, problem.H)[which], problem.paths[which]
    F = initial_features(task, theta)
    return spectrum(task, None, problem.rtol, problem.xp, F=F, vectors=vectors, path=path)


def _guarded(fn: Any, fallback: Any) -> Any:
    """``fn()`` without float warnings; ``fallback`` when a decomposition fails."""
    try:
        with np.errstate(all="ignore"):
            return fn()
    except Exception as exc:
        if not is_linalg_error(exc):
            raise
        return fallback


def _usable(x: float) -> bool:
    return x > 0 and math.isfinite(x)


def _weights(problem: Problem, state: State, opts: dict, warn: bool) -> Problem:
    """Default λ's (balanced at ``θ_0``) and IMMA's inner step, where not given."""
    method, theta = problem.method, state.theta
    imma_lr = opts["imma_lr"]
    if method.default_inner_lr is not None and imma_lr is None:
        imma_lr = _guarded(
            lambda: method.default_inner_lr(problem, theta, _at_start(problem, 1, theta, False)),
            float("nan"),
        )
        if not _usable(imma_lr):
            imma_lr = 1.0  # θ_0 overflows or maps X_h to 0: the loop stops at epoch 0
    problem = problem.with_weights(problem.lam_p, problem.lam_h, imma_lr)
    lam = {"p": opts["lam_p"], "h": opts["lam_h"]}
    if any(lam[k] is None for k in method.uses):

        def unit_sizes() -> tuple[float, float]:
            hsP, hsH = (_at_start(problem, which, theta, True) for which in (0, 1))
            return method.unit_sizes(problem, theta, hsP, hsH)

        sizes = dict(zip("ph", _guarded(unit_sizes, (float("nan"),) * 2), strict=True))
        bad = [k for k in method.uses if lam[k] is None and not _usable(sizes[k])]
        if bad and warn:
            warnings.warn(
                "immunize: the regularizer gradient is zero or not finite at theta0 for "
                f"{', '.join('lam_' + k for k in bad)}; using weight 1.0 (e.g. R_ill at its pole: "
                "all nonzero eigenvalues of H_H equal)",
                ImmunizationWarning,
                stacklevel=4,
            )
        for k in method.uses:
            if lam[k] is None:
                lam[k] = 1.0 if k in bad else problem.max_step / sizes[k]
    lam_p = lam["p"] if "p" in method.uses else 0.0
    lam_h = lam["h"] if "h" in method.uses else 0.0
    return problem.with_weights(lam_p, lam_h)


def prepare(
    X_p: Array,
    y_p: Array,
    X_h: Array,
    *,
    method: str = "condreg",
    task: str = "regression",
    lam_p: float | None = None,
    lam_h: float | None = None,
    lr: float = 0.005,
    theta0: Array | None = None,
    omega0: Array | None = None,
    seed: int = 0,
    y_h: Array | None = None,
    max_step: float = 0.3,
    ridge: float | None = None,
    imma_steps: int = 5,
    imma_lr: float | None = None,
    rtol: float | None = None,
    paths: tuple[str, str] | None = None,
    warn: bool = True,
    xp: Any = None,
    setup: DataSetup | None = None,
) -> tuple[Problem, State]:
    """Validate the inputs, build the :class:`Problem` and the starting :class:`State`.

    What :func:`condreg.immunize` runs before its loop: every check, the data's setup and the
    defaults (balanced weights, IMMA's ``1/L``, the paths); iterate :func:`step` from the state.

    Parameters
    ----------
    X_p, y_p, X_h : array
        As in :func:`condreg.immunize` (same defaults and errors, here and below).
    lam_p, lam_h, theta0, omega0, y_h, ridge, imma_lr, rtol, xp, setup : optional
        As in :func:`condreg.immunize`.
    method : str
        As in :func:`condreg.immunize`.
    task : str
        As in :func:`condreg.immunize`.
    lr : float
        As in :func:`condreg.immunize`.
    max_step : float
        As in :func:`condreg.immunize`.
    seed : int
        As in :func:`condreg.immunize`.
    imma_steps : int
        As in :func:`condreg.immunize`.
    warn : bool
        As in :func:`condreg.immunize`.
    paths : tuple of two str, optional
        The engine's path per task, ``"auto"`` or ``"exact"``; default: chosen at ``θ_0``.

    Returns
    -------
    problem, state : Problem, State
        Everything an epoch needs (immutable), and ``(θ_0, ω̂_0)`` in the problem's units.

    Raises
    ------
    TypeError, ValueError
        As :func:`condreg.immunize`; ``ValueError`` for ``paths`` not two of :data:`PATHS`.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg import algorithm
    >>> X_p, X_h = np.random.default_rng(0).standard_normal((2, 40, 6))
    >>> problem, state = algorithm.prepare(X_p, X_p[:, 0], X_h)
    >>> problem.method.name, problem.paths, state.theta.shape
    ('condreg', ('auto', 'auto'), (6, 6))
    """
    if paths is not None and (
        isinstance(paths, str) or len(paths) != 2 or any(p not in PATHS for p in paths)
    ):
        raise ValueError(f"immunize: paths must be two of {PATHS}, got {paths!r}")
    opts = _setup.options(
        method, task, lr, max_step, lam_p, lam_h, ridge, imma_steps, imma_lr, rtol
    )
    seed = _setup.integer(seed, "seed", 0, TypeError)
    named = {"X_p": X_p, "X_h": X_h, "y_p": y_p, "y_h": y_h, "theta0": theta0, "omega0": omega0}
    xp = _setup.namespace(named, xp)
    Xp, Xh = _setup.data_matrices(X_p, X_h, xp)
    D, dtype, dev = Xp.shape[1], Xp.dtype, _device(Xp)
    yp = _setup.labels(y_p, Xp.shape[0], "y_p", task, xp, dtype, dev)
    yh = None if y_h is None else _setup.labels(y_h, Xh.shape[0], "y_h", task, xp, dtype, dev)
    theta = xp.eye(D, dtype=dtype, device=dev)
    if theta0 is not None:
        theta = _setup.checked(theta0, "theta0", (D, D), xp, dtype, dev)
        if not bool(xp.any(theta != 0)):
            raise ValueError("immunize: theta0 is zero (rank 0)")
    omega = None if omega0 is None else _setup.checked(omega0, "omega0", (D,), xp, dtype, dev)
    rtol = opts["rtol"] or run_rtol(Xp, Xh)  # max(N_P, N_H, D)·eps, as metrics.rir
    if setup is None:
        setup = build_setup(X_p, X_h, Xp, Xh, xp, rtol, opts["ridge"])
    elif not isinstance(setup, DataSetup):
        raise TypeError(f"immunize: setup must be a DataSetup, got {type(setup).__name__}")
    else:
        setup.check(X_p, X_h, rtol=rtol, ridge=opts["ridge"], xp=xp)
    m = REGISTRY[method]
    if setup.H.rank < m.min_rank_h:
        raise ValueError(
            f"immunize: R_ill needs X_h of rank >= 2 (its covariance has rank {setup.H.rank})"
        )
    y_unit = (robust_rms(yp, xp) or 1.0) if task == "regression" else 1.0
    yh = _harmful_labels(yh, Xh, task, seed, xp) if m.needs_y_h else None
    if not paths:
        paths = setup.paths if theta0 is None else _paths(setup, theta)
    problem = Problem(
        m,
        task,
        setup.P,
        setup.H,
        yp / y_unit,
        yh,
        opts["lr"],
        opts["max_step"],
        0.0,
        0.0,
        opts["imma_steps"],
        0.0,
        setup.rtol,
        setup.P.scale * y_unit,
        xp,
        tuple(paths),
        setup,
    )
    state = problem.state(theta, xp.zeros_like(theta[0, :]) if omega is None else omega)
    return _weights(problem, state, opts, warn), state


def _paths(setup: DataSetup, theta: Array) -> tuple[str, ...]:
    """Per task, the path to run from ``θ_0`` (:func:`probe_path`)."""
    with np.errstate(all="ignore"):
        F = [initial_features(task, theta) for task in (setup.P, setup.H)]
    tasks = zip((setup.P, setup.H), F, strict=True)
    return tuple(probe_path(t, f, setup.rtol, setup.xp, vectors=False)[1] for t, f in tasks)


#: The defaults of :func:`condreg.immunize`'s options that a resumed run takes from its result.
DEFAULTS = MappingProxyType(
    dict(method="condreg", task="regression", lr=0.005, max_step=0.3, imma_steps=5, seed=0)
)

#: The options a result records and ``resume=`` reuses where not given.
RESUMED = (*DEFAULTS, "lam_p", "lam_h", "ridge", "imma_lr", "rtol", "paths", "y_h")


def run_options(resume: ImmunizationResult | None, **given: Any) -> dict[str, Any]:
    """The options of a run: those ``given``, else the resumed run's, else :data:`DEFAULTS`."""
    out = {"paths": None, **given}
    if resume is not None:
        if not isinstance(resume, ImmunizationResult):
            raise TypeError(
                f"immunize: resume must be an ImmunizationResult, got {type(resume).__name__}"
            )
        for key in ("method", "task"):
            if given[key] is not None and given[key] != getattr(resume, key):
                raise ValueError(
                    f"immunize: resume is a {key}={getattr(resume, key)!r} run, got "
                    f"{key}={given[key]!r}"
                )
        out["theta0"], out["omega0"] = resume.theta, resume.omega
        y_h = None if resume.resume_state is None else resume.resume_state.y_h
        for key in RESUMED:
            if out[key] is None:
                out[key] = y_h if key == "y_h" else getattr(resume, key, None)
    for key, value in DEFAULTS.items():
        if out[key] is None:
            out[key] = value
    return out
