"""Every value and gradient against a 50-digit reference (issue 9: float32, ties, extreme scales).

The reference (``tests/_mpref.py``) is mpmath at 50 digits, written from the closed forms of
docs/math.md §1–§4, and is always computed from the matrix condreg actually receives (the
float64/float32/float16 rounding of a construction), so any difference is condreg's error.

Tolerances, from first principles. A backward-stable SVD returns the exact result for
``A + E`` with ``‖E‖ ≤ c·eps·‖A‖``; the forward error is then at most ``cond·c·eps``, where
``cond`` is the relative sensitivity of the quantity (value or gradient) to a relative
perturbation of ``A``. ``cond`` is estimated independently of condreg (:func:`sensitivity`:
float64 closed forms under the perturbations that move σ_1, σ_k and their vectors most, plus
two random ones); it carries all the familiar factors — ``κ`` for values driven by ``σ_k``,
``2κ`` for ``κ(FᵀF)``, ``σ/gap`` for singular vectors, ``1/den`` for R_ill. With ``gram=True``
condreg may use the eigh of a Gram matrix instead (docs/math.md §10.1): its eigenvalues carry an
absolute error ``≈ eps_g·n·μ_1``, i.e. ``σ_k`` an absolute error ``≈ eps_g·n·κ(F)·σ_1/2``, and
condreg accepts that path only where the relative error of every counted ``μ`` is below
``0.1·√eps`` (``0.05·√eps / κ(F)`` in units of ``σ_1``); the effective eps is the smaller of the
two. The comparison allows ``10·√n`` times ``(1 + n)·eps_out + eps_eff·cond``, ``n = max(m, n)``
(``eps_out``: the rounding of the result to the input dtype, and ``n·eps_out`` the dot products
that assemble the gradient; ``10·√n`` is the constant of the backward error of Householder-based
SVD/eigh, with a margin). Measured errors stay below a fifth of it.
"""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np
import pytest

pytest.importorskip("mpmath")  # the test extra; without it this module is skipped

import _mpref as R  # noqa: E402
from conftest import enable_x64

import condreg
from condreg import PoleError, TiedExtremeError
from condreg.testing import matrix_with_spectrum

