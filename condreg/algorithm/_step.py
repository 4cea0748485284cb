"""One epoch of Algorithm 1 as pure Array API code (no host synchronisation: it traces under
``jax.jit``), and the pieces every method shares."""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass
from typing import Any, NamedTuple

import numpy as np
from array_api_compat import array_namespace, is_numpy_array, is_torch_array
from array_api_compat import device as _device

from condreg import _core, _extreme, _linalg, _spectrum, _validation
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
    epoch, :class:`Tracked`); ``theta`` is then not read."""
    if F is None:
        F = task.A @ theta
    if _eager(F):
        if _shared_factor(task, F):
            return _identity_spectrum(F, rtol, xp, vectors=vectors, path=path)
        return _eager_spectrum(F, rtol, xp, vectors=vectors, path=path)
    sp = _spectrum.decompose(
        F, xp, gram=True, vectors=vectors, rtol=rtol, concrete=_core.never, method=path
    )
    V = None if sp.Vh is None else sp.Vh.T
    return _linalg.HessianSpectrum(sp.mu, V, sp, None, sp.U, rtol)


#: Spectra of ``F = A`` (``θ = I``) of shared task factors (:func:`_shared_factor`): every
#: method run on the same data starts there (prepare's default weights, epoch 0), so they are
#: decomposed once. Keyed by the factor's identity (the entry holds the factor, so its id stays
#: valid), the tolerance and the path; the last :data:`_AT_IDENTITY_SIZE` only.
_AT_IDENTITY: dict[tuple[int, float, str], tuple[Array, Any]] = {}
_AT_IDENTITY_SIZE = 4


def _shared_factor(task: TaskData, F: Array) -> bool:
    """``F`` is the task's own factor as prepare's data setup shares it: read-only NumPy that
    owns its data (not a view of a writable array), so its spectrum cannot change under the
    cache."""
    return F is task.A and is_numpy_array(F) and not F.flags.writeable and F.base is None


def read_only(obj: Any, depth: int = 4) -> Any:
    """Mark the NumPy arrays in ``obj`` (tuples, dataclasses, nested) read-only; returns
    ``obj``."""
    if isinstance(obj, np.ndarray):
        obj.flags.writeable = False
    elif depth > 0 and isinstance(obj, tuple):
        for item in obj:
            read_only(item, depth - 1)
    elif depth > 0 and is_dataclass(obj):
        for f in fields(obj):
            read_only(getattr(obj, f.name), depth - 1)
    return obj


def _identity_spectrum(F: Array, rtol: float, xp: Any, *, vectors: bool, path: str):
    """:func:`_eager_spectrum` of a shared factor, from :data:`_AT_IDENTITY` when decomposed
    before (with vectors on demand; ``vectors=False`` drops them)."""
    key = (id(F), float(rtol), path)
    hit = _AT_IDENTITY.get(key)
    if hit is None:
        hs = read_only(_eager_spectrum(F, rtol, xp, vectors=True, path=path))
        hs.ext.shared = True  # what it finds later is read-only too: the methods share it
        keys = [key]
        if path == "auto" and hs.ext.R is not None:  # the Gram did not resolve it: exact path
            keys.append((id(F), float(rtol), "exact"))
        for k in keys:
            _AT_IDENTITY.pop(k, None)
            _AT_IDENTITY[k] = (F, hs)
        for old in list(_AT_IDENTITY)[:-_AT_IDENTITY_SIZE]:
            _AT_IDENTITY.pop(old, None)
    else:
        hs = hit[1]
    return hs if vectors else hs._replace(ext=None)


def initial_features(task: TaskData, theta: Array) -> Array:
    """``F = Aθ``; the factor itself when ``θ`` is exactly ``I`` (NumPy: ``A·I = A`` exactly),
    so that a shared factor's spectrum is reused (:func:`_identity_spectrum`)."""
    A = task.A
    same = theta.dtype == A.dtype and theta.shape == (A.shape[1],) * 2
    if same and is_numpy_array(theta) and is_numpy_array(A):
        if is_identity(theta, array_namespace(theta)):
            return A
    return A @ theta


