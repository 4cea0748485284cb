"""The types of Algorithm 1: the immutable problem it iterates on (scaled data, factors,
preconditioners, weights), its iterate, and what :func:`condreg.immunize` returns."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

Array = Any


class State(NamedTuple):
    """The iterate ``(θ_t, ω̂_t)``: ``theta`` (``D×D``) and the head in the problem's units."""

    theta: Array
    omega: Array


@dataclass(frozen=True)
class TaskData:
    """One task as Algorithm 1 uses it (:func:`build_task`): ``A = diag(sc) Vᵀ`` factors
    ``K̃ = c²K`` (``basis = V``, ``sc = c·s_r``, ``pinv = filter/sc``), ``Xhat = X·scale``,
    ``at_identity``: ``(path, spectrum)`` pairs at ``θ = I``."""

    A: Array
    basis: Array
    sc: Array
    pinv: Array
    Xhat: Array
    scale: float
    c: float
    rank: int
    kappa_K: float
    at_identity: tuple[tuple[str, Any], ...] = field(default=(), repr=False, compare=False)


@dataclass(frozen=True)
class Problem:
    """Everything one epoch needs, fixed for the run (``dataclasses.replace`` to vary it);
    ``yp``, ``yh`` are scaled labels, ``head_scale`` the head's raw units."""

    method: Method
    task: str
    P: TaskData
    H: TaskData
    yp: Array
    yh: Array | None
    lr: float
    max_step: float
    lam_p: float
    lam_h: float
    imma_steps: int
    imma_lr: float
    rtol: float
    head_scale: float
    xp: Any
    paths: tuple[str, str] = ("auto", "auto")
    setup: Any = None

    def state(self, theta: Array, omega_raw: Array) -> State:
        """The :class:`State` ``(θ, ω_raw / head_scale)`` of ``theta`` and a raw-units head."""
        return State(theta, omega_raw / self.head_scale)

    def raw_omega(self, state: State) -> Array:
        """The head of the iterate ``state`` in raw units: ``ω̂·head_scale``."""
        return state.omega * self.head_scale

    def with_weights(self, lam_p: float, lam_h: float, imma_lr: float | None = None) -> Problem:
        """A copy with weights ``λ_P``, ``λ_H`` and IMMA inner step (``None``: unchanged)."""
        imma_lr = self.imma_lr if imma_lr is None else float(imma_lr)
        return replace(self, lam_p=float(lam_p), lam_h=float(lam_h), imma_lr=imma_lr)


#: The history's entries that report :func:`condreg.metrics.rir` of ``θ_t``.
RIR_KEYS = ("kappa_hp", "kappa_hh", "kappa_kp", "kappa_kh", "i", "ii", "rir")

#: The keys of :attr:`ImmunizationResult.history`, one list entry per evaluated ``θ_t``.
HISTORY_KEYS = ("epoch", *RIR_KEYS, "r_well", "r_ill", "loss")

#: (i) must exceed 1 by more than this relative margin to count as harder (rounding of κ).
SUCCESS_MARGIN = 1e-6

#: Prefixes of :attr:`ImmunizationResult.stopped` for a run that ended before ``epochs``.
STOP_REASONS = ("completed", "stopped by callback", "diverged", "rank collapse")


class ResumeState(NamedTuple):
    """What ``resume=`` continues from: iterate, head units, health references, y_h."""

    iterate: Any
    head_scale: float
    references: tuple[float, tuple[float, float] | None]
    y_h: Any = None


class ImmunizationWarning(UserWarning):
    """Immunization did not succeed, stopped early (diverged, lost rank) or got degenerate data."""


