"""gram=True (docs/math.md §4): the quantity of H = FᵀF computed from F, with the gradient with
respect to F given by the chain rule ∇_F f(FᵀF) = 2F·G_H (G_H symmetric), for N < D and N > D."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import QUANTITIES, reference

import condreg
from condreg.testing import assert_close, check_gradient, matrix_with_spectrum, to_numpy

SHAPES = [
    pytest.param(3, 5, id="N<D"),
    pytest.param(5, 3, id="N>D"),
]


def _rtol(quantity):
    """A rank tolerance for the explicit H (R_well has none: it does not use the rank)."""
    return {} if quantity == "r_well" else {"rtol": 1e-8}


def _explicit_gram(backend, F):
    F64 = to_numpy(F).astype(np.float64)
    return F64, F64.T @ F64


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("N", "D"), SHAPES)
def test_gram_value_equals_explicit_gram(backend, quantity, N, D):
    F = backend.matrix([2.0, 1.4, 0.8], N, D, seed=N + D)
    got = getattr(condreg, quantity)(F, gram=True)
    _, H = _explicit_gram(backend, F)
    # H has rank 3 (<= D); its rank is read off F (rank(FᵀF) = rank(F)).
    want = reference(quantity, H, rtol=1e-8)
    assert_close(got, backend.asarray(want), rtol=backend.rtol * 10)
    assert_close(got, backend.asarray(reference(quantity, F, gram=True)), rtol=backend.rtol * 10)


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("N", "D"), SHAPES)
def test_gram_gradient_is_chain_rule_of_explicit_gram(backend, quantity, N, D):
    F = backend.matrix([2.0, 1.4, 0.8], N, D, seed=N * D)
    got = getattr(condreg, quantity + "_grad")(F, gram=True)
    assert got.shape == F.shape
    F64, H = _explicit_gram(backend, F)
    G_H = getattr(condreg, quantity + "_grad")(H, **_rtol(quantity))
    assert_close(G_H, G_H.T, atol=1e-10)  # symmetric
    want = 2.0 * F64 @ G_H
    scale = float(np.max(np.abs(want)))
    assert_close(got, backend.asarray(want), rtol=backend.rtol * 10, atol=backend.rtol * scale)


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("N", "D"), SHAPES)
def test_gram_gradient_matches_finite_differences(quantity, N, D):
    F = matrix_with_spectrum([2.0, 1.4, 0.8], N, D, seed=1)

    def f(X):
        return getattr(condreg, quantity)(X.T @ X, **_rtol(quantity))

    check_gradient(f, getattr(condreg, quantity + "_grad")(F, gram=True), F, rtol=1e-6)


def test_gram_kappa_is_kappa_squared(backend):
    F = backend.matrix([3.0, 2.0, 1.0], 4, 3, seed=3)
    kappa = condreg.condition_number(F)
    assert_close(condreg.condition_number(F, gram=True), kappa * kappa, rtol=backend.rtol * 10)


def test_gram_rank_deficient_features():
    """Collinear feature columns: H is singular; kappa and R_ill over the nonzero eigenvalues."""
    F = matrix_with_spectrum([2.0, 1.0, 0.0], 6, 3, seed=4)
    assert_close(condreg.condition_number(F, gram=True), np.asarray(4.0), rtol=1e-10)
    # H's nonzero eigenvalues (4, 1), k = 2: den = (16 + 1)/4 − 1/2.
    assert_close(condreg.r_ill(F, gram=True), np.asarray(1.0 / (17.0 / 4.0 - 0.5)), rtol=1e-10)
    # R_well with p = D = 3: ½·16 − 17/6.
    assert_close(condreg.r_well(F, gram=True), np.asarray(8.0 - 17.0 / 6.0), rtol=1e-10)


def test_gram_batched(backend):
    rng = np.random.default_rng(5)
    spectra = np.sort(rng.uniform(0.5, 3.0, size=(4, 3)), axis=-1)[:, ::-1].copy()
    F = backend.xp.reshape(backend.matrix(spectra, 4, 3, seed=6), (2, 2, 4, 3))
    got = condreg.r_ill_grad(F, gram=True)
    for i in range(2):
        for j in range(2):
            one = condreg.r_ill_grad(F[i, j, ...], gram=True)
            assert_close(got[i, j, ...], one, rtol=backend.rtol * 10, atol=backend.rtol)


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_gram_gradient_at_small_scale(backend, quantity):
    """Homogeneity: ∇_F f(c·F) = c^(2·deg+1) ∇_F f(F) (deg = 0, 1, −2 for kappa, R_well, R_ill).
    With c = 1e-6, R_ill's denominator is ~1e-24·, its square underflows float32: the gradient
    must still be right (1e30·), not 0/0 = NaN."""
    c = 1e-6
    power = {"condition_number": -1, "r_well": 3, "r_ill": -5}[quantity]
    F = backend.matrix([3.0, 2.0, 1.0], 4, 3, seed=7)
    grad = getattr(condreg, quantity + "_grad")
    small = to_numpy(grad(F * c, gram=True)).astype(np.float64)
    base = to_numpy(grad(F, gram=True)).astype(np.float64)
    assert np.all(np.isfinite(small))
    rtol = 1e-9 if backend.float64 else 2e-3
    assert_close(small / c**power, base, rtol=rtol, atol=rtol * float(np.max(np.abs(base))))
