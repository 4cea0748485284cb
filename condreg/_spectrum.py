"""The spectral engine: the one place where condreg decomposes a matrix.

A call is ``scale → decompose → parts → assemble`` (:func:`evaluate`, :func:`assemble`):

1. :func:`scaled`: ``A = S·2**-E``, one exact power of two per matrix (``E`` from its largest
   entry, carried as a scalar): nothing downstream over- or underflows where the result does not.
2. The decomposition of ``A``, on the route :func:`plan` chooses: ``"svd"`` (thin SVD of ``S``);
   ``"exact"`` (QR of ``F`` or ``Fᵀ`` and the SVD of its small ``R``: backward stable);
   ``"auto"`` (eigh of the smaller Gram matrix, float64 for float32 features where available,
   accepted by :func:`resolves` — every eigenvalue resolved to ``GRAM_ACCURACY·√eps`` against its
   error bound ``eps_g·(n·mu_1 + √m·Σmu)``, or certainly outside the rank — else ``"exact"``);
   ``"extreme"`` (``"auto"`` with ``eigvalsh`` only and the eigenvectors of the extreme tie sets,
   :mod:`condreg._extreme`; a single eager NumPy or PyTorch CPU matrix with
   ``min(N, D) >= EXTREME_MIN``, on every public route that reads the values).
3. :func:`condreg._core.parts` on the values — on a host copy (``_backend.to_host``: one read
   that carries the values, ``E`` and so the input checks and the accept decision) where values
   can be read, else on the device arrays (then ``"auto"`` is a ``lax.cond`` under JAX, ``"exact"``
   elsewhere). :func:`evaluate` is the one place that chooses.
4. The gradient factor ``K`` (``U diag(g) Vᵀ``; with ``gram``, ``2 Q diag(g) Qᵀ`` on the small
   side), with ``E``'s power of two folded in; :func:`assemble` is one GEMM with ``A``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from condreg import _backend, _core, _extreme
from condreg._errors import RankError

Array = Any
Concrete = Callable[[Array], "bool | None"]

METHODS = ("auto", "gram", "exact", "svd")
#: Multiplier of ``√max(m, n) * eps`` in the default tie tolerance (:func:`default_tie_rtol`).
TIE_FACTOR = 32.0
#: The Gram path must resolve every counted eigenvalue to ``GRAM_ACCURACY·√eps`` (relative).
GRAM_ACCURACY = 0.1
#: Smallest ``min(N, D)`` from which the ``"extreme"`` route pays for its inverse iteration.
EXTREME_MIN = 128


def gram_rtol(d: int, dtype: Any, xp: Any) -> float:
    """``√(d·eps(dtype))``: the default rank tolerance on ``√λ_i`` of a Gram matrix formed by the
    caller (``d×d``), whose eigenvalues are resolved only to ``d·eps·λ_1``."""
    return math.sqrt(d * float(xp.finfo(dtype).eps))


def default_tie_rtol(shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """``32 * √max(m, n) * eps(dtype)`` relative to ``s_1``: a backward-stable SVD's rounding."""
    return TIE_FACTOR * math.sqrt(max(shape[-2], shape[-1])) * float(xp.finfo(dtype).eps)


