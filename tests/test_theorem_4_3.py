"""Theorem 4.3: the K⁻¹-LEFT-preconditioned regularizer steps keep H's eigenvectors, lower κ(H_P)
under R_well and raise κ(H_H) under R_ill; the right-multiplied variant (docs/math.md §9.2) does
not."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import condreg
from condreg.algorithm import ImmunizationWarning, preconditioned_gradient


def _data(seed: int, D: int, N: int = 40, decay: float = 2.0):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((D, D)))
    X = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -decay / 2, D)) @ Q.T
    theta = np.eye(D) + 0.3 * rng.standard_normal((D, D)) / np.sqrt(D)
    return X, theta


def _H(theta, X):
    F = X @ theta
    return F.T @ F


def _kappa(H):
    mu = np.linalg.eigvalsh(H)
    return mu[-1] / mu[0]


def _offdiag_in_eigenbasis(H, H_new):
    """Relative off-diagonal mass of H_new in H's eigenbasis (0 iff same eigenvectors)."""
    _, V = np.linalg.eigh(H)
    M = V.T @ H_new @ V
    off = M - np.diag(np.diag(M))
    return np.linalg.norm(off) / np.linalg.norm(M)


def _r_well_step_bound(H):
    mu = np.sort(np.linalg.eigvalsh(H))[::-1]
    D = len(mu)
    s1, s2 = mu[0], mu[1]
    return 0.5 * min(1 / (2 * s1 * (1 - 1 / D)), D * (np.sqrt(s1 * s2) - s2) / (2 * s2**2))


def _r_ill_step(H):
    mu = np.sort(np.linalg.eigvalsh(H))[::-1]
    k = len(mu)
    den = np.sum(mu**2) / (2 * k) - 0.5 * mu[-1] ** 2
    return 0.25 * den**2 / ((1 - 1 / k) * mu[-1])  # a quarter of the bound D²/((1−1/k)σ_k)


@given(seed=st.integers(0, 10_000), D=st.integers(3, 8))
def test_r_well_left_step_lowers_kappa_and_keeps_eigenvectors(seed, D):
    X, theta = _data(seed, D)
    H = _H(theta, X)
    eta = _r_well_step_bound(H)
    new = theta - eta * preconditioned_gradient(theta, X, "r_well")
    H_new = _H(new, X)
    assert _kappa(H_new) < _kappa(H)
    assert _offdiag_in_eigenbasis(H, H_new) < 1e-9


@given(seed=st.integers(0, 10_000), D=st.integers(3, 8))
def test_r_ill_left_step_raises_kappa_and_keeps_eigenvectors(seed, D):
    X, theta = _data(seed, D)
    H = _H(theta, X)
    eta = _r_ill_step(H)
    new = theta - eta * preconditioned_gradient(theta, X, "r_ill")
    H_new = _H(new, X)
    k_old, k_new = _kappa(H), _kappa(H_new)
    assert k_new > k_old
    assert k_new < 1e8  # well inside float64's resolution of κ (docs/math.md §4)
    assert _offdiag_in_eigenbasis(H, H_new) < 1e-9


def test_left_step_is_two_theta_G_and_matches_theorem_4_2_factorisation():
    X, theta = _data(3, 6)
    H = _H(theta, X)
    mu, V = np.linalg.eigh(H)
    G = mu[-1] * np.outer(V[:, -1], V[:, -1]) - H / 6  # ∇_H R_well (unique top)
    np.testing.assert_allclose(
        preconditioned_gradient(theta, X, "r_well"), 2 * theta @ G, rtol=1e-9, atol=1e-12
    )
    eta = _r_well_step_bound(H)
    E = np.eye(6) - 2 * eta * G
    np.testing.assert_allclose(_H(theta - 2 * eta * theta @ G, X), E @ H @ E, rtol=1e-9)


def _right_step(theta, X, quantity, eta):
    """The public code's variant: ∇_θ multiplied by K⁻¹ on the RIGHT (docs/math.md §9.2)."""
    K = X.T @ X
    grad = (
        condreg.r_well_grad(X @ theta, gram=True)
        if quantity == "r_well"
        else (condreg.r_ill_grad(X @ theta, gram=True))
    )
    grad_theta = X.T @ grad  # = 2KθG
    return theta - eta * grad_theta @ np.linalg.inv(K)


def test_right_multiplied_variant_breaks_theorem_4_3():
    """Regression test against docs/math.md §9.2: with the same steps, the right-multiplied
    preconditioner changes H's eigenvectors and, on some problems, raises κ(H_P) under the R_well
    step, which the left one never does."""
    rose, rotated = 0, 0
    for seed in range(60):
        X, theta = _data(seed, 5, decay=3.0)
        H = _H(theta, X)
        eta = _r_well_step_bound(H)
        left = _H(theta - eta * preconditioned_gradient(theta, X, "r_well"), X)
        right = _H(_right_step(theta, X, "r_well", eta), X)
        assert _kappa(left) < _kappa(H)
        assert _offdiag_in_eigenbasis(H, left) < 1e-9
        rose += _kappa(right) > _kappa(H)
        rotated += _offdiag_in_eigenbasis(H, right) > 1e-3
    assert rotated >= 50
    assert rose >= 1


def test_singular_covariance_uses_pseudo_inverse():
    """N < D: K is singular; the step is K⁺K·2θG = (projection onto the row space of X)·2θG, and
    H(θ') still keeps H's eigenvectors."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 7))
    theta = np.eye(7) + 0.1 * rng.standard_normal((7, 7))
    step = preconditioned_gradient(theta, X, "r_well")
    P = np.linalg.pinv(X) @ X
    np.testing.assert_allclose(P @ step, step, atol=1e-12)
    H = _H(theta, X)
    H_new = _H(theta - 1e-3 * step, X)
    F = X @ theta
    _, _, Vt = np.linalg.svd(F, full_matrices=False)
    M = Vt @ H_new @ Vt.T
    assert np.linalg.norm(M - np.diag(np.diag(M))) / np.linalg.norm(M) < 1e-9
    assert _kappa(Vt @ H_new @ Vt.T) < _kappa(Vt @ H @ Vt.T)


@pytest.mark.parametrize("quantity", ["r_well", "r_ill"])
def test_one_epoch_of_immunize_follows_theorem_4_3(quantity):
    """One epoch of immunize with only one regularizer active (ω₀ = 0, so the supervised
    gradient on θ vanishes): the Theorem 4.3 behaviour, through the public entry point."""
    rng = np.random.default_rng(1)
    X_p = rng.standard_normal((60, 6)) @ np.diag(np.logspace(0, -1, 6))
    Q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    X_h = rng.standard_normal((60, 6)) @ np.diag(np.logspace(0, -1, 6)) @ Q
    y = rng.standard_normal(60)
    kw = {"lam_p": 1.0, "lam_h": 0.0} if quantity == "r_well" else {"lam_p": 0.0, "lam_h": 1.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImmunizationWarning)
        res = condreg.immunize(X_p, y, X_h, epochs=1, max_step=0.01, **kw)
    X = X_p if quantity == "r_well" else X_h
    H0, H1 = _H(np.eye(6), X), _H(res.theta, X)
    assert _offdiag_in_eigenbasis(H0, H1) < 1e-9
    if quantity == "r_well":
        assert _kappa(H1) < _kappa(H0)
    else:
        assert _kappa(H1) > _kappa(H0)
