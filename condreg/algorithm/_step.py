"""One epoch of Algorithm 1 as pure Array API code (no host synchronisation: it traces under
``jax.jit``), and the pieces every method shares."""

from __future__ import annotations

from typing import Any

from array_api_compat import is_numpy_array, is_torch_array

from condreg import _core, _extreme, _linalg, _spectrum, _validation
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
    """Spectrum of ``H̃(θ) = θᵀK̃θ`` from the factor: ``F = Aθ`` (``r×D``), rank
    ``#{σ_i(F) > rtol·σ₁(F)}``, every counted value resolved (the engine's guarantee).

    ``path="auto"``: the eigh of the ``r×r`` Gram where it resolves them, else a QR of ``Fᵀ``
    and the SVD of its ``R``; ``"exact"``: the latter directly (no wasted eigh on data whose
    spectrum the Gram never resolves).

    Eagerly (NumPy; PyTorch on the CPU outside ``torch.compile``) only the values are
    decomposed (``eigvalsh`` of the Gram, or the singular values of ``R``) and the vectors come
    back as an :class:`Extremes` (``hs.ext``) that finds the eigenvectors of the extreme
    clusters on demand (:mod:`condreg._extreme`), falling back to the full decomposition where
    they are not certified. Traced (``jax.jit``), the engine's full decomposition is used and the
    small side's vectors come back as ``W`` (``F = W S Vᵀ``; ``V`` instead when ``r = D``).

    ``F``: the features ``Aθ`` where the caller has them (the loop carries them from epoch to
    epoch, :class:`Tracked`); ``theta`` is then not read. Given the task's factor itself
    (``F is task.A``: ``θ = I``), the spectrum the data's setup keeps for that path and
    tolerance is returned (``task.at_identity``, :func:`condreg.algorithm.setup_data`)."""
    if F is None:
        F = task.A @ theta
    if _eager(F):
        for p, hs in task.at_identity:
            if p == path and hs.sp.F is F and hs.rtol == rtol:
                return hs if vectors else hs._replace(ext=None)
        return _eager_spectrum(F, rtol, xp, vectors=vectors, path=path)
    sp = _spectrum.decompose(
        F, xp, gram=True, vectors=vectors, rtol=rtol, concrete=_core.never, method=path
    )
    V = None if sp.Vh is None else sp.Vh.T
    return _linalg.HessianSpectrum(sp.mu, V, sp, None, sp.U, rtol)


def _eager(F: Array) -> bool:
    """Values-only decomposition with vectors on demand: NumPy, and PyTorch on the CPU outside
    ``torch.compile`` (its cluster checks read values: host synchronisations on a GPU). Other
    arrays (eager JAX, array-api-strict, CUDA tensors) take the full decomposition."""
    if is_numpy_array(F):
        return True
    return is_torch_array(F) and F.device.type == "cpu" and not _spectrum.traced(F)


def _left_gram(F: Array, gdtype: Any, xp: Any) -> Array:
    """``FFᵀ`` of the ``r×D`` factor (``r <= D``) in the Gram dtype ``gdtype``."""
    A = F if F.dtype == gdtype else xp.astype(F, gdtype)
    return A @ A.T


def _eager_spectrum(F: Array, rtol: float, xp: Any, *, vectors: bool, path: str):
    """:func:`spectrum` for eager arrays: values only, vectors on demand (``Extremes``)."""
    how = "auto" if path == "auto" else "exact"  # the engine's Gram-or-exact, keeping G or R
    sm = _spectrum.small_side(
        F, xp, how=how, vectors=False, rtol=rtol, read=_spectrum.eager, keep=True
    )
    mask, k = _spectrum.rank(sm.s, rtol, xp)
    mu = sm.s * sm.s
    sp = _core.Spectrum(None, sm.s, None, mu, mask, k, F.shape[1], True, sm.mu_err, F, sm.tie)
    gdtype = _spectrum.gram_dtype(F, xp)
    ext = Extremes(F, sm.G, sm.R, sp, gdtype, xp) if vectors else None
    return _linalg.HessianSpectrum(mu, None, sp, None, None, rtol, ext)


