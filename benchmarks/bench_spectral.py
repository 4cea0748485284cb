"""Speed of condreg's spectral engine, as ratios measured in one process.

Per shape (N, D), dtype and framework (PyTorch eager, JAX under ``jit``):

``reg``
    The regularizer alone: value and gradient of R_ill(FᵀF) with respect to a given feature
    batch F (N×D, or a batch B×N×D) — condreg (``condreg.r_ill(F, gram=True)``) against
    autodiff through ``svdvals(F)`` (the same formula written on the singular values, what a
    user writes by hand) and against its own *floor*: the same work as bare calls — the Gram
    GEMM (float64 for float32 features), its ``eigh`` and the gradient's two GEMMs; on the
    extreme-cluster route (one CPU matrix, min(N, D) >= 128) the Gram GEMM, ``eigvalsh``, one LU
    of the Gram matrix and the gradient's GEMM.
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

Usage: ``python benchmarks/bench_spectral.py [--shapes 64x784,1024x512,32x64x512]
[--dtypes float64] [--frameworks torch,jax] [--repeat 5] [--threads 2] [--json out.json]
[--markdown]`` (``JAX_ENABLE_X64=1`` for the float64 JAX rows; ``BxNxD`` is a batch, timed for
the regularizer only). ``--count`` prints, instead of timing, what one forward + backward of each
function dispatches on ``--device`` (PyTorch ops, host reads) and, on CUDA, checks that
``check_finite=False`` runs under ``torch.cuda.set_sync_debug_mode("error")``.
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
from condreg._spectrum import EXTREME_MIN

SHAPES = [(64, 784), (64, 2048), (256, 1024), (1024, 512), (4096, 1024), (32, 64, 512)]


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


def _data(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    D = shape[-1]
    theta = np.eye(D) + rng.standard_normal((D, D)) / np.sqrt(D) * 0.3
    return rng.standard_normal(shape), rng.standard_normal(shape), theta


def _r_from_mu(mu, D: int):
    """R_well + R_ill-style formulas on eigenvalues ``mu`` of H (descending, all nonzero),
    summed over a batch."""
    k = mu.shape[-1]
    fro2 = (mu * mu).sum(-1)
    r_well = 0.5 * mu[..., 0] ** 2 - fro2 / (2 * D)
    r_ill = 1.0 / (fro2 / (2 * k) - 0.5 * mu[..., -1] ** 2)
    return r_well.sum(), r_ill.sum()


def extreme_route(shape: tuple[int, ...], device: str = "cpu") -> bool:
    """Whether condreg's PyTorch adapter takes the extreme-cluster route for ``shape``."""
    return len(shape) == 2 and min(shape) >= EXTREME_MIN and device == "cpu"


# --------------------------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------------------------


def bench_torch(shape, dtype: str, repeat: int, device: str = "cpu", clock=None) -> dict:
    import torch

    dt = getattr(torch, dtype)
    XP, XH, th = (torch.asarray(a, dtype=dt, device=device) for a in _data(shape))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    F0 = XH @ th
    N, D = shape[-2:]
    k, left = min(N, D), N <= D

    def reg_ours():
        F = F0.detach().requires_grad_()
        condreg.r_ill(F, gram=True).sum().backward()
        return F.grad

    def reg_svdvals():
        F = F0.detach().requires_grad_()
        s = torch.linalg.svdvals(F)
        _r_from_mu(s * s, D)[1].backward()
        return F.grad

    def reg_floor():
        A = F0.double()
        G = A @ A.mT if left else A.mT @ A
        if extreme_route(shape, device):
            torch.linalg.eigvalsh(G)
            torch.linalg.lu_factor_ex(G)
            P = G
        else:
            mu, W = torch.linalg.eigh(G)
            P = (W * mu[..., None, :]) @ W.mT
        P = P.to(dt)
        return P @ F0 if left else F0 @ P

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
        loss = _r_from_mu(muP, D)[0] + _r_from_mu(muH, D)[1]
        loss.backward()
        return t.grad

    def step_svdvals():
        t = th.detach().requires_grad_()
        sP, sH = torch.linalg.svdvals(XP @ t), torch.linalg.svdvals(XH @ t)
        loss = _r_from_mu(sP * sP, D)[0] + _r_from_mu(sH * sH, D)[1]
        loss.backward()
        return t.grad

    def step_free():
        t = th.detach().requires_grad_()
        loss = (XP @ t * 0).sum() + (XH @ t * 0).sum()
        loss.backward()
        return t.grad

    def gemm():
        return XP @ th

    fns = {"reg_ours": reg_ours, "reg_svdvals": reg_svdvals, "reg_floor": reg_floor}
    if len(shape) == 2:
        fns |= {"step_ours": step_ours, "step_svdvals": step_svdvals, "step_free": step_free}
        fns |= {"gemm": gemm} | ({"step_official": step_official} if D <= 2048 else {})
    fns = {k: (lambda f=f: (f(), sync())) for k, f in fns.items()}
    t = _interleaved(fns, repeat, clock or time.perf_counter)
    if len(shape) == 2:
        ref = _step_reference(*(a.double().cpu().numpy() for a in (XP, XH, th)))
        got = step_ours().double().cpu().numpy()
        t["accuracy"] = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    return t