def is_identity(theta: Array, xp: Any) -> bool:
    """Whether the square ``theta`` is exactly ``I`` (reads its values)."""
    n = theta.shape[0]
    return bool(xp.all(theta == xp.eye(n, dtype=theta.dtype, device=_device(theta))))


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
        self.shared = False  # a spectrum of the cache at θ = I: its arrays are made read-only

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
            self._G = self._frozen(self._G)
        return self._G

    def _frozen(self, x: Array) -> Array:
        return read_only(x) if self.shared else x

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
            self._full = self._frozen(xp.astype(W, self.F.dtype))
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
        since a shared spectrum (:func:`_identity_spectrum`) is asked again."""
        if (lo, hi) not in self._clusters:
            self._clusters[(lo, hi)] = self._frozen(self._cluster(lo, hi))
        return self._clusters[(lo, hi)]

    def _cluster(self, lo: int, hi: int) -> Array:
        # Certified first even when the full decomposition exists (another cluster's fallback,
        # or all the vectors asked for): a cluster is then the same whatever was asked before
        # (a shared spectrum is asked by several methods, in their order).
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


def clip_factor(rho: Array, max_step: float, xp: Any) -> Array:
    """``min(1, max_step / rho)`` without dividing by zero."""
    safe = xp.where(rho > max_step, rho, xp.full_like(rho, max_step))
    return max_step / safe


def rel_size(step: Any, theta: Array, xp: Any) -> Array:
    """Relative size ``‖Δ‖_F·√D/‖θ‖_F`` of an un-preconditioned step (an array or a
    :class:`Delta`)."""
    D = theta.shape[-1]
    sq = step.frobenius_sq(theta, xp) if isinstance(step, Delta) else xp.sum(step * step)
    return xp.sqrt(sq) * math.sqrt(D) / xp.sqrt(xp.sum(theta * theta))


class Delta:
    """A step ``θ_t − θ_{t+1}`` kept factored, so that the features ``Aθ`` of both tasks follow
    it without a ``r×D×D`` product: ``Σ V_x N_x`` over the tasks' bases (``basis``: pairs of the
    task and ``N_x``, ``r_x×D``) plus ``Σ L_i R_i`` (``outer``: ``D×c`` and ``c×D`` factors)
    plus a dense ``D×D`` part (``dense``, or None). What :func:`condreg.algorithm.step`
    subtracts is :meth:`materialize`; a method's ``update`` may return either."""

    __slots__ = ("basis", "outer", "dense")

    def __init__(self, basis=(), outer=(), dense: Array | None = None) -> None:
        self.basis: list[tuple[TaskData, Array]] = list(basis)
        self.outer: list[tuple[Array, Array]] = list(outer)
        self.dense = dense

    def __add__(self, other: Delta) -> Delta:
        if self.dense is None or other.dense is None:
            dense = other.dense if self.dense is None else self.dense
        else:
            dense = self.dense + other.dense
        return Delta(self.basis + other.basis, self.outer + other.outer, dense)

    def scaled(self, c: Any) -> Delta:
        """``c·Δ`` (``c`` a scalar)."""
        return Delta(
            [(task, c * N) for task, N in self.basis],
            [(c * L, R) for L, R in self.outer],
            None if self.dense is None else c * self.dense,
        )

    def materialize(self, D: int, ref: Array) -> Array:
        """The ``D×D`` array ``Δ`` (zeros of ``ref``'s dtype and device when empty)."""
        out = self.dense
        for term in [task.basis @ N for task, N in self.basis] + [L @ R for L, R in self.outer]:
            out = term if out is None else out + term
        if out is None:
            xp = array_namespace(ref)
            return xp.zeros((D, D), dtype=ref.dtype, device=_device(ref))
        return out

    def frobenius_sq(self, ref: Array, xp: Any) -> Array:
        """``‖Δ‖_F²`` (0-d, of ``ref``'s dtype): from the ``c×c`` Grams of the factors when Δ
        is all outer products (clipped at 0: that sum may round below it)."""
        if self.basis or self.dense is not None:
            M = self.materialize(0, self.dense)  # not empty: D is not needed
            return xp.sum(M * M)
        if not self.outer:
            return xp.zeros((), dtype=ref.dtype, device=_device(ref))
        L = xp.concat([L for L, _ in self.outer], axis=1)
        R = xp.concat([R for _, R in self.outer], axis=0)
        sq = xp.sum((L.T @ L) * (R @ R.T))
        return xp.where(sq > 0, sq, xp.zeros_like(sq))

    def features(self, task: TaskData, other: TaskData, cross: Array) -> Array:
        """``A Δ`` for ``A`` the factor of ``task``: ``diag(sc)N`` on its own basis,
        ``diag(sc)(V_taskᵀV_other)N`` on the other's (``cross``), ``(AL)R`` on the outer
        products, ``AΔ_dense`` on the dense part (a ``r×D×D`` product, if any)."""
        sc = task.sc[:, None]
        out = None if self.dense is None else task.A @ self.dense
        for owner, N in self.basis:
            if owner is task:
                term = sc * N
            elif owner is other:
                term = sc * (cross @ N)
            else:  # pragma: no cover - a Delta of another problem's tasks
                term = task.A @ (owner.basis @ N)
            out = term if out is None else out + term
        for L, R in self.outer:
            term = (task.A @ L) @ R
            out = term if out is None else out + term
        return out


