"""What :func:`condreg.immunize` returns, and its warning."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

Array = Any

#: The keys of :attr:`ImmunizationResult.history`, one list entry per evaluated ``θ_t``.
HISTORY_KEYS = (
    "epoch", "kappa_hp", "kappa_hh", "kappa_kp", "kappa_kh", "i", "ii", "rir", "r_well", "r_ill",
    "loss",
)  # fmt: skip

#: (i) must exceed 1 by more than this relative margin to count as harder (rounding of κ).
SUCCESS_MARGIN = 1e-6

#: Prefixes of :attr:`ImmunizationResult.stopped` for a run that ended before ``epochs``.
STOP_REASONS = ("completed", "stopped by callback", "diverged", "rank collapse")


class ResumeState(NamedTuple):
    """What ``resume=`` continues from: the loop's factored iterate, the head's units, the
    references ``(loss, ranks)`` of its health checks and the harmful labels it was given."""

    iterate: Any
    head_scale: float
    references: tuple[float, tuple[float, float] | None]
    y_h: Any = None


class ImmunizationWarning(UserWarning):
    """Immunization did not succeed, the run stopped early (diverged or lost rank), or the
    input is degenerate."""


@dataclass
class ImmunizationResult:
    """The outcome of :func:`condreg.immunize`: the extractor, its history and metrics, and
    every option the run depended on.

    ``RIR = (i)/(ii)`` (Eq. 15), ``(i) = κ(H_H(θ))/κ(K_H)``, ``(ii) = κ(H_P(θ))/κ(K_P)``, every κ
    counting ``σ_i(Xθ) > rtol·σ₁(Xθ)`` with the run's one ``rtol``.

    Attributes
    ----------
    theta : array, shape (D, D)
        The last *healthy* ``θ_t`` (finite, with its starting rank), in the input's namespace.
    omega : array, shape (D,)
        The head in raw units: ``X_p @ theta @ omega`` predicts ``y_p`` (or the logits).
    method, task : str
        As run.
    lam_p, lam_h, lr, max_step, rtol, ridge, imma_steps, imma_lr, seed, paths
        Every option the run depended on, defaults resolved (``imma_lr`` None without an
        inner loop): ``resume=`` reuses them.
    epochs_run : int
        The epoch of ``theta``.
    history : dict of str to list of float
        One entry per ``θ_t``, ``t = 0 … epochs_run``, for each of :data:`HISTORY_KEYS`:
        κ(H_P(θ_t)), κ(H_H(θ_t)), κ(K_P), κ(K_H), ``i``, ``ii``, ``rir``, R_well(H̃_P),
        R_ill(H̃_H) and the task ``loss`` (relative MSE or mean logistic loss); the last row is
        the final report (``history["rir"][-1] == rir``).
    metrics : condreg.metrics.RIR
        ``condreg.metrics.rir(theta, X_p, X_h, rtol=rtol)``.
    stopped : str
        ``"completed"``, ``"stopped by callback at epoch t"``, ``"diverged: …"`` or
        ``"rank collapse: …"`` (the last two keep the last healthy θ and warn).
    spectra : condreg.metrics.RIRSpectra
        The singular values behind ``metrics`` (``res.spectra.rir(10 * res.rtol)``
        re-thresholds without a new decomposition).
    resume_state : ResumeState
        The loop's exact iterate and health references (for ``resume=``).

    Examples
    --------
    >>> import numpy as np, condreg
    >>> rng = np.random.default_rng(0)
    >>> X_p, X_h = rng.standard_normal((60, 6)), rng.standard_normal((60, 6))
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
        """Definition 3.1: (i) > 1 + SUCCESS_MARGIN (harder harmful task) and (ii) ≤ 1, both
        finite."""
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
