"""Scale-out: condreg under torch.distributed (2 CPU processes, gloo on loopback) and JAX
sharding (2 virtual CPU devices), each in a subprocess so no global state leaks into the suite.

The distributed value and gradients must equal the single-process computation on the stacked
features.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

TORCH_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import condreg
    from condreg.torch.distributed import gather_features

    def worker(rank, world, port, out):
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        try:
            g = torch.Generator().manual_seed(0)
            F_all = torch.randn(6 * world, 10, dtype=torch.float64, generator=g)
            F = F_all[6 * rank : 6 * (rank + 1)].clone().requires_grad_(True)
            loss = condreg.r_ill(gather_features(F), gram=True) + condreg.r_well(
                gather_features(F), gram=True
            )
            loss.backward()
            torch.save({"loss": loss.detach(), "grad": F.grad / world}, f"{out}/rank{rank}.pt")
        finally:
            dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(2, int(sys.argv[1]), sys.argv[2]), nprocs=2)
    """
)

JAX_SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import condreg

    assert len(jax.devices()) == 2, jax.devices()
    F = jnp.asarray(np.random.default_rng(0).standard_normal((12, 10)))
    mesh = Mesh(np.array(jax.devices()), ("data",))
    Fs = jax.device_put(F, NamedSharding(mesh, P("data", None)))
    f = jax.jit(jax.value_and_grad(lambda X: condreg.r_ill(X, gram=True)))
    v, g = f(Fs)
    v0, g0 = f(F)
    assert len(Fs.sharding.device_set) == 2
    np.testing.assert_allclose(float(v), float(v0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g0), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(
        np.asarray(g), condreg.r_ill_grad(np.asarray(F), gram=True), rtol=1e-10, atol=1e-14
    )
    print("ok", g.sharding)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(script: str, *args: str, cwd) -> subprocess.CompletedProcess:
    path = cwd / "script.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )


def test_torch_distributed_all_gather_matches_single_process(tmp_path):
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    import condreg

    proc = _run(TORCH_SCRIPT, str(_free_port()), str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    g = torch.Generator().manual_seed(0)
    F = torch.randn(12, 10, dtype=torch.float64, generator=g).requires_grad_(True)
    loss = condreg.r_ill(F, gram=True) + condreg.r_well(F, gram=True)
    loss.backward()
    for r in (r0, r1):
        np.testing.assert_allclose(float(r["loss"]), loss.item(), rtol=1e-12)
    grad = torch.cat([r0["grad"], r1["grad"]]).numpy()
    np.testing.assert_allclose(grad, F.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_gather_features_is_identity_without_a_process_group():
    torch = pytest.importorskip("torch")
    from condreg.torch.distributed import gather_features

    F = torch.randn(4, 3)
    assert gather_features(F) is F


def test_jax_sharded_features_jit_grad_matches_unsharded(tmp_path):
    pytest.importorskip("jax")
    proc = _run(JAX_SCRIPT, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok")
