"""The spectral engine: the one place where condreg decomposes a matrix.

:func:`decompose` returns the singular values ``s`` of ``S`` (or, ``gram=True``, of a feature
batch ``F``, with ``mu = s**2`` the eigenvalues of ``H = FᵀF``) as a :class:`Spectrum`, with the
vectors the closed-form gradients need and the numerical rank; :func:`assemble` turns a
derivative with respect to ``mu`` into the gradient. Every caller gets its spectrum here.

Routes, chosen by :func:`plan` alone (docs/math.md §10.1): ``"svd"`` (thin SVD of ``S``);
``"exact"`` (QR of ``F`` or ``Fᵀ`` and the SVD of its small ``R``: backward stable);
``"auto"`` (eigh of the smaller Gram matrix, float64 for float32 features where available,
accepted by :func:`accept_gram` — every eigenvalue resolved to ``GRAM_ACCURACY·√eps`` against
its error bound ``eps_g·(n·mu_1 + √m·Σmu)``, or certainly outside the rank — else ``"exact"``);
``"extreme"`` (``"auto"`` with ``eigvalsh`` only, keeping the unit Gram matrix so that
:func:`assemble` needs the extreme tie sets' vectors alone, :mod:`condreg._extreme`; for one
matrix with ``min(N, D) >= EXTREME_MIN`` where values are cheap to read). The accept decision is
one branch (:func:`choose`): a Python ``if`` eagerly, ``lax.cond`` under ``jax.jit``, ``"exact"``
where values cannot be read. Ties and rank are decided at the rounding scale of the values
computed: ``|s_i − s_e| ≤ tie_rtol·s_1`` (on ``mu``: ``tie_rtol·s_1·(s_i + s_e)``, widened by
the Gram path's error bound).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from array_api_compat import device, is_jax_array, is_numpy_array

from condreg import _extreme
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


class Spectrum(NamedTuple):
    """The decomposition: ``s`` (descending) of the argument, ``mu`` = ``s`` or ``s**2``
    (``gram``), ``mask``/``k`` the numerical rank (``k`` floating), ``p`` the R_well normaliser
    (``min(m, n)``, ``D`` with ``gram``). ``U``/``Vh``: singular vectors or ``None``; with
    ``gram`` one may be ``None`` and ``F`` holds the argument. ``mu_err``: error bound on ``mu``
    relative to ``mu_1`` (0 for an SVD); ``tie``: the default tie tolerance; ``M``: the unit
    Gram matrix of the ``"extreme"`` route."""

    U: Array | None
    s: Array
    Vh: Array | None
    mu: Array
    mask: Array
    k: Array
    p: int
    gram: bool
    mu_err: Any = 0.0
    F: Array | None = None
    tie: Any = None
    M: Array | None = None


@functools.cache
def _finfo_cached(xp: Any, dtype: Any) -> tuple[float, float, float]:
    fi = xp.finfo(dtype)
    return float(fi.eps), float(fi.smallest_normal), float(fi.max)


def finfo(xp: Any, dtype: Any) -> tuple[float, float, float]:
    """``(eps, smallest_normal, max)`` of ``dtype`` as Python floats."""
    try:
        return _finfo_cached(xp, dtype)
    except TypeError:  # an unhashable dtype object
        return _finfo_cached.__wrapped__(xp, dtype)


def eps(xp: Any, dtype: Any) -> float:
    return finfo(xp, dtype)[0]


def default_rtol(shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """``max(m, n) * eps(dtype)`` (numpy.linalg.matrix_rank's convention, on ``s``)."""
    return max(shape[-2], shape[-1]) * eps(xp, dtype)


def default_tie_rtol(shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """``32 * √max(m, n) * eps(dtype)`` relative to ``s_1``: equal up to a backward-stable
    SVD's rounding."""
    return TIE_FACTOR * math.sqrt(max(shape[-2], shape[-1])) * eps(xp, dtype)


def check_rtol(rtol: Any, name: str = "rtol") -> float:
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not 0.0 <= rtol < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {rtol!r}")
    return float(rtol)


def resolve_rtol(rtol: float | None, shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    return default_rtol(shape, dtype, xp) if rtol is None else check_rtol(rtol)


def eager(x: Array) -> bool:
    """``concrete`` callback for eager arrays: read the value."""
    return bool(x)


def never(x: Array) -> None:
    """``concrete`` callback that skips every value-dependent check."""
    return None


def readable(x: Array) -> bool | None:
    """``concrete`` callback for any library: the value, or ``None`` where the library refuses
    to read it (a JAX tracer; a tensor inside ``torch.func.vmap``). Adapters whose tracer does
    not refuse (``torch.compile``) pass their own callback."""
    try:
        return bool(x)
    except (TypeError, RuntimeError):
        return None


def traced(x: Array) -> bool:
    """Whether ``x`` has no values to read: a PyTorch tensor while ``torch.compile`` traces, a
    fake or meta tensor (PyTorch is loaded whenever ``x`` is one of its tensors)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return False
    return torch.compiler.is_compiling() or x.device.type == "meta" or "Fake" in type(x).__name__


def reader(S: Array, concrete: Concrete) -> Concrete:
    """How the engine reads its branch predicate: through ``concrete``, except that NumPy arrays
    are always read (no host synchronisation to avoid)."""
    return eager if (concrete is never and is_numpy_array(S)) else concrete


def choose(
    pred: Array, if_true: Callable[[], Any], if_false: Callable[[], Any], read: Concrete
) -> Any:
    """``if_true()`` if the 0-d boolean ``pred`` holds, else ``if_false()`` (the safe branch).

    Where ``read`` cannot tell, JAX arrays go through ``lax.cond`` (``jax.vmap`` makes it a
    select of both) and other libraries take ``if_false``."""
    try:
        value = read(pred)
    except (TypeError, RuntimeError):
        value = None
    if value is not None:
        return if_true() if value else if_false()
    if is_jax_array(pred):  # the array's own library is loaded: no import
        return sys.modules["jax"].lax.cond(pred, lambda _: if_true(), lambda _: if_false(), None)
    return if_false()


def mT(xp: Any, x: Array) -> Array:
    return xp.matrix_transpose(x) if hasattr(xp, "matrix_transpose") else x.mT


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
    """The dtype the Gram matrix is formed and decomposed in: float64 for float32 input where the
    library has it, else the input's dtype."""
    if x.dtype == xp.float32 and has_float64(xp):
        return xp.float64
    return x.dtype


def qr_r(xp: Any, A: Array) -> Array:
    """``R`` of a reduced QR factorisation of ``A`` (``Q`` not formed where the library can)."""
    if is_numpy_array(A):
        return np.linalg.qr(A, mode="r")
    try:
        out = xp.linalg.qr(A, mode="r")  # PyTorch and JAX
    except (TypeError, ValueError):
        return xp.linalg.qr(A).R
    return getattr(out, "R", out)


def rank(s: Array, rtol: float, xp: Any) -> tuple[Array, Array]:
    """``(mask, k)``: the numerical rank ``s_i > rtol·s_1`` and its count (floating)."""
    mask = s > rtol * s[..., :1]
    return mask, xp.sum(xp.astype(mask, s.dtype), axis=-1)


def svd_small_side(F: Array, xp: Any, vectors: bool) -> tuple[Array, Array | None, Array]:
    """``(s, Q, R)``: the singular values and the small side's vectors (``U`` when
    :func:`left_side`, ``V`` otherwise; ``None`` without ``vectors``) of ``F`` from the ``R`` of
    a QR factorisation of ``Fᵀ`` or ``F`` and its SVD (backward stable)."""
    R = qr_r(xp, mT(xp, F) if left_side(F.shape) else F)
    if not vectors:
        return xp.linalg.svdvals(R), None, R
    _, s, Vhr = xp.linalg.svd(R, full_matrices=False)
    return s, mT(xp, Vhr), R  # left: F = Rᵀ Qᵀ, U_F = V_R; right: F = Q R, V_F = V_R


def gram_matrix(F: Array, xp: Any, gdtype: Any) -> Array:
    """The smaller Gram matrix of ``F`` in ``gdtype``: ``FFᵀ`` (:func:`left_side`) or ``FᵀF``."""
    A = F if F.dtype == gdtype else xp.astype(F, gdtype)
    if is_numpy_array(A):  # an overflowing Gram is handled (accept_gram): no warning about it
        with np.errstate(over="ignore", invalid="ignore"):
            return A @ mT(xp, A) if left_side(F.shape) else mT(xp, A) @ A
    return A @ mT(xp, A) if left_side(F.shape) else mT(xp, A) @ A


def gram_trace_limit(shape: tuple[int, ...], big: float) -> float:
    """``max / (4·max(N, D))``: a Gram matrix whose trace is below it is finite and its ``mu_1``
    inside :func:`eigh_gram`'s range."""
    return big / (4.0 * max(shape[-2], shape[-1]))


def _finite_gram(M: Array, shape: tuple[int, int], xp: Any, read: Concrete) -> tuple[Array, Any]:
    """``(M, fits)``: ``fits`` = trace below :func:`gram_trace_limit` (False for NaN); unless it
    readably holds for all (then ``None``), ``M`` is the identity where it does not."""
    diagonal = getattr(xp.linalg, "diagonal", None)
    d = diagonal(M) if diagonal is not None else xp.diagonal(M, axis1=-2, axis2=-1)
    fits = xp.sum(d, axis=-1) < gram_trace_limit(shape, finfo(xp, M.dtype)[2])
    if read(xp.all(fits)):
        return M, None
    eye = xp.eye(M.shape[-1], dtype=M.dtype, device=device(M))
    return xp.where(fits[..., None, None], M, eye), fits


def eigh_gram(
    M: Array, shape: tuple[int, int], xp: Any, vectors: bool, dtype: Any, read: Concrete = never
) -> tuple[Array, Any, Array, Array, Array]:
    """``(s, W, mu / mu_1, err / mu_1, in_range)`` from the eigh of a formed Gram matrix ``M``
    (the smaller one, or data-parallel ranks' all-reduced ``Σ_r F_rᵀF_r``) of an ``(N, D)``
    feature batch; ``in_range``: ``mu_1`` safely inside the dtype's range. A Gram matrix whose
    trace is not below :func:`gram_trace_limit` is never decomposed (NaN values)."""
    M, fits = _finite_gram(M, shape, xp, read)
    if vectors:
        mu, W = xp.linalg.eigh(M)
        W = xp.flip(W, axis=-1)
        W = W if W.dtype == dtype else xp.astype(W, dtype)
    else:
        mu, W = xp.linalg.eigvalsh(M), None
    N, D = shape
    gdtype = mu.dtype
    mu = xp.flip(mu, axis=-1)
    mu = xp.where(mu < 0, 0.0, mu)  # NaN stays NaN
    if fits is not None:  # a matrix replaced by the identity: NaN values (not in range)
        mu = xp.where(fits[..., None], mu, math.nan)
    n, m = min(N, D), max(N, D)
    top = mu[..., :1]
    e, tiny, big = finfo(xp, gdtype)
    err = (e * n) * top + (e * math.sqrt(m)) * xp.sum(mu, axis=-1, keepdims=True)
    in_range = xp.all((top > tiny / (e * e)) & (top < gram_trace_limit(shape, big)))
    safe_top = xp.where(top > 0, top, 1.0)
    s, mu_rel, err_rel = xp.sqrt(mu), mu / safe_top, err / safe_top
    if gdtype != dtype:
        s, mu_rel, err_rel = (xp.astype(a, dtype) for a in (s, mu_rel, err_rel))
    return s, W, mu_rel, err_rel, in_range


def gram_resolves(mu_rel: Array, err_rel: Array, rtol: float, accuracy: float, xp: Any) -> Array:
    """0-d boolean: every eigenvalue (``mu_rel = mu / mu_1``, error bound ``err_rel``) is resolved
    to ``accuracy`` or certainly outside the rank ``mu > rtol²·mu_1``."""
    return xp.all((mu_rel * accuracy >= err_rel) | (mu_rel + err_rel < rtol * rtol))


def accept_gram(
    M: Array,
    shape: tuple[int, int],
    xp: Any,
    vectors: bool,
    dtype: Any,
    rtol: float,
    read: Concrete = never,
) -> tuple[Array, Any, Array, Array]:
    """The one accept rule: ``(s, W, err_rel, ok)`` from :func:`eigh_gram`, ``ok`` = in range and
    every counted eigenvalue resolved (:func:`gram_resolves`)."""
    s, W, mu_rel, err_rel, in_range = eigh_gram(M, shape, xp, vectors, dtype, read)
    accuracy = GRAM_ACCURACY * math.sqrt(eps(xp, dtype))  # relative, on every counted value
    ok = in_range & gram_resolves(mu_rel, err_rel, rtol, accuracy, xp)
    return s, W, err_rel, ok


class Small(NamedTuple):
    """What :func:`small_side` returns: singular values, the small side's vectors (or None), the
    error bound on ``mu`` relative to ``mu_1``, the default tie tolerance, and with ``keep`` the
    Gram matrix formed (``G``, in the Gram dtype; Gram path) or the exact path's ``R``."""

    s: Array
    Q: Array | None
    mu_err: Any
    tie: Any
    G: Array | None = None
    R: Array | None = None


def small_side(
    F: Array,
    xp: Any,
    *,
    how: str,
    vectors: bool,
    rtol: float,
    read: Concrete,
    keep: bool = False,
    exact_vectors: bool | None = None,
) -> Small:
    """The spectrum of a feature batch from the small side: ``how`` is ``"exact"``,
    ``"gram"`` (the Gram eigh, not checked), or ``"auto"`` (the Gram eigh where
    :func:`accept_gram` accepts it, else exact; one branch, :func:`choose`). ``keep``: return
    ``G`` and ``R`` too (eager callers only: the two branches then differ in structure).
    ``exact_vectors``: whether the exact branch computes vectors (default ``vectors``)."""
    tie_exact = default_tie_rtol(F.shape, F.dtype, xp)

    def exact() -> Small:
        s, Q, R = svd_small_side(F, xp, vectors if exact_vectors is None else exact_vectors)
        return Small(
            s,
            Q,
            xp.zeros_like(s[..., :1]),
            xp.full_like(s[..., :1], tie_exact),
            None,
            R if keep else None,
        )

    if how == "exact":
        return exact()
    G = gram_matrix(F, xp, gram_dtype(F, xp))
    s, W, err_rel, ok = accept_gram(G, F.shape[-2:], xp, vectors, F.dtype, rtol, read)
    # ties at the rounding scale of s, returned in F's dtype
    gram = Small(s, W, err_rel, xp.full_like(err_rel, tie_exact), G if keep else None, None)
    if how == "gram":
        return gram
    return choose(ok, lambda: gram, exact, read)


def plan(shape: tuple[int, ...], *, gram: bool, vectors: bool, method: str, extreme: bool) -> str:
    """The route of :func:`decompose`: ``"svd"``, ``"exact"``, ``"gram"``, ``"auto"`` or
    ``"extreme"`` (module documentation) — the one place that chooses."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not gram or method == "svd":
        return "svd"
    if method != "auto":
        return method
    if extreme and vectors and len(shape) == 2 and min(shape) >= EXTREME_MIN:
        return "extreme"
    return "auto"


def decompose(
    S: Array,
    xp: Any,
    *,
    gram: bool,
    vectors: bool,
    rtol: float | None,
    concrete: Concrete,
    method: str = "auto",
    extreme: bool = False,
) -> Spectrum:
    """The spectrum of ``S`` (``gram=False``: its thin SVD, or singular values only) or of the
    feature batch ``F = S`` (``gram=True``: the route of :func:`plan`), and the numerical rank
    ``s_i > rtol·s_1`` (default ``max(m, n)·eps``).

    ``method`` (``gram=True``): ``"auto"``, ``"gram"``, ``"exact"`` or ``"svd"`` (both sides'
    vectors, differentiable: for higher order). ``extreme``: the caller reads values cheaply
    (allows the ``"extreme"`` route). Raises :class:`RankError` when any matrix of the batch
    has rank 0 (if ``concrete`` can tell)."""
    rtol = resolve_rtol(rtol, S.shape, S.dtype, xp)
    how = plan(S.shape, gram=gram, vectors=vectors, method=method, extreme=extreme)
    m, n = S.shape[-2], S.shape[-1]
    mu_err: Any = 0.0
    tie: Any = default_tie_rtol(S.shape, S.dtype, xp)
    U = Vh = F = M = None
    if how == "svd" and vectors:
        U, s, Vh = xp.linalg.svd(S, full_matrices=False)
    elif how == "svd":
        s = xp.linalg.svdvals(S)
    else:
        keep = how == "extreme"  # eigvalsh only; the exact branch with its vectors
        sm = small_side(
            S,
            xp,
            how="auto" if keep else how,
            vectors=vectors and not keep,
            rtol=rtol,
            read=reader(S, concrete),
            keep=keep,
            exact_vectors=vectors,
        )
        s, mu_err, tie = sm.s, sm.mu_err, sm.tie
        if sm.G is not None:  # the Gram matrix formed here: made the unit Gram in place
            M = sm.G
            M /= xp.astype(s[..., :1] * s[..., :1], M.dtype)[..., None]
        if vectors:
            U, Vh, F = (
                (sm.Q, None, S) if left_side(S.shape) or sm.Q is None else (None, mT(xp, sm.Q), S)
            )
    mask, k = rank(s, rtol, xp)
    if concrete(xp.any(k == 0)):
        raise RankError(
            "the matrix is zero (numerical rank 0): condition numbers and the regularizers are "
            "undefined"
        )
    mu = square(s) if gram else s
    return Spectrum(U, s, Vh, mu, mask, k, n if gram else min(m, n), gram, mu_err, F, tie, M)


def square(s: Array) -> Array:
    """``s**2`` (may over- or underflow where ``s`` does not; the formulas use ``s / s_1``, so
    NumPy's warning about it would only be noise)."""
    if is_numpy_array(s):
        with np.errstate(over="ignore", under="ignore"):
            return s * s
    return s * s


def power_factors(s: Array, power: int, xp: Any) -> tuple[Array, Array]:
    """``(first, second)`` with ``s**power = first · second`` for positive ``s``, such that
    ``(x · first) · second`` over- or underflows only where ``x · s**power`` itself does.

    ``s = m·2**e`` with ``m ∈ [1, 2)`` (exact), so ``s**power = m**power · 2**(e·power)``;
    ``m**power`` is representable for ``|power| <= 6`` and the power of two is split into two
    exact factors (the second is 1 unless the exponent leaves the dtype's range; clipped so that
    it is never 0 or inf). A non-positive or non-finite ``s`` gives NaN (``m`` is NaN).
    """
    e = xp.floor(xp.log2(s))
    m = s / 2.0**e
    E = e * float(power)
    lim = float(math.floor(math.log2(finfo(xp, s.dtype)[2])))
    E1 = xp.clip(E, -(lim - 8.0), lim - 7.0)
    return m**power * 2.0**E1, 2.0 ** xp.clip(E - E1, -(lim - 1.0), lim - 1.0)


def scale_by_power(x: Array, s: Array, power: int, xp: Any) -> Array:
    """``x · s**power`` for positive ``s`` broadcastable to ``x`` (no batch dimension ``x``
    lacks), without an over- or underflow the result would not have (:func:`power_factors`);
    ``x``, a new array of the caller's, is scaled in place unless autodiff records it."""
    if power == 0:
        return x
    first, second = power_factors(s, power, xp)
    if getattr(x, "requires_grad", False):
        return (x * first) * second
    x *= first
    x *= second
    return x


def gram_gradient(Q: Array, g: Array, F: Array, xp: Any, left: bool | None = None) -> Array:
    """``2 (Q diag(g) Qᵀ) F`` (``left``, ``Q = U``) or ``2 F (Q diag(g) Qᵀ)`` (``Q = V``): the
    gradient with respect to ``F`` from one side's vectors and ``g = d value / d mu``
    (Theorem 4.2). ``left`` defaults to :func:`left_side` (a data-parallel rank's ``F_r`` may
    have ``N_r < D`` with the ``V`` of the global Gram)."""
    if left is None:
        left = left_side(F.shape)
    P = (Q * (2.0 * g)[..., None, :]) @ mT(xp, Q)
    return P @ F if left else F @ P


def _gram_matrix_part(sp: Spectrum, a: Any, h: Array, xp: Any) -> Array:
    """``P = 2 Q diag(a·mu + h) Qᵀ`` of the ``"extreme"`` route from the unit Gram ``sp.M``: the
    extreme clusters' vectors (:func:`condreg._extreme.gram_product`), or the full eigh of
    ``M`` where they are not certified."""
    P = _extreme.gram_product(sp.M, sp.mu, a, h, xp, value_eps=eps(xp, sp.s.dtype))
    if P is None:
        W = xp.flip(xp.linalg.eigh(sp.M)[1], axis=-1)
        g = a * sp.mu + h
        P = (W * (2.0 * g)[..., None, :]) @ mT(xp, W)
    return P if P.dtype == sp.s.dtype else xp.astype(P, sp.s.dtype)


def assemble(
    sp: Spectrum,
    a: Any,
    h: Array,
    xp: Any,
    scale: Array | None = None,
    power: int = 0,
    weight: Array | None = None,
) -> Array:
    """Gradient with respect to the argument from ``g = d value / d mu = a·mu + h`` (``a`` a
    float or of shape ``(..., 1)``, ``h`` nonzero on the extreme tie sets only), times
    ``scale**power`` and ``weight``.

    Without ``gram``: ``U diag(g) Vᵀ``. With ``gram`` (mu = s²): ``U diag(2 s g) Vᵀ``, which
    equals ``2 F G_H`` for the symmetric gradient ``G_H = V diag(g) Vᵀ`` with respect to H
    (Theorem 4.2); from one side's vectors ``2 (U diag(g) Uᵀ) F`` or ``2 F (V diag(g) Vᵀ)``,
    where ``F`` is ``sp.F / scale`` (the unit factor of a spectrum divided by ``s_1``); from the
    unit Gram ``sp.M`` (``"extreme"`` route) ``2 (a·M + Σ_c h_c Q_c Q_cᵀ) F``. ``weight``
    (shape ``(...)``) multiplies ``a`` and ``h``; ``scale**power`` (``scale`` of shape
    ``(..., 1)``) is applied by :func:`scale_by_power`.
    """
    if weight is not None:  # folded into g: G then has every batch dimension (in place below)
        a, h = a * weight[..., None], h * weight[..., None]
    if sp.gram and sp.F is not None and (sp.U is None or sp.Vh is None):
        if sp.M is not None:
            P = _gram_matrix_part(sp, a, h, xp)
            G = P @ sp.F if left_side(sp.F.shape) else sp.F @ P
        else:
            left = sp.U is not None
            G = gram_gradient(sp.U if left else mT(xp, sp.Vh), a * sp.mu + h, sp.F, xp, left)
        power -= 1  # sp.F = scale · the unit factor
    else:
        g = a * sp.mu + h
        d = 2.0 * sp.s * g if sp.gram else g
        G = (sp.U * d[..., None, :]) @ sp.Vh
    return G if scale is None else scale_by_power(G, scale[..., None], power, xp)
