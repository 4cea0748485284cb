"""Tied extreme singular values (docs/math.md §3, "Subgradients at tied extremes").

The default ``subgradient="min_norm"`` is the average of the tied rank-one terms,
(1/r)·U_J V_Jᵀ: the minimum-Frobenius-norm element of the subdifferential, independent of the basis
the decomposition returns, and a true subgradient of the convex sigma_1."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import spectral_parts

import condreg
from condreg import TiedExtremeError
from condreg.testing import assert_close, matrix_with_spectrum, random_orthonormal, to_numpy

# One shape (4×3, three singular values) for every backend: JAX compiles each new shape.
TOP_TIED = [2.0, 2.0, 1.0]  # sigma_1 with multiplicity 2
BOTTOM_TIED = [3.0, 1.0, 1.0]  # sigma_k with multiplicity 2
M, N = 4, 3


def _atol(backend):
    return 1e-11 if backend.float64 else 2e-5


def _expected_r_well(fac, r, p):
    s = fac.s
    UJ, VJ = fac.U[:, :r], fac.V[:, :r]
    S = fac.U @ np.diag(s) @ fac.Vt
    return s[0] / r * UJ @ VJ.T - S / p


def _expected_r_ill(fac, r, k):
    s = fac.s
    S = fac.U @ np.diag(s) @ fac.Vt
    UJ, VJ = fac.U[:, k - r : k], fac.V[:, k - r : k]
    den = np.sum(s[:k] ** 2) / (2 * k) - 0.5 * s[k - 1] ** 2
    return (s[k - 1] / r * UJ @ VJ.T - S / k) / den**2


def test_min_norm_r_well_gradient_is_the_average_form(backend):
    S, fac = backend.matrix(TOP_TIED, M, N, seed=1, return_factors=True)
    want = _expected_r_well(fac, 2, min(M, N))
    assert_close(condreg.r_well_grad(S), backend.asarray(want), atol=_atol(backend))


def test_min_norm_r_ill_gradient_is_the_average_form(backend):
    S, fac = backend.matrix(BOTTOM_TIED, M, N, seed=2, return_factors=True)
    want = _expected_r_ill(fac, 2, 3)
    assert_close(condreg.r_ill_grad(S), backend.asarray(want), atol=_atol(backend))


def test_min_norm_r_ill_gradient_at_rank_deficient_tie():
    """sigma_k is the smallest *nonzero* value: the tie is among the nonzero ones."""
    S, fac = matrix_with_spectrum([3.0, 1.0, 1.0, 0.0, 0.0], 6, 5, seed=3, return_factors=True)
    want = _expected_r_ill(fac, 2, 3)
    assert_close(condreg.r_ill_grad(S), want, atol=1e-12)


def test_min_norm_condition_number_gradient_both_extremes_tied():
    S, fac = matrix_with_spectrum([2.0, 2.0, 1.5, 0.5, 0.5], 6, 5, seed=4, return_factors=True)
    U, V = fac.U, fac.V
    want = (U[:, :2] @ V[:, :2].T / 2) / 0.5 - (2.0 / 0.25) * (U[:, 3:5] @ V[:, 3:5].T / 2)
    assert_close(condreg.condition_number_grad(S), want, atol=1e-11)


def test_min_norm_gram_gradient_is_the_average_form(backend):
    """gram=True: 2F((lambda_1/r) V_J V_Jᵀ − H/D) at a tied top eigenvalue of H = FᵀF."""
    F, fac = backend.matrix(TOP_TIED, 3, 5, seed=5, return_factors=True)
    F_np = fac.U @ np.diag(fac.s) @ fac.Vt
    H = F_np.T @ F_np
    VJ = fac.V[:, :2]
    want = 2 * F_np @ (4.0 / 2 * VJ @ VJ.T - H / 5)
    assert_close(condreg.r_well_grad(F, gram=True), backend.asarray(want), atol=10 * _atol(backend))


def _rotated(fac, J, seed):
    """The same matrix, built with the tied singular vectors rotated: U_J Q, V_J Q."""
    Q = random_orthonormal(len(J), len(J), seed=seed)
    U, V = fac.U.copy(), fac.V.copy()
    U[:, J] = U[:, J] @ Q
    V[:, J] = V[:, J] @ Q
    return U @ np.diag(fac.s) @ V.T


@pytest.mark.parametrize(
    ("name", "spectrum", "J"),
    [
        ("r_well_grad", TOP_TIED, [0, 1]),
        ("r_ill_grad", BOTTOM_TIED, [1, 2]),
        ("condition_number_grad", TOP_TIED, [0, 1]),
    ],
)
def test_min_norm_is_basis_independent(backend, name, spectrum, J):
    S1_np, fac = matrix_with_spectrum(spectrum, M, N, seed=6, return_factors=True)
    S2_np = _rotated(fac, J, seed=7)
    assert_close(S1_np, S2_np, atol=1e-14)  # the same matrix
    G1 = getattr(condreg, name)(backend.asarray(S1_np))
    G2 = getattr(condreg, name)(backend.asarray(S2_np))
    assert_close(G1, G2, atol=_atol(backend))
    # ... and both equal the average form built from the *unrotated* factors.
    expected = _expected_r_well(fac, 2, N) if name == "r_well_grad" else None
    if expected is not None:
        assert_close(G2, backend.asarray(expected), atol=_atol(backend))


def test_any_differs_from_min_norm_and_has_larger_norm(backend):
    S = backend.matrix(TOP_TIED, M, N, seed=8)
    p = min(M, N)
    G_min = to_numpy(condreg.r_well_grad(S)) + to_numpy(S) / p  # the sigma_1 part
    G_any = to_numpy(condreg.r_well_grad(S, subgradient="any")) + to_numpy(S) / p
    # sigma_1 u v ᵀ has norm sigma_1 = 2; the average (sigma_1/2) U_J V_Jᵀ has norm 2/sqrt(2);
    # their distance is sigma_1·sqrt(1 − 1/r).
    assert_close(np.linalg.norm(G_any), 2.0, rtol=1e-4)
    assert_close(np.linalg.norm(G_min), 2.0 / np.sqrt(2), rtol=1e-4)
    assert_close(np.linalg.norm(G_any - G_min), 2.0 * np.sqrt(0.5), rtol=1e-4)


def test_any_equals_min_norm_at_generic_points(backend):
    S = backend.matrix([3.0, 2.0, 1.0], M, N, seed=9)
    for name in ("r_well_grad", "r_ill_grad", "condition_number_grad"):
        f = getattr(condreg, name)
        assert_close(f(S, subgradient="any"), f(S), atol=_atol(backend))


# --------------------------------------------------------------------------------------------
# Subgradient inequality for the convex sigma_1 term
# --------------------------------------------------------------------------------------------


def _sigma1(A):
    return np.linalg.svd(A, compute_uv=False)[0]


@pytest.mark.parametrize(
    "spectrum", [[2.0, 2.0, 2.0, 1.0, 0.5], [2.0, 2.0, 0.0, 0.0, 0.0], [3.0, 2.0, 1.0]]
)
@pytest.mark.parametrize("policy", ["min_norm", "any"])
def test_sigma1_subgradient_inequality(spectrum, policy):
    """sigma_1(S + E) >= sigma_1(S) + <G_1, E> with G_1 = (r_well_grad + S/p) / sigma_1."""
    S = matrix_with_spectrum(spectrum, 6, 5, seed=10)
    p = 5
    G1 = (condreg.r_well_grad(S, subgradient=policy) + S / p) / _sigma1(S)
    rng = np.random.default_rng(11)
    for scale in [1e-6, 1e-3, 0.1, 1.0, 10.0]:
        for _ in range(20):
            E = scale * rng.standard_normal(S.shape)
            lhs = _sigma1(S + E)
            rhs = _sigma1(S) + np.sum(G1 * E)
            assert lhs >= rhs - 1e-12 * (1 + abs(rhs)), (scale, lhs, rhs)


def test_sigma1_subgradient_inequality_detects_a_non_subgradient():
    """Control: doubling the subgradient violates the inequality at E = S (the test can fail)."""
    S = matrix_with_spectrum(TOP_TIED, M, N, seed=12)
    G1 = (condreg.r_well_grad(S) + S / 3) / _sigma1(S)
    E = S
    assert _sigma1(S + E) < _sigma1(S) + np.sum(2 * G1 * E)
    # The average form is in the subdifferential: <G1, S> = sigma_1 (tr Z = 1).
    assert_close(np.sum(G1 * S), _sigma1(S), rtol=1e-12)


# --------------------------------------------------------------------------------------------
# Tie tolerance and subgradient="raise"
# --------------------------------------------------------------------------------------------


def test_near_tie_within_tolerance_counts_as_tied():
    S, fac = matrix_with_spectrum([2.0, 2.0 * (1 - 1e-14), 1.0], 4, 3, seed=13, return_factors=True)
    U, s, Vt = spectral_parts(S)
    want = 2.0 / 2 * U[:, :2] @ Vt[:2] - S / 3  # averaged
    assert_close(condreg.r_well_grad(S), want, atol=1e-12)
    with pytest.raises(TiedExtremeError):
        condreg.r_well_grad(S, subgradient="raise")
    # tie_rtol=0: no tie, the exact gradient of the (smooth) function at this point.
    exact = s[0] * np.outer(U[:, 0], Vt[0]) - S / 3
    assert_close(condreg.r_well_grad(S, tie_rtol=0.0), exact, atol=1e-12)


def test_larger_tie_rtol_merges_close_values():
    S = matrix_with_spectrum([2.0, 1.95, 1.0], 4, 3, seed=14)
    U, s, Vt = spectral_parts(S)
    merged = condreg.r_well_grad(S, tie_rtol=0.1)
    want = s[0] / 2 * U[:, :2] @ Vt[:2] - S / 3
    assert_close(merged, want, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "spectrum"),
    [
        ("r_well_grad", TOP_TIED),
        ("r_ill_grad", BOTTOM_TIED),
        ("condition_number_grad", TOP_TIED),
        ("condition_number_grad", BOTTOM_TIED),
    ],
)
def test_raise_at_ties(backend, name, spectrum):
    S = backend.matrix(spectrum, M, N, seed=15)
    with pytest.raises(TiedExtremeError, match="tied"):
        getattr(condreg, name)(S, subgradient="raise")


def test_raise_only_for_the_relevant_extreme(backend):
    """R_well only involves sigma_1, R_ill only sigma_k: a tie elsewhere is fine."""
    S_bottom = backend.matrix(BOTTOM_TIED, M, N, seed=16)
    S_top = backend.matrix([2.0, 2.0, 1.0], M, N, seed=16)
    assert condreg.r_well_grad(S_bottom, subgradient="raise").shape == (M, N)
    assert condreg.r_ill_grad(S_top, subgradient="raise").shape == (M, N)


@pytest.mark.parametrize("name", ["r_well_grad", "r_ill_grad", "condition_number_grad"])
def test_raise_not_at_generic_points(backend, name):
    S = backend.matrix([3.0, 2.0, 1.0], M, N, seed=17)
    G = getattr(condreg, name)(S, subgradient="raise")
    assert_close(G, getattr(condreg, name)(S), atol=_atol(backend))


def test_unknown_subgradient_policy():
    with pytest.raises(ValueError, match="subgradient"):
        condreg.r_well_grad(np.diag([2.0, 1.0]), subgradient="average")
