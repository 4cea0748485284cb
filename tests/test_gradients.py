"""Closed-form (sub)gradients (Eq. 13, Theorem A.1, docs/math.md §3-4) against central finite
differences and against an independent autodiff of the formulas (torch.autograd through
torch.linalg.svdvals, jax.grad through jnp.linalg.svd), all in float64."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import QUANTITIES, enable_x64

import condreg
from condreg.testing import (
    assert_close,
    check_gradient,
    matrix_with_spectrum,
    numerical_gradient,
    rank_preserving_direction,
    to_numpy,
)

GRAD = {q: getattr(condreg, q + "_grad") for q in QUANTITIES}
VALUE = {q: getattr(condreg, q) for q in QUANTITIES}

GENERIC = [
    pytest.param([3.0, 2.0, 1.0], 4, 3, id="tall"),
    pytest.param([2.5, 1.7, 0.6], 3, 5, id="wide"),
]


def _f(quantity, gram=False):
    return lambda X: VALUE[quantity](X, gram=gram)


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("spectrum", "m", "n"), GENERIC)
def test_gradient_matches_finite_differences(backend64, quantity, spectrum, m, n):
    S = backend64.matrix(spectrum, m, n, seed=m * n)
    G = GRAD[quantity](S)
    assert G.shape == S.shape and G.dtype == S.dtype
    check_gradient(_f(quantity), G, S, n_directions=4, seed=1)


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_gradient_at_rank_deficient_input(backend64, quantity):
    """rank 2 in a 4×3 matrix: finite differences along directions U A Vᵀ that keep the rank."""
    S, fac = backend64.matrix([3.0, 1.0, 0.0], 4, 3, seed=4, return_factors=True)
    G = GRAD[quantity](S)
    rng = np.random.default_rng(0)
    directions = [rank_preserving_direction(fac.U[:, :2], fac.V[:, :2], rng) for _ in range(4)]
    check_gradient(_f(quantity), G, S, directions=directions)
    # The gradient lives on the rank-2 part: nothing in the null spaces (u_3, v_3).
    G_np = to_numpy(G)
    null_part = fac.U[:, 2:].T @ G_np @ fac.V[:, 2:]
    assert_close(null_part, np.zeros_like(null_part), atol=1e-12)


def test_r_well_is_smooth_across_rank_deficiency():
    """R_well does not depend on the rank: its gradient is right in every direction."""
    S = matrix_with_spectrum([3.0, 2.0, 0.0], 4, 3, seed=2)
    check_gradient(_f("r_well"), condreg.r_well_grad(S), S, n_directions=6)


def test_gradient_check_detects_a_wrong_gradient():
    """The finite-difference checker fails on a wrong gradient (the tests can fail)."""
    S = matrix_with_spectrum([3.0, 2.0, 1.0], 4, 3, seed=0)
    G = condreg.r_ill_grad(S)
    with pytest.raises(AssertionError, match="gradient check failed"):
        check_gradient(_f("r_ill"), 1.01 * G, S)
    # Eq. 13 with ‖S‖_F instead of ‖S‖_F² (defect 4 of the reference code) is caught too.
    _, s, _ = np.linalg.svd(S)
    k = 3
    wrong_den = np.linalg.norm(S) / (2 * k) - 0.5 * s[-1] ** 2
    right_den = np.sum(S * S) / (2 * k) - 0.5 * s[-1] ** 2
    with pytest.raises(AssertionError):
        check_gradient(_f("r_ill"), G * right_den**2 / wrong_den**2, S)


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_entrywise_numerical_gradient(quantity):
    S = matrix_with_spectrum([2.0, 1.3, 0.5], 3, 4, seed=9)
    want = numerical_gradient(_f(quantity), S)
    assert_close(GRAD[quantity](S), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_gradient_of_a_batch(quantity):
    """The gradient of a batch is the gradient of the sum of the values."""
    rng = np.random.default_rng(3)
    spectra = np.sort(rng.uniform(0.5, 3.0, size=(3, 3)), axis=-1)[:, ::-1].copy()
    S = matrix_with_spectrum(spectra, 4, 3, seed=1)

    def total(X):
        return np.sum(VALUE[quantity](X))

    check_gradient(total, GRAD[quantity](S), S, n_directions=3)


# --------------------------------------------------------------------------------------------
# Independent autodiff of the formulas through the singular values
# --------------------------------------------------------------------------------------------


def _formula(quantity, s, fro2, p, k, xp_sum=None):
    """kappa / R_well / R_ill from singular values ``s`` (descending) and ‖·‖_F²."""
    if quantity == "condition_number":
        return s[0] / s[k - 1]
    if quantity == "r_well":
        return 0.5 * s[0] ** 2 - fro2 / (2 * p)
    return 1.0 / (fro2 / (2 * k) - 0.5 * s[k - 1] ** 2)


AUTODIFF_POINTS = [
    pytest.param([3.0, 2.0, 1.0], 4, 3, False, id="tall"),
    pytest.param([2.5, 1.7, 0.6], 3, 5, False, id="wide"),
    pytest.param([2.0, 1.1, 0.7], 3, 5, True, id="gram-N<D"),
    pytest.param([2.0, 1.1, 0.7], 6, 3, True, id="gram-N>D"),
]


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("spectrum", "m", "n", "gram"), AUTODIFF_POINTS)
def test_gradient_matches_torch_autograd(quantity, spectrum, m, n, gram):
    torch = pytest.importorskip("torch")
    S_np = matrix_with_spectrum(spectrum, m, n, seed=13)
    k = len(spectrum)
    S = torch.tensor(S_np, dtype=torch.float64, requires_grad=True)
    if gram:
        H = S.T @ S
        lam = torch.linalg.eigvalsh(H).flip(0)  # an independent route: eigenvalues of FᵀF
        value = _formula(quantity, lam, torch.sum(H * H), n, k)
    else:
        s = torch.linalg.svdvals(S)
        value = _formula(quantity, s, torch.sum(S * S), min(m, n), k)
    (want,) = torch.autograd.grad(value, S)
    got = GRAD[quantity](S_np, gram=gram)
    assert_close(got, want.numpy(), rtol=1e-8, atol=1e-10)
    assert_close(VALUE[quantity](S_np, gram=gram), np.asarray(value.item()), rtol=1e-9)


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("spectrum", "m", "n", "gram"), AUTODIFF_POINTS)
def test_gradient_matches_jax_grad(quantity, spectrum, m, n, gram):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    S_np = matrix_with_spectrum(spectrum, m, n, seed=17)
    k = len(spectrum)

    def value(S):
        if gram:
            s = jnp.linalg.svd(S, compute_uv=False) ** 2
            H = S.T @ S
            return _formula(quantity, s, jnp.sum(H * H), n, k)
        s = jnp.linalg.svd(S, compute_uv=False)
        return _formula(quantity, s, jnp.sum(S * S), min(m, n), k)

    with enable_x64(jax):
        want = jax.grad(value)(jnp.asarray(S_np, dtype=jnp.float64))
        assert want.dtype == jnp.float64
        want = np.asarray(want)
    got = GRAD[quantity](S_np, gram=gram)
    assert_close(got, want, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize("c", [1e-100, 1e100])
def test_gradient_homogeneity_over_200_orders_of_magnitude(quantity, c):
    """∇f(cS) = c^deg ∇f(S) with deg = −1, 1, −3 for kappa, R_well, R_ill (no 0/0, no inf − inf)."""
    power = {"condition_number": -1, "r_well": 1, "r_ill": -3}[quantity]
    S = matrix_with_spectrum([3.0, 2.0, 1.0, 0.0], 5, 4, seed=8)
    G = GRAD[quantity](S)
    Gc = GRAD[quantity](c * S)
    scaled = Gc
    for _ in range(abs(power)):
        scaled = scaled / c if power > 0 else scaled * c
    assert_close(scaled, G, rtol=1e-9, atol=1e-12 * float(np.max(np.abs(G))))


def test_r_ill_gradient_overflow_is_inf_not_nan_nor_pole_error():
    """At sigma ~ 1e-120 the R_ill gradient (~sigma^-3) exceeds float64: ±inf/0 entries, no
    NaN, and no PoleError (the denominator underflowing is not the pole)."""
    S = 1e-120 * matrix_with_spectrum([3.0, 2.0, 1.0], 4, 3, seed=9)
    G = condreg.r_ill_grad(S)
    assert not np.any(np.isnan(G))
    assert np.any(np.isinf(G))
