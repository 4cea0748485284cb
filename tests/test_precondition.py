"""condreg._precondition: the one home of the left preconditioner K⁻¹ (docs/math.md §5)."""

from __future__ import annotations

import numpy as np
import pytest

from condreg import _precondition as pc


def _data(seed=0, N=6, D=9):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, D)), rng.standard_normal((D, D))


def test_pseudo_inverse_is_the_projection_onto_the_row_space():
    X, M = _data()
    P = pc.left_preconditioner(X)
    np.testing.assert_allclose(P.apply(M), np.linalg.pinv(X) @ X @ M, atol=1e-12)
    K = X.T @ X
    np.testing.assert_allclose(P.apply(K @ M), K @ M, atol=1e-11)  # K⁺K·K = K


@pytest.mark.parametrize("ridge", [1e-6, 1e-2, 1.0])
def test_ridge_is_the_regularised_inverse(ridge):
    X, M = _data(1, N=20, D=7)
    K = X.T @ X
    expected = np.linalg.solve(K + ridge * np.linalg.norm(K, 2) * np.eye(7), K @ M)
    np.testing.assert_allclose(
        pc.left_preconditioner(X, ridge=ridge).apply(M), expected, atol=1e-10
    )


def test_one_rank_rule_drops_what_the_tolerance_does_not_count():
    X, M = _data(2, N=30, D=5)
    X[:, 0] = 0.0  # a constant (zero) feature: K is singular
    P = pc.left_preconditioner(X)
    assert np.sum(P.filter) == 4
    assert np.abs(P.apply(M)[0]).max() < 1e-15  # the unseen feature's row is not moved
    coarse = pc.left_preconditioner(X, rtol=0.9)
    s = np.linalg.svd(X, compute_uv=False)
    assert np.sum(coarse.filter) == np.sum(s > 0.9 * s[0]) < 4
    with pytest.raises(ValueError, match="rtol"):
        pc.left_preconditioner(X, rtol=1.5)
    with pytest.raises(ValueError, match="ridge"):
        pc.left_preconditioner(X, ridge=-1.0)
    # ridge = 0 is the pseudo-inverse, as everywhere (the filter s²/(s² + 0) is 1 on the rank)
    np.testing.assert_array_equal(pc.left_preconditioner(X, ridge=0.0).filter, P.filter)


@pytest.mark.parametrize("ridge", [0.0, 1e-3])
def test_sample_axis_form_is_the_dummy_layer_backward(ridge):
    x, _ = _data(3, N=5, D=8)
    g = np.random.default_rng(4).standard_normal((5, 3))
    s1 = np.linalg.norm(x, 2) ** 2
    expected = np.linalg.pinv(x @ x.T + ridge * s1 * np.eye(5)) @ g
    np.testing.assert_allclose(
        pc.sample_preconditioner(x, ridge=ridge).apply(g), expected, atol=1e-11
    )
    # push-through: xᵀ(xxᵀ + εI)⁻¹ = (xᵀx + εI)⁻¹xᵀ — the parameter gradient is left-preconditioned
    if ridge > 0:
        lhs = x.T @ pc.sample_preconditioner(x, ridge=ridge).apply(g)
        rhs = np.linalg.solve(x.T @ x + ridge * s1 * np.eye(8), x.T @ g)
        np.testing.assert_allclose(lhs, rhs, atol=1e-10)
    with pytest.raises(ValueError, match="ridge"):
        pc.sample_preconditioner(x, ridge=-1.0)


def test_preconditioners_trace_under_jit(x64):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    X, M = _data(5)
    f = jax.jit(lambda a, m: pc.left_preconditioner(a, ridge=1e-3).apply(m))
    np.testing.assert_allclose(
        np.asarray(f(jnp.asarray(X), jnp.asarray(M))),
        pc.left_preconditioner(X, ridge=1e-3).apply(M),
        atol=1e-12,
    )
