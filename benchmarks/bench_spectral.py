"""Speed of condreg's spectral engine, as ratios measured in one process.

Per shape (N, D), dtype and framework (PyTorch eager, JAX under ``jit``):

``reg``
    The regularizer alone: value and gradient of R_ill(FᵀF) with respect to a given feature
    batch F (N×D) — condreg (``condreg.r_ill(F, gram=True)``) against autodiff through
    ``svdvals(F)`` (the same formula written on the singular values, what a user writes by hand).
``step``
    One training step of Eq. 11: value and gradient with respect to θ (D×D) of
    R_well(X_P θ) + R_ill(X_H θ). condreg against
    (a) the peer approach (the paper's released code: form the D×D Hessian H = FᵀF, ``eigvalsh``,
    autodiff; not run at D > 2048),
    (b) autodiff through ``svdvals`` of the features, and
    (c) the *free step*: the same step with a regularizer that costs nothing
    (``(X_P θ * 0).sum() + (X_H θ * 0).sum()``: the feature GEMMs and autograd only) — the floor
    of any regularizer on this machine; also in units of one N×D×D GEMM (``X @ θ``).
``accuracy``
    The largest entry of |condreg's step gradient − the float64 closed form| over the largest
    entry of the latter (the closed form from ``numpy.linalg.svd`` of each task's features, written
    out here, independent of the engine).

Times are medians (``--stat min``: minima) over ``--repeat`` interleaved rounds (each round
runs every method, so a load spike hits all of them; within a round each method whose warm-up
took under 50 ms runs three times back to back and counts its best, so no method pays for the
caches another one evicted) after one warm-up. ``--clock cpu`` times the process's CPU time
instead of wall time (with ``--threads 1`` on a loaded host). ``--threads n``
limits PyTorch's intra-op threads, NumPy's BLAS (threadpoolctl) and, for ``n = 1``, XLA to ``n``
threads. The first line printed is the host's speed indicator: a 529×784 NumPy QR + SVD on one
thread (34 ms on the quietest host these pages were measured on), taken before and after the run.
The machines these figures come from are shared: compare the ratios, not the seconds.

Usage: ``python benchmarks/bench_spectral.py [--shapes 64x784,1024x512] [--dtypes float64]
[--frameworks torch,jax] [--repeat 5] [--threads 2] [--json out.json] [--markdown]``
(``JAX_ENABLE_X64=1`` for the float64 JAX rows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import condreg

SHAPES = [(64, 784), (64, 2048), (256, 1024), (1024, 512), (4096, 1024)]


def _interleaved(
    fns: dict[str, Callable[[], object]], repeat: int, clock: Callable[[], float]
) -> dict[str, float]:
    """``{name: median over rounds of the round's best, name + "_min": best of all calls}``."""
    inner = {}
    for k, fn in fns.items():
        t0 = clock()
        fn()  # warm-up (compilation, allocator)
        # three back-to-back calls (warm caches, the best of them) unless a call is slow
        inner[k] = 3 if clock() - t0 < 0.05 else 1
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            best = math.inf
            for _ in range(inner[k]):
                t0 = clock()
                fn()
                best = min(best, clock() - t0)
            times[k].append(best)
    out = {k: statistics.median(v) for k, v in times.items()}
    return out | {k + "_min": min(v) for k, v in times.items()}


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


def bench_torch(N: int, D: int, dtype: str, repeat: int, device: str = "cpu", clock=None) -> dict:
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

    def step_free():
        t = th.detach().requires_grad_()
        loss = (XP @ t * 0).sum() + (XH @ t * 0).sum()
        loss.backward()
        return t.grad

    def gemm():
        return XP @ th

    fns = {
        "reg_ours": reg_ours,
        "reg_svdvals": reg_svdvals,
        "step_ours": step_ours,
        "step_svdvals": step_svdvals,
        "step_free": step_free,
        "gemm": gemm,
    }
    if D <= 2048:
        fns["step_official"] = step_official
    fns = {k: (lambda f=f: (f(), sync())) for k, f in fns.items()}
    t = _interleaved(fns, repeat, clock or time.perf_counter)
    ref = _step_reference(*(a.double().cpu().numpy() for a in (XP, XH, th)))
    got = step_ours().double().cpu().numpy()
    t["accuracy"] = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    return t


# --------------------------------------------------------------------------------------------
# JAX (jit)
# --------------------------------------------------------------------------------------------


def bench_jax(N: int, D: int, dtype: str, repeat: int, clock=None) -> dict:
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

    def free(t):
        return jnp.sum(XP @ t * 0) + jnp.sum(XH @ t * 0)

    step_ours = jax.jit(jax.value_and_grad(ours))
    step_free = jax.jit(jax.value_and_grad(free))
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
        "step_free": run(step_free, th),
        "gemm": run(gemm, th),
    }
    if D <= 2048:
        fns["step_official"] = run(step_official, th)
    t = _interleaved(fns, repeat, clock or time.perf_counter)
    ref = _step_reference(*(np.asarray(a, dtype=np.float64) for a in (XP, XH, th)))
    got = np.asarray(step_ours(th)[1], dtype=np.float64)
    t["accuracy"] = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    return t


