"""κ, R_well and R_ill of a large feature batch from the extreme eigenpairs of its Gram matrix.

For a feature batch ``F`` (``N×D``, ``N >= D``) the quantities of ``H = FᵀF`` that
``condreg.condition_number/r_well/r_ill(F, gram=True)`` compute need only ``mu_1`` (the largest
eigenvalue of ``H``), ``mu_k`` (the smallest counted one) and ``‖H‖_F`` (docs/math.md §1, §3):

    kappa(H)  = mu_1 / mu_k
    R_well(H) = ½ mu_1² − ‖H‖_F² / (2D)
    R_ill(H)  = 1 / (‖H‖_F² / (2k) − ½ mu_k²)

and their gradients with respect to ``F`` are ``2 F G_H`` with ``G_H = a·H`` plus rank-``t`` terms
built from the eigenvectors of the extreme eigenvalues (Theorem 4.2). This module computes them
without a ``D×D`` eigendecomposition: one GEMM forms ``H``, block Lanczos (shift-and-invert with a
Cholesky factor for the bottom) finds the extreme eigenpairs, and Cholesky factorisations prove
what the result relies on (docs/extreme.md):

- the rank: a Cholesky of ``H − τI`` succeeds, so every eigenvalue of ``H`` exceeds
  ``τ = max(rtol²·mu_1 + 2·err, err / accuracy)`` (Sylvester's law of inertia), where ``err`` bounds
  the rounding error of the formed Gram (the dense engine's bound). Then ``k = D`` and every
  eigenvalue is resolved to ``accuracy``, the dense engine's own acceptance rule;
- the extreme clusters: a Cholesky of ``H + β X Xᵀ − cI`` (bottom) or ``cI − H + β X Xᵀ`` (top),
  ``X`` the ``t`` computed extreme eigenvectors, succeeds, so exactly ``t`` eigenvalues lie beyond
  ``c`` (interlacing of a rank-``t`` update); ``c`` is chosen so that every other eigenvalue is
  certainly not tied with the extreme one.

Whenever one of these cannot be proven (rank deficiency, a near-tie, a cluster wider than the
block, an iteration that did not converge, a spectrum the Gram does not resolve, ``N < D``, a
batch of matrices, values that cannot be read under tracing), ``method="auto"`` returns the dense
engine's result (``condreg.r_ill(F, gram=True)`` …) and ``method="extreme"`` raises
:class:`ExtremePathError`. ``return_info=True`` says which path was taken and why.

Backends: NumPy (with SciPy's triangular solver), PyTorch and JAX, eagerly. ``import condreg``
does not import this module's optional dependencies: SciPy is imported on first use with NumPy
input, torch and JAX are reached through ``sys.modules`` (they are loaded when their arrays
exist).
"""

from __future__ import annotations

import importlib
import inspect
import math
from typing import Any, NamedTuple

import numpy as np
from array_api_compat import device as _device
from array_api_compat import is_jax_array, is_numpy_array, is_torch_array

import condreg
from condreg import _extreme as _clusters
from condreg import _spectrum, _validation
from condreg._errors import RankError, TiedExtremeError

Array = Any

__all__ = [
    "ExtremeInfo",
    "ExtremePathError",
    "condition_number",
    "condition_number_grad",
    "condition_number_value_and_grad",
    "r_ill",
    "r_ill_grad",
    "r_ill_value_and_grad",
    "r_well",
    "r_well_grad",
    "r_well_value_and_grad",
]

METHODS = ("auto", "extreme", "dense")
SUBGRADIENTS = ("min_norm", "any", "raise")

#: Columns of the Krylov block (the largest tied cluster the path handles is ``BLOCK - 2``).
BLOCK = 8
#: Blocks per Krylov basis before a restart.
BASIS_BLOCKS = 8
#: Restarts before giving up.
RESTARTS = 12
#: Smallest ``D`` for which ``method="auto"`` tries the extreme path.
MIN_D = 64


class ExtremePathError(ValueError):
    """``method="extreme"`` was asked for, but the extreme path cannot decide the result safely
    (the reason is in the message); ``method="auto"`` would have used the dense engine."""


class ExtremeInfo(NamedTuple):
    """Which path produced a result (``return_info=True``).

    ``path``: ``"extreme"`` or ``"dense"``; ``reason``: why the dense engine was used (``""`` on
    the extreme path); ``restarts``: Krylov restarts used (both ends); ``residual``: the largest
    residual ``‖H x − θ x‖ / ‖H‖_F`` of an accepted extreme eigenpair; ``top`` and ``bottom``: the
    sizes of the extreme clusters (tied eigenvalues; 0 where that end was not needed).
    """

    path: str
    reason: str = ""
    restarts: int = 0
    residual: float = 0.0
    top: int = 0
    bottom: int = 0


class _Fallback(Exception):
    """Internal: the extreme path cannot decide; the argument is the reason."""


# --------------------------------------------------------------------------------------------
# Backend helpers (eager)
# --------------------------------------------------------------------------------------------