# --------------------------------------------------------------------------------------------
# JAX (jit)
# --------------------------------------------------------------------------------------------


def bench_jax(shape, dtype: str, repeat: int, clock=None) -> dict:
    import jax
    import jax.numpy as jnp

    if dtype == "float64" and not jax.config.read("jax_enable_x64"):
        raise RuntimeError("float64 with JAX needs JAX_ENABLE_X64=1 in the environment")
    XP, XH, th = (jnp.asarray(a, dtype=dtype) for a in _data(shape))
    F0 = XH @ th
    N, D = shape[-2:]
    k, left = min(N, D), N <= D

    def svd_loss(F):
        s = jnp.linalg.svd(F, compute_uv=False)
        return _r_from_mu(s * s, D)

    def floor(F):  # the Gram (float64 where x64 is on), its eigh and the gradient's GEMMs
        A = F.astype(jnp.promote_types(F.dtype, jnp.float64))
        mu, W = jnp.linalg.eigh(A @ A.mT if left else A.mT @ A)
        P = ((W * mu[..., None, :]) @ W.mT).astype(F.dtype)
        return P @ F if left else F @ P

    reg_ours = jax.jit(jax.value_and_grad(lambda F: condreg.r_ill(F, gram=True).sum()))
    reg_svdvals = jax.jit(jax.value_and_grad(lambda F: svd_loss(F)[1]))

    def ours(t):
        return condreg.r_well(XP @ t, gram=True) + condreg.r_ill(XH @ t, gram=True)

    def official(t):
        FP, FH = XP @ t, XH @ t
        muP = jnp.flip(jnp.linalg.eigvalsh(FP.T @ FP), -1)[:k]
        muH = jnp.flip(jnp.linalg.eigvalsh(FH.T @ FH), -1)[:k]
        return _r_from_mu(muP, D)[0] + _r_from_mu(muH, D)[1]

    def svdvals(t):
        return svd_loss(XP @ t)[0] + svd_loss(XH @ t)[1]

    def free(t):
        return jnp.sum(XP @ t * 0) + jnp.sum(XH @ t * 0)

    def run(f, *a):
        return lambda: jax.block_until_ready(f(*a))

    grad = jax.value_and_grad
    fns = {
        "reg_ours": run(reg_ours, F0),
        "reg_svdvals": run(reg_svdvals, F0),
        "reg_floor": run(jax.jit(floor), F0),
    }
    if len(shape) == 2:
        fns |= {
            "step_ours": run(jax.jit(grad(ours)), th),
            "step_svdvals": run(jax.jit(grad(svdvals)), th),
            "step_free": run(jax.jit(grad(free)), th),
            "gemm": run(jax.jit(lambda t: XP @ t), th),
        }
        if D <= 2048:
            fns["step_official"] = run(jax.jit(grad(official)), th)
    t = _interleaved(fns, repeat, clock or time.perf_counter)
    if len(shape) == 2:
        ref = _step_reference(*(np.asarray(a, dtype=np.float64) for a in (XP, XH, th)))
        got = np.asarray(jax.jit(grad(ours))(th)[1], dtype=np.float64)
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
    "| framework | dtype | threads | shape | reg: svdvals-AD / condreg | reg: condreg / floor | "
    "step: peer / condreg | step: svdvals-AD / condreg | step: condreg / free | "
    "free step in GEMMs | reg ms | floor ms | step ms | free ms | "
    "max rel. diff. vs float64 closed form |\n" + "|---" * 15 + "|"
)


def _ratio(r: dict, num: str, den: str, fmt: str = ".2f") -> str:
    return f"{r[num] / r[den]:{fmt}}×" if num in r and den in r else "—"