def _closed_form(quantity: str, F: np.ndarray) -> np.ndarray:
    """d quantity(FᵀF) / dF in float64 from ``numpy.linalg.svd(F)`` (unique extremes, full rank
    min(N, D)): ``2 F G`` with G = mu_1 v_1v_1ᵀ − H/D (R_well) or
    (mu_k v_kv_kᵀ − H/k) / (‖H‖_F²/(2k) − ½mu_k²)² (R_ill)."""
    _, s, Vt = np.linalg.svd(F, full_matrices=False)
    mu, k, D = s * s, s.size, F.shape[1]
    if quantity == "r_well":
        FG = mu[0] * np.outer(F @ Vt[0], Vt[0]) - F @ (F.T @ F) / D
    else:
        den = np.sum(mu * mu) / (2 * k) - 0.5 * mu[-1] ** 2
        FG = (mu[-1] * np.outer(F @ Vt[-1], Vt[-1]) - F @ (F.T @ F) / k) / den**2
    return 2 * FG


def _step_reference(XP: np.ndarray, XH: np.ndarray, th: np.ndarray) -> np.ndarray:
    """The step's gradient with respect to θ in float64 (:func:`_closed_form`)."""
    return XP.T @ _closed_form("r_well", XP @ th) + XH.T @ _closed_form("r_ill", XH @ th)


# --------------------------------------------------------------------------------------------


def machine() -> str:
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


def speed_indicator() -> float:
    """Seconds of a 529×784 NumPy QR + SVD on one thread (best of five): the host's speed."""
    from threadpoolctl import threadpool_limits

    A = np.random.default_rng(1).standard_normal((529, 784))
    best = math.inf
    with threadpool_limits(1):
        for _ in range(5):
            t0 = time.perf_counter()
            R = np.linalg.qr(A.T, mode="r")
            np.linalg.svd(R, compute_uv=False)
            best = min(best, time.perf_counter() - t0)
    return best


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}