def basis_step(
    task: TaskData,
    hs: Any,
    d: Array,
    left: Array,
    a: Any = None,
    sides: tuple[str, ...] | None = None,
) -> Delta:
    """``V_x diag(left) (F G)`` with ``G = V diag(d) Vᵀ`` the gradient's right factor, as a
    :class:`Delta` on the task's basis ``V_x``.

    ``FG = (W diag(d) Wᵀ) F`` from the left vectors (``FV = W diag(s)``; no division by ``s``,
    so tiny singular values cost no accuracy), or ``F (V diag(d) Vᵀ)`` when the engine returned
    the right ones. ``left = task.pinv``: the preconditioned ``K̃⁺K̃θG`` (= ``θG`` for
    invertible ``K``); ``left = task.sc``: the plain ``K̃θG``. Two ``r×D``-sized products.

    With ``a`` and ``sides`` the caller states that ``d = a·mu`` except on the tie sets named in
    ``sides`` (``"top"``, ``"bottom"``); with vectors on demand (``hs.ext``, eager) the product
    is then ``a·(FFᵀ)F + W_S diag(d_S − a·mu_S) W_Sᵀ F`` — the extreme clusters' vectors only;
    for ``a = 0`` (Opt κ: ``d`` lives on the tie sets) outer products of rank ``|S|``, so the
    step costs no ``D×r×D`` product at all."""
    F = hs.sp.F  # the engine keeps F = Aθ with the vectors
    ext = hs.ext
    if ext is not None and sides is not None:
        if isinstance(a, (int, float)) and a == 0:
            return _low_rank(task, hs, d, left, sides)
        return Delta([(task, _structured(hs, d, left, a, sides))])
    if ext is not None:
        return Delta([(task, _all_vectors(hs, d, left))])
    if hs.W is not None:
        FG = ((hs.W * d[None, :]) @ hs.W.T) @ F
    else:
        FG = F @ ((hs.V * d[None, :]) @ hs.V.T)
    return Delta([(task, left[:, None] * FG)])


def _all_vectors(hs: Any, d: Array, left: Array) -> Array:
    """``diag(left)(W diag(d) Wᵀ)F`` from all of ``W`` (vectors on demand: the full
    decomposition)."""
    W = hs.ext.full()
    return (left[:, None] * ((W * d[None, :]) @ W.T)) @ hs.sp.F


def _tie_ranges(hs: Any, sides: tuple[str, ...]) -> list[tuple[int, int]] | None:
    """The index ranges of the tie sets ``sides``; None when the two overlap."""
    ranges = [hs.ext.bounds(side, hs.tie_rtol) for side in sides]
    if len(ranges) == 2 and ranges[0][1] > ranges[1][0]:
        return None
    return ranges