def _cholesky(A: Array, xp: Any) -> Any:
    """A factor of the symmetric ``A`` for :func:`_inverse`, or ``None`` when ``A`` is not
    positive definite (the factorisation breaks down)."""
    if is_torch_array(A):
        torch = _spectrum.loaded("torch")
        L, info = torch.linalg.cholesky_ex(A)
        return None if int(info) != 0 else L
    if is_jax_array(A):
        L = _spectrum.loaded("jax").numpy.linalg.cholesky(A)
        return L if bool(xp.all(xp.isfinite(L))) else None
    import scipy.linalg as sl

    potrf = sl.get_lapack_funcs("potrf", (A,))
    # A is symmetric: its C-ordered buffer is the Fortran-ordered Aᵀ = A (no copy).
    c, info = potrf(A.T, lower=True, overwrite_a=True, clean=False)
    return c if info == 0 and bool(np.isfinite(c[-1, -1])) else None


def _inverse(L: Any) -> Any:
    """``B ↦ A⁻¹ B`` from the factor :func:`_cholesky` returned."""
    if is_torch_array(L):
        torch = _spectrum.loaded("torch")
        return lambda B: torch.cholesky_solve(B, L, upper=False)
    if is_jax_array(L):
        jsl = importlib.import_module("jax.scipy.linalg")
        return lambda B: jsl.cho_solve((L, True), B)
    import scipy.linalg as sl

    potrs = sl.get_lapack_funcs("potrs", (L,))

    def solve(B):
        x, info = potrs(L, B, lower=True)
        return x

    return solve