COLUMNS = (
    "| framework | dtype | threads | N×D | reg: svdvals-AD / condreg | step: peer / condreg | "
    "step: svdvals-AD / condreg | step: condreg / free | free step in GEMMs | reg ms | step ms | "
    "free ms | max rel. diff. vs float64 closed form |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def markdown_row(r: dict, stat: str = "median") -> str:
    """One row of :data:`COLUMNS` from a result row: ratios of medians, or of minima
    (``stat="min"``)."""
    if stat == "min":
        r = r | {k.removesuffix("_min"): v for k, v in r.items() if k.endswith("_min")}
    off = r.get("step_official")
    peer = f"{off / r['step_ours']:.1f}×" if off else "—"
    return (
        f"| {r['framework']} | {r['dtype']} | {r['threads'] or 'default'} | {r['N']}×{r['D']} | "
        f"{r['reg_svdvals'] / r['reg_ours']:.2f}× | {peer} | "
        f"{r['step_svdvals'] / r['step_ours']:.2f}× | {r['step_ours'] / r['step_free']:.2f}× | "
        f"{r['step_free'] / r['gemm']:.1f} | {r['reg_ours'] * 1e3:.2f} | "
        f"{r['step_ours'] * 1e3:.1f} | {r['step_free'] * 1e3:.1f} | {r['accuracy']:.1e} |"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(f"{n}x{d}" for n, d in SHAPES))
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--frameworks", default="torch,jax")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", action="store_true", help="print the rows as a markdown table")
    ap.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="wall time, or the process's CPU time (with --threads 1 on a loaded host: the time "
        "waiting for a core is not counted)",
    )
    ap.add_argument(
        "--stat",
        choices=("median", "min"),
        default="median",
        help="the table's statistic: the median round, or the fastest call (on a loaded host "
        "a call longer than a scheduler slice waits for the other runnable processes, which "
        "penalises the slower methods' medians)",
    )
    ap.add_argument("--device", default="cpu", help="PyTorch device (cpu, cuda)")
    ap.add_argument("--threads", type=int, default=None, help="threads (torch, BLAS; XLA if 1)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    limits = contextlib.nullcontext()
    if args.threads:
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(args.threads)
        limits = threadpool_limits(args.threads)
        if args.threads == 1 and "jax" not in sys.modules:
            os.environ["XLA_FLAGS"] = (
                os.environ.get("XLA_FLAGS", "")
                + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
            )
    speed = speed_indicator()
    print(f"{machine()}; load {os.getloadavg()[0]:.1f}; speed indicator {speed * 1e3:.0f} ms")
    print(
        "framework dtype N D | reg: svdvals-AD/ours | step: peer/ours svdvals-AD/ours ours/free "
        "free/GEMM | accuracy"
    )
    rows = []
    with limits:
        for fw in args.frameworks.split(","):
            for dtype in args.dtypes.split(","):
                for N, D in shapes:
                    rows.append(_row(fw, dtype, N, D, args))
    speed_after = speed_indicator()
    print(f"speed indicator after: {speed_after * 1e3:.0f} ms; load {os.getloadavg()[0]:.1f}")
    if args.markdown:
        print(COLUMNS)
        for r in rows:
            print(markdown_row(r, args.stat))
    if args.json:
        meta = {"machine": machine(), "speed_before": speed, "speed_after": speed_after}
        with open(args.json, "w") as fh:
            json.dump({**meta, "rows": rows}, fh, indent=1)


def _row(fw: str, dtype: str, N: int, D: int, args) -> dict:
    repeat = args.repeat if N * D <= 300_000 else max(2, args.repeat // 2)
    if fw == "torch":
        t = bench_torch(N, D, dtype, repeat, args.device, CLOCKS[args.clock])
    else:
        t = bench_jax(N, D, dtype, repeat, CLOCKS[args.clock])
    device = args.device if fw == "torch" else "default"
    row = {"framework": fw, "device": device, "dtype": dtype, "threads": args.threads}
    row.update({"N": N, "D": D, **t})
    off = t.get("step_official")
    print(
        f"{fw} {dtype} {N} {D} | {t['reg_svdvals'] / t['reg_ours']:.2f} | "
        f"{(off / t['step_ours']) if off else float('nan'):.1f} "
        f"{t['step_svdvals'] / t['step_ours']:.2f} {t['step_ours'] / t['step_free']:.2f} "
        f"{t['step_free'] / t['gemm']:.1f} | {t['accuracy']:.1e}",
        flush=True,
    )
    return row


if __name__ == "__main__":
    main()