def _low_rank(task: TaskData, hs: Any, d: Array, left: Array, sides: tuple[str, ...]) -> Delta:
    """``V_x diag(left)(W diag(d) Wᵀ)F`` for ``d`` zero off the tie sets ``sides``: outer
    products ``(V_x diag(left) W_S diag(d_S))(W_Sᵀ F)`` (``D×|S|`` and ``|S|×D``)."""
    ext, F = hs.ext, hs.sp.F
    ranges = _tie_ranges(hs, sides)
    if ranges is None:  # the tie sets overlap: every value is in one of them
        return Delta([(task, _all_vectors(hs, d, left))])
    outer = []
    for lo, hi in ranges:
        if hi > lo:
            W = ext.cluster(lo, hi)
            outer.append((task.basis @ ((left[:, None] * W) * d[lo:hi][None, :]), W.T @ F))
    return Delta(outer=outer)


def _structured(hs: Any, d: Array, left: Array, a: Any, sides: tuple[str, ...]) -> Array:
    """``diag(left)·(W diag(d) Wᵀ)F`` for ``d = a·mu`` off the tie sets ``sides`` (``a ≠ 0``):
    one ``r×r`` matrix ``a·FFᵀ + W_S diag(e_S) W_Sᵀ`` times ``F`` (one ``r×r×D`` product)."""
    ext, F = hs.ext, hs.sp.F
    ranges = _tie_ranges(hs, sides)
    if ranges is None:  # the two tie sets overlap
        return _all_vectors(hs, d, left)
    clusters = [(lo, hi, ext.cluster(lo, hi)) for lo, hi in ranges if hi > lo]
    terms = [(W, d[lo:hi] - a * hs.sp.mu[lo:hi]) for lo, hi, W in clusters]
    M = _extreme.gram_plus_clusters(ext.gram(), a, terms)
    return (left[:, None] * M) @ F


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


def _all_finite(a: Array, xp: Any) -> Array:
    """0-d boolean: no NaN or Inf in ``a`` (its smallest and largest entry, no ``a``-sized
    temporary; a sum of magnitudes would also overflow on finite entries near the maximum)."""
    return _validation.all_finite(a, xp)


#: The loop sums θ and recomputes ``F = Aθ`` every this many epochs: the carried features'
#: rounding errors then never pile up (float32: ~1e-6 relative over 25 epochs, 2e-5 over 1000
#: without), at ~4 GEMMs per refresh.
REFRESH_EVERY = 25


class Tracked(NamedTuple):
    """The loop's iterate, factored: ``θ = theta + V_P·Y_P + V_H·Y_H`` (the basis parts of the
    regularizer steps kept apart, so no ``D×r×D`` product is paid per epoch), the head
    ``omega``, and the features ``F_P = A_Pθ``, ``F_H = A_Hθ``, updated with every step
    (:meth:`Delta.features`) instead of recomputed (``None`` after the public
    :func:`step`). ``P``, ``H``: the tasks the parts refer to. ``Y_P``/``Y_H`` are None until a
    step has a part on that basis. ``age``: epochs since θ was last summed and ``F``
    recomputed (:data:`REFRESH_EVERY`)."""

    theta: Array
    omega: Array
    Y_P: Array | None
    Y_H: Array | None
    F_P: Array | None
    F_H: Array | None
    P: TaskData
    H: TaskData
    age: int = 0

    @classmethod
    def start(cls, problem: Problem, state: State) -> Tracked:
        theta, omega = state
        F_P, F_H = initial_features(problem.P, theta), initial_features(problem.H, theta)
        return cls(theta, omega, None, None, F_P, F_H, problem.P, problem.H)

    def dense(self) -> Array:
        """θ as one ``D×D`` array (two ``D×r×D`` products when both basis parts exist)."""
        theta = self.theta
        for task, Y in ((self.P, self.Y_P), (self.H, self.Y_H)):
            if Y is not None:
                theta = theta + task.basis @ Y
        return theta

    def state(self) -> State:
        return State(self.dense(), self.omega)

    def apply(self, w: Array) -> Array:
        """``θw``."""
        out = self.theta @ w
        for task, Y in ((self.P, self.Y_P), (self.H, self.Y_H)):
            if Y is not None:
                out = out + task.basis @ (Y @ w)
        return out

    def apply_t(self, c: Array) -> Array:
        """``θᵀc``."""
        out = self.theta.T @ c
        for task, Y in ((self.P, self.Y_P), (self.H, self.Y_H)):
            if Y is not None:
                out = out + Y.T @ (task.basis.T @ c)
        return out

    def on(self, problem: Problem) -> bool:
        """Whether the parts refer to ``problem``'s tasks (the same factors, entry for entry)."""
        xp = problem.xp
        return all(
            mine is theirs or (mine.A.shape == theirs.A.shape and bool(xp.all(mine.A == theirs.A)))
            for mine, theirs in ((self.P, problem.P), (self.H, problem.H))
        )


