"""condreg.jax.optax: a real optax transformation that composes in optax.chain."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

import condreg  # noqa: E402
from condreg.algorithm import preconditioned_gradient  # noqa: E402


@pytest.fixture
def reg(x64):
    from condreg.jax.optax import condition_regularizer

    return condition_regularizer


def _pair(seed=3, N=80, D=6):
    rng = np.random.default_rng(seed)
    X_p = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -1, D))
    Q, _ = np.linalg.qr(rng.standard_normal((D, D)))
    X_h = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -1, D)) @ Q.T
    y = X_p @ rng.standard_normal(D)
    return X_p / np.linalg.norm(X_p, 2), y, X_h / np.linalg.norm(X_h, 2)


def _train(tx, X_p, y, X_h, steps):
    """A small model: immunized linear map theta (D×D) and a linear head, trained by ``tx``."""
    D = X_p.shape[1]
    xp_, xh_, yy = jnp.asarray(X_p), jnp.asarray(X_h), jnp.asarray(y)
    params = {"theta": jnp.eye(D), "head": {"omega": jnp.zeros(D)}}
    state = tx.init(params)

    def task_loss(p):
        return jnp.mean((xp_ @ p["theta"] @ p["head"]["omega"] - yy) ** 2)

    @jax.jit
    def step(p, s):
        g = jax.grad(task_loss)(p)
        u, s = tx.update(g, s, p, x_p=xp_, x_h=xh_)
        return optax.apply_updates(p, u), s

    for _ in range(steps):
        params, state = step(params, state)
    return params, float(task_loss(params))


def test_is_an_optax_transformation_and_chain_passes_the_batches(reg):
    X_p, _, X_h = _pair()
    tx = reg(0.7, 0.2, key="theta")
    assert isinstance(tx, optax.GradientTransformationExtraArgs)
    rng = np.random.default_rng(0)
    theta = jnp.asarray(np.eye(6) + 0.1 * rng.standard_normal((6, 6)))
    params = {"theta": theta, "w": jnp.ones(3)}
    grads = {"theta": jnp.asarray(rng.standard_normal((6, 6))), "w": jnp.full(3, 2.0)}
    chain = optax.chain(tx, optax.sgd(0.01))
    u, _ = jax.jit(chain.update)(
        grads, chain.init(params), params, x_p=jnp.asarray(X_p), x_h=jnp.asarray(X_h)
    )
    expected = np.asarray(grads["theta"]) + (
        0.7 * preconditioned_gradient(np.asarray(theta), X_p, "r_well")
        + 0.2 * preconditioned_gradient(np.asarray(theta), X_h, "r_ill")
    )
    np.testing.assert_allclose(np.asarray(u["theta"]), -0.01 * expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(u["w"]), -0.02 * np.ones(3))
    # without the batches, or with them misspelled, no silent identity: a clear error
    with pytest.raises(ValueError, match=r"lam_p=0.7 needs the batch x_p=.*received: \[\]"):
        chain.update(grads, chain.init(params), params)
    with pytest.raises(ValueError, match=r"x_p=.*\['X_h', 'X_p'\].*did you mean"):
        chain.update(grads, chain.init(params), params, X_p=X_p, X_h=X_h)
    with pytest.raises(ValueError, match="x_h="):
        chain.update(grads, chain.init(params), params, x_p=jnp.asarray(X_p))
    with pytest.raises(ValueError, match="columns"):
        chain.update(grads, chain.init(params), params, x_p=X_p[:, :5], x_h=X_h)
    with pytest.raises(ValueError, match="token features"):
        chain.update(grads, chain.init(params), params, x_p=X_p[0], x_h=X_h)
    # under jit too (shapes are static): the error is raised while tracing
    with pytest.raises(ValueError, match="x_p="):
        jax.jit(lambda g, p: chain.update(g, chain.init(p), p))(grads, params)


def test_nested_key_and_bare_params(reg):
    X_p, _, X_h = _pair()
    theta = jnp.eye(6) * 1.5
    g = jnp.zeros((6, 6))
    bare, _ = reg(1.0, 0.0).update(g, None, theta, x_p=jnp.asarray(X_p))
    nested, _ = reg(1.0, 0.0, key=("enc", 0)).update(
        {"enc": [g, jnp.ones(2)]}, None, {"enc": [theta, jnp.ones(2)]}, x_p=jnp.asarray(X_p)
    )
    np.testing.assert_allclose(np.asarray(nested["enc"][0]), np.asarray(bare))
    np.testing.assert_allclose(
        np.asarray(bare), preconditioned_gradient(np.asarray(theta), X_p, "r_well"), rtol=1e-10
    )
    with pytest.raises(ValueError, match="params"):
        reg().update(g, None, None, x_p=jnp.asarray(X_p))
    with pytest.raises(ValueError):
        reg(-1.0)
    with pytest.raises(ValueError):
        reg(ridge=-1.0)


@pytest.mark.parametrize(
    "make_opt, steps", [(lambda: optax.sgd(5e-3), 150), (lambda: optax.adam(2e-3), 150)]
)
def test_training_in_optax_chain_moves_kappa_the_intended_way(reg, make_opt, steps):
    """κ(H_P) ends below the same optimizer's without the regularizer, κ(H_H) above its start,
    and the RIR (Eq. 15) is far above the un-regularized run's."""
    X_p, y, X_h = _pair()
    with_reg, loss_reg = _train(
        optax.chain(reg(1.0, 1e-2, key="theta"), make_opt()), X_p, y, X_h, steps
    )
    plain, _ = _train(make_opt(), X_p, y, X_h, steps)
    r = condreg.metrics.rir(np.asarray(with_reg["theta"]), X_p, X_h)
    r0 = condreg.metrics.rir(np.asarray(plain["theta"]), X_p, X_h)
    assert r.kappa_hp < 0.6 * r0.kappa_hp and r.kappa_hp < r.kappa_kp, (r, r0)
    assert r.kappa_hh > 1.2 * r.kappa_kh, r
    assert r.rir > 2 * r0.rir and r.rir > 2 and r.ii < 1, (r, r0)
    assert np.isfinite(loss_reg)


def test_r_well_alone_lowers_kappa_and_r_ill_alone_raises_it(reg):
    X_p, y, X_h = _pair()
    k_p0 = float(condreg.condition_number(X_p))
    k_h0 = float(condreg.condition_number(X_h))
    well, _ = _train(optax.chain(reg(1.0, 0.0, key="theta"), optax.sgd(5e-3)), X_p, y, X_h, 60)
    ill, _ = _train(optax.chain(reg(0.0, 0.1, key="theta"), optax.sgd(5e-3)), X_p, y, X_h, 60)
    assert float(condreg.condition_number(X_p @ np.asarray(well["theta"]))) < 0.9 * k_p0
    assert float(condreg.condition_number(X_h @ np.asarray(ill["theta"]))) > 1.2 * k_h0


def test_sharded_batches_give_the_update_of_the_whole_batch(tmp_path):
    """2 virtual CPU devices (XLA_FLAGS before jax's import: a subprocess): jit with row-sharded
    batches, shard_map and pmap with ``axis_name`` equal one device on the whole batch; shard_map
    without the axis name regularizes each shard (different: the test can fail)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(here / "_scale_jax.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rel = dict(line.split() for line in proc.stdout.splitlines())
    assert set(rel) == {"jit-sharded", "shard_map", "shard_map-no-axis", "pmap"}, proc.stdout
    for case in ("jit-sharded", "shard_map", "pmap"):
        assert float(rel[case]) < 1e-10, (case, rel)
    assert float(rel["shard_map-no-axis"]) > 1e-3, rel
