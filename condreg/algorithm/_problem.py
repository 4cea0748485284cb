"""The immutable problem Algorithm 1 iterates on: scaled data, factors, preconditioners, weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from condreg import _linalg, _precondition

if TYPE_CHECKING:  # pragma: no cover
    from condreg.algorithm._methods import Method

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
        """The :class:`State` ``(θ, ω_raw / head_scale)``.

        Parameters
        ----------
        theta, omega_raw : array
            The extractor (``D×D``) and the head in raw units (as ``ImmunizationResult.omega``).

        Returns
        -------
        State
        """
        return State(theta, omega_raw / self.head_scale)

    def raw_omega(self, state: State) -> Array:
        """The head of ``state`` in raw units: ``ω̂·head_scale``.

        Parameters
        ----------
        state : State
            An iterate of this problem.

        Returns
        -------
        array
        """
        return state.omega * self.head_scale

    def with_weights(self, lam_p: float, lam_h: float, imma_lr: float | None = None) -> Problem:
        """A copy with other regularizer weights (and IMMA inner step).

        Parameters
        ----------
        lam_p, lam_h, imma_lr : float
            The new ``λ_P``, ``λ_H`` and IMMA inner step (``imma_lr=None``: unchanged).

        Returns
        -------
        Problem
        """
        kw: dict[str, Any] = {"lam_p": float(lam_p), "lam_h": float(lam_h)}
        if imma_lr is not None:
            kw["imma_lr"] = float(imma_lr)
        return replace(self, **kw)


def robust_rms(y: Array, xp: Any) -> float:
    """``sqrt(mean(y²))`` without overflow or underflow (0 for y = 0)."""
    m = float(xp.max(xp.abs(y)))
    if not m > 0:
        return 0.0
    z = y / m
    return m * math.sqrt(float(xp.mean(z * z)))


def build_task(X: Array, xp: Any, rtol: float, ridge: float | None, kappa_K: float) -> TaskData:
    """The :class:`TaskData` of ``X`` from one SVD (``ValueError`` at rank 0)."""
    N, D = X.shape
    _, s, Vh = xp.linalg.svd(X, full_matrices=False)
    s1 = float(s[0])
    if not (s1 > 0 and math.isfinite(s1)):
        raise ValueError("immunize: a data matrix is zero (rank 0); nothing to immunize")
    rank = int(xp.sum(xp.astype(_precondition.rank_mask(s, rtol), s.dtype)))
    c = _linalg.power_of_two_scale(s1)
    sc = s[:rank] * c
    Vr = Vh[:rank, :]
    A = sc[:, None] * Vr
    f = _precondition.left_filter(sc, sc > 0, ridge, xp)
    scale = math.sqrt(N) / s1
    return TaskData(A, Vr.T, sc, f / sc, X * scale, scale, c, rank, kappa_K)