LIBS = ["numpy", "torch", "jax"]
Q = R.QUANTITIES
EPS64 = float(np.finfo(np.float64).eps)
EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small matrices: one BLAS / torch thread is fastest and immune to a busy machine (with two
    threads, torch's extreme path took 10 s instead of 0.5 s under load). Restored afterwards."""
    from threadpoolctl import threadpool_limits

    try:
        import torch
    except ImportError:  # the NumPy and JAX tests still run
        torch = None
    old = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(old)


# --------------------------------------------------------------------------------------------
# Running condreg on one library
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _jax_mode(dtype):
    """JAX's x64 for float64 work (restored afterwards), its default mode otherwise."""
    if np.dtype(dtype) == np.float64:
        with enable_x64():
            yield
    else:
        yield


class Out:
    """condreg's results as float64 NumPy arrays, with the dtypes it returned."""

    def __init__(self, value, grad, auto, dtypes):
        self.value, self.grad, self.auto, self.dtypes = value, grad, auto, dtypes


def _value_kwargs(q: str, kw: dict) -> dict:
    return {k: v for k, v in kw.items() if k == "compute_dtype" or q != "r_well"}


def run(lib: str, q: str, A: np.ndarray, *, gram: bool, autodiff: bool = True, **kw) -> Out:
    """Value, closed-form gradient (``condreg.*_grad``) and, for torch and JAX, the gradient of
    the adapter's autodiff (``torch.autograd.grad`` / ``jax.grad`` of ``condreg.<q>``)."""
    f, fg = getattr(condreg, q), getattr(condreg, q + "_grad")
    vkw = _value_kwargs(q, kw)
    if lib == "numpy":
        v, G = f(A, gram=gram, **vkw), fg(A, gram=gram, **kw)
        return Out(_f64(v), _f64(G), None, (v.dtype, G.dtype))
    if lib == "torch":
        torch = pytest.importorskip("torch")
        T = torch.from_numpy(A.copy())
        G = fg(T, gram=gram, **kw)
        auto = None
        X = T.clone().requires_grad_(True)
        v = f(X, gram=gram, **vkw)
        dtypes = [v.dtype, G.dtype]
        if autodiff:
            (auto,) = torch.autograd.grad(v, X)
            dtypes.append(auto.dtype)
            auto = _f64(auto)
        return Out(_f64(v), _f64(G), auto, tuple(dtypes))
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    with _jax_mode(A.dtype):
        X = jnp.asarray(A)
        assert X.dtype == A.dtype
        v, G = f(X, gram=gram, **vkw), fg(X, gram=gram, **kw)
        dtypes = [v.dtype, G.dtype]
        auto = None
        if autodiff:
            auto = jax.grad(lambda Y: f(Y, gram=gram, **vkw))(X)
            dtypes.append(auto.dtype)
            auto = _f64(auto)
        return Out(_f64(v), _f64(G), auto, tuple(dtypes))


def _f64(x) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        return x.detach().double().cpu().numpy()
    return np.asarray(x).astype(np.float64)


# --------------------------------------------------------------------------------------------
# Tolerances: an independent float64 sensitivity estimate
# --------------------------------------------------------------------------------------------


def _closed_f64(q: str, A: np.ndarray, gram: bool, rtol: float, tie: float):
    """float64 NumPy closed forms (docs/math.md §1–§4), min-norm within ``tie·σ_1``."""
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    k = int(np.sum(s > rtol * s[0]))
    top = np.abs(s[:k] - s[0]) <= tie * s[0]
    bot = np.abs(s[:k] - s[k - 1]) <= tie * s[0]

    def avg(mask, power=0):
        w = np.zeros_like(s)
        w[:k] = mask * s[:k] ** power / mask.sum()
        return (U * w) @ Vt

    m, n = A.shape
    if not gram:
        s1, sk = s[0], s[k - 1]
        if q == "condition_number":
            return s1 / sk, avg(top) / sk - s1 / sk**2 * avg(bot)
        if q == "r_well":
            return 0.5 * s1**2 - np.sum(A * A) / (2 * min(m, n)), s1 * avg(top) - A / min(m, n)
        den = np.sum(s[:k] ** 2 - sk**2) / (2 * k)
        return 1 / den, (sk * avg(bot) - A / k) / den**2
    mu = s**2
    m1, mk = mu[0], mu[k - 1]
    AH = A @ (A.T @ A)
    if q == "condition_number":
        return m1 / mk, 2 * (avg(top, 1) / mk - m1 / mk**2 * avg(bot, 1))
    if q == "r_well":
        return 0.5 * m1**2 - np.sum(mu**2) / (2 * n), 2 * (m1 * avg(top, 1) - AH / n)
    den = np.sum(mu[:k] ** 2 - mk**2) / (2 * k)
    return 1 / den, 2 * (mk * avg(bot, 1) - AH / k) / den**2


@functools.cache
def _sensitivity_cached(key, q, gram, rtol, tie):
    A = _MATRICES[key].astype(np.float64)
    c = np.max(np.abs(A))
    A = A / c  # scale-free: the relative sensitivity does not depend on the scale
    v0, g0 = _closed_f64(q, A, gram, rtol, tie)
    rng = np.random.default_rng(12345)
    h = 1e-10  # relative step: h·cond ≪ 1 for cond ≤ 1e8, float64 noise ≪ h·cond
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    k = int(np.sum(s > rtol * s[0]))
    ends = sorted({0, 1, k - 2, k - 1} & set(range(k)))
    # The worst directions for the extreme singular values and vectors, u_i v_jᵀ (i, j at both
    # ends of the spectrum), and two random ones.
    directions = [np.outer(U[:, i], Vt[j]) for i in ends for j in ends]
    directions += [rng.standard_normal(A.shape) for _ in range(2)]
    cv = cg = 0.0
    for E in directions:
        E = E * (h * np.linalg.norm(A) / np.linalg.norm(E))
        v1, g1 = _closed_f64(q, A + E, gram, rtol, tie)
        cv = max(cv, abs(v1 - v0) / abs(v0) / h)
        cg = max(cg, np.linalg.norm(g1 - g0) / np.linalg.norm(g0) / h)
    return max(cv, 1.0), max(cg, 1.0)


_MATRICES: dict = {}


def _register(A: np.ndarray) -> tuple:
    key = (A.dtype.str, A.shape, A.tobytes())
    _MATRICES[key] = A
    return key


def sensitivity(q, A, *, gram, rtol, tie=0.0):
    """(cond of the value, cond of the gradient) of ``q`` at ``A``: relative change per relative
    perturbation (Frobenius norms), the largest over the directions ``u_i v_jᵀ`` with ``i, j`` at
    both ends of the spectrum (where σ_1, σ_k and their vectors move most) and two random ones;
    at least 1."""
    # A tie window in the estimate must exceed the split h·‖A‖ a perturbation makes.
    return _sensitivity_cached(_register(A), q, gram, rtol, max(tie, 1e-8) if tie else 0.0)


def eps_effective(A, *, gram, eps_c, eps_g, kappa_F):
    """The per-singular-value error of condreg's path, in units of ``eps·σ_1`` (module doc)."""
    if not gram:
        return eps_c
    n = max(A.shape)
    return max(eps_c, min(eps_g * n * kappa_F, 0.05 * math.sqrt(eps_c) / kappa_F))


def tolerance(A, cond, *, eps_out, eps_eff):
    """``10·√n·((1 + n)·eps_out + eps_eff·cond)``, ``n = max(m, n)`` (module doc); ``n·eps_out``
    is the dot-product bound γ_n of the final assembly ``G = U diag(d) Vᵀ`` (or ``2 F·P``), an
    error the backward-stable decomposition does not account for."""
    n = max(A.shape)
    return 10 * math.sqrt(n) * ((1 + n) * eps_out + eps_eff * cond)


def _rtol(A, dtype=None):
    """condreg's default rank tolerance ``max(m, n)·eps`` (of ``dtype``, default ``A``'s)."""
    return max(A.shape) * float(np.finfo(dtype or A.dtype).eps)


def _eps(dtype) -> float:
    return float(np.finfo(dtype).eps)


def _eps_gram(lib: str, dtype) -> float:
    """condreg forms and decomposes a float32 Gram in float64 where the backend has float64
    (NumPy, torch; JAX only with x64, which these float32 tests leave off)."""
    return EPS32 if (lib == "jax" and np.dtype(dtype) == np.float32) else EPS64


def check_against(out: Out, ref, A, *, q, gram, lib, rtol, tie=0.0, eps_c=None, label=""):
    """Assert value, closed-form gradient and autodiff gradient against the reference."""
    eps_out = _eps(A.dtype)
    eps_c = eps_out if eps_c is None else eps_c
    kappa_F = float(ref_sv_kappa(ref))
    eff = eps_effective(A, gram=gram, eps_c=eps_c, eps_g=_eps_gram(lib, A.dtype), kappa_F=kappa_F)
    cv, cg = sensitivity(q, A, gram=gram, rtol=rtol, tie=tie)
    tv = tolerance(A, cv, eps_out=eps_out, eps_eff=eff)
    tg = tolerance(A, cg, eps_out=eps_out, eps_eff=eff)
    ev = R.rel_err(out.value, ref.ref.value)
    assert ev <= tv, f"{label} {q} gram={gram} value: {ev:.3g} > {tv:.3g}"
    eg = R.rel_err(out.grad, ref.ref.grad)
    assert eg <= tg, f"{label} {q} gram={gram} closed-form gradient: {eg:.3g} > {tg:.3g}"
    if out.auto is not None:
        ea = R.rel_err(out.auto, ref.ref.grad)
        assert ea <= tg, f"{label} {q} gram={gram} autodiff gradient: {ea:.3g} > {tg:.3g}"
    return ev, eg


class RefCase:
    def __init__(self, ref, sv):
        self.ref, self.sv = ref, sv


def ref_sv_kappa(case: RefCase):
    s = case.sv.s
    return s[0] / s[case.ref.k - 1]


# --------------------------------------------------------------------------------------------
# The references, cached: one 50-digit SVD per matrix
# --------------------------------------------------------------------------------------------


@functools.cache
def _svd_cached(key):
    return R.svd50(_MATRICES[key])


def svd_of(A):
    return _svd_cached(_register(A))


@functools.cache
def _ref_cached(key, q, gram, rtol, tie):
    sv = _svd_cached(key)
    return RefCase(R.reference(q, None, gram=gram, rtol=rtol, tie=tie, sv=sv), sv)


def ref_of(q, A, *, gram, rtol, tie=0.0):
    return _ref_cached(_register(A), q, gram, rtol, tie)


def _dtype(name):
    return {"float64": np.float64, "float32": np.float32}[name]


# --------------------------------------------------------------------------------------------
# The reference itself
# --------------------------------------------------------------------------------------------


def test_reference_matches_lapack_and_exact_construction():
    """The reference agrees with float64 LAPACK on a benign matrix (to float64 accuracy), and the
    50-digit construction has exactly tied singular values (to 45 digits)."""
    A = matrix_with_spectrum([3.0, 2.0, 1.0, 0.5], 7, 4, seed=0)
    sv = R.svd50(A)
    s64 = np.linalg.svd(A, compute_uv=False)
    assert max(abs(float(a) - b) for a, b in zip(sv.s, s64, strict=True)) < 1e-14
    UtU = sv.U.T @ sv.U
    assert max(abs(UtU[i, j] - (i == j)) for i in range(4) for j in range(4)) < 1e-45
    for q in Q:
        for gram in (False, True):
            v, G = _closed_f64(q, A, gram, _rtol(A), 0.0)
            ref = R.reference(q, A, gram=gram, sv=sv)
            assert R.rel_err(v, ref.value) < 1e-13
            assert R.rel_err(G, ref.grad) < 1e-13
    M = R.construct(["2", "2", "1", "0.5", "0.5"], 6, 5, seed=4)
    s = R.svd50(M).s
    assert abs(s[0] - s[1]) < R.ctx.mpf(10) ** -45 and abs(s[3] - s[4]) < R.ctx.mpf(10) ** -45
    assert abs(s[2] - 1) < R.ctx.mpf(10) ** -45


# --------------------------------------------------------------------------------------------
# Well-separated spectra: κ from 1e1 to 1e7 (float64), to 1e3 (float32)
# --------------------------------------------------------------------------------------------

SEPARATED = [("float64", kappa) for kappa in (1e1, 1e3, 1e5, 1e7)] + [
    ("float32", kappa) for kappa in (1e1, 1e2, 1e3)
]


def separated_matrix(dtype_name, kappa, shape):
    m, n = shape
    s = 3.0 * np.logspace(0.0, -math.log10(kappa), min(m, n))
    return matrix_with_spectrum(s, m, n, seed=int(math.log10(kappa)) + m).astype(_dtype(dtype_name))


# JAX runs the same core as NumPy through its adapter; eager JAX compiles every new shape
# (~1.5 s), so it takes the ends of the κ range on the tall shape only.
SEPARATED_CASES = [
    pytest.param(lib, d, k, shape, id=f"{lib}-{d}-{k:g}-{name}")
    for lib in LIBS
    for d, k in SEPARATED
    for shape, name in (((9, 6), "tall"), ((5, 8), "wide"))
    if lib != "jax" or (k in (1e1, 1e3, 1e7) and name == "tall")
]


@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
@pytest.mark.parametrize(("lib", "dtype_name", "kappa", "shape"), SEPARATED_CASES)
def test_separated_spectra(lib, dtype_name, kappa, gram, shape):
    A = separated_matrix(dtype_name, kappa, shape)
    rtol = _rtol(A)
    for q in Q:
        out = run(lib, q, A, gram=gram)
        assert all(np.dtype(str(d).replace("torch.", "")) == A.dtype for d in out.dtypes)
        ref = ref_of(q, A, gram=gram, rtol=rtol)
        assert ref.ref.k == min(shape)
        check_against(out, ref, A, q=q, gram=gram, lib=lib, rtol=rtol, label=lib)


# --------------------------------------------------------------------------------------------
# Issue 9's float32 defect: 128×64, σ spread over 10^2.5, σ_{k-1}/σ_k = 1.23
# --------------------------------------------------------------------------------------------


@functools.cache
def issue9_matrix():
    s = np.logspace(0.0, -2.5, 64)
    s[-1] = s[-2] / 1.23
    return matrix_with_spectrum(s, 128, 64, seed=7).astype(np.float32)


@pytest.mark.parametrize("gram", [True, False], ids=["gram", "S"])
@pytest.mark.parametrize("lib", LIBS)
def test_issue9_float32_defect(lib, gram):
    F = issue9_matrix()
    s = svd_of(F).s
    ratio = float(s[-2] / s[-1])
    assert abs(ratio - 1.23) < 1e-5 and 10**2.5 < float(s[0] / s[-1]) < 10**2.6
    rtol = _rtol(F)
    tie32 = 32 * math.sqrt(128) * EPS32
    for q in Q:
        ref = ref_of(q, F, gram=gram, rtol=rtol, tie=tie32)
        # Within condreg's own default tie window nothing is tied with σ_min (nor σ_1).
        assert ref.ref.bottom == [63] and ref.ref.top == [0]
        out = run(lib, q, F, gram=gram)
        check_against(out, ref, F, q=q, gram=gram, lib=lib, rtol=rtol, label="issue9")
        # A differentiable point: "raise" must not raise.
        getattr(condreg, q + "_grad")(_as(lib, F), gram=gram, subgradient="raise")
    if gram:
        # The defect this guards against: averaging the 20 values below √(16·128·eps)·σ_1 as
        # "tied" (ties decided on μ with tolerance tie_rtol·μ_1) is wrong by far more than tol.
        wrong = R.reference("condition_number", None, gram=True, rtol=rtol, tie=0.2, sv=svd_of(F))
        right = ref_of("condition_number", F, gram=True, rtol=rtol, tie=tie32)
        assert len(wrong.bottom) >= 15
        assert R.rel_err(R.to_float(wrong.grad), right.ref.grad) > 0.5


def _as(lib, A):
    if lib == "numpy":
        return A
    if lib == "torch":
        import torch

        return torch.from_numpy(A.copy())
    import jax.numpy as jnp

    return jnp.asarray(A)


# --------------------------------------------------------------------------------------------
# Exact ties, built in 50 digits and rounded
# --------------------------------------------------------------------------------------------

TIES = {
    # name: (singular values, m, n, tied at top, tied at bottom)
    "top3": (["3", "3", "3", "1.5", "0.7", "0.4"], 9, 6, True, False),
    "bottom3": (["3", "2.2", "1.5", "0.7", "0.7", "0.7"], 9, 6, False, True),
    "both2-wide": (["2", "2", "1.2", "0.5", "0.5"], 5, 8, True, True),
}


@functools.cache
def tie_case(name, dtype_name):
    s, m, n, _, _ = TIES[name]
    M = R.construct(s, m, n, seed=3)
    return M, R.to_float(M, _dtype(dtype_name))


def _raises_expected(q, top, bottom):
    return {"condition_number": top or bottom, "r_well": top, "r_ill": bottom}[q]


@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
@pytest.mark.parametrize("name", list(TIES))
@pytest.mark.parametrize("lib", LIBS)
def test_exact_ties(lib, name, dtype_name, gram):
    """Min-norm subgradient = the reference's average of the tied terms: that of the rounded
    matrix with condreg's default tie window (the rounding splits the tie by ~eps·σ_1, inside
    the window), and that of the unrounded exact tie (the two differ by O(eps·σ_1/gap), inside
    the same tolerance). ``subgradient="raise"`` raises exactly where the extreme is tied."""
    s, m, n, top, bottom = TIES[name]
    M, A = tie_case(name, dtype_name)
    rtol = _rtol(A)
    tie = 32 * math.sqrt(max(m, n)) * _eps(A.dtype)
    for q in Q:
        ref = ref_of(q, A, gram=gram, rtol=rtol, tie=tie)
        mult = s.count(s[0]), s.count(s[-1])
        assert (len(ref.ref.top), len(ref.ref.bottom)) == mult  # the split is inside the window
        out = run(lib, q, A, gram=gram)
        check_against(out, ref, A, q=q, gram=gram, lib=lib, rtol=rtol, tie=tie, label=name)
        exact = R.reference(q, M, gram=gram, rtol=rtol, tie=1e-30)
        cv, cg = sensitivity(q, A, gram=gram, rtol=rtol, tie=tie)
        eff = eps_effective(
            A,
            gram=gram,
            eps_c=_eps(A.dtype),
            eps_g=_eps_gram(lib, A.dtype),
            kappa_F=float(ref_sv_kappa(ref)),
        )
        tg = tolerance(A, cg, eps_out=_eps(A.dtype), eps_eff=eff)
        assert R.rel_err(out.grad, exact.grad) <= tg
        if out.auto is not None:
            assert R.rel_err(out.auto, exact.grad) <= tg
        grad = getattr(condreg, q + "_grad")
        ctx = _jax_mode(A.dtype) if lib == "jax" else contextlib.nullcontext()
        with ctx:
            X = _as(lib, A)
            if _raises_expected(q, top, bottom):
                with pytest.raises(TiedExtremeError):
                    grad(X, gram=gram, subgradient="raise")
            else:
                grad(X, gram=gram, subgradient="raise")


@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_batch(lib, gram):
    """A batch (2, 9, 6) — an exact top tie next to a generic κ = 1e3 matrix — gives, matrix by
    matrix, the same results against the reference as one matrix at a time (ties decided per
    matrix)."""
    A_tie = tie_case("top3", "float64")[1]
    A_gen = separated_matrix("float64", 1e3, (9, 6))
    B = np.stack([A_tie, A_gen])
    tie = 32 * math.sqrt(9) * EPS64
    for q in Q:
        out = run(lib, q, B, gram=gram, autodiff=False)
        assert out.value.shape == (2,) and out.grad.shape == B.shape
        for i, (A, w) in enumerate(((A_tie, tie), (A_gen, 0.0))):
            rtol = _rtol(A)
            ref = ref_of(q, A, gram=gram, rtol=rtol, tie=w)
            one = Out(out.value[i], out.grad[i], None, out.dtypes)
            check_against(one, ref, A, q=q, gram=gram, lib=lib, rtol=rtol, tie=w, label="batch")


# --------------------------------------------------------------------------------------------
# Extreme scales
# --------------------------------------------------------------------------------------------

SCALES = [("float64", c) for c in (1e-150, 1e-60, 1e60, 1e150)] + [
    ("float32", c) for c in (1e-30, 1e-7, 1e7, 1e30)
]
#: How each quantity scales with S → c·S: (value, gradient) exponents; with gram=True doubled
#: for the value of H = FᵀF (gradient w.r.t. F: one less than the value's).
POWERS = {"condition_number": (0, -1), "r_well": (2, 1), "r_ill": (-2, -3)}


def _powers(q, gram):
    pv, pg = POWERS[q]
    return (2 * pv, 2 * pv - 1) if gram else (pv, pg)


@functools.cache
def scale_base():
    # 9×6, the shape of the separated and tied cases (JAX compiles each new shape once).
    return matrix_with_spectrum(np.linspace(2.0, 0.5, 6), 9, 6, seed=1)


@pytest.mark.parametrize("base_name", ["generic", "ties"])
@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
@pytest.mark.parametrize(("dtype_name", "c"), SCALES, ids=[f"{d}-{c:g}" for d, c in SCALES])
@pytest.mark.parametrize("lib", LIBS)
def test_extreme_scales(lib, dtype_name, c, gram, base_name, request):
    """c·S for c = 1e±150 (float64), 1e±30 (float32): where the exact result is representable
    (largest magnitude within [1000·tiny, max/1000]) condreg matches the reference of the rounded
    scaled matrix, and c^power times the reference of S; κ and its gradient always are. Where
    it is not, the result overflows to inf or underflows below tiny, never NaN. ``ties``: the
    exact ties of ``both2-wide`` (top and bottom), scaled in 50 digits, then rounded once."""
    dt = _dtype(dtype_name)
    if base_name == "generic":
        A = (scale_base() * c).astype(dt)
        base = scale_base().astype(dt)
        tie = 0.0
    else:
        M = tie_case("both2-wide", "float64")[0]
        A = R.to_float(M * R.ctx.mpf(c), dt)
        base = R.to_float(M, dt)
        tie = 32 * math.sqrt(max(A.shape)) * _eps(dt)
    rtol = _rtol(A)
    fi = np.finfo(dt)
    for q in Q:
        ref = ref_of(q, A, gram=gram, rtol=rtol, tie=tie)
        ref1 = ref_of(q, base, gram=gram, rtol=rtol, tie=tie)
        if tie:
            assert len(ref.ref.top) == 2 and len(ref.ref.bottom) == 2
        out = run(lib, q, A, gram=gram)
        assert all(np.dtype(str(d).replace("torch.", "")) == A.dtype for d in out.dtypes)
        cv, cg = sensitivity(q, A, gram=gram, rtol=rtol, tie=tie)
        eff = eps_effective(
            A, gram=gram, eps_c=_eps(dt), eps_g=_eps_gram(lib, dt), kappa_F=float(ref_sv_kappa(ref))
        )
        pv, pg = _powers(q, gram)
        cm = R.ctx.mpf(c)
        for what, x, r, r1, p, cond in (
            ("value", out.value, ref.ref.value, ref1.ref.value, pv, cv),
            ("gradient", out.grad, ref.ref.grad, ref1.ref.grad, pg, cg),
            ("autodiff", out.auto, ref.ref.grad, ref1.ref.grad, pg, cg),
        ):
            if x is None:
                continue
            assert not np.isnan(x).any(), (q, what)
            tol = tolerance(A, cond, eps_out=_eps(dt), eps_eff=eff)
            if R.representable(r, dt):
                assert np.isfinite(x).all(), (q, what)
                assert R.rel_err(x, r) <= tol, (q, what, R.rel_err(x, r), tol)
                # The scaling law, against the unscaled reference (c·S is rounded: one more
                # relative perturbation of eps, amplified by cond).
                assert R.rel_err(x, r1 * cm**p) <= 2 * tol, (q, what)
            elif R.max_abs(r) > R.ctx.mpf(float(fi.max)) * 1000:
                assert np.isinf(x).any(), (q, what, "overflow expected")
            elif R.max_abs(r) < R.ctx.mpf(float(fi.tiny)) / 1000:
                assert np.max(np.abs(x)) < fi.tiny, (q, what, "underflow expected")
        if q == "condition_number":
            assert R.representable(ref.ref.value, dt) and R.representable(ref.ref.grad, dt)


# --------------------------------------------------------------------------------------------
# float16 / bfloat16 (torch): computed in float32 (or compute_dtype), returned in the input dtype
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compute", [None, "float64"])
@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_precision_torch(half, gram, compute):
    torch = pytest.importorskip("torch")
    hdt = getattr(torch, half)
    T = torch.from_numpy(scale_base()).to(hdt)
    A = T.double().numpy()  # exactly the half-precision entries
    u_out = {"float16": 2.0**-11, "bfloat16": 2.0**-8}[half]  # unit roundoff of the output
    kw = {} if compute is None else {"compute_dtype": torch.float64}
    eps_c = EPS32 if compute is None else EPS64
    rtol = _rtol(A, np.float32 if compute is None else np.float64)
    for q in Q:
        ref = ref_of(q, A, gram=gram, rtol=rtol)
        X = T.clone().requires_grad_(True)
        v = getattr(condreg, q)(X, gram=gram, **_value_kwargs(q, kw))
        (auto,) = torch.autograd.grad(v, X)
        G = getattr(condreg, q + "_grad")(T, gram=gram, **kw)
        assert v.dtype == hdt and auto.dtype == hdt and G.dtype == hdt
        cv, cg = sensitivity(q, A, gram=gram, rtol=rtol)
        # Rounding the result to the half dtype: ≤ u (value), ≤ u entrywise (gradient, so also
        # in the Frobenius norm); plus the float32/float64 computation (module doc), doubled.
        tv = 2 * u_out + tolerance(A, cv, eps_out=0.0, eps_eff=eps_c)
        tg = 2 * u_out + tolerance(A, cg, eps_out=0.0, eps_eff=eps_c)
        assert R.rel_err(_f64(v), ref.ref.value) <= tv
        assert R.rel_err(_f64(G), ref.ref.grad) <= tg
        assert R.rel_err(_f64(auto), ref.ref.grad) <= tg


# --------------------------------------------------------------------------------------------
# float32 κ to 1e-3 up to κ(F) = 1e6 when computed in float64
# --------------------------------------------------------------------------------------------


@functools.cache
def kappa6_matrix(shape):
    m, n = shape
    return matrix_with_spectrum(np.logspace(0, -6, min(m, n)), m, n, seed=2).astype(np.float32)


KAPPA6_CASES = [
    pytest.param(lib, shape, id=f"{lib}-{name}")
    for lib in LIBS
    for shape, name in (((24, 12), "tall"), ((12, 24), "wide"))
    if lib != "jax" or name == "tall"  # one shape for JAX: each new one compiles
]


@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
@pytest.mark.parametrize(("lib", "shape"), KAPPA6_CASES)
def test_float32_kappa_1e6_in_float64(lib, gram, shape):
    """Issue 9: "float32 κ accurate to 1e-3 relative up to κ(F) = 1e6 when computed in float64".
    Relative to κ of the float32 matrix actually given (the rounding of F to float32 itself
    moves σ_k by up to ~eps32·σ_1, i.e. κ by ~10 % here: not condreg's error). The first-
    principles bound (float64 computation, float32 output) is far tighter; both are asserted."""
    F = kappa6_matrix(shape)
    # Computed in float64, the default rank rule is max(m, n)·eps(float64) (with float32's,
    # 24·eps32 = 2.9e-6 > 1e-6 would cut σ_k itself).
    rtol = _rtol(F, np.float64)
    cdt = {"numpy": np.float64}.get(lib)
    if lib == "torch":
        import torch

        cdt = torch.float64
    elif lib == "jax":
        import jax.numpy as jnp

        cdt = jnp.float64
    ref = ref_of("condition_number", F, gram=gram, rtol=rtol)
    assert 0.9e6 < float(ref_sv_kappa(ref)) < 1.1e6 and ref.ref.k == min(shape)
    with _jax_mode(np.float64) if lib == "jax" else contextlib.nullcontext():
        out = run(lib, "condition_number", F, gram=gram, compute_dtype=cdt)
    assert all(np.dtype(str(d).replace("torch.", "")) == np.float32 for d in out.dtypes)
    ev = R.rel_err(out.value, ref.ref.value)
    assert ev <= 1e-3
    cv, cg = sensitivity("condition_number", F, gram=gram, rtol=rtol)
    eff = eps_effective(F, gram=gram, eps_c=EPS64, eps_g=EPS64, kappa_F=1e6)
    assert ev <= tolerance(F, cv, eps_out=EPS32, eps_eff=eff)
    tg = tolerance(F, cg, eps_out=EPS32, eps_eff=eff)
    assert R.rel_err(out.grad, ref.ref.grad) <= tg
    if out.auto is not None:
        assert R.rel_err(out.auto, ref.ref.grad) <= tg


# --------------------------------------------------------------------------------------------
# R_ill's pole
# --------------------------------------------------------------------------------------------


@functools.cache
def pole_matrix(kind, dtype_name):
    if kind == "equal":  # all σ = 1.7: 1.7·(orthonormal columns), built in 50 digits
        M = R.construct(["1.7"] * 6, 9, 6, seed=9)
    elif kind == "rank1":  # rank 1: one nonzero σ
        M = R.construct(["2.5"] + ["0"] * 5, 9, 6, seed=9)
    else:  # near the pole: σ split by 1e-3 relative, a real difference far outside the window
        M = R.construct(["1.7"] * 5 + ["1.6983"], 9, 6, seed=9)
    return R.to_float(M, _dtype(dtype_name))


@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
@pytest.mark.parametrize("lib", LIBS)
def test_r_ill_pole(lib, dtype_name, gram, request):
    """At the pole (all nonzero σ equal, rank 1 included) R_ill = +inf (documented) and its
    gradient raises PoleError (closed form, torch backward, eager jax.grad). Just off the pole
    (σ_k 1e-3 below the rest) it is finite and matches the reference."""
    torch = pytest.importorskip("torch") if lib == "torch" else None
    for kind in ("equal", "rank1"):
        A = pole_matrix(kind, dtype_name)
        rtol = _rtol(A)
        tie = 32 * math.sqrt(9) * _eps(A.dtype)
        ref = ref_of("r_ill", A, gram=gram, rtol=rtol, tie=tie)
        assert ref.ref.value == R.ctx.inf and ref.ref.k == (6 if kind == "equal" else 1)
        with _jax_mode(A.dtype) if lib == "jax" else contextlib.nullcontext():
            X = _as(lib, A)
            v = condreg.r_ill(X, gram=gram)
            assert np.isposinf(_f64(v)), (kind, v)
            with pytest.raises(PoleError):
                condreg.r_ill_grad(X, gram=gram)
            if lib == "torch":
                Y = X.clone().requires_grad_(True)
                with pytest.raises(PoleError):
                    torch.autograd.grad(condreg.r_ill(Y, gram=gram), Y)
            elif lib == "jax":
                import jax

                with pytest.raises(PoleError):
                    jax.grad(lambda Y: condreg.r_ill(Y, gram=gram))(X)
    A = pole_matrix("near", dtype_name)
    rtol = _rtol(A)
    ref = ref_of("r_ill", A, gram=gram, rtol=rtol)
    out = run(lib, "r_ill", A, gram=gram)
    check_against(out, ref, A, q="r_ill", gram=gram, lib=lib, rtol=rtol, label="near-pole")


# --------------------------------------------------------------------------------------------
# The engine's "extreme" route (large single feature batches, PyTorch on the CPU)
# --------------------------------------------------------------------------------------------


@functools.cache
def hadamard_matrix(bottom_tie: bool):
    """128×64 with exactly tied σ, exact in float64: F = [H diag(s) H / 64; 0] with H the 64×64
    Sylvester Hadamard matrix (H/8 orthogonal), s dyadic; σ_1 tied 3 times, and σ_k twice when
    ``bottom_tie``. Its SVD is known exactly (U = [H/8; 0], V = H/8): the 50-digit reference
    needs no decomposition."""
    H = np.array([[1.0]])
    while H.shape[0] < 64:
        H = np.block([[H, H], [H, -H]])
    if bottom_tie:
        s = np.concatenate([[4.0, 4.0, 4.0], np.linspace(3.5, 1.25, 59), [1.0, 1.0]])
    else:
        s = np.concatenate([[4.0, 4.0, 4.0], np.linspace(3.5, 1.0, 61)])
    s = np.round(s * 64) / 64  # dyadic: the product below is exact
    F = np.zeros((128, 64))
    F[:64] = (H * s) @ H / 64
    U = np.zeros((128, 64))
    U[:64] = H / 8  # entries ±1/8: exact
    return F, R.make_svd(F, [R.ctx.mpf(x) for x in s], U, H / 8)


EXTREME_CASES = ("issue9", "hadamard-top3", "hadamard-top3-bottom2")


@pytest.mark.parametrize("case", EXTREME_CASES)
def test_extreme_route(case, monkeypatch):
    """The engine's ``"extreme"`` route (values from ``eigvalsh``, the gradient from the extreme
    clusters' certified eigenvectors; PyTorch on the CPU, a single matrix) against the reference,
    float64, N = 128 ≥ D = 64 (``EXTREME_MIN`` lowered to 64 for this batch). ``"issue9"``
    (κ(F) = 355): the Gram is refused, exact path; ``"hadamard-top3"``: a tied top cluster,
    certified (the route proper); ``"hadamard-top3-bottom2"``: both ends tied."""
    pytest.importorskip("torch")
    from condreg import _extreme, _spectrum

    monkeypatch.setattr(_spectrum, "EXTREME_MIN", 64)
    taken = []
    real = _extreme.gram_product

    def spy(*args, **kwargs):
        P = real(*args, **kwargs)
        taken.append(P is not None)
        return P

    monkeypatch.setattr(_extreme, "gram_product", spy)
    if case == "issue9":
        F = issue9_matrix().astype(np.float64)  # same entries as the float32 batch: same SVD
        sv = svd_of(issue9_matrix())
        tie = 0.0
    else:
        F, sv = hadamard_matrix(case.endswith("bottom2"))
        tie = 1e-12
    rtol = _rtol(F)
    kappa = float(sv.s[0] / sv.s[-1])
    for q in Q:
        ref = R.reference(q, None, gram=True, rtol=rtol, tie=tie, sv=sv)
        out = run("torch", q, F, gram=True, **({} if q == "r_well" else {"rtol": rtol}))
        # eigenvalues resolved to the dense engine's accuracy, eigenvectors accepted at a
        # backward-stable residual: the dense Gram path's error model (eps_effective)
        eff = eps_effective(F, gram=True, eps_c=EPS64, eps_g=EPS64, kappa_F=kappa)
        cv, cg = sensitivity(q, F, gram=True, rtol=rtol, tie=tie)
        tv = tolerance(F, cv, eps_out=EPS64, eps_eff=eff)
        tg = tolerance(F, cg, eps_out=EPS64, eps_eff=eff)
        assert R.rel_err(out.value, ref.value) <= tv, (q, R.rel_err(out.value, ref.value), tv)
        assert R.rel_err(out.auto, ref.grad) <= tg, (q, R.rel_err(out.auto, ref.grad), tg)
    if case == "hadamard-top3":
        assert taken and all(taken)  # every quantity's gradient from the certified clusters


# --------------------------------------------------------------------------------------------
# float32 features on a float64 Gram: ties at the float32 values' rounding scale
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax-x64"])
def test_float32_gram_ties_decided_on_float32_rounded_sigma(lib):
    """An exact tie rounded to float32 (split ~2e-8) is one tie set, not 2 of its 3 values: the
    float64 Gram's values are rounded to float32, so ties are decided at float32's scale (as
    gram=False and JAX's 32-bit mode do). Either convention passes here — the cluster averaged,
    or no tie at all (the exact gradient of the given matrix) — but not a partial tie set (a
    float64 window on float32-rounded values gave r_well_grad 85 % / 267 % off the two
    references). Likewise R_ill at a float32-rounded pole: +inf, or the exact R_ill of the given
    matrix (2.86e6 here), not 1.34e6."""
    if lib == "jax-x64":  # float32 arrays, JAX's x64 on: a float64 Gram, as NumPy/torch
        with enable_x64():
            _float32_gram_tie_checks("jax")
    else:
        _float32_gram_tie_checks(lib)


def _float32_gram_tie_checks(lib):
    A = R.to_float(R.construct(["1.7", "1.7", "1.7", "1"], 8, 4, seed=3), np.float32)
    sv = svd_of(A)
    assert float((sv.s[0] - sv.s[2]) / sv.s[0]) < 1e-7  # the rounding split of the tie
    tol = 1e-5  # float32 output rounding, a well-conditioned 8×4 (σ gap ≥ 0.7 outside the tie)
    G = _f64(condreg.r_well_grad(_as(lib, A), gram=True))
    averaged = R.reference("r_well", None, gram=True, tie=1e-5, sv=sv)
    exact = R.reference("r_well", None, gram=True, tie=0.0, sv=sv)
    assert len(averaged.top) == 3 and len(exact.top) == 1
    assert min(R.rel_err(G, averaged.grad), R.rel_err(G, exact.grad)) <= tol
    P = R.to_float(R.construct(["1.7"] * 4, 7, 4, seed=9), np.float32)
    v = float(_f64(condreg.r_ill(_as(lib, P), gram=True)))
    exact_pole = R.reference("r_ill", P, gram=True, tie=0.0)
    assert v == math.inf or R.rel_err(v, exact_pole.value) <= tol
