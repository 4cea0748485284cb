"""Algorithm 1's factored iterate: factored steps (:class:`Delta`), the loop's iterate with its
features (:class:`Tracked`), and steps on a task's basis (:func:`basis_step`)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from array_api_compat import array_namespace, is_numpy_array
from array_api_compat import device as _device

from condreg import _extreme
from condreg.algorithm._problem import Problem, State, TaskData

Array = Any


def initial_features(task: TaskData, theta: Array) -> Array:
    """``F = Aθ``; ``A`` itself when ``θ`` is exactly ``I`` (NumPy: reuses the setup's spectrum)."""
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


def clip_factor(rho: Array, max_step: float, xp: Any) -> Array:
    """``min(1, max_step / rho)`` without dividing by zero."""
    safe = xp.where(rho > max_step, rho, xp.full_like(rho, max_step))
    return max_step / safe


def rel_size(step: Delta, theta: Array, xp: Any) -> Array:
    """Relative size ``‖Δ‖_F·√D/‖θ‖_F`` of a step."""
    sq = step.frobenius_sq(theta, xp)
    return xp.sqrt(sq) * math.sqrt(theta.shape[-1]) / xp.sqrt(xp.sum(theta * theta))


class Delta:
    """A step ``θ_t − θ_{t+1}`` kept factored: ``Σ V_x N_x`` (``basis``) + ``Σ L_i R_i``
    (``outer``) + ``dense`` (or None)."""

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

    def materialize(self) -> Array:
        """The ``D×D`` array ``Δ`` (of a non-empty step)."""
        out = self.dense
        for term in [task.basis @ N for task, N in self.basis] + [L @ R for L, R in self.outer]:
            out = term if out is None else out + term
        return out

    def frobenius_sq(self, ref: Array, xp: Any) -> Array:
        """``‖Δ‖_F²`` (0-d); from the factors' Grams when Δ is all outer products."""
        if self.basis or self.dense is not None:
            M = self.materialize()
            return xp.sum(M * M)
        if not self.outer:
            return xp.zeros((), dtype=ref.dtype, device=_device(ref))
        L = xp.concat([L for L, _ in self.outer], axis=1)
        R = xp.concat([R for _, R in self.outer], axis=0)
        sq = xp.sum((L.T @ L) * (R @ R.T))
        return xp.where(sq > 0, sq, xp.zeros_like(sq))

    def features(self, task: TaskData, cross: Array) -> Array:
        """``AΔ`` for ``A`` the factor of ``task`` (``cross = V_taskᵀV_other``)."""
        sc = task.sc[:, None]
        out = None if self.dense is None else task.A @ self.dense
        for owner, N in self.basis:  # on the basis of ``task`` or of the other task
            term = sc * N if owner is task else sc * (cross @ N)
            out = term if out is None else out + term
        for L, R in self.outer:
            term = (task.A @ L) @ R
            out = term if out is None else out + term
        return out


def basis_step(
    task: TaskData, hs: Any, d: Array, left: Array, a: Any, sides: tuple[str, ...]
) -> Delta:
    """``V_x diag(left)(FG)``, ``G = V diag(d) Vᵀ``, on the task's basis, for ``d = a·mu`` off
    the tie sets ``sides``: eager, only the extreme clusters' vectors are needed."""
    F, ext = hs.sp.F, hs.ext  # the engine keeps F = Aθ with the vectors
    if ext is not None:
        ranges = [ext.bounds(side, hs.tie_rtol) for side in sides]
        if len(ranges) == 2 and ranges[0][1] > ranges[1][0]:  # overlapping tie sets: all of W
            W = ext.full()
            return Delta([(task, (left[:, None] * ((W * d[None, :]) @ W.T)) @ F)])
        if isinstance(a, (int, float)) and a == 0:
            return _low_rank(task, hs, d, left, ranges)
        return Delta([(task, _structured(hs, d, left, a, ranges))])
    if hs.W is not None:
        FG = ((hs.W * d[None, :]) @ hs.W.T) @ F
    else:
        FG = F @ ((hs.V * d[None, :]) @ hs.V.T)
    return Delta([(task, left[:, None] * FG)])


def _low_rank(task: TaskData, hs: Any, d: Array, left: Array, ranges: list) -> Delta:
    """``V_x diag(left)(W diag(d) Wᵀ)F`` for ``d`` zero off the tie sets, as outer products."""
    outer = []
    for lo, hi in ranges:
        if hi > lo:
            W = hs.ext.cluster(lo, hi)
            outer.append((task.basis @ ((left[:, None] * W) * d[lo:hi][None, :]), W.T @ hs.sp.F))
    return Delta(outer=outer)


def _structured(hs: Any, d: Array, left: Array, a: Any, ranges: list) -> Array:
    """``diag(left)(W diag(d) Wᵀ)F`` for ``d = a·mu`` off the tie sets, from the clusters."""
    ext = hs.ext
    clusters = [(lo, hi, ext.cluster(lo, hi)) for lo, hi in ranges if hi > lo]
    terms = [(W, d[lo:hi] - a * hs.sp.mu[lo:hi]) for lo, hi, W in clusters]
    G = ext.G if ext.G.dtype == ext.F.dtype else ext.xp.astype(ext.G, ext.F.dtype)  # F's dtype
    M = _extreme.gram_plus_clusters(G, a, terms)
    return (left[:, None] * M) @ hs.sp.F


#: The loop sums θ and recomputes ``F = Aθ`` every this many epochs (rounding never piles up).
REFRESH_EVERY = 25


class Tracked(NamedTuple):
    """The loop's iterate ``θ = theta + V_P·Y_P + V_H·Y_H``, its head, features ``F = Aθ`` of
    both tasks (None after :func:`step`) and ``age``: epochs since θ was last summed."""

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
        """Whether the parts refer to ``problem``'s tasks (the same factors)."""
        xp = problem.xp
        return all(
            mine is theirs or (mine.A.shape == theirs.A.shape and bool(xp.all(mine.A == theirs.A)))
            for mine, theirs in ((self.P, problem.P), (self.H, problem.H))
        )


def cross_basis(problem: Problem) -> Array:
    """``V_Pᵀ V_H`` (``r_P×r_H``): how a step on one task's basis moves the other's features."""
    return problem.P.basis.T @ problem.H.basis


def advance_parts(
    problem: Problem, tr: Tracked, delta: Delta, omega: Array, cross: Array
) -> Tracked:
    """``tr − Δ`` kept factored, features moved by ``AΔ`` (summed every :data:`REFRESH_EVERY`)."""
    P, H = problem.P, problem.H
    theta = tr.theta
    for L, R in delta.outer:
        theta = theta - L @ R
    if delta.dense is not None:
        theta = theta - delta.dense
    Y = {"P": tr.Y_P, "H": tr.Y_H}
    for task, N in delta.basis:  # every method steps on the basis of P or of H
        key = "P" if task is P else "H"
        Y[key] = -N if Y[key] is None else Y[key] - N
    age = tr.age + 1
    if age >= REFRESH_EVERY:
        dense = Tracked(theta, omega, Y["P"], Y["H"], None, None, P, H).dense()
        return Tracked(dense, omega, None, None, P.A @ dense, H.A @ dense, P, H)
    F_P = tr.F_P - delta.features(P, cross)
    F_H = tr.F_H - delta.features(H, cross.T)
    return Tracked(theta, omega, Y["P"], Y["H"], F_P, F_H, P, H, age)
