"""condreg.extreme: the extreme-eigenpair path for large feature batches (docs/extreme.md).

Every result of the extreme path is compared with the dense engine (``condreg.*(F, gram=True)``),
the gradient also with central finite differences; the fallback is checked on inputs where the
extreme path cannot prove its result (rank-deficient, unresolved, near-tied, pole, N < D, batch,
tracing), and the typed errors on bad input.
"""

from __future__ import annotations

import numpy as np
import pytest

import condreg
from condreg import extreme
from condreg.testing import matrix_with_spectrum, to_numpy

QUANTITIES = ("condition_number", "r_well", "r_ill")
N, D = 192, 96


def spectrum(d: int = D, lo: float = 1.0, hi: float = 3.0) -> np.ndarray:
    return np.geomspace(hi, lo, d)


def batch(values=None, n: int = N, d: int = D, seed: int = 0) -> np.ndarray:
    return matrix_with_spectrum(spectrum(d) if values is None else values, n, d, seed=seed)


def dense(quantity: str, F: np.ndarray, **kw):
    value = getattr(condreg, quantity)(F, gram=True)
    return float(value), np.asarray(getattr(condreg, quantity + "_grad")(F, gram=True, **kw))


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _convert(library: str, F: np.ndarray):
    if library.startswith("numpy"):
        return F.astype(np.float32) if library.endswith("32") else F
    if library.startswith("torch"):
        torch = pytest.importorskip("torch")
        dtype = torch.float32 if library.endswith("32") else torch.float64
        return torch.asarray(F, dtype=dtype)
    jnp = pytest.importorskip("jax.numpy")
    return jnp.asarray(F, dtype=jnp.float32 if library.endswith("32") else jnp.float64)


LIBRARIES = ["numpy64", "numpy32", "torch64", "torch32", "jax64", "jax32"]


@pytest.fixture
def library(request, x64):
    """A library/dtype; JAX runs with x64 enabled for the test (float32 arrays stay float32,
    their Gram is formed in float64 as in the dense engine)."""
    return request.param


@pytest.mark.parametrize("library", LIBRARIES, indirect=True)
@pytest.mark.parametrize("quantity", QUANTITIES)
def test_matches_dense_engine(library, quantity):
    F = batch()
    value_ref, grad_ref = dense(quantity, F)
    X = _convert(library, F)
    value, grad, info = getattr(extreme, quantity + "_value_and_grad")(
        X, method="extreme", return_info=True
    )
    assert info.path == "extreme" and info.reason == ""
    assert grad.shape == X.shape and grad.dtype == X.dtype and type(grad) is type(X)
    tol_value, tol_grad = (1e-10, 1e-10) if library.endswith("64") else (1e-5, 1e-4)
    assert abs(float(value) / value_ref - 1) < tol_value
    assert rel(to_numpy(grad), grad_ref) < tol_grad
    alone = getattr(extreme, quantity)(X, method="extreme")
    assert abs(float(alone) / value_ref - 1) < tol_value


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_gradient_matches_finite_differences(quantity):
    F = batch(spectrum(lo=1.0, hi=1.6))
    _, G = getattr(extreme, quantity + "_value_and_grad")(F, method="extreme")
    E = np.random.default_rng(7).standard_normal(F.shape)
    E /= np.linalg.norm(E)
    h = 1e-5  # the spectrum's gaps are ~1e-2: the O(h²) error is ~1e-8 relative

    def f(x):
        return float(getattr(extreme, quantity)(x, method="extreme"))

    fd = (f(F + h * E) - f(F - h * E)) / (2 * h)
    assert abs(fd - float(np.sum(G * E))) <= 1e-7 * abs(fd)


def test_clear_tie_uses_the_whole_tied_eigenspace():
    """An exactly tied bottom (and top) pair: the extreme path proves the cluster and returns the
    minimum-norm subgradient (average of the tied projectors), equal to the dense engine's."""
    s = spectrum()
    s[-2] = s[-1]
    s[1] = s[0]
    F = batch(s)
    for quantity in QUANTITIES:
        value, G, info = getattr(extreme, quantity + "_value_and_grad")(
            F, method="extreme", return_info=True
        )
        if quantity != "r_ill":
            assert info.top == 2
        if quantity != "r_well":
            assert info.bottom == 2
        value_ref, grad_ref = dense(quantity, F)
        assert abs(float(value) / value_ref - 1) < 1e-10
        assert rel(G, grad_ref) < 1e-9
    with pytest.raises(condreg.TiedExtremeError):
        extreme.r_ill_grad(F, subgradient="raise")


@pytest.mark.parametrize(
    "case",
    ["rank_deficient", "numerically_rank_deficient", "unresolved", "near_tie", "pole", "wide"],
)
def test_falls_back_where_it_cannot_prove(case):
    s = spectrum()
    if case == "rank_deficient":
        s[-3:] = 0.0
    elif case == "numerically_rank_deficient":
        s[-1] = 1e-15 * s[0]  # below rtol·sigma_1 = 192·eps: not counted by the rank rule
    elif case == "unresolved":
        s[-1] = 1e-6 * s[0]  # counted, but the Gram cannot resolve mu_k = 1e-12·mu_1
    elif case == "near_tie":
        s[-2] = s[-1] * (1 + 2e-12)  # a few times the tie tolerance: undecidable from H
    elif case == "pole":
        s[:] = 2.0
    elif case == "wide":
        s[-12:] = s[-1]  # a tied cluster wider than the Krylov block
    F = batch(s)
    for quantity in ("condition_number",) if case == "pole" else ("condition_number", "r_ill"):
        value, G, info = getattr(extreme, quantity + "_value_and_grad")(F, return_info=True)
        assert info.path == "dense", info
        assert info.reason
        with pytest.raises(extreme.ExtremePathError):
            getattr(extreme, quantity + "_value_and_grad")(F, method="extreme")
        value_ref, grad_ref = dense(quantity, F)
        assert float(value) == value_ref
        np.testing.assert_array_equal(G, grad_ref)