class Extremes:
    """The left singular vectors ``W`` of ``F`` (eigenvectors of ``G = FFᵀ``) on demand.

    ``G`` is the Gram the values came from (``R is None``), or ``F`` was decomposed through
    ``R`` (``Fᵀ = QR``, exact path) and ``G`` is formed only when needed. Clusters are found by
    :mod:`condreg._extreme`; where it does not certify them, the full decomposition (eigh of
    ``G``, or the SVD of ``R``) is computed once and reused."""

    def __init__(self, F: Array, G: Array | None, R: Array | None, sp: Any, gdtype: Any, xp: Any):
        self.F, self._G, self.R, self.sp, self.gdtype, self.xp = F, G, R, sp, gdtype, xp
        self._full: Array | None = None
        self._clusters: dict[tuple[int, int], Array] = {}
        self.fallbacks = 0  # clusters that needed the full decomposition (for tests)

    @property
    def G(self) -> Array:
        """``FFᵀ`` in the Gram dtype; from the exact path's ``R`` as ``RᵀR`` (``Fᵀ = QR``: the
        same matrix to rounding, an ``r×r×r`` product instead of ``r×D×r``) when ``R`` is in
        that dtype."""
        if self._G is None:
            xp = self.xp
            if self.R is not None and self.R.dtype == self.gdtype:
                self._G = self.R.T @ self.R
            else:
                self._G = _left_gram(self.F, self.gdtype, xp)
        return self._G

    def gram(self) -> Array:
        """``G = FFᵀ`` in the dtype of ``F``."""
        G = self.G
        return G if G.dtype == self.F.dtype else self.xp.astype(G, self.F.dtype)

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
        if side == "top":
            return 0, int(xp.sum(_core.top_ties(sp, tie_rtol, xp)))
        k = int(sp.k)
        return k - int(xp.sum(_core.bottom_ties(sp, tie_rtol, xp))), k

    def cluster(self, lo: int, hi: int) -> Array:
        """The columns ``lo:hi`` of ``W`` (certified, or from the full decomposition); kept,
        since the setup's spectrum at ``θ = I`` is asked again by every method run on it."""
        if (lo, hi) not in self._clusters:
            self._clusters[(lo, hi)] = self._cluster(lo, hi)
        return self._clusters[(lo, hi)]

    def _cluster(self, lo: int, hi: int) -> Array:
        # Certified first even when the full decomposition exists (another cluster's fallback,
        # or all the vectors asked for): a cluster is then the same whatever was asked before
        # (the setup's spectrum at θ = I is asked by several methods, in their order).
        xp = self.xp
        V = None
        n = self.sp.s.shape[-1]
        if self.R is None or lo == 0:
            mu = xp.astype(self.sp.s, self.gdtype) ** 2
            value_eps = _spectrum.eps(xp, self.sp.s.dtype)
            V = _extreme.gram_cluster(self.G, mu, lo, hi, xp, value_eps=value_eps)
        elif hi == n:
            V = _extreme.triangular_bottom(self.R, self.sp.s, lo, xp)
        if V is not None:
            return xp.astype(V, self.F.dtype)
        self.fallbacks += 1
        return self.full()[:, lo:hi]


def is_linalg_error(exc: BaseException) -> bool:
    """A backend's "decomposition did not converge" (numpy LinAlgError, torch _LinAlgError…)."""
    return any("LinAlgError" in c.__name__ for c in type(exc).__mro__)


def gram_was_used(hs: Any, xp: Any) -> bool:
    """Whether the engine took the Gram path (its error bound is then > 0; eager)."""
    err = hs.sp.mu_err
    return bool(err > 0) if isinstance(err, float) else bool(float(xp.max(err)) > 0)