def markdown_row(r: dict, stat: str = "median") -> str:
    """One row of :data:`COLUMNS` from a result row: ratios of medians, or of minima
    (``stat="min"``)."""
    if stat == "min":
        r = r | {k.removesuffix("_min"): v for k, v in r.items() if k.endswith("_min")}
    ms = [f"{r[k] * 1e3:.2f}" if k in r else "—" for k in ("reg_ours", "reg_floor", "step_ours")]
    ms.append(f"{r['step_free'] * 1e3:.1f}" if "step_free" in r else "—")
    free = f"{r['step_free'] / r['gemm']:.1f}" if "gemm" in r else "—"
    return (
        f"| {r['framework']} | {r['dtype']} | {r['threads'] or 'default'} | {r['shape']} | "
        f"{_ratio(r, 'reg_svdvals', 'reg_ours')} | {_ratio(r, 'reg_ours', 'reg_floor')} | "
        f"{_ratio(r, 'step_official', 'step_ours', '.1f')} | "
        f"{_ratio(r, 'step_svdvals', 'step_ours')} | {_ratio(r, 'step_ours', 'step_free')} | "
        f"{free} | {' | '.join(ms)} | {r.get('accuracy', math.nan):.1e} |"
    )


def _syncs(call, torch) -> int:
    """CUDA synchronisations of ``call()``, counted with ``set_sync_debug_mode("warn")``."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def count(shapes: list[tuple[int, ...]], dtypes: list[str], device: str) -> None:
    """Per forward + backward of each function (``gram=True``): the PyTorch ops it dispatches
    (one kernel launch each on a GPU) and its host reads (the engine's ``to_host`` of device
    data, ``.item()``); on CUDA also the synchronisations, and ``check_finite=False`` (a fixed
    route, nothing read) must run under ``set_sync_debug_mode("error")``."""
    import collections

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from condreg import _backend

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    reads, real = [], _backend.to_host
    _backend.to_host = lambda x: (reads.append(not isinstance(x, np.ndarray)), real(x))[1]
    cuda = device.startswith("cuda")
    print("function | dtype | shape | check_finite | aten ops | host reads | CUDA syncs")
    for dtype, shape in ((d, s) for d in dtypes for s in shapes):
        for name, check in (
            (n, c) for n in ("r_ill", "r_well", "condition_number") for c in (1, 0)
        ):
            X = torch.randn(shape, dtype=getattr(torch, dtype), device=device).requires_grad_()

            def call(name=name, check=bool(check), X=X):
                getattr(condreg, name)(X, gram=True, check_finite=check).sum().backward()

            call()
            reads.clear()
            with Ops() as mode:
                call()
            n_ops, n_reads = sum(mode.ops.values()), sum(reads) + mode.ops["_local_scalar_dense"]
            syncs = _syncs(call, torch) if cuda else "—"
            print(f"{name} | {dtype} | {shape} | {bool(check)} | {n_ops} | {n_reads} | {syncs}")
            if cuda and not check:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    call()  # raises on any synchronisation
                finally:
                    torch.cuda.set_sync_debug_mode("default")
    _backend.to_host = real


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
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
    ap.add_argument("--count", action="store_true", help="count ops and host reads, no timing")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.count:
        return count(shapes, args.dtypes.split(","), args.device)
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
        "framework dtype shape | reg: svdvals-AD/ours ours/floor | step: peer/ours "
        "svdvals-AD/ours ours/free free/GEMM | accuracy"
    )
    rows = []
    with limits:
        for fw in args.frameworks.split(","):
            for dtype in args.dtypes.split(","):
                for shape in shapes:
                    rows.append(_row(fw, dtype, shape, args))
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


def _row(fw: str, dtype: str, shape: tuple[int, ...], args) -> dict:
    repeat = args.repeat if math.prod(shape) <= 300_000 else max(2, args.repeat // 2)
    if fw == "torch":
        t = bench_torch(shape, dtype, repeat, args.device, CLOCKS[args.clock])
    else:
        t = bench_jax(shape, dtype, repeat, CLOCKS[args.clock])
    device = args.device if fw == "torch" else "default"
    row = {"framework": fw, "device": device, "dtype": dtype, "threads": args.threads}
    row.update({"shape": "×".join(map(str, shape)), "N": shape[-2], "D": shape[-1], **t})
    ratios = [
        ("reg_svdvals", "reg_ours"),
        ("reg_ours", "reg_floor"),
        ("step_official", "step_ours"),
    ]
    ratios += [("step_svdvals", "step_ours"), ("step_ours", "step_free"), ("step_free", "gemm")]
    text = " ".join(_ratio(t, a, b) for a, b in ratios)
    print(f"{fw} {dtype} {row['shape']} | {text} | {t.get('accuracy', math.nan):.1e}", flush=True)
    return row


if __name__ == "__main__":
    main()