def cross_basis(problem: Problem) -> Array:
    """``V_Pᵀ V_H`` (``r_P×r_H``): how a step on one task's basis moves the other's features."""
    return problem.P.basis.T @ problem.H.basis


def step(problem: Problem, state: State) -> tuple[State, Array]:
    """One epoch of ``problem.method`` from ``state = (θ_t, ω̂_t)``.

    Returns ``(State(θ_{t+1}, ω̂_{t+1}), record_t)`` with ``record_t`` the entries
    :data:`RECORD_FIELDS` at ``θ_t``: κ(H_P), κ(H_H), R_well(H̃_P), R_ill(H̃_H), the reported
    loss, the two ranks at ``problem.rtol`` and ``next_ok`` (1.0 when ``θ_{t+1}`` and ``ω_{t+1}``
    are finite). The head's step and the supervised θ step are taken from ``(θ_t, ω_t)``; the
    method adds its regularizer step (:data:`condreg.algorithm.REGISTRY`). Pure and jit-able:
    it never raises on the values (a diverged state gives a non-finite record).
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
        ok = _all_finite(new_theta, xp) & _all_finite(new_omega, xp)
    else:
        new = _advance_parts(problem, tr, delta, new_omega, cross)
        parts = [new.theta, new.omega, new.F_P, new.F_H] + [
            Y for Y in (new.Y_P, new.Y_H) if Y is not None
        ]
        ok = _all_finite(parts[0], xp)
        for part in parts[1:]:
            ok = ok & _all_finite(part, xp)
    rec = record(problem, hsP, hsH, loss, xp.astype(ok, loss.dtype))
    return new, rec


def _advance_parts(
    problem: Problem, tr: Tracked, delta: Delta, omega: Array, cross: Array
) -> Tracked:
    """``tr − Δ`` kept factored: the outer and dense parts into ``theta``, the basis parts into
    ``Y_P``/``Y_H``, and both features moved by ``AΔ`` — or, every :data:`REFRESH_EVERY`
    epochs, θ summed and ``F = Aθ`` recomputed (deterministic in the epoch count, which
    ``resume=`` carries: a resumed run stays bit-identical)."""
    P, H = problem.P, problem.H
    theta = tr.theta
    for L, R in delta.outer:
        theta = theta - L @ R
    if delta.dense is not None:
        theta = theta - delta.dense
    Y = {"P": tr.Y_P, "H": tr.Y_H}
    for task, N in delta.basis:
        if task is P or task is H:
            key = "P" if task is P else "H"
            Y[key] = -N if Y[key] is None else Y[key] - N
        else:  # a part on another basis (a third-party method): summed into θ
            theta = theta - task.basis @ N
    age = tr.age + 1
    if age >= REFRESH_EVERY:
        dense = Tracked(theta, omega, Y["P"], Y["H"], None, None, P, H).dense()
        return Tracked(dense, omega, None, None, P.A @ dense, H.A @ dense, P, H)
    F_P = tr.F_P - delta.features(P, H, cross)
    F_H = tr.F_H - delta.features(H, P, cross.T)
    return Tracked(theta, omega, Y["P"], Y["H"], F_P, F_H, P, H, age)


def evaluate(problem: Problem, state: State | Tracked) -> Array:
    """The record of ``state`` without taking a step (eigenvalues only)."""
    xp = problem.xp
    tr = state if isinstance(state, Tracked) else Tracked.start(problem, state)
    path_p, path_h = problem.paths
    hsP = spectrum(problem.P, None, problem.rtol, xp, vectors=False, path=path_p, F=tr.F_P)
    hsH = spectrum(problem.H, None, problem.rtol, xp, vectors=False, path=path_h, F=tr.F_H)
    loss, _, _ = supervised(tr, tr.omega, problem.P.Xhat, problem.yp, problem.task, xp)
    return record(problem, hsP, hsH, loss, xp.ones_like(loss))
