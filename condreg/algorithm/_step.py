"""One epoch of Algorithm 1 as pure Array API code (jit-able), and the pieces methods share."""

from __future__ import annotations

from typing import Any

import numpy as np

from condreg import _backend, _core, _extreme, _linalg, _spectrum, _validation
from condreg.algorithm._factored import Delta, Tracked, advance_parts
from condreg.algorithm._problem import Problem, State, TaskData

Array = Any

#: The entries of the record :func:`step` returns for ``θ_t``.
RECORD_FIELDS = ("kappa_hp", "kappa_hh", "r_well", "r_ill", "loss", "rank_p", "rank_h", "next_ok")

#: Decomposition paths of the engine a task may use (:func:`condreg._spectrum.decompose`).
PATHS = ("auto", "exact")


def spectrum(
    task: TaskData,
    theta: Array,
    rtol: float,
    xp: Any,
    *,
    vectors: bool,
    path: str,
    F: Array | None = None,
):
    """Spectrum of ``H̃(θ) = θᵀK̃θ`` from ``F = Aθ`` on ``path``: values and vectors on demand
    (``hs.ext``) for eager arrays, the setup's at ``θ = I``, the full decomposition if traced."""
    if F is None:
        F = task.A @ theta
    if _eager(F):
        for p, hs in task.at_identity:
            if p == path and hs.sp.F is F and hs.rtol == rtol:
                return hs if vectors else hs._replace(ext=None)
        return _eager_spectrum(F, rtol, xp, vectors=vectors, path=path)
    return _linalg.hessian_spectrum(F, xp, vectors=vectors, rtol=rtol, method=path)


def _eager(F: Array) -> bool:
    """Values only, vectors on demand: NumPy, and CPU PyTorch outside ``torch.compile``."""
    return _backend.cpu(F) and not _backend.traced(F)


def _eager_spectrum(F: Array, rtol: float, xp: Any, *, vectors: bool, path: str):
    """:func:`spectrum` for eager arrays: values only, vectors on demand (``Extremes``)."""
    sp = _spectrum.decompose(
        F,
        xp,
        gram=True,
        vectors=False,
        rtol=rtol,
        concrete=_core.never,
        method=path,
        read=_backend.eager,
        keep=True,
    )
    gdtype = _spectrum.gram_dtype(F, xp)
    ext = Extremes(F, sp.G, sp.R, sp, gdtype, xp) if vectors else None
    return _linalg.HessianSpectrum(sp.mu, None, sp, None, None, rtol, ext)


class Extremes:
    """The left singular vectors ``W`` of ``F`` on demand, from ``G = FFᵀ`` or the exact path's
    ``R`` (``Fᵀ = QR``): certified clusters, else the full decomposition."""

    def __init__(self, F: Array, G: Array | None, R: Array | None, sp: Any, gdtype: Any, xp: Any):
        self.F, self._G, self.R, self.sp, self.gdtype, self.xp = F, G, R, sp, gdtype, xp
        self._full: Array | None = None
        self._clusters: dict[tuple[int, int], Array] = {}
        self.fallbacks = 0  # clusters that needed the full decomposition (for tests)

    @property
    def G(self) -> Array:
        """``FFᵀ`` in the Gram dtype (``RᵀR`` when ``R`` is in that dtype)."""
        if self._G is None:
            if self.R is not None and self.R.dtype == self.gdtype:
                self._G = self.R.T @ self.R
            else:
                A = self.F if self.F.dtype == self.gdtype else self.xp.astype(self.F, self.gdtype)
                self._G = A @ A.T
        return self._G

    def full(self) -> Array:
        """All of ``W`` (``r×r``, columns in the order of the spectrum)."""
        if self._full is None:
            xp = self.xp
            if self.R is None:
                _, W = xp.linalg.eigh(self.G)
                W = xp.flip(W, axis=-1)
            else:
                _, _, Vh = xp.linalg.svd(self.R, full_matrices=False)
                W = Vh.T
            self._full = xp.astype(W, self.F.dtype)
        return self._full

    def bounds(self, side: str, tie_rtol: float | None) -> tuple[int, int]:
        """Index range ``[lo, hi)`` of the top or bottom tie set."""
        xp, sp = self.xp, self.sp
        p = _core.spectrum_parts("condition_number", sp, xp, tie_rtol)
        if side == "top":
            return 0, int(xp.sum(xp.astype(p.wt > 0, sp.s.dtype)))
        k = int(sp.k)
        return k - int(xp.sum(xp.astype(p.wb > 0, sp.s.dtype))), k

    def cluster(self, lo: int, hi: int) -> Array:
        """The columns ``lo:hi`` of ``W`` (kept): certified if possible, else from :meth:`full`."""
        if (lo, hi) in self._clusters:
            return self._clusters[(lo, hi)]
        xp, V = self.xp, None
        if self.R is None or lo == 0:
            mu = xp.astype(self.sp.s, self.gdtype) ** 2
            value_eps = float(xp.finfo(self.sp.s.dtype).eps)
            V = _extreme.gram_cluster(self.G, mu, lo, hi, xp, value_eps=value_eps)
        elif hi == self.sp.s.shape[-1]:
            V = _extreme.triangular_bottom(self.R, self.sp.s, lo, xp)
        if V is None:
            self.fallbacks += 1
            V = self.full()[:, lo:hi]
        else:
            V = xp.astype(V, self.F.dtype)
        self._clusters[(lo, hi)] = V
        return V


