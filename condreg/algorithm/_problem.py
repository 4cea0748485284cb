"""The immutable problem Algorithm 1 iterates on: scaled data, factors, preconditioners, weights.

:func:`build_task` turns one task's data ``X`` into a :class:`TaskData` with one thin SVD
``X = U diag(s) Vᵀ`` (the only decomposition of the data): the factor ``A = diag(c·s_r) V_rᵀ``
of ``K̃ = c²K`` restricted to the numerical rank ``r`` (``s_i > rtol·s₁``; ``c`` a power of two
bringing ``c·s₁`` into ``[1/√2, √2]``, an exact rescaling), the left preconditioner's basis and
filter (:mod:`condreg._precondition`), and the power-of-two-scaled data of the supervised loss.
Every epoch then decomposes ``F = Aθ`` (``r×D``) — never a ``D×D`` matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from condreg import _linalg, _precondition
from condreg._api import condition_number

if TYPE_CHECKING:  # pragma: no cover
    from condreg.algorithm._methods import Method

Array = Any


class State(NamedTuple):
    """The iterate ``(θ_t, ω̂_t)``: ``theta`` (``D×D``) and the head ``omega`` in the problem's
    scaled units (raw units: :meth:`Problem.raw_omega`)."""

    theta: Array
    omega: Array


@dataclass(frozen=True)
class TaskData:
    """One task as Algorithm 1 uses it (built by :func:`build_task`).

    ``A`` (``r×D``): factor of ``K̃ = c²K`` on the rank, ``A = diag(sc) Vᵀ``; ``basis`` = ``V``
    (``D×r``); ``sc`` = ``c·s_r``; ``pinv`` = ``f/sc`` (preconditioned steps are
    ``V diag(pinv)·(FG)``, ``f`` the pinv/ridge filter); ``Xhat`` = ``X·scale``
    (``scale = √N/‖X‖₂``) for the supervised and probe losses; ``c``; ``rank`` = ``r``;
    ``kappa_K`` = κ(K) at the run's ``rtol``, exactly as :func:`condreg.metrics.rir` computes it;
    ``at_identity``: pairs ``(path, spectrum)`` of the engine's spectrum of ``F = A`` (``θ = I``)
    on that path, found by :func:`condreg.algorithm._step.spectrum` when it is given ``F = A``
    itself (:func:`condreg.algorithm.setup_data` fills them; every method starting at
    ``θ_0 = I`` then shares one decomposition)."""

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
    """Everything one epoch needs, fixed for the run (``dataclasses.replace`` to vary it).

    ``method`` is an entry of :data:`condreg.algorithm.REGISTRY`; ``P``/``H`` the two tasks;
    ``yp`` the scaled pre-training labels (``y/rms(y)`` for regression), ``yh`` the harmful
    labels of IMMA (or None); ``head_scale`` converts the head to raw units; ``rtol`` is the
    run's rank tolerance on singular values of ``Xθ``; ``xp`` the array namespace; ``paths``
    the engine's decomposition path per task (``"auto"`` or ``"exact"``, chosen at ``θ_0``:
    ``"exact"`` where the Gram did not resolve the spectrum there)."""

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
    #: the :class:`condreg.algorithm.DataSetup` the tasks come from (its ``tasks``, the data's
    #: spectra at ``rtol``, are reused by the result)
    setup: Any = None

    def state(self, theta: Array, omega_raw: Array) -> State:
        """The :class:`State` of ``θ`` and a head in raw units: ``(θ, ω_raw / head_scale)``.

        Parameters
        ----------
        theta : array
            The immunized map, ``D×D``.
        omega_raw : array
            The head in the units of the raw data, ``(D,)`` (as ``ImmunizationResult.omega``).

        Returns
        -------
        State
            The iterate in the problem's scaled units.
        """
        return State(theta, omega_raw / self.head_scale)

    def raw_omega(self, state: State) -> Array:
        """The head of ``state`` in the units of the raw data: ``ω̂·head_scale``.

        Parameters
        ----------
        state : State
            An iterate of this problem.

        Returns
        -------
        array
            ``(D,)``, as ``ImmunizationResult.omega``.
        """
        return state.omega * self.head_scale

    def with_weights(self, lam_p: float, lam_h: float, imma_lr: float | None = None) -> Problem:
        """A copy with other regularizer weights (and IMMA inner step).

        Parameters
        ----------
        lam_p, lam_h : float
            The new ``λ_P`` and ``λ_H``.
        imma_lr : float, optional
            The new inner step of IMMA (``None``: unchanged).

        Returns
        -------
        Problem
            The copy (``dataclasses.replace``); ``self`` is unchanged.
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


def build_task(
    X: Array, xp: Any, rtol: float, ridge: float | None, kappa_K: float | None = None
) -> TaskData:
    """One SVD of ``X``; raises ``ValueError`` when ``X`` has rank 0. ``kappa_K``: κ(K) at
    ``rtol`` as :func:`condreg.metrics.rir` computes it, when the caller has it."""
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
    if kappa_K is None:
        kappa_K = float(condition_number(X, gram=True, rtol=rtol))  # exactly metrics.rir's κ(K)
    return TaskData(A, Vr.T, sc, f / sc, X * scale, scale, c, rank, kappa_K)
