"""The spectral engine: the one place where condreg decomposes a matrix.

Every quantity condreg computes is a function of the singular values ``s`` of an argument ``S``
(or, with ``gram=True``, of the eigenvalues ``mu = s**2`` of the Gram matrix ``H = FᵀF`` of a
feature batch ``F``). :func:`decompose` returns them as a :class:`Spectrum`, together with the
singular vectors the closed-form gradients need, and decides the numerical rank. The public
functions (:mod:`condreg._api`), the PyTorch and JAX adapters and Algorithm 1
(:mod:`condreg._linalg`) all get their spectrum here.

Paths (``gram=True``; docs/math.md §10.1)
------------------------------------------
``"gram"``
    ``eigh`` of the smaller Gram matrix: ``FFᵀ`` (``N×N``) when ``N < D``, ``FᵀF`` (``D×D``) when
    ``N >= D``, after an exact power-of-two rescaling of ``F`` (so ``mu`` never over- or
    underflows). Only the vectors of the small side are formed; the gradient is then
    ``2 (U diag(g) Uᵀ) F`` or ``2 F (V diag(g) Vᵀ)`` (Theorem 4.2) — one GEMM with ``F``. A
    float32 Gram is formed and decomposed in float64 where the backend has float64 (NumPy,
    PyTorch, JAX with x64).
``"svd"``
    A backward-stable decomposition of ``F`` itself (a QR factorisation of ``F`` or ``Fᵀ``, whose
    ``R`` has the singular values of ``F``, then the SVD of the small ``R``): every ``s_i`` has
    absolute error ≈ ``c·eps·s_1``.
``"auto"`` (default)
    ``"gram"`` when it resolves every value the rank rule counts, ``"svd"`` otherwise. The eigh
    of a Gram matrix carries an absolute error of about ``err = eps_g·(n·mu_1 + √m·Σmu)``
    (``n`` its size, ``m`` the inner dimension, ``eps_g`` the Gram dtype's eps) on every
    eigenvalue. The Gram path is accepted when every computed eigenvalue is either resolved,
    ``mu_i >= err / GRAM_ACCURACY(dtype)`` (relative error below ``0.1·√eps`` of the result
    dtype: 1.5e-9 in float64, 3.5e-5 in float32), or certainly outside the rank
    (``mu_i + err < rtol²·mu_1``). Otherwise the whole batch takes the ``"svd"`` path. In float64
    the Gram path resolves ``κ(F)`` up to ~1e2–1e3 at the usual sizes, in float32 (float64 Gram)
    ~1e4; a rank-deficient batch (rank below ``min(N, D)``) always takes the ``"svd"`` path under
    the default ``rtol``.

The decision is one data-dependent branch: eagerly a Python ``if`` (one host synchronisation on a
GPU), under ``jax.jit`` a ``lax.cond``; where values cannot be read (``torch.compile``,
``torch.func.vmap``) the ``"svd"`` path is taken.

Ties and rank are decided at the scale of the rounding error of the values actually computed:
singular values within ``tie_rtol·s_1`` of an extreme one are tied with it — on ``mu = s²`` that
is ``|mu_i − mu_e| ≤ tie_rtol·s_1·(s_i + s_e)``, not ``tie_rtol·mu_1`` — widened by the Gram
path's own error bound ``2·err`` when that path was taken.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from array_api_compat import is_jax_array, is_numpy_array, is_torch_array

from condreg._errors import RankError


def loaded(name: str) -> Any:
    """The module ``name`` as the caller's program already imported it (``sys.modules``).

    The core never imports an array framework: its native fast paths run only for arrays of a
    library that is loaded already, and reach that library through this function."""
    return sys.modules[name]


Array = Any
Concrete = Callable[[Array], "bool | None"]

METHODS = ("auto", "gram", "exact", "svd")


def eager(x: Array) -> bool:
    """``concrete`` callback for eager arrays: read the value."""
    return bool(x)


def never(x: Array) -> None:
    """``concrete`` callback that skips every value-dependent check."""
    return None


class Spectrum(NamedTuple):
    """The decomposition every value and gradient is computed from.

    ``s`` are the singular values of the argument (``S``, or ``F`` when ``gram``), descending;
    ``mu`` is the spectrum of the matrix the quantity is about: ``s`` itself, or ``s**2`` (the
    nonzero eigenvalues of ``H = FᵀF``) when ``gram`` (it may over- or underflow where ``s`` does
    not: every formula works on ``s / s_1``). ``mask`` marks the numerical rank and ``k`` counts
    it (in the floating dtype). ``p`` is the R_well normaliser: ``min(m, n)``, or ``D`` (the size
    of ``H``) when ``gram``.

    ``U`` (``m×r``) and ``Vh`` (``r×n``) are the singular vectors (``None`` when not computed).
    With ``gram`` one of them may be ``None`` and ``F`` hold the argument: the gradient is then
    assembled as ``2 (U diag(g) Uᵀ) F`` or ``2 F (Vh.T diag(g) Vh)``. ``mu_err`` is the absolute
    error bound of the decomposition on ``mu`` beyond the SVD's, relative to ``mu_1`` (0 for the
    SVD; the Gram path's ``err / mu_1``): ties are widened by it. ``tie`` is the default tie
    tolerance (relative to ``s_1``, on ``s``) at the rounding scale of the dtype the values were
    computed in (``None``: that of ``s``); an explicit ``tie_rtol`` overrides it.
    """

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


# --------------------------------------------------------------------------------------------
# Tolerances (the one home for them)
# --------------------------------------------------------------------------------------------

#: Multiplier of ``√max(m, n) * eps`` in the default tie tolerance (:func:`default_tie_rtol`).
TIE_FACTOR = 32.0


_FINFO: dict[tuple[type, Any], tuple[float, float, float]] = {}


def _finfo(xp: Any, dtype: Any) -> tuple[float, float, float]:
    """``(eps, smallest_normal, max)`` of ``dtype`` as Python floats (cached per dtype: this is
    on every call's path)."""
    key = (type(dtype), dtype)  # the type first: no dtype comparison across libraries
    try:
        return _FINFO[key]
    except (KeyError, TypeError):
        fi = xp.finfo(dtype)
        out = (float(fi.eps), float(fi.smallest_normal), float(fi.max))
        try:
            _FINFO[key] = out
        except TypeError:  # pragma: no cover - an unhashable dtype object
            pass
        return out


def eps(xp: Any, dtype: Any) -> float:
    return _finfo(xp, dtype)[0]


def default_rtol(shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """``max(m, n) * eps(dtype)``: numpy.linalg.matrix_rank's convention, on the singular values
    of the argument (of ``F`` when ``gram=True``; rank(FᵀF) = rank(F))."""
    return max(shape[-2], shape[-1]) * eps(xp, dtype)


def default_tie_rtol(shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """``32 * √max(m, n) * eps(dtype)``, relative to the largest singular value ``s_1``.

    Backward-stable SVDs return singular values with absolute error of a small multiple of
    ``eps * s_1`` (measured: up to ~35·eps for 1024×512 in float32, ~1·eps for exactly tied
    values of a small matrix); singular values closer than this are equal up to rounding and
    are tied. (Decided on ``s``: on ``mu = s²`` the tolerance is ``tie_rtol·s_1·(s_i + s_e)``.)
    """
    return TIE_FACTOR * math.sqrt(max(shape[-2], shape[-1])) * eps(xp, dtype)


def check_rtol(rtol: Any, name: str = "rtol") -> float:
    if not (isinstance(rtol, (int, float)) and not isinstance(rtol, bool)):
        raise ValueError(f"{name} must be a float in [0, 1), got {rtol!r}")
    if not 0.0 <= float(rtol) < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {rtol!r}")
    return float(rtol)


def resolve_rtol(rtol: float | None, shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    return default_rtol(shape, dtype, xp) if rtol is None else check_rtol(rtol)


def resolve_tie_rtol(tie_rtol: float | None, shape: tuple[int, ...], dtype: Any, xp: Any) -> float:
    """The tie tolerance to use: ``tie_rtol`` checked, or the default for ``shape``/``dtype``."""
    if tie_rtol is None:
        return default_tie_rtol(shape, dtype, xp)
    return check_rtol(tie_rtol, "tie_rtol")


def gram_accuracy(xp: Any, dtype: Any) -> float:
    """The relative error on every counted eigenvalue the ``"gram"`` path may have:
    ``0.1·√eps(dtype)`` of the result dtype."""
    return 0.1 * math.sqrt(eps(xp, dtype))


# --------------------------------------------------------------------------------------------
# Backend helpers
# --------------------------------------------------------------------------------------------


def _device(x: Array) -> Any:
    from array_api_compat import device

    return device(x)


def _mT(xp: Any, x: Array) -> Array:
    return xp.matrix_transpose(x) if hasattr(xp, "matrix_transpose") else x.mT


def _library(x: Array) -> str:
    if is_torch_array(x):
        return "torch"
    if is_jax_array(x):
        return "jax"
    if is_numpy_array(x):
        return "numpy"
    return "other"


def _has_float64(x: Array, xp: Any) -> bool:
    if is_jax_array(x):
        return bool(loaded("jax").config.read("jax_enable_x64"))
    return hasattr(xp, "float64")


def gram_dtype(x: Array, xp: Any) -> Any:
    """The dtype the Gram matrix is formed and decomposed in: float64 for float32 input where the
    backend has it, else the input's dtype."""
    if x.dtype == xp.float32 and _has_float64(x, xp):
        return xp.float64
    return x.dtype


def _qr_r(xp: Any, A: Array) -> Array:
    """``R`` of a reduced QR factorisation (``Q`` is never formed where the backend allows)."""
    lib = _library(A)
    if lib == "torch":
        return loaded("torch").linalg.qr(A, mode="r").R
    if lib == "jax":
        return loaded("jax").numpy.linalg.qr(A, mode="r")
    if lib == "numpy":
        import numpy as np

        lapack = _numpy_lapack(A)
        if lapack is None:
            return np.linalg.qr(A, mode="r")
        m, n = A.shape
        key = (lapack.prefix, m, n)
        if key not in _GEQRF_LWORK:  # the optimal workspace (blocked Householder QR)
            if len(_GEQRF_LWORK) > 256:
                _GEQRF_LWORK.clear()
            _GEQRF_LWORK[key] = max(int(lapack.geqrf_lwork(m, n)[0].real), 1)
        qr, _, _, info = lapack.geqrf(A, lwork=_GEQRF_LWORK[key])
        if info != 0:  # pragma: no cover - only for an invalid argument
            raise np.linalg.LinAlgError(f"QR factorisation failed (LAPACK info {info})")
        return np.triu(qr[: min(m, n)])
    return xp.linalg.qr(A).R


def svdvals(xp: Any, R: Array) -> Array:
    """Singular values (descending) of a matrix, ``xp.linalg.svdvals``; for a single NumPy
    float64 matrix through SciPy's LAPACK ``dgesdd`` where SciPy is installed (on the 2-core
    reference machine 3–8 % faster than NumPy's own, from n = 400 to 600; the same algorithm,
    so the same backward error ``c·eps·σ₁``). Raises ``numpy.linalg.LinAlgError`` where NumPy's
    would (NaN entries: "SVD did not converge")."""
    lapack = _numpy_lapack(R) if is_numpy_array(R) else None
    if lapack is None:
        return xp.linalg.svdvals(R)
    import numpy as np

    # σ(Rᵀ) = σ(R) (the wrapper copies its input: R is never overwritten)
    _, s, _, info = lapack.gesdd(R.T, compute_uv=0)
    if info != 0:
        raise np.linalg.LinAlgError("SVD did not converge")
    return s


class _Lapack(NamedTuple):
    prefix: str
    geqrf: Any
    geqrf_lwork: Any
    gesdd: Any


_GEQRF_LWORK: dict[tuple[str, int, int], int] = {}
_LAPACK: dict[str, _Lapack | None] = {}


def _numpy_lapack(A: Array) -> _Lapack | None:
    """SciPy's float64 LAPACK routines for a non-empty 2-D NumPy float64 array; None without
    SciPy or for anything else, float32 included (the caller then uses NumPy's ``linalg``,
    which computes float32 input in float64: SciPy's ``s`` routines would be 1e3–1e4 times
    less accurate on an ill-conditioned float32 batch)."""
    if A.ndim != 2 or A.size == 0 or str(A.dtype) != "float64":
        return None
    prefix = "d"
    if prefix not in _LAPACK:
        try:
            from scipy.linalg import lapack
        except ImportError:
            _LAPACK[prefix] = None
        else:
            _LAPACK[prefix] = _Lapack(
                prefix,
                getattr(lapack, f"{prefix}geqrf"),
                getattr(lapack, f"{prefix}geqrf_lwork"),
                getattr(lapack, f"{prefix}gesdd"),
            )
    return _LAPACK[prefix]


def _untraceable(x: Array) -> bool:
    if is_torch_array(x):
        if loaded("torch").compiler.is_compiling():
            return True
        fake = sys.modules.get("torch._subclasses.fake_tensor")  # not loaded: no fake tensors
        return (fake is not None and isinstance(x, fake.FakeTensor)) or x.device.type == "meta"
    return False


def choose(
    pred: Array,
    if_true: Callable[[], Any],
    if_false: Callable[[], Any],
    read: Concrete = eager,
) -> Any:
    """``if_true()`` if the 0-d boolean ``pred`` holds, else ``if_false()``.

    ``read`` turns ``pred`` into a Python ``bool`` or ``None`` (cannot or must not be read: under
    ``torch.compile``, ``torch.func.vmap``, or with host synchronisation turned off). When it
    cannot be read, JAX arrays go through ``lax.cond`` (``jax.vmap`` makes it a select of both),
    other libraries take ``if_false`` (the safe branch).
    """
    if is_jax_array(pred):
        jax = loaded("jax")
        try:
            value = read(pred)
        except jax.errors.ConcretizationTypeError:
            value = None
        if value is None:
            return jax.lax.cond(pred, lambda _: if_true(), lambda _: if_false(), None)
        return if_true() if value else if_false()
    if _untraceable(pred):
        return if_false()
    try:
        value = read(pred)
    except RuntimeError:  # functorch vmap: data-dependent control flow is not allowed
        value = None
    if value is None:
        return if_false()
    return if_true() if value else if_false()


def reader(S: Array, concrete: Concrete) -> Concrete:
    """How the engine reads its one branch predicate: through ``concrete``, except that NumPy
    arrays are always read (no host synchronisation to avoid)."""
    return eager if (concrete is never and is_numpy_array(S)) else concrete


# --------------------------------------------------------------------------------------------
# Decompositions
# --------------------------------------------------------------------------------------------


def _rank(s: Array, rtol: float, xp: Any) -> tuple[Array, Array]:
    mask = s > rtol * s[..., :1]
    return mask, xp.sum(xp.astype(mask, s.dtype), axis=-1)


def _svd_small_side(F: Array, xp: Any, vectors: bool) -> tuple[Array, Array | None]:
    """``s`` and the singular vectors of the small side of ``F`` (``U``, ``N×N`` when ``N < D``;
    ``V``, ``D×D`` otherwise) from a QR factorisation and the SVD of its ``R`` (backward
    stable: every ``s_i`` has absolute error ≈ ``c·eps·s_1``)."""
    N, D = F.shape[-2], F.shape[-1]
    R = _qr_r(xp, _mT(xp, F) if N < D else F)
    if not vectors:
        return svdvals(xp, R), None
    _, s, Vhr = xp.linalg.svd(R, full_matrices=False)
    return s, _mT(xp, Vhr)  # N < D: F = Rᵀ Qᵀ, U_F = V_R; N >= D: F = Q R, V_F = V_R


def _gram_matrix(F: Array, xp: Any, gdtype: Any) -> Array:
    """The smaller Gram matrix of ``F`` in ``gdtype``: ``FFᵀ`` when ``N < D``, else ``FᵀF``
    (a single large CPU tensor: :func:`_symmetric_gram`)."""
    A = F if F.dtype == gdtype else xp.astype(F, gdtype)
    wide = F.shape[-2] < F.shape[-1]
    if _blocked_gram_eligible(A):
        return _symmetric_gram(A.mT if wide else A)
    if is_numpy_array(A):  # an overflowing Gram is handled (eigh_gram): no warning about it
        import numpy as np

        with np.errstate(over="ignore", invalid="ignore"):
            return A @ _mT(xp, A) if wide else _mT(xp, A) @ A
    return A @ _mT(xp, A) if wide else _mT(xp, A) @ A


def _blocked_gram_eligible(A: Array) -> bool:
    """A single eager CPU PyTorch matrix (not traced, not wrapped by a ``torch.func``
    transform) with both sides >= 256 and ``max·min² >= 2**26`` flops: where
    :func:`_symmetric_gram` pays on one and on two threads (measured: 0.67–0.83× the time of
    ``X.T @ X`` from 1024×256 to 4096×1024; 0.96–1.07× at 300×256 and 600×300)."""
    if not (is_torch_array(A) and A.ndim == 2 and A.device.type == "cpu"):
        return False
    n, m = min(A.shape), max(A.shape)
    return (
        n >= 256
        and m * n * n >= 2**26
        and not _untraceable(A)
        and not loaded("torch")._C._functorch.is_functorch_wrapped_tensor(A)
    )


#: Column blocks of :func:`_symmetric_gram`.
GRAM_BLOCKS = 4


def _symmetric_gram(X: Array) -> Array:
    """``XᵀX`` (PyTorch, 2-D) from its upper block rows only: block row ``i`` is one GEMM
    ``X_iᵀ X[:, i:]`` and the lower part its transpose, so ``GRAM_BLOCKS = 4`` column blocks
    cost 10/16 of the full product's flops (PyTorch has no ``syrk``; on a 4096×1024 batch 0.64×
    the time of ``X.T @ X`` on one CPU thread). Off the diagonal blocks exactly symmetric (the
    diagonal blocks are as symmetric as a GEMM's result; ``eigh`` reads one triangle); each
    entry is a dot product of two columns, as in the full product (the same rounding bound)."""
    n = X.shape[-1]
    edges = [n * i // GRAM_BLOCKS for i in range(GRAM_BLOCKS + 1)]
    G = X.new_empty((n, n))
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        row = X[:, lo:hi].mT @ X[:, lo:]
        G[lo:hi, lo:] = row
        G[hi:, lo:hi] = row[:, hi - lo :].mT
    return G


def eigh_gram(
    M: Array, shape: tuple[int, int], xp: Any, vectors: bool, dtype: Any
) -> tuple[Array, Any, Array, Array, Array]:
    """``(s, W, mu / mu_1, err / mu_1, in_range)`` from the eigh of a formed Gram matrix ``M``
    (the smaller one, :func:`_gram_matrix`, or the all-reduced ``Σ_r F_rᵀF_r`` of data-parallel
    ranks) of a feature batch of ``shape`` ``(N, D)``: singular values, the small side's
    vectors, the eigenvalues and the error bound relative to the largest one, and a 0-d boolean
    saying that ``mu_1`` lies safely inside the dtype's range (between the smallest normal
    number over eps² and the largest over 4·max(N, D); always true for float32 features with a
    float64 Gram). Out of range (``F = 1e-170·I`` or ``1e200·I`` in float64) the caller takes
    the exact path. Results in ``dtype``.

    A Gram matrix whose trace is not below that upper bound (it overflowed, or NaN input under
    a trace or with checks off) is never decomposed: LAPACK does not converge on ``inf``
    entries (NumPy and PyTorch raise). Its eigh runs on the identity instead, its values are
    NaN (its vectors the identity's) and ``in_range`` is false, so the exact path decides
    (``"auto"``). The bound is on the trace, not on ``mu_1 <= trace``: a Gram within a factor
    ``min(N, D)`` of it also takes the exact path (equally accurate)."""
    M, fits = _finite_gram(M, shape, xp)
    if vectors:
        mu, W = xp.linalg.eigh(M)
        W = xp.flip(W, axis=-1)
        if W.dtype != dtype:
            W = xp.astype(W, dtype)
    else:
        mu, W = xp.linalg.eigvalsh(M), None
    s, mu_rel, err_rel, in_range = _eigh_tail(mu, shape, xp, dtype)
    if fits is not None:  # a matrix replaced by the identity: NaN values (method="gram")
        s, mu_rel, err_rel = (xp.where(fits[..., None], a, math.nan) for a in (s, mu_rel, err_rel))
        in_range = in_range & xp.all(fits)
    return s, W, mu_rel, err_rel, in_range


def gram_trace_limit(shape: tuple[int, ...], big: float) -> float:
    """``max / (4·max(N, D))`` for the Gram dtype's largest number ``big``: a Gram matrix whose
    trace is below it is finite and its ``mu_1`` inside :func:`eigh_gram`'s range."""
    return big / (4.0 * max(shape[-2], shape[-1]))


def _finite_gram(M: Array, shape: tuple[int, int], xp: Any) -> tuple[Array, Array | None]:
    """``(M, fits)``: ``fits`` (one boolean per matrix) says that the trace of ``M`` is below
    ``max / (4·max(N, D))`` (False for NaN): then every entry is finite (``|M_ij| <=
    √(M_ii·M_jj)``) and ``mu_1`` inside :func:`eigh_gram`'s range. Where it does not, ``M`` is
    replaced by the identity (an array select: traceable, no host read except for NumPy). A
    NumPy ``M`` that fits entirely is returned as it is, with ``fits = None`` (no copy, nothing
    to mask)."""
    diagonal = getattr(xp.linalg, "diagonal", None)
    d = diagonal(M) if diagonal is not None else xp.diagonal(M, axis1=-2, axis2=-1)
    fits = xp.sum(d, axis=-1) < gram_trace_limit(shape, _finfo(xp, M.dtype)[2])
    if is_numpy_array(M) and bool(xp.all(fits)):
        return M, None
    n = M.shape[-1]
    try:
        eye = xp.eye(n, dtype=M.dtype, device=_device(M))
    except TypeError:  # NumPy < 2 has no device argument
        eye = xp.eye(n, dtype=M.dtype)
    return xp.where(fits[..., None, None], M, eye), fits


def _eigh_tail(
    mu: Array, shape: tuple[int, int], xp: Any, dtype: Any
) -> tuple[Array, Array, Array, Array]:
    """:func:`eigh_gram` from the ascending eigenvalues ``mu`` (in the Gram dtype)."""
    N, D = shape
    gdtype = mu.dtype
    mu = xp.flip(mu, axis=-1)
    mu = xp.where(mu < 0, 0.0, mu)  # NaN stays NaN
    n, m = min(N, D), max(N, D)
    top = mu[..., :1]
    e, tiny, big = _finfo(xp, gdtype)
    err = (e * n) * top + (e * math.sqrt(m)) * xp.sum(mu, axis=-1, keepdims=True)
    lo = tiny / (e * e)
    hi = gram_trace_limit(shape, big)
    in_range = xp.all((top > lo) & (top < hi))  # False for NaN and for a zero matrix
    safe_top = xp.where(top > 0, top, 1.0)
    s, mu_rel, err_rel = xp.sqrt(mu), mu / safe_top, err / safe_top
    if gdtype != dtype:
        s, mu_rel, err_rel = (xp.astype(a, dtype) for a in (s, mu_rel, err_rel))
    return s, mu_rel, err_rel, in_range


def gram_resolves(mu_rel: Array, err_rel: Array, rtol: float, accuracy: float, xp: Any) -> Array:
    """0-d boolean: every eigenvalue (``mu_rel = mu / mu_1``, error bound ``err_rel``) is resolved
    to ``accuracy`` or certainly outside the rank ``mu > rtol²·mu_1``."""
    return xp.all((mu_rel * accuracy >= err_rel) | (mu_rel + err_rel < rtol * rtol))


#: The last Gram verdict per (size, shape, dtype) of single NumPy matrices: True where the Gram
#: was refused. :func:`gram_refused` runs its check only after a refusal of the same kind, so an
#: accepted Gram pays nothing for it; the results never depend on this (only the cost does).
_REFUSED_LAST: dict[tuple, bool] = {}


def _verdict_key(M: Array, shape: tuple[int, int]) -> tuple:
    return (M.shape[0], tuple(int(d) for d in shape), str(M.dtype))


def note_gram_verdict(M: Array, shape: tuple[int, int], ok: Any) -> None:
    """Record whether the eigenvalues accepted the Gram ``M`` (a single NumPy matrix; anything
    else is ignored) for :func:`gram_refused`'s next decision on a matrix of this kind."""
    if is_numpy_array(M) and M.ndim == 2:
        if len(_REFUSED_LAST) > 256:
            _REFUSED_LAST.clear()
        _REFUSED_LAST[_verdict_key(M, shape)] = not bool(ok)


def gram_refused(M: Array, shape: tuple[int, int], rtol: float, accuracy: float) -> bool:
    """True only when :func:`gram_resolves` would certainly refuse the Gram matrix ``M`` of a
    feature batch of ``shape``: a Cholesky factorisation (a third of an ``eigvalsh``) decides it
    before the eigenvalues are computed. False means "compute them and see"; it is also the
    answer, without any work, unless the last Gram of this size, shape and dtype was refused
    (:func:`note_gram_verdict`), so that accepted Grams pay nothing.

    For a single NumPy matrix, when no eigenvalue can be "certainly outside the rank"
    (``rtol² <= eps·n/2``, ``n = min(N, D)``, ``m = max(N, D)``, eps of the Gram's dtype: the
    default tolerance of float64 features; float32 ones only with an explicit small rtol),
    acceptance needs every ``mu_i >= tau·mu_1`` with ``tau = err_rel/accuracy >= tau_0 =
    (eps·n + 0.9·eps·√m·trace(M)/rho)/accuracy`` (``err_rel = eps·(n + √m·Σmu/mu_1)``, ``rho``
    the largest absolute row sum, ``>= mu_1``; 0.9 covers the rounding of the computed Σmu).
    If the Cholesky factorisation of ``M − (tau_0/2)·max_i M_ii·I`` fails, then
    ``lambda_min(M) <= (tau_0/2 + n(n+1)·eps)·mu_1`` (its backward error, Higham Thm 10.7;
    ``max M_ii <= mu_1``), and the computed smallest eigenvalue, within ``p(n)·eps·mu_1`` of
    it — LAPACK's bound, assumed here with ``p(n) <= 8n`` — is below ``tau·mu_1`` while
    ``(n + 9)·accuracy <= 1/4`` (checked): the Gram path would be refused. The result is
    therefore exactly the one computing the eigenvalues would give. Non-finite ``M``: False
    (the eigenvalues decide, as before)."""
    if not (is_numpy_array(M) and M.ndim == 2):
        return False
    if not _REFUSED_LAST.get(_verdict_key(M, shape), False):
        return False
    import numpy as np

    n, m = M.shape[0], max(shape)
    e = eps(np, M.dtype)
    if n < 2 or n != min(shape) or rtol * rtol > 0.5 * e * n or (n + 9) * accuracy > 0.25:
        return False
    top = float(np.max(np.diagonal(M)))
    if not (math.isfinite(top) and top > 0.0) or not bool(np.isfinite(M).all()):
        return False
    rho = float(np.max(np.sum(np.abs(M), axis=1)))
    trace = float(np.trace(M))
    tau0 = (e * n + 0.9 * e * math.sqrt(m) * trace / rho) / accuracy
    shifted = np.array(M, copy=True)
    shifted.flat[:: n + 1] -= 0.5 * tau0 * top
    try:
        np.linalg.cholesky(shifted)
    except np.linalg.LinAlgError:
        return True
    return False


def checked_eigh_gram(
    M: Array,
    shape: tuple[int, int],
    xp: Any,
    vectors: bool,
    dtype: Any,
    rtol: float,
    accuracy: float,
) -> tuple[Array, Any, Array, Array, Array] | None:
    """:func:`eigh_gram` and its verdict: None where :func:`gram_refused` proves the Gram would
    be refused (no eigenvalues computed), else ``(s, W, mu_rel, err_rel, ok)`` with ``ok`` the
    0-d boolean "in range and resolved" (:func:`gram_resolves`), recorded for the next
    pre-check (:func:`note_gram_verdict`)."""
    if gram_refused(M, shape, rtol, accuracy):
        return None
    s, W, mu_rel, err_rel, in_range = eigh_gram(M, shape, xp, vectors, dtype)
    ok = in_range & gram_resolves(mu_rel, err_rel, rtol, accuracy, xp)
    note_gram_verdict(M, shape, ok)
    return s, W, mu_rel, err_rel, ok


def gram_spectrum(
    F: Array,
    xp: Any,
    *,
    vectors: bool,
    rtol: float,
    method: str = "auto",
    accuracy: float | None = None,
    read: Concrete = eager,
) -> tuple[Array, Array | None, Any, Any]:
    """``(s, Q, mu_err, tie)`` of a feature batch ``F`` (``..., N, D``): singular values
    (descending), the small side's singular vectors ``Q`` (``U`` when ``N < D``, ``V``
    otherwise; ``None`` without ``vectors``), the path's error bound on ``mu`` relative to
    ``mu_1`` and its default tie tolerance on ``s`` (both ``(..., 1)``)."""
    return _gram_spectrum(F, xp, vectors, rtol, method, accuracy, read, False)[:4]


class UnitGram(NamedTuple):
    """The Gram matrix divided by its largest eigenvalue (``M / mu_1``, in the Gram dtype) and
    its eigenvalues (descending, the same dtype; a NumPy array from
    :func:`decompose_host_extreme`): what the extreme-cluster assembly needs."""

    M: Array
    mu: Array


def _gram_spectrum(
    F: Array,
    xp: Any,
    vectors: bool,
    rtol: float,
    method: str,
    accuracy: float | None,
    read: Concrete,
    extreme: bool,
) -> tuple[Array, Array | None, Any, Any, UnitGram | None]:
    """:func:`gram_spectrum` plus, with ``extreme`` (``vectors`` must be true), the Gram path
    without vectors: ``eigvalsh`` only, and the :class:`UnitGram` (``None`` when the exact path
    was taken, which returns its vectors as usual)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    tie_exact = default_tie_rtol(F.shape, F.dtype, xp)
    if method in ("exact", "svd"):
        s, Q = _svd_small_side(F, xp, vectors)
        return s, Q, 0.0, tie_exact, None
    gdtype = gram_dtype(F, xp)
    unit = None
    if accuracy is None:
        accuracy = gram_accuracy(xp, F.dtype)
    M = _gram_matrix(F, xp, gdtype)
    if method == "auto" and gram_refused(M, F.shape[-2:], rtol, accuracy):
        # the exact path's result below, without the eigenvalues that would refuse M
        s, Q = _svd_small_side(F, xp, vectors)
        zero = xp.zeros((1,), dtype=F.dtype)
        return s, Q, zero, xp.full_like(zero, tie_exact), None
    if extreme:  # eigenvalues only, in the Gram dtype; M / mu_1 kept for the assembly
        s, Q, mu_g, err_rel, in_range = eigh_gram(M, F.shape[-2:], xp, False, gdtype)
        top = s[..., :1, None] * s[..., :1, None]
        unit = UnitGram(M / xp.where(top > 0, top, 1.0), mu_g)
        s, mu_rel, err_rel = (xp.astype(a, F.dtype) for a in (s, mu_g, err_rel))
    else:
        s, Q, mu_rel, err_rel, in_range = eigh_gram(M, F.shape[-2:], xp, vectors, F.dtype)
    # ties at the rounding scale of the values used: s is returned in F's dtype (a float32
    # batch's float64 Gram resolves more, but its values are rounded to float32 here)
    tie_gram = xp.full_like(err_rel, default_tie_rtol(F.shape, F.dtype, xp))
    if method == "gram":
        return s, Q, err_rel, tie_gram, unit
    ok = in_range & gram_resolves(mu_rel, err_rel, rtol, accuracy, xp)
    note_gram_verdict(M, F.shape[-2:], ok)

    def exact():
        s2, Q2 = _svd_small_side(F, xp, vectors)
        return s2, Q2, xp.zeros_like(err_rel), xp.full_like(err_rel, tie_exact), None

    return choose(ok, lambda: (s, Q, err_rel, tie_gram, unit), exact, read)


def decompose(
    S: Array,
    xp: Any,
    *,
    gram: bool,
    vectors: bool,
    rtol: float | None,
    concrete: Concrete,
    method: str = "auto",
) -> Spectrum:
    """The spectrum of ``S`` (``gram=False``: its thin SVD, or singular values only) or of the
    feature batch ``F = S`` (``gram=True``: the path chosen by ``method``), and the numerical rank
    ``s_i > rtol·s_1`` (default ``max(m, n)·eps``).

    ``method`` (``gram=True``): ``"auto"`` (the Gram eigh where it resolves the spectrum, else
    ``"exact"``), ``"gram"``, ``"exact"`` (QR of ``F`` and the SVD of its ``R``, small side's
    vectors only) or ``"svd"`` (the full thin SVD of ``F``, both sides, differentiable: for
    higher order). Raises :class:`RankError` when any matrix of the batch has rank 0 (if
    ``concrete`` can tell).
    """
    return _decompose(S, xp, gram, vectors, rtol, concrete, method, False)[0]


def decompose_extreme(
    F: Array, xp: Any, *, rtol: float | None, concrete: Concrete
) -> tuple[Spectrum, UnitGram | None]:
    """:func:`decompose` of a feature batch (``gram=True``, ``method="auto"``, with vectors)
    for :func:`extreme_gram_product`: where the Gram path is taken it runs ``eigvalsh`` only and
    returns the :class:`UnitGram` instead of the vectors (the spectrum then has ``U = Vh =
    None``); the exact path returns its vectors and ``None``."""
    return _decompose(F, xp, True, True, rtol, concrete, "auto", True)


def _decompose(
    S: Array,
    xp: Any,
    gram: bool,
    vectors: bool,
    rtol: float | None,
    concrete: Concrete,
    method: str,
    extreme: bool,
) -> tuple[Spectrum, UnitGram | None]:
    rtol = resolve_rtol(rtol, S.shape, S.dtype, xp)
    m, n = S.shape[-2], S.shape[-1]
    mu_err: Any = 0.0
    tie: Any = default_tie_rtol(S.shape, S.dtype, xp)
    F = None
    unit = None
    if gram and method != "svd":
        s, Q, mu_err, tie, unit = _gram_spectrum(
            S, xp, vectors, rtol, method, None, reader(S, concrete), extreme
        )
        U, Vh, F = (Q, None, S) if m < n else (None, None if Q is None else _mT(xp, Q), S)
        if not vectors:
            F = None
    elif vectors:
        U, s, Vh = xp.linalg.svd(S, full_matrices=False)
    else:
        U, Vh = None, None
        s = xp.linalg.svdvals(S)
    mask, k = _rank(s, rtol, xp)
    _check_rank(k, xp, concrete)
    mu = _square(s, xp) if gram else s
    p = n if gram else min(m, n)
    return Spectrum(U, s, Vh, mu, mask, k, p, gram, mu_err, F, tie), unit


def _check_rank(k: Array, xp: Any, concrete: Concrete) -> None:
    if concrete(xp.any(k == 0)):
        raise RankError(
            "the matrix is zero (numerical rank 0): condition numbers and the regularizers are "
            "undefined"
        )


def host_eligible(F: Array, concrete: Concrete) -> bool:
    """Whether :func:`decompose_host` applies: a single PyTorch float32/float64 matrix on the
    CPU, values readable (``concrete`` is not :func:`never`), not traced or wrapped by a
    ``torch.func`` transform, small side below :data:`EXTREME_MIN`."""
    if concrete is never or not is_torch_array(F) or F.ndim != 2:
        return False
    torch = loaded("torch")
    return (
        F.device.type == "cpu"
        and F.dtype in (torch.float32, torch.float64)
        and min(F.shape) < EXTREME_MIN
        and not _untraceable(F)
        and not torch._C._functorch.is_functorch_wrapped_tensor(F)
    )


def host_gram(F: Array) -> Array:
    """The smaller Gram matrix of a single CPU PyTorch feature batch in float64 (a float32
    batch is cast first, as :func:`gram_dtype` says; a large one from its upper block rows,
    :func:`_symmetric_gram`)."""
    from array_api_compat import array_namespace

    return _gram_matrix(F, array_namespace(F), loaded("torch").float64)


def decompose_host(F: Array, xp: Any, *, rtol: float | None, M: Array | None = None) -> Spectrum:
    """:func:`decompose` of a small feature batch (``gram=True``, ``method="auto"``, with
    vectors; :func:`host_eligible`) whose spectrum lives in NumPy: the Gram matrix
    (:func:`host_gram`, or ``M`` when the caller formed it), its ``eigh`` (or the exact path's
    QR/SVD) and the vectors are computed by PyTorch, the values (``s``, ``mu``, rank, error
    bounds, tie tolerances) are NumPy arrays, on which the core's formulas run a few times
    faster than as small tensors (a CPU array is read without a synchronisation). ``U``/``Vh``/
    ``F`` stay tensors. The same values as :func:`_eigh_tail` and the verdict of
    :func:`gram_resolves`, with the scalars as Python floats (fewer small operations: this is
    every eager training step's path), and, like :func:`eigh_gram`, the exact path for a Gram
    whose trace is not below ``max / (4·max(N, D))``. ``xp``: the PyTorch namespace (for the
    exact path)."""
    return _decompose_host(F, xp, rtol, M, False)[0]


def decompose_host_extreme(
    F: Array, xp: Any, *, rtol: float | None, M: Array | None = None
) -> tuple[Spectrum, UnitGram | None]:
    """:func:`decompose_host` for :func:`extreme_gram_product` (a single CPU PyTorch matrix of
    any size): where the Gram path is taken, ``eigvalsh`` only, a spectrum without vectors and
    the :class:`UnitGram` (its ``mu`` a NumPy array); the exact path returns its vectors and
    ``None`` (as :func:`decompose_extreme`)."""
    return _decompose_host(F, xp, rtol, M, True)


def _decompose_host(
    F: Array, xp: Any, rtol: float | None, M: Array | None, extreme: bool
) -> tuple[Spectrum, UnitGram | None]:
    import numpy as np

    torch = loaded("torch")
    N, D = F.shape
    n, m = min(N, D), max(N, D)
    hdtype = np.float32 if F.dtype == torch.float32 else np.float64
    rtol = resolve_rtol(rtol, F.shape, hdtype, np)
    tie = default_tie_rtol(F.shape, hdtype, np)  # s is in F's dtype
    e, tiny, big = _finfo(np, np.float64)  # the Gram is float64
    M = host_gram(F) if M is None else M
    W = unit = None
    # mu_1 <= trace < max/(4m): every entry finite (|M_ij| <= √(M_ii M_jj)) and mu_1 inside
    # eigh_gram's range; otherwise (NaN, overflow) the exact path, without an eigh of inf
    ok = float(np.trace(M.numpy())) < gram_trace_limit(F.shape, big)
    if ok:
        if extreme:
            mu = torch.linalg.eigvalsh(M)
        else:
            mu, W = torch.linalg.eigh(M)
        mu = np.maximum(mu.numpy()[::-1], 0.0)  # descending
        top = float(mu[0])
        ok = tiny / (e * e) < top  # False for a zero matrix and one whose Gram underflows
    if ok:
        err_rel = float(hdtype(((e * n) * top + (e * math.sqrt(m)) * float(np.sum(mu))) / top))
        mu_rel = mu / top
        s = np.sqrt(mu).astype(hdtype, copy=False)
        accuracy = gram_accuracy(np, hdtype)
        ok = bool(gram_resolves(mu_rel.astype(hdtype, copy=False), err_rel, rtol, accuracy, np))
    if ok:
        if extreme:
            s1 = math.sqrt(top)
            unit = UnitGram(M / (s1 * s1), mu_rel)
        else:
            W = W.flip(-1)
            if W.dtype != F.dtype:
                W = W.to(F.dtype)
    else:
        s_t, W = _svd_small_side(F, xp, True)
        s, err_rel = s_t.numpy(), 0.0
    mask, k = _rank(s, rtol, np)
    _check_rank(k, np, eager)
    U, Vh = (W, None) if N < D or W is None else (None, W.mT)
    return Spectrum(U, s, Vh, _square(s, np), mask, k, D, True, err_rel, F, tie), unit


def _square(s: Array, xp: Any) -> Array:
    """``s**2`` (may over- or underflow where ``s`` does not; the formulas use ``s / s_1``, so
    NumPy's warning about it would only be noise)."""
    if is_numpy_array(s):
        import numpy as np

        with np.errstate(over="ignore", under="ignore"):
            return s * s
    return s * s


def power_factors(s: Array, power: int, xp: Any) -> tuple[Array, Array]:
    """``(first, second)`` with ``s**power = first · second`` for positive ``s``, such that
    ``(x · first) · second`` over- or underflows only where ``x · s**power`` itself does.

    ``s = m·2**e`` with ``m ∈ [1, 2)`` (exact), so ``s**power = m**power · 2**(e·power)``;
    ``m**power`` is representable for ``|power| <= 6`` and the power of two is split into two
    exact factors (the second is 1 unless the exponent leaves the dtype's range; clipped so that
    it is never 0 or inf: 0 · inf would be NaN where the result is an exact 0). A non-positive
    or non-finite ``s`` gives NaN. Computed once per spectrum (a few operations on ``s``'s
    shape); :func:`scale_by_power` applies them.
    """
    ok = (s > 0) & (s < math.inf)  # False for NaN
    safe = xp.where(ok, s, 1.0)
    e = xp.floor(xp.log2(safe))
    m = safe / 2.0**e
    E = e * float(power)
    lim = float(math.floor(math.log2(_finfo(xp, s.dtype)[2])))
    E1 = xp.clip(E, -(lim - 8.0), lim - 7.0)
    first = xp.where(ok, m**power * 2.0**E1, math.nan)  # s = 0, inf, NaN: NaN
    return first, 2.0 ** xp.clip(E - E1, -(lim - 1.0), lim - 1.0)


def scale_by_power(x: Array, s: Array, power: int, xp: Any, weight: Array | None = None) -> Array:
    """``x · s**power`` for positive ``s`` broadcastable to ``x``, in at most three passes and
    without an over- or underflow that the result itself would not have (the two factors of
    :func:`power_factors`). A non-positive or non-finite ``s`` gives NaN. ``weight``
    (broadcastable like ``s``) multiplies the first factor (the chain rule's incoming gradient,
    without another pass over ``x``).
    """
    if power == 0:
        return x if weight is None else x * weight
    first, second = power_factors(s, power, xp)
    if weight is not None:
        first = first * weight
    return (x * first) * second


def gram_gradient(Q: Array, g: Array, F: Array, xp: Any, left: bool | None = None) -> Array:
    """``2 (Q diag(g) Qᵀ) F`` (``left``, ``Q = U``) or ``2 F (Q diag(g) Qᵀ)`` (``Q = V``): the
    gradient with respect to ``F`` from one side's vectors and ``g = d value / d mu``
    (Theorem 4.2) — one GEMM with ``F``. ``left`` defaults to ``N < D`` (the small side; a
    data-parallel rank's ``F_r`` may have ``N_r < D`` with the ``V`` of the global Gram)."""
    if left is None:
        left = F.shape[-2] < F.shape[-1]
    P = (Q * (2.0 * g)[..., None, :]) @ _mT(xp, Q)
    return P @ F if left else F @ P


def assemble(
    sp: Spectrum,
    g: Array,
    xp: Any,
    scale: Array | None = None,
    power: int = 0,
    weight: Array | None = None,
) -> Array:
    """Gradient with respect to the argument from ``g = d value / d mu``, times ``scale**power``.

    Without ``gram``: ``U diag(g) Vᵀ``. With ``gram`` (mu = s²): ``U diag(2 s g) Vᵀ``, which equals
    ``2 F G_H`` for the symmetric gradient ``G_H = V diag(g) Vᵀ`` with respect to H (Theorem 4.2);
    from one side's vectors: ``2 (U diag(g) Uᵀ) F`` (``N < D``) or ``2 F (V diag(g) Vᵀ)``, where
    ``F`` is ``sp.F / scale`` (the unit factor of a spectrum divided by ``s_1``).
    ``scale**power`` (``scale`` of shape ``(..., 1)``) and ``weight`` (shape ``(...)``) are
    applied to the result by :func:`scale_by_power`.
    """
    if sp.gram and sp.F is not None and (sp.U is None or sp.Vh is None):
        left = sp.U is not None
        G = gram_gradient(sp.U if left else _mT(xp, sp.Vh), g, sp.F, xp, left)
        power -= 1  # sp.F = scale · the unit factor
    else:
        d = 2.0 * sp.s * g if sp.gram else g
        G = (sp.U * d[..., None, :]) @ sp.Vh
    w = None if weight is None else weight[..., None, None]
    if scale is None:
        return G if w is None else G * w
    return scale_by_power(G, scale[..., None], power, xp, w)


# --------------------------------------------------------------------------------------------
# The extreme-cluster assembly (eigvalsh + the extreme eigenvectors, single matrices, eager)
# --------------------------------------------------------------------------------------------

#: Smallest Gram size ``min(N, D)`` from which :func:`extreme_gram_product` pays for its
#: inverse iteration (below it the full ``eigh`` is cheaper than the extra small operations).
EXTREME_MIN = 128

#: Most extreme vectors (all clusters together) before the full ``eigh`` is cheaper.
EXTREME_MAX_FRACTION = 8


def extreme_gram_product(unit: UnitGram, a: Any, h: Array, xp: Any) -> Array | None:
    """``2 (a·M/mu_1 + Σ_c h_c Q_c Q_cᵀ)`` — the matrix ``P`` of the gradient ``P F``
    (``N < D``) or ``F P`` (``N >= D``) of a quantity whose derivative is
    ``g = a·mu + h`` (:class:`condreg._core.Rule`), from the unit Gram matrix and the
    eigenvectors ``Q_c`` of the clusters ``c`` where ``h`` is nonzero (runs of equal ``h``:
    the tie sets of the extreme values; :func:`condreg._extreme.gram_cluster`). Equals
    ``2 W diag(g) Wᵀ`` from the full eigh (``W diag(mu) Wᵀ = M / mu_1``) at the cost of
    ``eigvalsh`` and one factorisation per cluster instead of all eigenvectors.

    PyTorch, a single matrix, values readable (it reads ``h``, the eigenvalues and its checks:
    host synchronisations on a GPU). Returns ``None`` — the caller then takes the full eigh —
    when ``h`` or ``a`` is not finite (R_ill's pole), the clusters hold more than
    ``n / EXTREME_MAX_FRACTION`` (at least 8) values, or a cluster is not separated well enough
    (see :func:`condreg._extreme.gram_cluster`)."""
    M = unit.M
    n = M.shape[-1]
    if M.ndim != 2 or not is_torch_array(M):
        return None
    hs = h.tolist()
    av = a if isinstance(a, float) else float(a.reshape(()))
    if not (math.isfinite(av) and all(math.isfinite(v) for v in hs)):
        return None
    runs, i = [], 0
    while i < n:
        if hs[i] == 0.0:
            i += 1
            continue
        j = i + 1
        while j < n and hs[j] == hs[i]:
            j += 1
        runs.append((i, j, hs[i]))
        i = j
    if sum(hi - lo for lo, hi, _ in runs) > max(8, n // EXTREME_MAX_FRACTION):
        return None
    from condreg import _extreme  # the one home of the clusters' inverse iteration

    clusters = []
    for lo, hi, c in runs:
        Q = _extreme.gram_cluster(M, unit.mu, lo, hi, xp)
        if Q is None:
            return None
        clusters.append((Q, c))
    return 2.0 * _extreme.gram_plus_clusters(M, av, clusters)