def is_linalg_error(exc: BaseException) -> bool:
    """A backend's "decomposition did not converge" (numpy LinAlgError, torch _LinAlgError…)."""
    return any("LinAlgError" in c.__name__ for c in type(exc).__mro__)


def probe_path(task: TaskData, F: Array, rtol: float, xp: Any, *, vectors: bool):
    """``(hs, path)``: the spectrum of ``F`` on ``"auto"`` (None if it failed) and the path to
    run, ``"auto"`` where the Gram resolved it, else ``"exact"``."""
    try:
        with np.errstate(all="ignore"):
            hs = spectrum(task, None, rtol, xp, F=F, vectors=vectors, path="auto")
    except Exception as exc:  # the features overflow: the loop reports it
        if not is_linalg_error(exc):
            raise
        return None, "exact"
    err = hs.sp.mu_err  # > 0 where the engine took the Gram path
    gram = bool(err > 0) if isinstance(err, float) else bool(float(xp.max(err)) > 0)
    return hs, "auto" if gram else "exact"


def loss_parts(z: Array, y: Array, task: str, xp: Any) -> tuple[Array, Array, Array]:
    """Per-sample loss, first and second derivative with respect to the logit/prediction ``z``."""
    if task == "regression":
        r = z - y
        return r * r, 2.0 * r, 2.0 * xp.ones_like(z)
    e = xp.exp(-xp.abs(z))
    p = xp.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))  # the sigmoid, without overflow
    loss = xp.logaddexp(xp.zeros_like(z), z) - y * z
    return loss, p - y, p * (1.0 - p)


def _measure(problem: Problem, tr: Tracked, vectors: tuple[bool, bool]):
    """``(hs_P, hs_H, loss, q, g_omega)`` at ``tr``; the θ-gradient of the loss is ``q ωᵀ``."""
    xp, X, rtol, paths = problem.xp, problem.P.Xhat, problem.rtol, problem.paths
    hsP = spectrum(problem.P, None, rtol, xp, vectors=vectors[0], path=paths[0], F=tr.F_P)
    hsH = spectrum(problem.H, None, rtol, xp, vectors=vectors[1], path=paths[1], F=tr.F_H)
    loss, d1, _ = loss_parts(X @ tr.apply(tr.omega), problem.yp, problem.task, xp)
    q = X.T @ (d1 / X.shape[0])
    return hsP, hsH, xp.mean(loss), q, tr.apply_t(q)


def record(problem: Problem, hsP: Any, hsH: Any, loss: Array, next_ok: Array) -> Array:
    """The :data:`RECORD_FIELDS` as one array."""
    xp = problem.xp
    kappas = [_linalg.kappa(hsP, xp), _linalg.kappa(hsH, xp)]
    ranks = [xp.astype(hs.sp.k, loss.dtype) for hs in (hsP, hsH)]
    regs = [_linalg.r_well(hsP, xp), _linalg.r_ill(hsH, xp)]
    return xp.stack([*kappas, *regs, loss, *ranks, next_ok])


