"""Speed of condreg's closed forms against the autodiff baseline, as ratios in one process.

The baseline is what the public reference code does for a probing Hessian from a batch of
features F (N×D): form H = FᵀF (D×D), take its eigenvalues, and let the framework's autodiff
differentiate through the D×D eigendecomposition. condreg instead evaluates R_ill(FᵀF) and its
closed-form gradient from the thin SVD of F (N×N-sized work when N < D).

Usage:  python benchmarks/bench_spectral.py [--n 256] [--d 1024] [--repeat 5] [--json out.json]

Times are medians over --repeat runs after one warm-up; the machine is noisy, so compare the
ratios (baseline / condreg), not the absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

import condreg


def _median_time(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up (JIT compilation, allocator)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _r_ill_from_eigs(lam, k: int, xp):
    """R_ill from the eigenvalues of H (ascending), the top ``k`` being the nonzero ones."""
    top = lam[..., -k:]
    return 1.0 / (xp.sum(top * top) / (2 * k) - 0.5 * top[0] ** 2)


def bench_numpy(F: np.ndarray, repeat: int) -> dict:
    k = min(F.shape)

    def baseline():
        H = F.T @ F
        lam, V = np.linalg.eigh(H)
        lam_k, v_k = lam[-k], V[:, -k]
        den = np.sum(lam[-k:] ** 2) / (2 * k) - 0.5 * lam_k**2
        G_H = (lam_k * np.outer(v_k, v_k) - H / k) / den**2
        return 2 * F @ G_H

    def ours():
        return condreg.r_ill_grad(F, gram=True)

    np.testing.assert_allclose(ours(), baseline(), rtol=1e-6, atol=1e-12)
    return {"baseline_s": _median_time(baseline, repeat), "condreg_s": _median_time(ours, repeat)}


def bench_torch(F: np.ndarray, repeat: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    k = min(F.shape)
    Ft = torch.tensor(F)

    def baseline():
        X = Ft.clone().requires_grad_(True)
        lam = torch.linalg.eigvalsh(X.T @ X)
        _r_ill_from_eigs(lam, k, torch).backward()
        return X.grad

    def ours():
        X = Ft.clone().requires_grad_(True)
        condreg.r_ill(X, gram=True).backward()
        return X.grad

    np.testing.assert_allclose(ours().numpy(), baseline().numpy(), rtol=1e-5, atol=1e-12)
    return {"baseline_s": _median_time(baseline, repeat), "condreg_s": _median_time(ours, repeat)}


def bench_jax(F: np.ndarray, repeat: int) -> dict | None:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    k = min(F.shape)
    with jax.enable_x64(True) if hasattr(jax, "enable_x64") else _x64():
        Fj = jnp.asarray(F)
        base = jax.jit(jax.grad(lambda X: _r_ill_from_eigs(jnp.linalg.eigvalsh(X.T @ X), k, jnp)))
        ours = jax.jit(jax.grad(lambda X: condreg.r_ill(X, gram=True)))
        np.testing.assert_allclose(
            np.asarray(ours(Fj)), np.asarray(base(Fj)), rtol=1e-5, atol=1e-12
        )
        return {
            "baseline_s": _median_time(lambda: base(Fj).block_until_ready(), repeat),
            "condreg_s": _median_time(lambda: ours(Fj).block_until_ready(), repeat),
        }


class _x64:
    """Enable JAX float64 for the block only (older JAX without jax.enable_x64)."""

    def __enter__(self):
        import jax

        self._old = jax.config.jax_enable_x64
        jax.config.update("jax_enable_x64", True)

    def __exit__(self, *exc):
        import jax

        jax.config.update("jax_enable_x64", self._old)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="batch size N (rows of F)")
    parser.add_argument("--d", type=int, default=1024, help="feature dimension D (columns of F)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    # Features with a spread spectrum, as from a trained network.
    F = rng.standard_normal((args.n, args.d)) * np.logspace(0, -2, args.d)
    rows = {}
    for name, bench in (("numpy", bench_numpy), ("torch", bench_torch), ("jax (jit)", bench_jax)):
        res = bench(F, args.repeat)
        if res is not None:
            res["speedup"] = res["baseline_s"] / res["condreg_s"]
            rows[name] = res
    print(f"R_ill(FᵀF) value+gradient, F {args.n}×{args.d}, float64, median of {args.repeat}")
    print(
        "| backend | baseline (D×D eigendecomposition; autodiff on torch/jax) s "
        "| condreg (SVD of F, closed form) s | speed-up |"
    )
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['baseline_s']:.4f} | {r['condreg_s']:.4f} | {r['speedup']:.1f}× |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"n": args.n, "d": args.d, "repeat": args.repeat, "results": rows}, fh, indent=2
            )


if __name__ == "__main__":
    main()