def _checked(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a float in [0, 1), got {value!r}")
    return float(value)


def _shifted(sign: float, H: Array, c: float, xp: Any, X: Array | None = None, beta: float = 0.0):
    """``sign·H + beta·X Xᵀ − c·I`` as a new array (the diagonal shifted in place where the
    library allows: no ``D×D`` identity is formed)."""
    A = sign * H
    if X is not None:
        A = A + X @ (beta * X.T)
    if is_numpy_array(A):
        A.reshape(-1)[:: A.shape[0] + 1] -= c
        return A
    if is_torch_array(A):
        A.diagonal().sub_(c)
        return A
    return A - c * xp.eye(A.shape[0], dtype=A.dtype, device=_device(A))


# shared with the clusters' inverse iteration (condreg._extreme): start blocks, orthonormal
# bases, column norms and host reads have one home
_start = _clusters._start
_orth = _clusters._orthonormal


def _norms(X: Array, xp: Any) -> list[float]:
    return _clusters._host(_clusters._column_norms(X, xp))


_floats = _clusters._host


def _times_pow2(x: Array, n: int) -> Array:
    """``x · 2**n`` in exact steps that never leave the float range on their own."""
    while n != 0:
        step = max(-500, min(500, n))
        x = x * (2.0**step)
        n -= step
    return x


# --------------------------------------------------------------------------------------------
# Extreme eigenpairs
# --------------------------------------------------------------------------------------------


class _End(NamedTuple):
    """The extreme eigenpairs at one end of the spectrum of ``H`` (ordered from the extreme
    inward): Ritz values ``theta``, residual norms ``res``, vectors ``X`` (``D×b``), restarts."""

    theta: list[float]
    res: list[float]
    X: Array
    restarts: int


def _lanczos(
    apply: Any,
    H: Array,
    xp: Any,
    *,
    top: bool,
    target: float,
    need: int,
    start: Array,
    restarts: int = RESTARTS,
    blocks: int = BASIS_BLOCKS,
) -> _End:
    """Block Lanczos with full reorthogonalisation, restarted from the best ``BLOCK`` Ritz
    vectors, on the symmetric operator ``apply`` (``H`` for the top end, a shifted inverse of
    ``H`` for the bottom end). After every restart the block is refined by Rayleigh–Ritz on ``H``
    itself; iteration stops once the first ``need`` pairs have ``‖H x − θ x‖ <= target``, or
    when the residuals stop decreasing."""
    D = H.shape[-1]
    b = start.shape[-1]
    X = _orth(start, xp)
    best = math.inf
    stalled = 0
    end = None
    for restart in range(1, restarts + 1):
        Qs, Ws = [X], []
        for j in range(min(blocks, max(1, D // b))):
            W = apply(Qs[-1])
            Ws.append(W)
            if j == blocks - 1 or (j + 2) * b > D:
                break
            Q = xp.concat(Qs, axis=1)
            Z = W - Q @ (Q.T @ W)
            Z = Z - Q @ (Q.T @ Z)
            Qs.append(_orth(Z, xp))
        Q = xp.concat(Qs, axis=1)
        T = Q.T @ xp.concat(Ws, axis=1)
        _, Y = xp.linalg.eigh(0.5 * (T + T.T))  # ascending: the wanted end of `apply` is last
        X = Q @ Y[:, -b:]
        # Rayleigh–Ritz on H within span(X): Ritz pairs of H, ordered from the extreme inward.
        HX = H @ X
        theta, Z = xp.linalg.eigh(0.5 * (X.T @ HX + (X.T @ HX).T))
        if top:
            theta, Z = xp.flip(theta), xp.flip(Z, axis=-1)
        X, HX = X @ Z, HX @ Z
        res = _norms(HX - X * theta[None, :], xp)
        end = _End(_floats(theta), res, X, restart)
        worst = max(res[:need])
        if worst <= target:
            break
        if worst < 0.5 * best:
            best, stalled = worst, 0
        else:
            stalled += 1
            if stalled >= 2:
                break
    return end


def _rough(H: Array, xp: Any) -> tuple[_End, _End]:
    """``(top, bottom)``: the ``BLOCK`` Ritz pairs at each end of one block Krylov space of ``H``
    (``BASIS_BLOCKS`` blocks): estimates to place the shifts (Rayleigh quotients: the top ones
    are lower bounds of ``mu_1``, the bottom ones upper bounds of ``mu_D``)."""
    D = H.shape[-1]
    b = min(BLOCK, D)
    Qs, Ws = [_orth(_start(D, b, H, xp, 2), xp)], []
    for j in range(min(BASIS_BLOCKS, max(1, D // b))):
        W = H @ Qs[-1]
        Ws.append(W)
        if j == BASIS_BLOCKS - 1 or (j + 2) * b > D:
            break
        Q = xp.concat(Qs, axis=1)
        Z = W - Q @ (Q.T @ W)
        Z = Z - Q @ (Q.T @ Z)
        Qs.append(_orth(Z, xp))
    Q, W = xp.concat(Qs, axis=1), xp.concat(Ws, axis=1)
    T = Q.T @ W
    theta, Y = xp.linalg.eigh(0.5 * (T + T.T))
    ends = []
    for top in (True, False):
        Yb = xp.flip(Y[:, -b:], axis=-1) if top else Y[:, :b]
        th = xp.flip(theta[-b:]) if top else theta[:b]
        X, HX = Q @ Yb, W @ Yb
        ends.append(_End(_floats(th), _norms(HX - X * th[None, :], xp), X, 1))
    return ends[0], ends[1]


def _refine(
    rough: _End, H: Array, xp: Any, *, top: bool, target: float, slack: float, limit: float
) -> _End | None:
    """Shift-and-invert block Lanczos from ``rough``: ``(cI − H)⁻¹`` with ``c`` just above the
    estimate of ``mu_1`` (top), ``(H − cI)⁻¹`` with ``c`` just below that of ``mu_D`` (bottom).
    A Cholesky factorisation that fails means ``c`` is not beyond the extreme eigenvalue, and
    ``c`` is moved out (at most to ``limit``: the proven upper bound of ``mu_1``, or the rank
    threshold ``tau``, tried last). At the bottom, success proves every eigenvalue exceeds ``c``.
    ``None``: no factorisation succeeded."""
    step = max(rough.res[0], 8.0 * slack)
    shifts = []
    for _ in range(4):
        c = rough.theta[0] + step + slack if top else rough.theta[0] - step - slack
        if (top and c >= limit) or (not top and c <= limit):
            break
        shifts.append(c)
        step *= 8.0
    shifts.append(limit)

    def factor(c: float):
        return _cholesky(_shifted(-1.0, H, -c, xp) if top else _shifted(1.0, H, c, xp), xp)

    for c in shifts:
        L = factor(c)
        if L is not None:
            break
    else:
        return None
    end = _lanczos(_inverse(L), H, xp, top=top, target=target, need=2, start=rough.X, restarts=1)
    count = rough.restarts + end.restarts
    if max(end.res[:2]) > target:
        # Converging slowly (the first shift is typically far out: a rough Krylov estimate has
        # residuals of the order of the gaps): one re-shift next to the improved estimate.
        c2 = (
            end.theta[0] + 2.0 * end.res[0] + slack
            if top
            else end.theta[0] - 2.0 * end.res[0] - slack
        )
        closer = c2 < c if top else c2 > c
        slow = end.res[0] > 1e-3 * rough.res[0]
        if slow and closer and ((top and c2 < limit) or (not top and c2 > limit)):
            L2 = factor(c2)
            if L2 is not None:
                L = L2
        end = _lanczos(_inverse(L), H, xp, top=top, target=target, need=2, start=end.X)
        count += end.restarts
    return end._replace(restarts=count)


class _Cluster(NamedTuple):
    """A proven extreme cluster: its size ``t``, extreme value ``value`` (``mu_1`` or ``mu_k``),
    vectors ``X`` (``D×t``), the largest residual and a proven lower bound on the gap to the rest
    of the spectrum."""

    t: int
    value: float
    X: Array
    residual: float
    gap: float


class _Bounds(NamedTuple):
    """What the tie rule and the proofs need: ``mu_1`` in ``[mu1_lo, mu1_hi]``, the Gram error
    bound at each end of it (``err_lo``, ``err_hi``), the tie tolerance, the realistic rounding
    ``margin`` of a computed eigenvalue, the deflation weight ``beta`` and the Cholesky
    ``slack``."""

    mu1_lo: float
    mu1_hi: float
    err_lo: float
    err_hi: float
    tie: float
    margin: float
    beta: float
    slack: float

    def window(self, s_j: float, s_e: float, high: bool) -> float:
        """The Gram path's tie window ``tie·s_1·(s_j + s_e) + 2·err`` (docs/math.md §10.1) at
        the smallest (``high=False``) or largest possible ``s_1`` and ``err``."""
        mu1, err = (self.mu1_hi, self.err_hi) if high else (self.mu1_lo, self.err_lo)
        return self.tie * math.sqrt(mu1) * (s_j + s_e) + 2.0 * err


def _cluster(end: _End, H: Array, xp: Any, *, top: bool, bounds: _Bounds) -> _Cluster:
    """Decide the tied cluster at one end and prove it with one Cholesky factorisation.

    A Ritz value ``theta_j`` (residual ``r_j``) is tied with the extreme one ``theta_0`` when
    ``|theta_j − theta_0| + r_j + r_0 + margin`` fits the dense engine's Gram-path tie window
    (``tie·s_1·(s_j + s_e) + 2·err``) even at the smallest possible ``s_1`` and ``err``; it is
    certainly untied when ``|theta_j − theta_0| − r_j − r_0 − margin`` exceeds the window at the
    largest. In between lies a near-tie: :class:`_Fallback`. The cut ``c`` halfway to the first
    untied Ritz value must itself be certainly untied; a Cholesky of the deflated, shifted ``H``
    then proves that exactly ``t`` eigenvalues lie on the cluster's side of ``c`` (interlacing),
    so every other one is certainly untied as well.
    """
    theta, res = end.theta, end.res
    e0 = theta[0]
    if not e0 > 0:
        raise _Fallback("an extreme eigenvalue is not positive")
    s0 = math.sqrt(e0)
    side = "top" if top else "bottom"
    m = bounds.margin
    t = 1
    while t < len(theta):
        sj = math.sqrt(max(theta[t], 0.0))
        dist = abs(theta[t] - e0)
        if dist + res[t] + res[0] + m <= bounds.window(sj, s0, high=False):
            t += 1
            continue
        if not dist - res[t] - res[0] - m > bounds.window(sj, s0, high=True):
            raise _Fallback(f"near-tie at the {side}")
        break
    if t >= len(theta) - 1:
        raise _Fallback(f"the tied cluster at the {side} is wider than the Krylov block")
    r_cluster = math.sqrt(sum(r * r for r in res[:t]))  # ≥ ‖R‖₂ of the cluster's block
    edge = theta[t - 1] - r_cluster if top else theta[t - 1] + r_cluster
    nxt = theta[t] + res[t] if top else theta[t] - res[t]
    c = 0.5 * (edge + nxt)
    if not abs(c - e0) - r_cluster - m > bounds.window(math.sqrt(max(c, 0.0)), s0, high=True):
        raise _Fallback(f"the gap after the {side} cluster is too small")
    X = end.X[:, :t]
    if top:  # (c − slack)·I − H + beta·X Xᵀ
        A = _shifted(-1.0, H, -(c - bounds.slack), xp, X, bounds.beta)
    else:  # H + beta·X Xᵀ − (c + slack)·I
        A = _shifted(1.0, H, c + bounds.slack, xp, X, bounds.beta)
    if _cholesky(A, xp) is None:
        raise _Fallback(f"the {side} cluster could not be proven")
    value = max(theta[:t]) if top else min(theta[:t])
    return _Cluster(t, value, X, r_cluster, abs(c - edge))


# --------------------------------------------------------------------------------------------
# The path
# --------------------------------------------------------------------------------------------


class _Result(NamedTuple):
    value: Array
    grad: Array | None
    info: ExtremeInfo


def _extreme(
    quantity: str,
    F: Array,
    xp: Any,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    accuracy: float | None,
    grad: bool,
    subgradient: str,
) -> _Result:
    """The extreme path on a validated, finite 2-D ``F`` (eager); raises :class:`_Fallback`."""
    N, D = F.shape
    if N < D:
        raise _Fallback("N < D: H = FᵀF is rank-deficient (the dense engine uses the N×N Gram)")
    if D < 3:
        raise _Fallback("D < 3")
    rtol = _spectrum.resolve_rtol(rtol, F.shape, F.dtype, xp)
    gdtype = _spectrum.gram_dtype(F, xp)
    eg = _spectrum.eps(xp, gdtype)
    if accuracy is None:
        accuracy = _spectrum.gram_accuracy(xp, F.dtype)
    tie = (
        _spectrum.default_tie_rtol(F.shape, gdtype, xp)
        if tie_rtol is None
        else _checked(tie_rtol, "tie_rtol")
    )

    # Exact power-of-two scaling: mu never over- or underflows; results are rescaled at the end.
    big = float(xp.max(xp.abs(F)))
    if not (big > 0 and math.isfinite(big)):
        raise _Fallback("zero or non-finite input")
    e = math.frexp(big)[1]
    Fs = _times_pow2(F, -e)
    A = Fs if Fs.dtype == gdtype else xp.astype(Fs, gdtype)
    H = A.T @ A
    frob2 = float(xp.linalg.vector_norm(xp.reshape(H, (-1,)))) ** 2
    trace = float(xp.sum(xp.linalg.diagonal(H)))
    diag_max = float(xp.max(xp.linalg.diagonal(H)))
    frob = math.sqrt(frob2)
    if not (trace > 0 and math.isfinite(frob2)):
        raise _Fallback("zero or non-finite Gram matrix")
    # Bounds on mu_1 that need no eigensolver: max_i H_ii <= mu_1 <= ‖H‖_F (<= tr H).
    mu1_lo = max(diag_max, trace / D, frob / math.sqrt(D))
    mu1_hi = min(frob, trace) * (1.0 + 4.0 * D * eg)
    slack = 4.0 * D * eg * (2.0 * mu1_hi)  # backward error of the certifying Cholesky

    def bounds(lo: float, hi: float) -> _Bounds:
        def err(mu1: float) -> float:  # the formed Gram's error bound (2-norm), as the engine's
            return eg * (D * mu1 + math.sqrt(N) * trace)

        return _Bounds(lo, hi, err(lo), err(hi), tie, 4.0 * math.sqrt(D) * eg * hi, hi, slack)

    target = 2.0 * eg * frob
    need_top = quantity in ("condition_number", "r_well")
    need_bottom = quantity in ("condition_number", "r_ill")
    restarts = 0
    residual = 0.0
    top = bottom = None
    rough_top, rough_bottom = _rough(H, xp)
    mu1_lo = max(mu1_lo, rough_top.theta[0])  # a Rayleigh quotient: <= mu_1
    if need_top:
        end = _refine(rough_top, H, xp, top=True, target=target, slack=slack, limit=mu1_hi + slack)
        if end is None:
            raise _Fallback("no shift above mu_1 could be factorised")
        restarts += end.restarts
        # The Rayleigh quotient theta_0 <= mu_1. Above: theta_0 plus the block's residual norm
        # √Σ r_j² (Kahan's bound for a Ritz block, ≥ r_0 for a tied cluster of any size); the
        # cluster proof below then tightens it.
        block_res = math.sqrt(sum(r * r for r in end.res))
        lo, hi = max(mu1_lo, end.theta[0]), min(mu1_hi, end.theta[0] + block_res)
        if not lo <= hi:
            raise _Fallback("inconsistent bounds on mu_1")
        top = _cluster(end, H, xp, top=True, bounds=bounds(lo, hi))
        mu1_lo, mu1_hi = lo, max(lo, top.value + top.residual)
    if need_bottom:

        def threshold(hi: float) -> float:
            """The rank and resolution threshold: every eigenvalue must provably exceed it."""
            err_hi = bounds(mu1_lo, hi).err_hi
            return max(rtol * rtol * (hi + err_hi) + 2.0 * err_hi + slack, err_hi / accuracy)

        tau = threshold(mu1_hi)
        if top is None and tau >= 0.25 * rough_bottom.theta[0]:
            # ‖H‖_F overestimates mu_1 by up to √D, and so tau: prove a tighter bound with one
            # Cholesky factorisation of cI − H (it succeeds only if mu_1 < c).
            c = rough_top.theta[0] + rough_top.res[0] + slack
            if c < mu1_hi and _cholesky(_shifted(-1.0, H, -c, xp), xp) is not None:
                mu1_hi = c
                tau = threshold(mu1_hi)
        proven = bounds(mu1_lo, mu1_hi)
        b = proven
        if top is None:  # the tie window's scale s_1 from the rough estimate (not a proof)
            hi = max(mu1_lo, min(mu1_hi, rough_top.theta[0] + rough_top.res[0]))
            b = bounds(mu1_lo, hi)
        not_proven = _Fallback(
            "rank or resolution not proven: some eigenvalue of H is below "
            f"{tau / mu1_hi:.3g}·mu_1 (rank deficient, or not resolved by the Gram)"
        )
        if rough_bottom.theta[0] <= tau:  # a Rayleigh quotient: mu_D <= theta_0 <= tau
            raise not_proven
        # Every shift tried is >= tau: a Cholesky of H − cI that succeeds proves the rank and the
        # resolution (Sylvester's law of inertia), and its factor is the shift-and-invert operator.
        end = _refine(rough_bottom, H, xp, top=False, target=target, slack=slack, limit=tau)
        if end is None:
            raise not_proven
        restarts += end.restarts
        bottom = _cluster(end, H, xp, top=False, bounds=b)
    err = bounds(mu1_lo, mu1_hi).err_hi
    for cl in (top, bottom):
        if cl is None:
            continue
        residual = max(residual, cl.residual / frob)
        # Eigenvalue error <= r²/gap (r: residual), vector error <= r/gap (Davis–Kahan).
        if cl.residual / cl.gap > accuracy or cl.residual**2 / cl.gap > accuracy * cl.value:
            raise _Fallback("the extreme eigenpairs did not converge to the required accuracy")
        if subgradient == "raise" and grad and cl.t > 1:
            raise TiedExtremeError(
                "the extreme eigenvalue is tied (multiplicity > 1): the gradient does not exist "
                'there; use subgradient="min_norm" for the minimum-norm subgradient'
            )
        if subgradient == "any" and grad and cl.t > 1:
            raise _Fallback('subgradient="any" at a tie: the dense engine picks the vector')

    value, P, coef = _assemble(quantity, H, xp, frob2, trace, top, bottom, eg, err, accuracy, grad)
    # Degrees of homogeneity in F: value 0 / 4 / −4, gradient −1 / 3 / −5.
    vdeg, gdeg = {"condition_number": (0, -1), "r_well": (4, 3), "r_ill": (-4, -5)}[quantity]
    value = _times_pow2(xp.asarray(value, dtype=gdtype, device=_device(F)), vdeg * e)
    G = None
    if grad:
        G = _gradient(Fs, P, coef, xp)
        G = _times_pow2(G, gdeg * e)
    info = ExtremeInfo(
        "extreme",
        "",
        restarts,
        residual,
        0 if top is None else top.t,
        0 if bottom is None else bottom.t,
    )
    return _Result(value, G, info)


def _assemble(
    quantity: str,
    H: Array,
    xp: Any,
    frob2: float,
    trace: float,
    top: _Cluster | None,
    bottom: _Cluster | None,
    eg: float,
    err: float,
    accuracy: float,
    grad: bool,
):
    """``(value, P, coef)`` on the scaled ``H``: the gradient is ``F_s @ P`` (``P`` a ``D×D``
    matrix or ``None``) plus ``Σ c (F_s X) Xᵀ`` over ``coef = [(c, X), ...]``."""
    D = H.shape[-1]
    rounding = eg * (4.0 + 2.0 * math.log2(D)) * frob2  # of the sum ‖H‖_F² = Σ H_ij²
    # The Gram error E (‖E‖₂ <= err) moves ‖H‖_F² by at most 2|<H, E>| + ‖E‖_F² <= 2·tr(H)·err.
    gram_err = 2.0 * trace * err + D * err * err
    if quantity == "condition_number":
        m1, mk = top.value, bottom.value
        coef = [
            (2.0 / (top.t * mk), top.X),
            (-2.0 * (m1 / mk) / (mk * bottom.t), bottom.X),
        ]
        return m1 / mk, None, (coef if grad else [])
    if quantity == "r_well":
        m1 = top.value
        num = D * m1 * m1 - frob2  # = Σ (mu_1² − mu_i²) >= 0
        # Error: the Gram error on ‖H‖_F², that of D·mu_1², and the rounding of the sum.
        num_err = gram_err + 2.0 * D * m1 * (err + top.residual) + rounding
        if not num > 0 or num_err > accuracy * num:
            raise _Fallback("R_well is too close to 0 (kappa ≈ 1) for ‖H‖_F² − D·mu_1²")
        value = num / (2.0 * D)
        if not grad:
            return value, None, []
        P = (-2.0 / D) * H
        return value, P, [(2.0 * m1 / top.t, top.X)]
    # r_ill: den = (‖H‖_F² − Σ_cluster theta_j² − (D − t)·mu_k²) / (2D): the tied terms left out,
    # as the dense engine does (they are below rounding).
    mk = bottom.value
    X = bottom.X
    cluster2 = sum(v * v for v in _floats(xp.sum(X * (H @ X), axis=0)))
    num = frob2 - cluster2 - (D - bottom.t) * mk * mk
    num_err = gram_err + 2.0 * D * mk * (err + bottom.residual) + rounding
    if not num > 0 or num_err > accuracy * num:
        raise _Fallback("R_ill is too close to its pole (kappa ≈ 1) for ‖H‖_F² − D·mu_k²")
    den = num / (2.0 * D)
    value = 1.0 / den
    if not grad:
        return value, None, []
    P = (-2.0 / D) * H / den / den
    return value, P, [(2.0 * mk / bottom.t / den / den, X)]


def _gradient(Fs: Array, P: Array | None, coef: list, xp: Any) -> Array:
    """``Fs @ P + Σ c (Fs X) Xᵀ`` in the dtype of ``Fs`` (like the dense engine's assembly): with
    ``P`` one ``N×D×D`` GEMM; without, one ``N×D×t`` and one ``N×t×D`` product."""
    dtype = Fs.dtype
    if P is not None:
        for c, X in coef:
            P = P + X @ (c * X.T)
        return Fs @ (P if P.dtype == dtype else xp.astype(P, dtype))
    X = xp.concat([X for _, X in coef], axis=1)
    C = xp.concat([c * X.T for c, X in coef], axis=0)
    X = X if X.dtype == dtype else xp.astype(X, dtype)
    C = C if C.dtype == dtype else xp.astype(C, dtype)
    return (Fs @ X) @ C


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def _dense(quantity: str, F: Array, grad: bool, kwargs: dict) -> tuple[Array, Array | None]:
    value_fn = getattr(condreg, quantity)
    value_kwargs = {k: v for k, v in kwargs.items() if k != "subgradient"}
    if quantity == "condition_number":
        value_kwargs.pop("tie_rtol", None)
    if quantity == "r_well":
        value_kwargs.pop("tie_rtol", None)
        value_kwargs.pop("rtol", None)
    value = value_fn(F, gram=True, **value_kwargs)
    if not grad:
        return value, None
    grad_kwargs = dict(kwargs)
    if quantity == "r_well":
        grad_kwargs.pop("rtol", None)
    return value, getattr(condreg, quantity + "_grad")(F, gram=True, **grad_kwargs)


def _run(
    quantity: str,
    F: Array,
    *,
    grad: bool,
    rtol: float | None,
    tie_rtol: float | None,
    subgradient: str,
    method: str,
    accuracy: float | None,
    return_info: bool,
    check_finite: bool,
    xp: Any,
):
    where = "condreg.extreme." + quantity + ("_grad" if grad else "")
    if method not in METHODS:
        raise ValueError(f"{where}: method must be one of {METHODS}, got {method!r}")
    if subgradient not in SUBGRADIENTS:
        raise ValueError(f"{where}: subgradient must be one of {SUBGRADIENTS}, got {subgradient!r}")
    if accuracy is not None and not (
        isinstance(accuracy, (int, float)) and not isinstance(accuracy, bool) and 0 < accuracy < 1
    ):
        raise ValueError(f"{where}: accuracy must be a float in (0, 1), got {accuracy!r}")
    F, xp, concrete = _validation.matrix(F, xp=xp, where=where, check_finite=check_finite)
    kwargs: dict[str, Any] = {"rtol": rtol, "tie_rtol": tie_rtol, "check_finite": check_finite}
    if grad:
        kwargs["subgradient"] = subgradient

    def finish(value: Array, G: Array | None, info: ExtremeInfo):
        out = (value, G) if grad else (value,)
        if return_info:
            out = (*out, info)
        return out if len(out) > 1 else out[0]

    def dense(reason: str):
        value, G = _dense(quantity, F, grad, kwargs)
        return finish(value, G, ExtremeInfo("dense", reason))

    if method == "dense":
        return dense("method='dense'")
    reason = None
    if F.ndim != 2:
        reason = "a batch of matrices (the extreme path takes one N×D matrix)"
    elif not (is_numpy_array(F) or is_torch_array(F) or is_jax_array(F)):
        reason = "not a NumPy, PyTorch or JAX array"
    elif (
        _spectrum._untraceable(F)
        or _validation.concrete_for(F, True)(xp.all(F[:1, :1] == F[:1, :1])) is None
    ):
        reason = "values cannot be read (tracing)"
    elif method == "auto" and F.shape[-1] < MIN_D:
        reason = f"D < {MIN_D}: the dense engine is faster"
    if reason is None and check_finite and concrete(xp.all(F == 0)):
        raise RankError(
            "the matrix is zero (numerical rank 0): condition numbers and the regularizers are "
            "undefined"
        )
    if reason is None:
        work, out_dtype = _validation.compute_dtype(F, xp, None, where=where)
        if is_torch_array(work):
            work = work.detach()
        try:
            res = _extreme(
                quantity,
                work,
                xp,
                rtol=rtol,
                tie_rtol=tie_rtol,
                accuracy=accuracy,
                grad=grad,
                subgradient=subgradient,
            )
        except _Fallback as exc:
            reason = str(exc)
        else:
            value = _validation.as_output(res.value, out_dtype, xp)
            G = None if res.grad is None else _validation.as_output(res.grad, out_dtype, xp)
            return finish(value, G, res.info)
    if method == "extreme":
        raise ExtremePathError(f"{where}: the extreme path cannot decide safely: {reason}")
    return dense(reason)


_COMMON_DOC = """
    ``F``: one feature matrix ``N×D`` (NumPy, PyTorch or JAX); the quantity is that of
    ``H = FᵀF``, exactly as ``condreg.{name}(F, gram=True)``. Keywords as there (``rtol``: rank
    rule ``sigma_i > rtol·sigma_1`` on ``F``, default ``max(N, D)·eps``; ``tie_rtol``: ties on σ,
    default ``32·√max(N, D)·eps`` of the Gram's dtype), and:

    method : {{"auto", "extreme", "dense"}}
        ``"auto"`` (default): the extreme path where it can prove its result, the dense engine
        otherwise; ``"extreme"``: raise :class:`ExtremePathError` instead of falling back;
        ``"dense"``: the dense engine.
    accuracy : float, optional
        Relative accuracy every counted eigenvalue must provably have (default: the dense
        engine's, ``0.1·√eps`` of ``F``'s dtype).
    return_info : bool
        Also return an :class:`ExtremeInfo` (the path taken and why).
"""


def condition_number(
    F: Array,
    *,
    rtol: float | None = None,
    method: str = "auto",
    accuracy: float | None = None,
    return_info: bool = False,
    check_finite: bool = True,
    xp: Any = None,
):
    """kappa(FᵀF) = mu_1 / mu_k (Eq. 1) from the extreme eigenvalues of ``H = FᵀF``. Returns a
    0-d array (and an :class:`ExtremeInfo` with ``return_info``)."""
    return _run(
        "condition_number",
        F,
        grad=False,
        rtol=rtol,
        tie_rtol=None,
        subgradient="min_norm",
        method=method,
        accuracy=accuracy,
        return_info=return_info,
        check_finite=check_finite,
        xp=xp,
    )


def r_well(
    F: Array,
    *,
    method: str = "auto",
    accuracy: float | None = None,
    return_info: bool = False,
    check_finite: bool = True,
    xp: Any = None,
):
    """R_well(FᵀF) = ½ mu_1² − ‖H‖_F² / (2D) (Eq. 3, ``p = D``) from ``mu_1`` and ``‖H‖_F``."""
    return _run(
        "r_well",
        F,
        grad=False,
        rtol=None,
        tie_rtol=None,
        subgradient="min_norm",
        method=method,
        accuracy=accuracy,
        return_info=return_info,
        check_finite=check_finite,
        xp=xp,
    )


def r_ill(
    F: Array,
    *,
    rtol: float | None = None,
    tie_rtol: float | None = None,
    method: str = "auto",
    accuracy: float | None = None,
    return_info: bool = False,
    check_finite: bool = True,
    xp: Any = None,
):
    """R_ill(FᵀF) = 1 / (‖H‖_F² / (2k) − ½ mu_k²) (Eq. 12) from ``mu_k`` and ``‖H‖_F`` (the
    extreme path needs ``k = D``; at the pole the dense engine returns ``+inf``)."""
    return _run(
        "r_ill",
        F,
        grad=False,
        rtol=rtol,
        tie_rtol=tie_rtol,
        subgradient="min_norm",
        method=method,
        accuracy=accuracy,
        return_info=return_info,
        check_finite=check_finite,
        xp=xp,
    )


def condition_number_value_and_grad(
    F: Array,
    *,
    rtol: float | None = None,
    subgradient: str = "min_norm",
    tie_rtol: float | None = None,
    method: str = "auto",
    accuracy: float | None = None,
    return_info: bool = False,
    check_finite: bool = True,
    xp: Any = None,
):
    """``(kappa, ∇_F kappa)`` with ``∇_F kappa = 2F (P_1 / mu_k − (mu_1 / mu_k²) P_k)``, ``P_1``,
    ``P_k`` the averaged projectors onto the tied extreme eigenvectors (rank-``t`` terms: no
    ``D×D`` GEMM). Raises :class:`TiedExtremeError` at a tie under ``subgradient="raise"``."""
    return _run(
        "condition_number",
        F,
        grad=True,
        rtol=rtol,
        tie_rtol=tie_rtol,
        subgradient=subgradient,
        method=method,
        accuracy=accuracy,
        return_info=return_info,
        check_finite=check_finite,
        xp=xp,
    )


def r_well_value_and_grad(
    F: Array,
    *,
    subgradient: str = "min_norm",
    tie_rtol: float | None = None,
    method: str = "auto",
    accuracy: float | None = None,
    return_info: bool = False,
    check_finite: bool = True,
    xp: Any = None,
):
    """``(R_well, ∇_F R_well)`` with ``∇_F R_well = 2F (mu_1 P_1 − H / D)`` (Theorem A.1 through
    Theorem 4.2; one ``N×D×D`` GEMM for ``F H``)."""
    return _run(
        "r_well",
        F,
        grad=True,
        rtol=None,
        tie_rtol=tie_rtol,
        subgradient=subgradient,
        method=method,
        accuracy=accuracy,
        return_info=return_info,
        check_finite=check_finite,
        xp=xp,
    )


def r_ill_value_and_grad(
    F: Array,
    *,
    rtol: float | None = None,
    subgradient: str = "min_norm",
    tie_rtol: float | None = None,
    method: str = "auto",
    accuracy: float | None = None,
    return_info: bool = False,
    check_finite: bool = True,
    xp: Any = None,
):
    """``(R_ill, ∇_F R_ill)`` with ``∇_F R_ill = 2F (mu_k P_k − H / D) / den²`` (Eq. 13 through
    Theorem 4.2). At the pole the dense engine raises :class:`PoleError`."""
    return _run(
        "r_ill",
        F,
        grad=True,
        rtol=rtol,
        tie_rtol=tie_rtol,
        subgradient=subgradient,
        method=method,
        accuracy=accuracy,
        return_info=return_info,
        check_finite=check_finite,
        xp=xp,
    )


def condition_number_grad(F: Array, **kwargs: Any):
    """``∇_F kappa`` alone (:func:`condition_number_value_and_grad` without the value), like
    ``condreg.condition_number_grad(F, gram=True)``; with ``return_info=True`` also the
    :class:`ExtremeInfo`."""
    return _grad_only("condition_number", condition_number_value_and_grad, F, kwargs)


def r_well_grad(F: Array, **kwargs: Any):
    """``∇_F R_well`` alone (:func:`r_well_value_and_grad` without the value), like
    ``condreg.r_well_grad(F, gram=True)``; with ``return_info=True`` also the
    :class:`ExtremeInfo`."""
    return _grad_only("r_well", r_well_value_and_grad, F, kwargs)


def r_ill_grad(F: Array, **kwargs: Any):
    """``∇_F R_ill`` alone (:func:`r_ill_value_and_grad` without the value), like
    ``condreg.r_ill_grad(F, gram=True)``; with ``return_info=True`` also the
    :class:`ExtremeInfo`. Keywords as :func:`r_ill_value_and_grad`."""
    return _grad_only("r_ill", r_ill_value_and_grad, F, kwargs)


def _grad_only(quantity: str, both: Any, F: Array, kwargs: dict) -> Any:
    """The gradient (and info) of ``both(F, **kwargs)``, without the value."""
    out = both(F, **kwargs)
    return out[1:] if kwargs.get("return_info") else out[1]


# The gradient-only functions take exactly the keywords of their *_value_and_grad (shown as
# their signatures by help() and the API docs).
for _alone, _both in (
    (condition_number_grad, condition_number_value_and_grad),
    (r_well_grad, r_well_value_and_grad),
    (r_ill_grad, r_ill_value_and_grad),
):
    _alone.__signature__ = inspect.signature(_both)  # type: ignore[attr-defined]
del _alone, _both


for _f in (
    condition_number,
    r_well,
    r_ill,
    condition_number_value_and_grad,
    r_well_value_and_grad,
    r_ill_value_and_grad,
):
    _name = _f.__name__.removesuffix("_value_and_grad")
    _f.__doc__ = (_f.__doc__ or "") + "\n" + _COMMON_DOC.format(name=_name)
del _f, _name
