"""Speed of condreg's spectral engine, as ratios measured in one process.

Three comparisons per shape (N, D), dtype and framework (PyTorch eager, JAX under ``jit``):

``reg``
    The regularizer alone: value and gradient of R_ill(FᵀF) with respect to a given feature
    batch F (N×D) — condreg (``condreg.r_ill(F, gram=True)``, the engine's cheapest exact path)
    against autodiff through ``svdvals(F)`` (the same formula written on the singular values).
``step``
    One training step of Eq. 11: value and gradient with respect to θ (D×D) of
    R_well(X_P θ) + R_ill(X_H θ) — condreg against the official approach (form the D×D Hessian
    H = FᵀF, ``eigvalsh``, autodiff) and against autodiff through ``svdvals``; also expressed in
    units of one N×D×D GEMM (``X @ θ``, every method's unavoidable cost: 2 forward + 2 backward).
``accuracy``
    The largest relative difference of condreg's step gradient from the float64 SVD path
    (``method="svd"`` of the engine) on the same input.

Times are medians over ``--repeat`` interleaved rounds (each round runs every method, so a load
spike hits all of them; within a round each method runs three times back to back and counts its
best, so no method pays for the caches another one evicted) after one warm-up. The machine
these figures come from is shared: compare the ratios, not the seconds.

Usage: ``python benchmarks/bench_spectral.py [--shapes 64x784,1024x512] [--dtypes float64]
[--frameworks torch,jax] [--repeat 5] [--json out.json] [--markdown]``
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

import condreg

SHAPES = [(64, 784), (64, 2048), (256, 1024), (1024, 512), (4096, 1024)]


def _interleaved(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm-up (compilation, allocator)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            best = math.inf
            for _ in range(3):  # three back-to-back calls: warm caches, the best of them
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            times[k].append(best)
    return {k: statistics.median(v) for k, v in times.items()}


def _data(N: int, D: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    theta = np.eye(D) + rng.standard_normal((D, D)) / np.sqrt(D) * 0.3
    return rng.standard_normal((N, D)), rng.standard_normal((N, D)), theta


def _r_from_mu(mu, D: int, xp_sum):
    """R_well + R_ill-style formulas on eigenvalues ``mu`` of H (descending, all nonzero)."""
    k = mu.shape[-1]
    fro2 = xp_sum(mu * mu)
    r_well = 0.5 * mu[0] ** 2 - fro2 / (2 * D)
    r_ill = 1.0 / (fro2 / (2 * k) - 0.5 * mu[-1] ** 2)
    return r_well, r_ill


# --------------------------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------------------------


def bench_torch(N: int, D: int, dtype: str, repeat: int, device: str = "cpu") -> dict:
    import torch

    dt = getattr(torch, dtype)
    XP, XH, th = (torch.asarray(a, dtype=dt, device=device) for a in _data(N, D))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    F0 = XH @ th
    k = min(N, D)

    def reg_ours():
        F = F0.detach().requires_grad_()
        condreg.r_ill(F, gram=True).backward()
        return F.grad

    def reg_svdvals():
        F = F0.detach().requires_grad_()
        s = torch.linalg.svdvals(F)
        _, r_ill = _r_from_mu(s * s, D, torch.sum)
        r_ill.backward()
        return F.grad

    def step_ours():
        t = th.detach().requires_grad_()
        loss = condreg.r_well(XP @ t, gram=True) + condreg.r_ill(XH @ t, gram=True)
        loss.backward()
        return t.grad

    def step_official():
        t = th.detach().requires_grad_()
        FP, FH = XP @ t, XH @ t
        muP = torch.flip(torch.linalg.eigvalsh(FP.T @ FP), (-1,))[:k]
        muH = torch.flip(torch.linalg.eigvalsh(FH.T @ FH), (-1,))[:k]
        loss = _r_from_mu(muP, D, torch.sum)[0] + _r_from_mu(muH, D, torch.sum)[1]
        loss.backward()
        return t.grad

    def step_svdvals():
        t = th.detach().requires_grad_()
        sP, sH = torch.linalg.svdvals(XP @ t), torch.linalg.svdvals(XH @ t)
        loss = _r_from_mu(sP * sP, D, torch.sum)[0] + _r_from_mu(sH * sH, D, torch.sum)[1]
        loss.backward()
        return t.grad

    def gemm():
        return XP @ th

    fns = {
        "reg_ours": reg_ours,
        "reg_svdvals": reg_svdvals,
        "step_ours": step_ours,
        "step_svdvals": step_svdvals,
        "gemm": gemm,
    }
    if D <= 2048:
        fns["step_official"] = step_official
    fns = {k: (lambda f=f: (f(), sync())) for k, f in fns.items()}
    t = _interleaved(fns, repeat)
    ref = _step_reference(*(a.double().cpu().numpy() for a in (XP, XH, th)))
    got = step_ours().double().cpu().numpy()
    t["accuracy"] = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    return t


# --------------------------------------------------------------------------------------------
# JAX (jit)
# --------------------------------------------------------------------------------------------


def bench_jax(N: int, D: int, dtype: str, repeat: int) -> dict:
    import jax
    import jax.numpy as jnp

    if dtype == "float64" and not jax.config.read("jax_enable_x64"):
        raise RuntimeError("float64 with JAX needs JAX_ENABLE_X64=1 in the environment")
    XP, XH, th = (jnp.asarray(a, dtype=dtype) for a in _data(N, D))
    F0 = XH @ th
    k = min(N, D)

    def svd_loss(F):
        s = jnp.linalg.svd(F, compute_uv=False)
        return _r_from_mu(s * s, D, jnp.sum)

    reg_ours = jax.jit(jax.value_and_grad(lambda F: condreg.r_ill(F, gram=True)))
    reg_svdvals = jax.jit(jax.value_and_grad(lambda F: svd_loss(F)[1]))

    def ours(t):
        return condreg.r_well(XP @ t, gram=True) + condreg.r_ill(XH @ t, gram=True)

    def official(t):
        FP, FH = XP @ t, XH @ t
        muP = jnp.flip(jnp.linalg.eigvalsh(FP.T @ FP), -1)[:k]
        muH = jnp.flip(jnp.linalg.eigvalsh(FH.T @ FH), -1)[:k]
        return _r_from_mu(muP, D, jnp.sum)[0] + _r_from_mu(muH, D, jnp.sum)[1]

    def svdvals(t):
        return svd_loss(XP @ t)[0] + svd_loss(XH @ t)[1]

    step_ours = jax.jit(jax.value_and_grad(ours))
    step_official = jax.jit(jax.value_and_grad(official))
    step_svdvals = jax.jit(jax.value_and_grad(svdvals))
    gemm = jax.jit(lambda t: XP @ t)

    def run(f, *a):
        return lambda: jax.block_until_ready(f(*a))

    fns = {
        "reg_ours": run(reg_ours, F0),
        "reg_svdvals": run(reg_svdvals, F0),
        "step_ours": run(step_ours, th),
        "step_svdvals": run(step_svdvals, th),
        "gemm": run(gemm, th),
    }
    if D <= 2048:
        fns["step_official"] = run(step_official, th)
    t = _interleaved(fns, repeat)
    ref = _step_reference(*(np.asarray(a, dtype=np.float64) for a in (XP, XH, th)))
    got = np.asarray(step_ours(th)[1], dtype=np.float64)
    t["accuracy"] = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    return t


def _step_reference(XP: np.ndarray, XH: np.ndarray, th: np.ndarray) -> np.ndarray:
    """The step's gradient in float64 from the engine's SVD path (``method="svd"``)."""
    from condreg import _core

    out = np.zeros_like(th)
    for X, q in ((XP, "r_well"), (XH, "r_ill")):
        G = _core.gradient(
            q,
            X @ th,
            np,
            rtol=None,
            tie_rtol=None,
            gram=True,
            subgradient="min_norm",
            concrete=_core.eager,
            method="svd",
        )
        out += X.T @ G
    return out


# --------------------------------------------------------------------------------------------


def machine() -> str:
    import os

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(f"{n}x{d}" for n, d in SHAPES))
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--frameworks", default="torch,jax")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cpu", help="PyTorch device (cpu, cuda)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(machine())
    print(
        "framework dtype N D | reg: svdvals-AD/ours | step: official/ours svdvals-AD/ours "
        "ours/GEMM | accuracy"
    )
    for fw in args.frameworks.split(","):
        for dtype in args.dtypes.split(","):
            for N, D in shapes:
                repeat = args.repeat if N * D <= 300_000 else max(2, args.repeat // 2)
                if fw == "torch":
                    t = bench_torch(N, D, dtype, repeat, args.device)
                else:
                    t = bench_jax(N, D, dtype, repeat)
                device = args.device if fw == "torch" else "default"
                row = {"framework": fw, "device": device, "dtype": dtype, "N": N, "D": D, **t}
                rows.append(row)
                off = t.get("step_official")
                print(
                    f"{fw} {dtype} {N} {D} | {t['reg_svdvals'] / t['reg_ours']:.2f} | "
                    f"{(off / t['step_ours']) if off else float('nan'):.1f} "
                    f"{t['step_svdvals'] / t['step_ours']:.2f} {t['step_ours'] / t['gemm']:.1f} | "
                    f"{t['accuracy']:.1e}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