def resolve_rtol(rtol: float | None, shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """``rtol`` checked (:func:`condreg._core.check_rtol`), or for ``None`` the default rank
    tolerance ``max(m, n) * eps(dtype)`` (numpy.linalg.matrix_rank's convention, on ``s``)."""
    rtol = _core.check_rtol(rtol)
    return max(shape[-2], shape[-1]) * float(xp.finfo(dtype).eps) if rtol is None else rtol


def left_side(shape: tuple[int, ...]) -> bool:
    """Whether the small side of a ``(..., N, D)`` feature batch is the left one (``N <= D``:
    the Gram ``FFᵀ`` and the left singular vectors ``U``)."""
    return shape[-2] <= shape[-1]


def has_float64(xp: Any) -> bool:
    """Whether the namespace computes in float64 now (JAX: only with x64 enabled)."""
    info = getattr(xp, "__array_namespace_info__", None)
    if info is not None:
        try:
            return "float64" in info().dtypes(kind="real floating")
        except Exception:  # pragma: no cover - an older namespace
            pass
    return hasattr(xp, "float64")


def gram_dtype(x: Array, xp: Any) -> Any:
    """The Gram matrix's dtype: float64 for float32 input where the library has it."""
    if x.dtype != xp.float32:
        return x.dtype
    return xp.float64 if _backend.library(x) in ("numpy", "torch") or has_float64(xp) else x.dtype


def finite(x: Array, xp: Any) -> Array:
    """``x`` with non-finite entries zeroed (the identity on finite input): what LAPACK gets, so
    that NaN/Inf input is reported (or gives NaN) instead of a non-convergence error."""
    nan_to_num = getattr(xp, "nan_to_num", None)
    if nan_to_num is not None:
        return nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    return xp.where(xp.isfinite(x), x, 0.0)


def exponent_limits(dtype: Any, xp: Any) -> tuple[float, float]:
    emax = math.floor(math.log2(float(xp.finfo(dtype).max)))
    return -(emax - 1.0), emax - 2.0


def scaled(S: Array, xp: Any) -> tuple[Array, Array]:
    """``(A, E)``: ``E = floor(log2 max|S|)`` per matrix (``(..., 1, 1)``; ``−inf`` for a zero
    matrix, ``inf``/NaN for non-finite input) and ``A = S·2**-clip(E)``, exact (the clip keeps the
    power of two representable, :func:`exponent_limits`)."""
    axes = {"axis": (-2, -1), "keepdims": True}  # no S-sized temporary (page faults)
    norm = xp.maximum(xp.max(S, **axes), -xp.min(S, **axes))
    with _backend.quiet(norm):
        E = xp.floor(xp.log2(norm))
    return S * 0.5 ** xp.clip(E, *exponent_limits(S.dtype, xp)), E


def qr_r(xp: Any, A: Array) -> Array:
    """``R`` of a reduced QR factorisation of ``A`` (``Q`` not formed where the library can)."""
    if _backend.library(A) == "numpy":
        return np.linalg.qr(A, mode="r")
    try:
        out = xp.linalg.qr(A, mode="r")  # PyTorch and JAX
    except (TypeError, ValueError):
        return xp.linalg.qr(A).R
    return getattr(out, "R", out)


def exact(A: Array, xp: Any, vectors: bool) -> tuple[Array, Array | None, Array]:
    """``(s, Q, R)``: singular values and the small side's vectors (``U`` when :func:`left_side`,
    else ``V``; ``None`` without ``vectors``) of ``A`` from the SVD of the ``R`` of a QR of
    ``Aᵀ`` or ``A`` (backward stable)."""
    R = qr_r(xp, A.mT if left_side(A.shape) else A)
    if not vectors:
        return xp.linalg.svdvals(finite(R, xp)), None, R
    _, s, Vhr = xp.linalg.svd(finite(R, xp), full_matrices=False)
    return s, Vhr.mT, R  # left: A = Rᵀ Qᵀ, U_A = V_R; right: A = Q R, V_A = V_R


def resolves(
    mu: Array, shape: tuple[int, ...], rtol: float, dtype: Any, xp: Any
) -> tuple[Array, Array, Array]:
    """The one accept rule of the Gram path. ``(s, mu_err, ok)`` from the ascending eigenvalues
    ``mu`` of the smaller Gram matrix of an ``(..., N, D)`` batch: ``s`` descending in ``dtype``,
    ``mu_err`` the error bound ``eps_g·(n·mu_1 + √m·Σmu)`` relative to ``mu_1``, ``ok`` (0-d) that
    every eigenvalue is resolved to ``GRAM_ACCURACY·√eps(dtype)`` or certainly outside the rank
    ``mu > rtol²·mu_1`` (false for a zero or NaN ``mu_1``)."""
    n, m = min(shape[-2:]), max(shape[-2:])
    e = float(xp.finfo(mu.dtype).eps)
    with _backend.quiet(mu):
        mu = xp.maximum(xp.flip(mu, axis=-1), 0.0)  # NaN stays NaN
        top = mu[..., :1]
        err = ((e * n) * top + (e * math.sqrt(m)) * xp.sum(mu, axis=-1, keepdims=True)) / top
        rel, acc = mu / top, GRAM_ACCURACY * math.sqrt(float(xp.finfo(dtype).eps))
        ok = xp.all((rel * acc >= err) | (rel + err < rtol * rtol))
    return xp.astype(xp.sqrt(mu), dtype), xp.astype(err, dtype), ok


def plan(shape: tuple[int, ...], *, gram: bool, vectors: bool, method: str, extreme: bool) -> str:
    """The route: ``"svd"``, ``"exact"``, ``"gram"``, ``"auto"`` or ``"extreme"`` (module
    documentation) — the one place that chooses."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not gram or method == "svd":
        return "svd"
    if method != "auto":
        return method
    if extreme and vectors and len(shape) == 2 and min(shape) >= EXTREME_MIN:
        return "extreme"
    return "auto"


def nonfinite_error(where: str) -> ValueError:
    return ValueError(
        f"{where}: the input contains NaN or Inf (pass check_finite=False to skip this check)"
    )


def rank_error() -> RankError:
    return RankError(
        "the matrix is zero (numerical rank 0): condition numbers and the regularizers are "
        "undefined"
    )


# --------------------------------------------------------------------------------------------
# One call: evaluate → assemble
# --------------------------------------------------------------------------------------------


class Evaluation(NamedTuple):
    """What :func:`evaluate` returns: the value (shape ``S.shape[:-2]``, on ``S``'s device), the
    gradient factor ``K`` and the rescaled input ``A`` its GEMM partner (:func:`assemble`; ``A``
    is ``None`` for ``gram=False``), R_ill's pole where it was read (else ``None``), and the
    power of two ``n`` (``(..., 1, 1)``) the gradient still takes (``None``: folded into ``K``)."""

    value: Array
    K: Array | None = None
    A: Array | None = None
    pole: bool | None = None
    n: Array | None = None


def evaluate(
    quantity: str,
    S: Array,
    xp: Any,
    *,
    gram: bool,
    vectors: bool,
    rtol: float | None = None,
    tie_rtol: float | None = None,
    policy: str = "min_norm",
    check: bool = True,
    host: bool | None = None,
    method: str = "auto",
    where: str | None = None,
) -> Evaluation:
    """The value of ``quantity`` for a validated ``S`` and, with ``vectors``, its gradient factor.

    ``check``: raise ``ValueError`` (NaN/Inf), :class:`RankError` (a zero matrix) and the
    ``policy="raise"`` errors, from the one read; unchecked invalid input gives NaN. ``host``:
    where :func:`condreg._core.parts` runs (default: see its first lines; ``False`` keeps everything
    on the device and differentiable). The ``"extreme"`` route is taken where the values are
    read on the host of a NumPy array or a PyTorch CPU tensor (:func:`condreg._backend.cpu`).
    ``where``: the name in error messages (default ``quantity``)."""
    _core.check_name(quantity, _core.QUANTITIES, "quantity")
    _core.check_name(policy, _core.SUBGRADIENTS, "subgradient")
    if host is None:  # the one choice: a host copy of the spectrum for NumPy input and, with
        # checks on, for arrays whose values can be read (one read that the checks and the Gram
        # accept decision need anyway); else the device arrays (check_finite=False,
        # torch.compile, jax.jit: no read at all)
        host = _backend.library(S) == "numpy" or (check and not _backend.traced(S))
    how = plan(S.shape, gram=gram, vectors=vectors, method=method, extreme=host and _backend.cpu(S))
    if how == "auto" and not host and _backend.library(S) != "jax":
        how = "exact"  # no read and no lax.cond: the route that needs no decision
    A, E = scaled(S, xp)
    values, X, Y = _decompose(A, xp, how, vectors)
    E, at = xp.reshape(E, E.shape[:-1]), np if host else xp  # ``at``: where the parts run
    if host:
        both = _backend.to_host(xp.concat([values, E], axis=-1))
        values, E = both[..., :-1], both[..., -1:]
        if check and not np.all(np.isfinite(E)):  # the input checks, from E (:func:`scaled`)
            if np.any(np.isnan(E) | (E == math.inf)):
                raise nonfinite_error(where or quantity)
            raise rank_error()
    tie = _core.check_rtol(
        tie_rtol, "tie_rtol"
    )  # after the input checks: NaN input is reported first
    tie = default_tie_rtol(S.shape, S.dtype, xp) if tie is None else tie
    rtol = resolve_rtol(rtol, S.shape, S.dtype, xp)
    dtype = np.dtype(str(S.dtype).rpartition(".")[2]) if host else S.dtype
    E = E.astype(dtype) if host else E  # integers (or ±inf, NaN): exact
    s, mu_err, order = values, 0.0, 1
    if how not in ("svd", "exact"):
        s, mu_err, ok = resolves(values, A.shape, rtol, dtype, at)
        if not host:
            X = None if X is None else xp.astype(xp.flip(X, axis=-1), S.dtype)
            if how == "auto":
                gram_route = (s, X, mu_err)

                def refused() -> tuple:
                    s, Q, _ = exact(A, xp, vectors)
                    return s, Q, 0.0 * gram_route[2]

                s, X, mu_err = choose(ok, lambda: gram_route, refused, _core.never)
        elif ok or how == "gram":
            order = -1  # the Gram's vectors are ascending
        else:
            how, mu_err = "exact", 0.0
            s, X, Y = exact(A, xp, vectors)
            s = _backend.to_host(s)
    mask, k = _core.rank(s, rtol, at)
    read = _backend.eager if host and check else _core.never
    kw = {"gram": gram, "p": S.shape[-1] if gram else min(S.shape[-2:]), "mask": mask, "k": k}
    p = _core.parts(quantity, s, at, tie=tie, mu_err=mu_err, policy=policy, read=read, **kw)
    # the value rescaled by E's power of two, and the power n the gradient takes ((..., 1));
    # NaN for invalid input (E not finite: a zero or non-finite matrix)
    Ec = at.clip(E, *exponent_limits(p.value.dtype, at))
    degree = _core.VALUE_DEGREE[quantity] * (2 if gram else 1)
    with _backend.quiet(E):
        poison = 0.0 * E  # 0, or NaN for an invalid matrix
        value = p.value if degree == 0 else _core.pow2(p.value, degree * Ec[..., 0], at)
        value, n = value + poison[..., 0], (degree - 1) * Ec + poison
    pole = bool(np.any(p.pole)) if read is _backend.eager and p.pole is not None else None
    value = _backend.to_device(value, A, xp, dtype) if host else value  # to S's device
    if not vectors:
        return Evaluation(value, pole=pole)
    twice = 1.0 if not gram else 2.0 * s if how == "svd" else 2.0  # 2 F G_H (Theorem 4.2)
    a, h = np.asarray(p.a, dtype=dtype) if host else p.a, p.h  # NaN: not foldable (a <= big)
    with _backend.quiet(s):
        g = (p.a * (s * s if gram else s) + p.h) * twice
        if host:  # the power of two into g (and a, h) where that stays exact
            g2, a2, h2 = _core.pow2(g, n, np), a, h
            ok = _foldable(g, g2)
            if how == "extreme":
                a2, h2 = _core.pow2(a, n, np), _core.pow2(h, n, np)
                ok = ok and _foldable(a, a2) and _foldable(h, h2)
            if ok:
                g, a, h, n = g2, a2, h2, None
    if how == "extreme":
        K = _extreme_factor(Y, values, a, h, g, xp)
    else:  # U diag(g) Vᵀ on the SVD route, else Q diag(g) Qᵀ of the small side's vectors
        with _backend.quiet(X):
            g = _backend.to_device(g[..., None, ::order], A, xp, dtype) if host else g[..., None, :]
            K = (X * g) @ (Y if how == "svd" else X.mT)
    K = K if K.dtype == S.dtype else xp.astype(K, S.dtype)
    if n is not None:
        n = _backend.to_device(n[..., None], A, xp, dtype) if host else n[..., None]
    return Evaluation(value, K, A if gram and how != "svd" else None, pole, n)


def _decompose(A: Array, xp: Any, how: str, vectors: bool) -> tuple[Array, Any, Any]:
    """``(values, X, Y)``: ``"svd"`` ``(s, U, Vh)``; ``"exact"`` ``(s, Q, R)``; the Gram routes
    ``(ascending mu, W, G)`` of the smaller Gram matrix ``G`` (``AAᵀ`` when :func:`left_side`,
    else ``AᵀA``) in :func:`gram_dtype` (``W`` only with vectors, not on ``"extreme"``)."""
    if how == "svd":
        if vectors:
            U, s, Vh = xp.linalg.svd(finite(A, xp), full_matrices=False)
            return s, U, Vh
        return xp.linalg.svdvals(finite(A, xp)), None, None
    if how == "exact":
        return exact(A, xp, vectors)
    gdtype = gram_dtype(A, xp)
    B = A if A.dtype == gdtype else xp.astype(A, gdtype)
    with _backend.quiet(B):  # NumPy: unchecked NaN/Inf input gives NaN (documented)
        G = B @ B.mT if left_side(B.shape) else B.mT @ B
    if vectors and how != "extreme":
        mu, W = xp.linalg.eigh(finite(G, xp))
        return mu, W, G
    return xp.linalg.eigvalsh(finite(G, xp)), None, G


def _foldable(x: Any, x2: Any) -> bool:
    """Whether ``x2 = x·2**n`` (host arrays) stays clear of over- and underflow: then the power
    of two is folded into ``d value / d mu`` (no product with the gradient factor)."""
    fi = np.finfo(x2.dtype)
    tiny, big = float(fi.smallest_normal), float(fi.max)
    a = np.abs(x2)
    return bool(np.all((a <= big * 2.0**-64) & ((a >= tiny * 2.0**64) | (x == 0))))


def _extreme_factor(
    G: Array, mu: np.ndarray, a: Any, h: np.ndarray, g: np.ndarray, xp: Any
) -> Array:
    """``K = 2 W diag(g) Wᵀ`` of the Gram matrix ``G`` (ascending eigenvalues ``mu``, host) with
    ``g = a·mu + h``: from the vectors of the runs of ``h`` (the extreme tie sets;
    :func:`condreg._extreme.gram_product`), or the full ``eigh`` of ``G`` where they are not
    certified."""
    mu = np.maximum(mu[::-1], 0.0)
    K = _extreme.gram_product(G, mu, float(np.reshape(a, -1)[0]), np.reshape(h, -1), xp)
    if K is None:
        W = xp.linalg.eigh(finite(G, xp))[1]
        K = (W * _backend.to_device(g[::-1], G, xp)) @ W.mT
    return K


def assemble(ev: Evaluation, xp: Any, weight: Array | None = None) -> Array:
    """The gradient from an :class:`Evaluation` with vectors, times ``weight`` (``S.shape[:-2]``):
    ``K`` itself (``gram=False``), else ``K @ A`` or ``A @ K`` (Theorem 4.2: ``2 F G_H``)."""
    with _backend.quiet(ev.K):
        K = ev.K if weight is None else ev.K * xp.reshape(weight, weight.shape + (1, 1))
        if ev.A is not None:
            K = K @ ev.A if left_side(ev.A.shape) else ev.A @ K
    return K if ev.n is None else _core.pow2(K, ev.n, xp)


# --------------------------------------------------------------------------------------------
# The spectrum itself (Algorithm 1, the metrics, data parallel): the same decomposition
# --------------------------------------------------------------------------------------------


def choose(
    pred: Array, if_true: Callable[[], Any], if_false: Callable[[], Any], read: Concrete
) -> Any:
    """``if_true()`` if the 0-d boolean ``pred`` holds, else ``if_false()`` (the safe branch);
    where ``read`` cannot tell, ``lax.cond`` for JAX arrays and ``if_false`` elsewhere."""
    value = read(pred)
    if value is not None:
        return if_true() if value else if_false()
    if _backend.library(pred) == "jax":
        return sys.modules["jax"].lax.cond(pred, lambda _: if_true(), lambda _: if_false(), None)
    return if_false()


def accept_gram(
    M: Array,
    shape: tuple[int, int],
    xp: Any,
    vectors: bool,
    dtype: Any,
    rtol: float,
) -> tuple[Array, Any, Array, Array]:
    """``(s, W, err_rel, ok)`` of a formed Gram matrix ``M`` of an ``(N, D)`` batch (data
    parallel: the all-reduced ``Σ_r F_rᵀF_r``): :func:`resolves` on its eigh, ``W`` descending;
    ``ok`` false for a non-finite ``M``."""
    Mf = finite(M, xp)
    mu, W = xp.linalg.eigh(Mf) if vectors else (xp.linalg.eigvalsh(Mf), None)
    s, err, ok = resolves(mu, shape, rtol, dtype, xp)
    fi = xp.finfo(M.dtype)
    e, tiny, big = float(fi.eps), float(fi.smallest_normal), float(fi.max)
    top = xp.max(mu, axis=-1)  # well inside the range (M is not scaled), and finite
    ok = (
        ok
        & xp.all((top > tiny / (e * e)) & (top < big / (4.0 * max(shape))))
        & xp.all(xp.isfinite(M))
    )
    W = None if W is None else xp.astype(xp.flip(W, axis=-1), dtype)
    return s, W, err, ok


def decompose(
    S: Array,
    xp: Any,
    *,
    gram: bool,
    vectors: bool,
    rtol: float | None,
    concrete: Concrete,
    method: str = "auto",
    read: Concrete | None = None,
    keep: bool = False,
) -> _core.Spectrum:
    """The spectrum of ``S`` (``gram=False``: its thin SVD, or singular values only) or of the
    feature batch ``F = S`` (``gram=True``: the route of :func:`plan` — ``"auto"`` takes the Gram
    where :func:`resolves` accepts it and ``read`` can tell, else exact; both sides' vectors
    with ``method="svd"``), on :func:`scaled` ``S`` and scaled back exactly, with the numerical
    rank ``s_i > rtol·s_1``. :class:`RankError` when a matrix has rank 0 and ``concrete`` can
    tell. ``read`` (the accept decision): default ``concrete``, always for NumPy arrays.
    ``keep``: the Gram matrix (``G``) or the exact route's ``R`` kept on the spectrum."""
    rtol = resolve_rtol(rtol, S.shape, S.dtype, xp)
    how = plan(S.shape, gram=gram, vectors=vectors, method=method, extreme=False)
    if read is None:
        read = _backend.eager if _backend.library(S) == "numpy" else concrete
    A, E = scaled(S, xp)
    Ec = xp.clip(E, *exponent_limits(S.dtype, xp))
    tie = default_tie_rtol(S.shape, S.dtype, xp)
    U = Vh = G = R = None
    mu_err: Any = 0.0
    if how == "svd":
        s, U, Vh = _decompose(A, xp, "svd", vectors)
        s = _core.pow2(s, Ec[..., 0], xp)
    else:
        zero = xp.zeros_like(A[..., :1, 0])  # mu_err of the exact route (a lax.cond branch)

        def from_exact() -> tuple:
            s, Q, R = exact(A, xp, vectors)
            return _core.pow2(s, Ec[..., 0], xp), Q, zero, None, R if keep else None

        if how == "exact":
            s, Q, mu_err, G, R = from_exact()
        else:
            mu, W, G = _decompose(A, xp, "auto", vectors)
            s, err, ok = resolves(mu, S.shape, rtol, S.dtype, xp)
            Q = None if W is None else xp.astype(xp.flip(W, axis=-1), S.dtype)
            by_gram = (_core.pow2(s, Ec[..., 0], xp), Q, err, G if keep else None, None)
            s, Q, mu_err, G, R = (
                by_gram if how == "gram" else choose(ok, lambda: by_gram, from_exact, read)
            )
        if vectors:
            U, Vh = (Q, None) if left_side(S.shape) else (None, Q.mT)
        if keep:
            G = None if G is None else _core.pow2(G, 2.0 * Ec, xp)
            R = None if R is None else _core.pow2(R, Ec, xp)
    mask, k = _core.rank(s, rtol, xp)
    if concrete(xp.any(k == 0)):
        raise rank_error()
    with _backend.quiet(s):
        mu = s * s if gram else s
    p = S.shape[-1] if gram else min(S.shape[-2:])
    return _core.Spectrum(U, s, Vh, mu, mask, k, p, gram, mu_err, S, tie, G, R)
