"""What :func:`condreg.immunize` returns, and its warning."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

Array = Any

#: The keys of :attr:`ImmunizationResult.history`, one list entry per evaluated ``θ_t``.
HISTORY_KEYS = (
    "epoch",
    "kappa_hp",
    "kappa_hh",
    "kappa_kp",
    "kappa_kh",
    "i",
    "ii",
    "rir",
    "r_well",
    "r_ill",
    "loss",
)

#: (i) must exceed 1 by more than this relative margin to count as harder (rounding of κ).
SUCCESS_MARGIN = 1e-6

#: Prefixes of :attr:`ImmunizationResult.stopped` for a run that ended before ``epochs``.
STOP_REASONS = ("completed", "stopped by callback", "diverged", "rank collapse")


class ResumeState(NamedTuple):
    """What ``resume=`` continues from, beyond a result's options: the loop's factored iterate
    (θ's parts, the head in the algorithm's units, the features ``Aθ``, the epochs since θ was
    last summed), ``head_scale`` (the units of the head: a resumed run on other data starts
    from ``theta`` and ``omega`` instead), ``references`` (the loss and ranks the run's health
    checks compare with, those of its ``θ_0``) and the harmful labels ``y_h`` it was given."""

    iterate: Any
    head_scale: float
    references: tuple[float, tuple[float, float] | None]
    y_h: Any = None


class ImmunizationWarning(UserWarning):
    """Immunization did not succeed (RIR ≤ 1 or (ii) > 1), the run stopped early because it
    diverged or lost rank, or the input is degenerate in a way that makes the result
    meaningless."""


@dataclass
class ImmunizationResult:
    """The outcome of :func:`condreg.immunize`: the immunized extractor, its history and metrics,
    and everything the run depended on.

    The figures are the relative immunization ratio (Eq. 15)
    ``RIR = (i)/(ii)``, ``(i) = κ(H_H(θ))/κ(K_H)``, ``(ii) = κ(H_P(θ))/κ(K_P)``, with
    ``H(θ) = θᵀXᵀXθ``, ``K = XᵀX`` and every κ counting the singular values
    ``σ_i(Xθ) > rtol·σ₁(Xθ)`` with the run's one tolerance ``rtol`` — in the loop, the history
    and the final figures alike, each from a decomposition that resolves every value it counts.

    Attributes
    ----------
    theta : array, shape (D, D)
        The last *healthy* ``θ_t`` of the run (finite, with the rank it started with), in the
        input's namespace.
    omega : array, shape (D,)
        The head in the units of the raw data: ``X_p @ theta @ omega`` predicts ``y_p`` (or
        the logits).
    method, task : str
        As run.
    lam_p, lam_h, lr, max_step, rtol, ridge, imma_steps, imma_lr, seed, paths
        Every option the run depended on, defaults resolved (``imma_lr`` None for the methods
        without an inner loop): ``resume=`` reuses them.
    epochs_run : int
        The epoch of ``theta``.
    history : dict of str to list of float
        One entry per evaluated ``θ_t`` (``t = 0 … epochs_run``; entry 0 is ``θ_0``) for each
        of :data:`HISTORY_KEYS`: ``kappa_hp = κ(H_P(θ_t))``, ``kappa_hh = κ(H_H(θ_t))``,
        ``kappa_kp = κ(K_P)``, ``kappa_kh = κ(K_H)``, the ratios ``i``, ``ii``, ``rir``,
        ``r_well`` = R_well(H̃_P), ``r_ill`` = R_ill(H̃_H) of the rescaled Hessians, and the task
        ``loss`` at ``(θ_t, ω_t)``: ``mean((xᵀθω − y)²)/mean(y²)`` for regression, the mean
        logistic loss for classification. The last row is the final report:
        ``history["rir"][-1] == rir``.
    metrics : condreg.metrics.RIR
        ``condreg.metrics.rir(theta, X_p, X_h, rtol=rtol)``.
    stopped : str
        Why the run ended: ``"completed"``, ``"stopped by callback at epoch t"``,
        ``"diverged: …"`` (a non-finite θ/ω, loss, κ or R_well, a loss more than 10× the
        reference, or a failed decomposition) or ``"rank collapse: …"`` (``H_P`` or ``H_H``
        lost rank at ``rtol``). The last two keep the last healthy θ and warn.
    spectra : condreg.metrics.RIRSpectra
        The singular values behind ``metrics``: ``res.spectra.rir(f * res.rtol)`` is the verdict
        at a coarser tolerance ``f >= 1`` without a new decomposition.
    resume_state : ResumeState
        The loop's exact iterate and the references of its health checks (for ``resume=``).

    Examples
    --------
    >>> import numpy as np, condreg
    >>> rng = np.random.default_rng(0)
    >>> X_p = rng.standard_normal((60, 6)) @ np.diag(np.logspace(0, -1, 6))
    >>> y_p = X_p @ rng.standard_normal(6)
    >>> X_h = rng.standard_normal((60, 6)) @ np.linalg.qr(rng.standard_normal((6, 6)))[0]
    >>> res = condreg.immunize(X_p, y_p, X_h, epochs=10)
    >>> res.stopped, res.succeeded, res.history["rir"][-1] == res.rir
    ('completed', True, True)
    >>> more = condreg.immunize(X_p, y_p, X_h, epochs=10, resume=res)  # = one 20-epoch run
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
    #: :class:`ResumeState`: the loop's exact iterate and the references of its health checks,
    #: so that ``resume=`` continues exactly (``theta`` is the iterate's sum and ``omega`` in raw
    #: units: they round-trip only up to rounding)
    resume_state: ResumeState | None = field(default=None, repr=False)
    #: the :class:`condreg.metrics.RIRSpectra` behind ``metrics`` (singular values of ``X_p``,
    #: ``X_h``, ``X_pθ``, ``X_hθ`` at ``rtol``): ``res.spectra.rir(10 * res.rtol)`` re-thresholds
    #: the verdict at a coarser tolerance without a new decomposition
    spectra: Any = field(default=None, repr=False)
    #: the preconditioner's ridge (None: pseudo-inverse)
    ridge: float | None = None
    #: IMMA's inner steps (recorded for every method)
    imma_steps: int = 5
    #: the seed of IMMA's surrogate harmful labels
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
        """Definition 3.1 (a) and (b) in ratio form: (i) > 1 — the harmful task became harder,
        by more than rounding (``(i) > 1 + SUCCESS_MARGIN``) — and (ii) ≤ 1 — the pre-training
        task did not; hence RIR > 1. A large RIR alone is not success (e.g. (i) < 1 with
        (ii) ≪ 1). Non-finite figures are not success."""
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