def test_rank_decision_is_needed():
    """sigma_D = 1e-4·sigma_1 is resolved by the Gram at ``accuracy=1e-3`` and isolated at the
    bottom, so the eigensolver and the cluster proof succeed on it. With ``rtol=1e-3`` the rank
    rule does not count it: only the rank proof (every eigenvalue of H above rtol²·mu_1) sends
    this to the dense engine; without it the path would return (sigma_1/sigma_D)² ≈ 9e8."""
    s = spectrum()
    s[-1] = 1e-4 * s[0]
    F = batch(s)
    kappa, info = extreme.condition_number(F, rtol=1e-3, accuracy=1e-3, return_info=True)
    assert info.path == "dense" and "rank" in info.reason
    ref = float(condreg.condition_number(F, rtol=1e-3, gram=True))
    assert float(kappa) == ref < 100
    # Counted (rtol=1e-5 < 1e-4): the extreme path takes it and agrees with the dense engine.
    kappa, info = extreme.condition_number(F, rtol=1e-5, accuracy=1e-3, return_info=True)
    assert info.path == "extreme"
    ref = float(condreg.condition_number(F, rtol=1e-5, gram=True))
    assert ref == pytest.approx(1e8, rel=1e-9) and abs(float(kappa) / ref - 1) < 1e-4


def test_r_ill_pole_and_bad_input():
    F = batch(np.full(D, 2.0))
    assert float(extreme.r_ill(F)) == np.inf
    with pytest.raises(condreg.PoleError):
        extreme.r_ill_grad(F)
    bad = batch()
    bad[3, 4] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        extreme.r_well(bad)
    with pytest.raises(condreg.RankError):
        extreme.condition_number(np.zeros((N, D)), method="extreme")
    with pytest.raises(condreg.RankError):
        extreme.r_well_grad(np.zeros((N, D)))
    with pytest.raises(ValueError, match="method"):
        extreme.r_ill(batch(), method="lanczos")
    with pytest.raises(ValueError, match="accuracy"):
        extreme.r_ill(batch(), accuracy=2.0)
    with pytest.raises(TypeError):
        extreme.r_ill([[1.0, 2.0], [3.0, 4.0]])


def test_shapes_the_path_does_not_take():
    wide = matrix_with_spectrum(spectrum(64), 64, 128, seed=1)  # N < D
    stack = np.stack([batch(), batch(seed=1)])
    small = matrix_with_spectrum(spectrum(8), 32, 8, seed=2)
    for F in (wide, stack, small):
        value, info = extreme.r_ill(F, return_info=True)
        assert info.path == "dense"
        np.testing.assert_array_equal(value, condreg.r_ill(F, gram=True))
    for F in (wide, stack):
        with pytest.raises(extreme.ExtremePathError):
            extreme.r_ill(F, method="extreme")
    assert extreme.r_ill(batch(), method="dense", return_info=True)[1].path == "dense"


def test_jit_falls_back(x64):
    jax = pytest.importorskip("jax")
    F = jax.numpy.asarray(batch())
    out = jax.jit(lambda x: extreme.r_ill(x))(F)
    assert abs(float(out) / float(condreg.r_ill(batch(), gram=True)) - 1) < 1e-12


@pytest.mark.parametrize("scale", [1.1e-18, 1e-6, 1e6, 1.5e15])
def test_scale_free(scale):
    """Values and gradients are homogeneous in F (degrees 0 / 4 / −4, gradients −1 / 3 / −5):
    an exact power-of-two scaling inside keeps mu in range, equal to the dense engine's."""
    F = batch() * scale
    for quantity in QUANTITIES:
        value, G = getattr(extreme, quantity + "_value_and_grad")(F, method="extreme")
        value_ref, grad_ref = dense(quantity, F)
        assert abs(float(value) / value_ref - 1) < 1e-10
        assert rel(G, grad_ref) < 1e-10


def test_torch_tensor_that_requires_grad():
    torch = pytest.importorskip("torch")
    F = torch.asarray(batch(), requires_grad=True)
    value, G = extreme.r_ill_value_and_grad(F, method="extreme")
    assert not G.requires_grad and G.shape == F.shape
    ref = condreg.r_ill_grad(F.detach(), gram=True)
    assert rel(G.numpy(), ref.numpy()) < 1e-10


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_grad_alone_is_the_gradient_of_value_and_grad(quantity):
    """``condreg.extreme.<q>_grad`` returns the gradient alone, like ``condreg.<q>_grad``."""
    F = batch()
    value, G = getattr(extreme, quantity + "_value_and_grad")(F, method="extreme")
    np.testing.assert_array_equal(getattr(extreme, quantity + "_grad")(F, method="extreme"), G)
    G2, info = getattr(extreme, quantity + "_grad")(F, return_info=True)
    np.testing.assert_array_equal(G2, G)
    assert info.path == "extreme"