@dataclass
class ImmunizationResult:
    """The outcome of :func:`condreg.immunize`: the extractor, its history and metrics, and
    every option the run depended on (defaults resolved; ``resume=`` reuses them).

    ``RIR = (i)/(ii)`` (Eq. 15), ``(i) = κ(H_H(θ))/κ(K_H)``, ``(ii) = κ(H_P(θ))/κ(K_P)``, every κ
    counting ``σ_i(Xθ) > rtol·σ₁(Xθ)``.

    Attributes
    ----------
    theta, omega : array, shape (D, D) and (D,)
        The last healthy ``θ_t`` (``t = epochs_run``) and its head in raw units (for ``X_p``).
    history : dict of str to list of float
        :data:`HISTORY_KEYS` per ``θ_t``, ``t = 0 … epochs_run``; the last row is the final one.
    metrics, spectra : condreg.metrics.RIR, condreg.metrics.RIRSpectra
        ``condreg.metrics.rir(theta, X_p, X_h, rtol=rtol)`` and its singular values.
    stopped : str
        ``"completed"``, ``"stopped by callback at epoch t"``, ``"diverged: …"`` or
        ``"rank collapse: …"`` (the last two keep the last healthy θ and warn).

    Examples
    --------
    >>> import numpy as np, condreg
    >>> X_p, X_h = np.random.default_rng(0).standard_normal((2, 60, 6))
    >>> res = condreg.immunize(X_p, X_p @ np.ones(6), X_h, epochs=5, warn=False)
    >>> res.history["rir"][-1] == res.rir, res.epochs_run
    (True, 5)
    """

    theta: Array
    omega: Array
    method: str
    task: str
    lam_p: float
    lam_h: float
    lr: float
    max_step: float
    epochs_run: int
    history: dict[str, list[float]] = field(repr=False)
    metrics: Any = field(repr=False, default=None)
    stopped: str = "completed"
    rtol: float = 0.0
    imma_lr: float | None = None
    paths: tuple[str, str] | None = None
    resume_state: ResumeState | None = field(default=None, repr=False)
    spectra: Any = field(default=None, repr=False)
    ridge: float | None = None
    imma_steps: int = 5
    seed: int = 0

    @property
    def rir(self) -> float:
        """Final RIR = (i)/(ii) (Eq. 15) at :attr:`rtol`."""
        return self.metrics.rir

    @property
    def i(self) -> float:
        """Final (i) = κ(H_H(θ_I))/κ(K_H) at :attr:`rtol`."""
        return self.metrics.i

    @property
    def ii(self) -> float:
        """Final (ii) = κ(H_P(θ_I))/κ(K_P) at :attr:`rtol`."""
        return self.metrics.ii

    @property
    def succeeded(self) -> bool:
        """Definition 3.1: finite (i) > 1 + SUCCESS_MARGIN and (ii) ≤ 1."""
        i, ii = self.i, self.ii
        finite = math.isfinite(i) and math.isfinite(ii)
        return bool(finite and i > 1.0 + SUCCESS_MARGIN and ii <= 1.0)

    def __repr__(self) -> str:
        return (
            f"ImmunizationResult(method={self.method!r}, task={self.task!r}, "
            f"epochs_run={self.epochs_run}, i={self.i:.4g}, ii={self.ii:.4g}, "
            f"rir={self.rir:.4g}, lam_p={self.lam_p:.4g}, lam_h={self.lam_h:.4g}, "
            f"rtol={self.rtol:.3g}, stopped={self.stopped!r})"
        )


Sizes = Callable[[Problem, Array, Any, Any], "tuple[float, float]"]
Update = Callable[[Problem, Any, Any, Any], Any]  # an array or a _factored.Delta


@dataclass(frozen=True)
class Method:
    """One entry of :data:`REGISTRY` (adding a method is adding an entry).

    ``uses``: the weights it reads (``"p"``, ``"h"``; the others are 0); ``unit_sizes(problem,
    θ_0, hs_P, hs_H)``: its update per unit weight (``λ = max_step / size``); ``update(problem,
    θ, hs_P, hs_H)``: the regularizer part of ``θ_t − θ_{t+1}`` (``θ`` None unless
    ``uses_theta``); ``default_inner_lr(problem, θ_0, hs_H)``: the default ``imma_lr``, if any;
    ``label``: its name in tables and plots."""

    name: str
    uses: tuple[str, ...]
    needs_vectors: tuple[bool, bool]
    unit_sizes: Sizes
    update: Update
    summary: str
    label: str = ""
    needs_y_h: bool = False
    min_rank_h: int = 1
    default_inner_lr: Callable[[Problem, Array, Any], float] | None = None
    uses_theta: bool = True

    def vectors(self, problem: Problem) -> tuple[bool, bool]:
        """Whether an epoch of ``problem`` needs eigenvectors of ``(H_P, H_H)`` (not for λ = 0)."""
        vec_p, vec_h = self.needs_vectors
        return vec_p and problem.lam_p > 0, vec_h and problem.lam_h > 0
