"""Run by tests/test_optax.py in a subprocess (XLA_FLAGS must be set before jax is imported):
condreg.jax.optax.condition_regularizer with the batches sharded over 2 virtual CPU devices —
under jax.jit (NamedSharding), under shard_map and under pmap with the axis name — equals one
device on the whole batch. Prints one line per case: its name and the relative difference."""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from condreg.jax.optax import condition_regularizer  # noqa: E402


def rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def main():
    assert len(jax.devices()) == 2, jax.devices()
    rng = np.random.default_rng(0)
    x_p = jnp.asarray(rng.standard_normal((32, 6)))
    x_h = jnp.asarray(rng.standard_normal((32, 6)) * np.logspace(0, -1, 6))
    params = {"theta": jnp.eye(6) + 0.1 * jnp.asarray(rng.standard_normal((6, 6)))}
    grads = {"theta": jnp.asarray(rng.standard_normal((6, 6)))}

    def update(tx, g, p, a, b):
        chain = optax.chain(tx, optax.sgd(0.1))
        return chain.update(g, chain.init(p), p, x_p=a, x_h=b)[0]

    tx = condition_regularizer(1.0, 0.5, key="theta")
    ref = jax.jit(lambda g, p, a, b: update(tx, g, p, a, b))(grads, params, x_p, x_h)["theta"]

    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = NamedSharding(mesh, P("data", None))
    a, b = jax.device_put(x_p, rows), jax.device_put(x_h, rows)
    assert len(a.sharding.device_set) == 2
    out = jax.jit(lambda g, p, a, b: update(tx, g, p, a, b))(grads, params, a, b)["theta"]
    print("jit-sharded", rel(out, ref))

    tx_axis = condition_regularizer(1.0, 0.5, key="theta", axis_name="data")
    for name, t in (("shard_map", tx_axis), ("shard_map-no-axis", tx)):
        f = jax.shard_map(
            lambda g, p, a, b, t=t: update(t, g, p, a, b),
            mesh=mesh,
            in_specs=(P(), P(), P("data", None), P("data", None)),
            out_specs=P(),
            check_vma=False,
        )
        print(name, rel(jax.jit(f)(grads, params, x_p, x_h)["theta"], ref))

    def split(x):
        return x.reshape(2, 16, 6)

    f = jax.pmap(
        lambda g, p, a, b: update(tx_axis, g, p, a, b), axis_name="data", in_axes=(None, None, 0, 0)
    )
    out = f(grads, params, split(x_p), split(x_h))["theta"]
    print("pmap", max(rel(out[0], ref), rel(out[1], ref)))


if __name__ == "__main__":
    main()