def sigmoid(z: Array, xp: Any) -> Array:
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def loss_parts(z: Array, y: Array, task: str, xp: Any) -> tuple[Array, Array, Array]:
    """Per-sample loss, first and second derivative with respect to the logit/prediction ``z``."""
    if task == "regression":
        r = z - y
        return r * r, 2.0 * r, 2.0 * xp.ones_like(z)
    p = sigmoid(z, xp)
    loss = xp.logaddexp(xp.zeros_like(z), z) - y * z
    return loss, p - y, p * (1.0 - p)


def supervised(theta: Any, omega: Array, X: Array, y: Array, task: str, xp: Any):
    """Mean loss, ``q`` and the gradient with respect to ω (the head sits on ``Xθ``); the
    gradient with respect to θ is ``q ωᵀ``. ``theta``: a ``D×D`` array or a :class:`Tracked`
    (``θ`` applied through its parts)."""
    N = X.shape[0]
    apply, apply_t = _operators(theta)
    z = X @ apply(omega)
    loss, d1, _ = loss_parts(z, y, task, xp)
    q = X.T @ (d1 / N)
    return xp.mean(loss), q, apply_t(q)


def _operators(theta: Any):
    """``w ↦ θw`` and ``c ↦ θᵀc`` of a dense θ or a :class:`Tracked` one."""
    if isinstance(theta, Tracked):
        return theta.apply, theta.apply_t
    return (lambda w: theta @ w), (lambda c: theta.T @ c)


def record(problem: Problem, hsP: Any, hsH: Any, loss: Array, next_ok: Array) -> Array:
    xp = problem.xp
    return xp.stack(
        [
            _linalg.kappa(hsP, xp),
            _linalg.kappa(hsH, xp),
            _linalg.r_well(hsP, xp),
            _linalg.r_ill(hsH, xp),
            loss,
            xp.astype(hsP.sp.k, loss.dtype),
            xp.astype(hsH.sp.k, loss.dtype),
            next_ok,
        ]
    )


def step(problem: Problem, state: State) -> tuple[State, Array]:
    """One epoch of ``problem.method`` from ``state = (θ_t, ω̂_t)``.

    ``ω_{t+1} = ω_t − η∇_ωL``, ``θ_{t+1} = θ_t − η∇_θL − Δ_t``: the head's step and the
    supervised θ step are taken from ``(θ_t, ω_t)``; ``Δ_t`` is the method's regularizer step
    (:data:`condreg.algorithm.REGISTRY`; for condreg
    ``ηλ_P K_P⁻¹∇_θR_well(H_P) + ηλ_H K_H⁻¹∇_θR_ill(H_H)``, each part clipped to relative size
    ``max_step``). Pure and jit-able: it never raises on the values (a diverged state gives a
    non-finite record).

    Parameters
    ----------
    problem : Problem
        From :func:`condreg.algorithm.prepare`.
    state : State
        ``(θ_t, ω̂_t)``, the head in the problem's scaled units.

    Returns
    -------
    state : State
        ``(θ_{t+1}, ω̂_{t+1})``.
    record : array, shape (8,)
        The entries :data:`RECORD_FIELDS` at ``θ_t``: κ(H_P), κ(H_H), R_well(H̃_P),
        R_ill(H̃_H), the reported loss, the two ranks at ``problem.rtol`` and ``next_ok``
        (1.0 when ``θ_{t+1}`` and ``ω_{t+1}`` are finite).

    Examples
    --------
    >>> import numpy as np
    >>> from condreg import algorithm
    >>> rng = np.random.default_rng(0)
    >>> X_p, X_h = rng.standard_normal((40, 6)), rng.standard_normal((30, 6))
    >>> problem, state = algorithm.prepare(X_p, rng.standard_normal(40), X_h)
    >>> state, record = algorithm.step(problem, state)
    >>> dict(zip(algorithm.RECORD_FIELDS, record.tolist()))["next_ok"]
    1.0
    """
    new, rec = advance(problem, Tracked.start(problem, state), None)
    return State(new.theta, new.omega), rec


