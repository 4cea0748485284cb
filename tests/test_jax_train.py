"""condreg.jax.train: pure, jit-able training functions and the optax-style transformation."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import condreg  # noqa: E402
from condreg.algorithm import ImmunizationWarning, preconditioned_gradient  # noqa: E402


@pytest.fixture
def train(x64):
    from condreg.jax import train

    return train


def _pair(seed=0, N=40, D=6, N_h=None):
    rng = np.random.default_rng(seed)
    X_p = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -1, D))
    Q, _ = np.linalg.qr(rng.standard_normal((D, D)))
    X_h = rng.standard_normal((N_h or N, D)) @ np.diag(np.logspace(0, -1, D)) @ Q.T
    y = X_p @ rng.standard_normal(D)
    return X_p, y, X_h


def test_dummy_layer_gradient_is_the_closed_form_update_under_jit(train):
    X_p, _, X_h = _pair(N_h=4)  # N_h < D: pseudo-inverse path
    theta = jnp.asarray(np.eye(6) + 0.1 * np.random.default_rng(1).standard_normal((6, 6)))
    xp_, xh_ = jnp.asarray(X_p), jnp.asarray(X_h)

    def loss(th):
        return train.regularizer_loss(
            train.precondition(xp_ @ th, xp_, 0.0),
            train.precondition(xh_ @ th, xh_, 0.0),
            0.7,
            0.2,
            normalize=False,
        )

    g = jax.jit(jax.grad(loss))(theta)
    expected = 0.7 * preconditioned_gradient(
        np.asarray(theta), X_p, "r_well"
    ) + 0.2 * preconditioned_gradient(np.asarray(theta), X_h, "r_ill")
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-8, atol=1e-12)
    upd = jax.jit(lambda th: train.preconditioned_update(th, xp_, xh_, 0.7, 0.2))(theta)
    np.testing.assert_allclose(np.asarray(upd), expected, rtol=1e-8, atol=1e-12)
    # the forward pass is the identity, and inputs get no gradient from the dummy layer
    assert jnp.array_equal(train.precondition(xp_ @ theta, xp_), xp_ @ theta)
    F = xp_ @ theta
    gx = jax.grad(lambda x: jnp.sum(train.precondition(F, x) ** 2))(xp_)
    assert not bool(jnp.any(gx))


def test_regularizer_loss_normalisation_and_jit(train):
    X_p, _, X_h = _pair(2)
    a, b = jnp.asarray(X_p), jnp.asarray(X_h)
    f = jax.jit(lambda u, v: train.regularizer_loss(u, v, 1.0, 2.0))
    np.testing.assert_allclose(float(f(5 * a, 0.2 * b)), float(f(a, b)), rtol=1e-10)
    plain = train.regularizer_loss(a, None, 3.0, 0.0, normalize=False)
    np.testing.assert_allclose(float(plain), 3 * condreg.r_well(X_p, gram=True), rtol=1e-10)


def test_optax_transformation_called_directly_in_a_sgd_loop(train):
    optax = pytest.importorskip("optax")
    X_p, y, X_h = _pair(3, N=80, D=6)
    X_p = X_p / np.linalg.norm(X_p, 2)
    X_h = X_h / np.linalg.norm(X_h, 2)
    from condreg.jax.optax import condition_regularizer

    tx = condition_regularizer(1.0, 1e-3, key="theta")
    assert isinstance(tx, optax.GradientTransformationExtraArgs)
    params = {"theta": jnp.eye(6), "omega": jnp.zeros(6)}
    state = tx.init(params)
    xp_, xh_, yy = jnp.asarray(X_p), jnp.asarray(X_h), jnp.asarray(y)

    def task_loss(p):
        return jnp.mean((xp_ @ p["theta"] @ p["omega"] - yy) ** 2)

    @jax.jit
    def step(p, s):
        g = jax.grad(task_loss)(p)
        u, s = tx.update(g, s, p, x_p=xp_, x_h=xh_)
        return jax.tree_util.tree_map(lambda a, b: a - 5e-3 * b, p, u), s

    for _ in range(150):
        params, state = step(params, state)
    res = condreg.metrics.rir(np.asarray(params["theta"]), X_p, X_h)
    assert res.rir > 2 and res.ii < 1
    with pytest.raises(ValueError):
        tx.update(params, state, None)


def test_algorithm1_step_is_jitted_and_reproduces_immunize(train):
    X_p, y, X_h = _pair(4, N_h=5)
    for method in ("condreg", "opt_kappa", "imma"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ImmunizationWarning)
            ref = condreg.immunize(X_p, y, X_h, method=method, epochs=5)
        step = train.algorithm1_step(
            jnp.asarray(X_p),
            jnp.asarray(y),
            jnp.asarray(X_h),
            lam_p=ref.lam_p,
            lam_h=ref.lam_h,
            method=method,
        )
        theta, omega = jnp.eye(6), jnp.zeros(6)
        for _ in range(5):
            theta, omega, record = step(theta, omega)
        np.testing.assert_allclose(np.asarray(theta), ref.theta, atol=1e-10)
        np.testing.assert_allclose(np.asarray(omega), ref.omega, atol=1e-10)
        assert record.shape == (5,)
        np.testing.assert_allclose(float(record[0]), ref.history["kappa_hp"][4], rtol=1e-8)


def test_jax_immunize_keeps_float32_without_x64():
    """Without x64 (the JAX default) immunize runs in float32 and returns JAX arrays."""
    X_p, y, X_h = _pair(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImmunizationWarning)
        res = condreg.immunize(
            jnp.asarray(X_p, dtype=jnp.float32),
            jnp.asarray(y, dtype=jnp.float32),
            jnp.asarray(X_h, dtype=jnp.float32),
            epochs=3,
        )
    assert res.theta.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(res.theta)))


def test_regularizer_loss_of_a_zero_batch_raises_rank_error(train):
    zero = jnp.zeros((4, 3))
    for normalize in (True, False):
        with pytest.raises(condreg.RankError):
            train.regularizer_loss(zero, None, normalize=normalize)
        with pytest.raises(condreg.RankError):
            train.regularizer_loss(None, zero, normalize=normalize)
    with pytest.raises(ValueError, match="NaN or Inf"):
        train.regularizer_loss(jnp.full((4, 3), jnp.nan), None)


def test_the_old_gradient_transformation_name_is_gone(train):
    with pytest.raises(AttributeError):
        train.GradientTransformation  # noqa: B018


def test_token_batches_are_rows_and_bad_shapes_raise(train):
    """(B, T, D) feature and input batches: tokens as rows, (B·T, D), everywhere."""
    X_p, _, X_h = _pair(6, N=60)  # 60 × 6
    a, b = jnp.asarray(X_p), jnp.asarray(X_h)
    np.testing.assert_allclose(
        float(train.regularizer_loss(a.reshape(20, 3, 6), b.reshape(10, 6, 6), 1.0, 2.0)),
        float(train.regularizer_loss(a, b, 1.0, 2.0)),
        rtol=1e-12,
    )
    theta = jnp.eye(6) + 0.1
    np.testing.assert_allclose(
        np.asarray(train.preconditioned_update(theta, a.reshape(20, 3, 6), None, 1.0, 0.0)),
        np.asarray(train.preconditioned_update(theta, a, None, 1.0, 0.0)),
        rtol=1e-12,
    )
    with pytest.raises(ValueError, match="columns"):
        train.preconditioned_update(theta, a[:, :5], None)
    with pytest.raises(ValueError, match="D_in×D"):
        train.preconditioned_update(theta[0], a, None)
    with pytest.raises(ValueError, match=r"\(B, T, D\)"):
        train.regularizer_loss(a.reshape(60, 1, 2, 3), None)
    with pytest.raises(ValueError, match="same rows"):
        train.precondition(a @ theta, a[:10])