def step(problem: Problem, state: State) -> tuple[State, Array]:
    """One epoch of ``problem.method`` from ``state = (θ_t, ω̂_t)``.

    ``ω_{t+1} = ω_t − η∇_ωL``, ``θ_{t+1} = θ_t − η∇_θL − Δ_t`` (``Δ_t`` the method's clipped
    regularizer step). Pure and jit-able: a diverged state gives a non-finite record, no error.

    Parameters
    ----------
    problem, state : Problem, State
        From :func:`prepare`; ``state`` is ``(θ_t, ω̂_t)``, the head in the problem's units.

    Returns
    -------
    state, record : State, array of shape (8,)
        ``(θ_{t+1}, ω̂_{t+1})`` and :data:`RECORD_FIELDS` at ``θ_t`` (``next_ok``: all finite).

    Examples
    --------
    >>> import numpy as np
    >>> from condreg import algorithm
    >>> X_p, X_h = np.random.default_rng(0).standard_normal((2, 40, 6))
    >>> state, record = algorithm.step(*algorithm.prepare(X_p, X_p[:, 0], X_h))
    >>> dict(zip(algorithm.RECORD_FIELDS, record.tolist()))["next_ok"]
    1.0
    """
    new, rec = advance(problem, Tracked.start(problem, state), None)
    return State(new.theta, new.omega), rec


def advance(problem: Problem, tr: Tracked, cross: Array | None) -> tuple[Tracked, Array]:
    """:func:`step` on a :class:`Tracked` iterate: kept factored with ``cross``
    (:func:`cross_basis`, the loop), else dense in ``theta`` without features."""
    xp, method = problem.xp, problem.method
    hsP, hsH, loss, q, g_omega = _measure(problem, tr, method.vectors(problem))
    plain = tr.Y_P is None and tr.Y_H is None
    theta = tr.theta if plain else (tr.dense() if method.uses_theta else None)
    update = method.update(problem, theta, hsP, hsH)
    delta = Delta(outer=[(problem.lr * q[:, None], tr.omega[None, :])])  # the supervised step
    delta = delta + (update if isinstance(update, Delta) else Delta(dense=update))
    new_omega = tr.omega - problem.lr * g_omega
    if cross is None:
        new_theta = tr.dense() - delta.materialize()
        new = Tracked(new_theta, new_omega, None, None, None, None, tr.P, tr.H)
    else:
        new = advance_parts(problem, tr, delta, new_omega, cross)
    ok = _validation.all_finite(new.theta, xp)
    for part in (new.omega, new.F_P, new.F_H, new.Y_P, new.Y_H):
        if part is not None:
            ok = ok & _validation.all_finite(part, xp)
    return new, record(problem, hsP, hsH, loss, xp.astype(ok, loss.dtype))


def evaluate(problem: Problem, state: State | Tracked) -> Array:
    """The record of ``state`` without taking a step (eigenvalues only).

    Parameters
    ----------
    problem, state : Problem, State
        From :func:`prepare`; ``state`` is ``(θ_t, ω̂_t)`` (or the loop's factored iterate).

    Returns
    -------
    array, shape (8,)
        :data:`RECORD_FIELDS` of ``θ_t`` as :func:`step` reports them, ``next_ok`` 1.0.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg import algorithm
    >>> X_p, X_h = np.random.default_rng(0).standard_normal((2, 40, 6))
    >>> problem, state = algorithm.prepare(X_p, X_p[:, 0], X_h)
    >>> bool(np.isclose(algorithm.evaluate(problem, state)[0], problem.P.kappa_K))
    True
    """
    tr = state if isinstance(state, Tracked) else Tracked.start(problem, state)
    hsP, hsH, loss, _, _ = _measure(problem, tr, (False, False))
    return record(problem, hsP, hsH, loss, problem.xp.ones_like(loss))