def advance(problem: Problem, tr: Tracked, cross: Array | None) -> tuple[Tracked, Array]:
    """:func:`step` on a :class:`Tracked` iterate. ``cross`` (:func:`cross_basis`): keep the
    result factored and its features updated (the loop); None: return ``θ_{t+1}`` dense in
    ``theta`` (the features of the result are then not computed: ``F_P``, ``F_H`` None)."""
    xp, method = problem.xp, problem.method
    vec_p, vec_h = method.vectors(problem)
    path_p, path_h = problem.paths
    hsP = spectrum(problem.P, None, problem.rtol, xp, vectors=vec_p, path=path_p, F=tr.F_P)
    hsH = spectrum(problem.H, None, problem.rtol, xp, vectors=vec_h, path=path_h, F=tr.F_H)
    loss, q, g_omega = supervised(tr, tr.omega, problem.P.Xhat, problem.yp, problem.task, xp)
    plain = tr.Y_P is None and tr.Y_H is None
    theta = tr.theta if plain else (tr.dense() if method.uses_theta else None)
    update = method.update(problem, theta, hsP, hsH)
    delta = Delta(outer=[(problem.lr * q[:, None], tr.omega[None, :])])  # the supervised step
    delta = delta + (update if isinstance(update, Delta) else Delta(dense=update))
    new_omega = tr.omega - problem.lr * g_omega
    if cross is None:
        new_theta = tr.dense() - delta.materialize(tr.theta.shape[0], tr.theta)
        new = Tracked(new_theta, new_omega, None, None, None, None, tr.P, tr.H)
        ok = _validation.all_finite(new_theta, xp) & _validation.all_finite(new_omega, xp)
    else:
        new = advance_parts(problem, tr, delta, new_omega, cross)
        parts = [new.theta, new.omega, new.F_P, new.F_H] + [
            Y for Y in (new.Y_P, new.Y_H) if Y is not None
        ]
        ok = _validation.all_finite(parts[0], xp)
        for part in parts[1:]:
            ok = ok & _validation.all_finite(part, xp)
    rec = record(problem, hsP, hsH, loss, xp.astype(ok, loss.dtype))
    return new, rec


def evaluate(problem: Problem, state: State | Tracked) -> Array:
    """The record of ``state`` without taking a step (eigenvalues only).

    Parameters
    ----------
    problem : Problem
        From :func:`condreg.algorithm.prepare`.
    state : State
        ``(θ_t, ω̂_t)`` (or the loop's factored iterate).

    Returns
    -------
    array, shape (8,)
        The entries :data:`RECORD_FIELDS` of ``θ_t`` as :func:`step` reports them, ``next_ok``
        1.0: κ(H_P), κ(H_H) (``κ(H) = σ₁²/σ_k²`` over the singular values of ``Xθ`` above
        ``rtol·σ₁``), R_well(H̃_P), R_ill(H̃_H), the loss and the two ranks.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg import algorithm
    >>> rng = np.random.default_rng(0)
    >>> X_p, X_h = rng.standard_normal((40, 6)), rng.standard_normal((30, 6))
    >>> problem, state = algorithm.prepare(X_p, rng.standard_normal(40), X_h)
    >>> record = algorithm.evaluate(problem, state)
    >>> bool(np.isclose(record[0], problem.P.kappa_K))  # κ(H_P(I)) = κ(K_P)
    True
    """
    xp = problem.xp
    tr = state if isinstance(state, Tracked) else Tracked.start(problem, state)
    path_p, path_h = problem.paths
    hsP = spectrum(problem.P, None, problem.rtol, xp, vectors=False, path=path_p, F=tr.F_P)
    hsH = spectrum(problem.H, None, problem.rtol, xp, vectors=False, path=path_h, F=tr.F_H)
    loss, _, _ = supervised(tr, tr.omega, problem.P.Xhat, problem.yp, problem.task, xp)
    return record(problem, hsP, hsH, loss, xp.ones_like(loss))
