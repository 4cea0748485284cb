"""Speed of condreg.extreme (docs/extreme.md) against the dense engine and autodiff, as ratios.

For each shape (N, D) with N >= D, dtype and quantity (kappa, R_well, R_ill of H = FᵀF), on a
Gaussian feature batch F (the Marchenko–Pastur spectrum: small relative gaps at both ends, the
hard case for Krylov methods) it times, in one process and one thread:

``extreme``
    ``condreg.extreme.<q>_value_and_grad(F, method="extreme")``: value and gradient from the proven
    extreme eigenpairs (raises if the path would fall back, so the figure is the path's own).
``dense``
    ``condreg.<q>_grad(F, gram=True)``: the dense engine's gradient alone (one D×D ``eigh`` of
    the Gram, or the QR/SVD of F where the Gram does not resolve the spectrum). The value is not
    included: the baseline does less work than ``extreme``.
``svdvals``
    PyTorch only: autodiff through ``torch.linalg.svdvals(F)`` (value and gradient, the formula
    written on the singular values), what a user writes by hand.
``adapter``
    PyTorch only: condreg's own autograd path, ``condreg.<q>(F, gram=True)`` and its backward
    (the engine's one-decomposition forward with the closed form as the backward).
``gemm``
    One ``FᵀF`` GEMM in the same dtype: the floor of any method that forms the Gram.

``value`` rows time the value alone (``condreg.extreme.<q>`` against ``condreg.<q>(gram=True)``).
Each figure is the best of ``--repeat`` interleaved calls after a warm-up. ``--kappa K`` uses F
with geometric singular values from 1 to 1/K instead (``--accuracy`` is then passed to the extreme
path: at ``K = 100`` in float64 the dense engine takes its QR/SVD path).

Usage: ``python benchmarks/bench_extreme.py [--shapes 2048x1024,4096x2048] [--dtypes float64]
[--frameworks numpy,torch] [--repeat 3] [--markdown out.md]``
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time

import numpy as np
import scipy.linalg  # noqa: F401  (loaded before the thread limit so that it applies to it)

import condreg
from condreg import extreme

QUANTITIES = ("condition_number", "r_well", "r_ill")
SHORT = {"condition_number": "kappa", "r_well": "R_well", "r_ill": "R_ill"}


def _best(fns: dict, repeat: int) -> dict[str, float]:
    for fn in fns.values():
        fn()
    best = {k: math.inf for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def _torch_svdvals(quantity: str, torch):
    def f(F):
        F = F.detach().requires_grad_(True)
        s = torch.linalg.svdvals(F)
        mu = s * s
        D = F.shape[-1]
        if quantity == "condition_number":
            v = mu[0] / mu[-1]
        elif quantity == "r_well":
            v = 0.5 * mu[0] ** 2 - (mu * mu).sum() / (2 * D)
        else:
            v = 1.0 / ((mu * mu).sum() / (2 * D) - 0.5 * mu[-1] ** 2)
        (g,) = torch.autograd.grad(v, F)
        return v, g

    return f


def _batch(N: int, D: int, kappa: float | None) -> np.ndarray:
    if kappa is None:
        return np.random.default_rng(0).standard_normal((N, D))
    from condreg.testing import matrix_with_spectrum

    return matrix_with_spectrum(np.geomspace(1.0, 1.0 / kappa, D), N, D, seed=0)


def _torch_adapter(quantity: str, torch):
    """condreg's own PyTorch autograd path: the value and ``backward`` (one decomposition, the
    engine's closed form as the backward)."""

    def f(F):
        F = F.detach().requires_grad_(True)
        v = getattr(condreg, quantity)(F, gram=True)
        (g,) = torch.autograd.grad(v, F)
        return v, g

    return f


def run(
    shapes, dtypes, frameworks, repeat, svd_max_d=2048, kappa=None, accuracy=None,
    quantities=QUANTITIES,
):  # fmt: skip
    rows = []
    torch = None
    if "torch" in frameworks:
        import torch

        torch.set_num_threads(1)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        for N, D in shapes:
            base = _batch(N, D, kappa)
            for dtype in dtypes:
                for fw in frameworks:
                    if fw == "numpy":
                        F = base.astype(dtype)
                    else:
                        F = torch.asarray(base, dtype=getattr(torch, dtype))
                    gemm = _best({"g": lambda F=F: F.T @ F}, repeat)["g"]
                    for q in quantities:
                        fns = {
                            "extreme": lambda q=q, F=F: getattr(extreme, q + "_value_and_grad")(
                                F, method="extreme", accuracy=accuracy
                            ),
                            "dense": lambda q=q, F=F: getattr(condreg, q + "_grad")(F, gram=True),
                        }
                        if fw == "torch":
                            fns["adapter"] = lambda q=q, F=F: _torch_adapter(q, torch)(F)
                        if fw == "torch" and D <= svd_max_d:
                            fns["svdvals"] = lambda q=q, F=F: _torch_svdvals(q, torch)(F)
                        t = _best(fns, repeat)
                        _, G = getattr(extreme, q + "_value_and_grad")(
                            F, method="extreme", accuracy=accuracy
                        )
                        Gd = getattr(condreg, q + "_grad")(F, gram=True)
                        err = float(np.linalg.norm(np.asarray(G) - np.asarray(Gd)))
                        err /= float(np.linalg.norm(np.asarray(Gd)))
                        tv = _best(
                            {
                                "extreme": lambda q=q, F=F: getattr(extreme, q)(
                                    F, method="extreme", accuracy=accuracy
                                ),
                                "dense": lambda q=q, F=F: getattr(condreg, q)(F, gram=True),
                            },
                            repeat,
                        )
                        row = dict(
                            shape=f"{N}x{D}", dtype=dtype, fw=fw, q=SHORT[q], gemm=gemm, err=err,
                            t_ext=t["extreme"], t_dense=t["dense"], t_svd=t.get("svdvals"),
                            t_adapter=t.get("adapter"),
                            v_ext=tv["extreme"], v_dense=tv["dense"],
                        )  # fmt: skip
                        rows.append(row)
                        print(_line(row), flush=True)
    return rows


def _line(r) -> str:
    svd = "—" if r["t_svd"] is None else f"{r['t_svd'] / r['t_ext']:.1f}×"
    ad = "—" if r.get("t_adapter") is None else f"{r['t_adapter'] / r['t_ext']:.2f}×"
    return (
        f"| {r['shape']} | {r['dtype']} | {r['fw']} | {r['q']} | "
        f"{r['t_dense'] / r['t_ext']:.2f}× | {ad} | {svd} | {r['t_ext'] / r['gemm']:.1f} | "
        f"{r['t_dense'] / r['gemm']:.1f} | {r['v_dense'] / r['v_ext']:.2f}× | {r['err']:.1e} |"
    )


HEADER = (
    "| N×D | dtype | library | quantity | value+grad: dense / extreme | torch adapter / extreme | "
    "svdvals autodiff / extreme | extreme (GEMMs) | dense grad (GEMMs) | value: dense / extreme "
    "| grad rel. diff |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="2048x1024,4096x2048")
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--frameworks", default="numpy,torch")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--svd-max-d", type=int, default=2048, help="no svdvals timing above this D")
    ap.add_argument("--kappa", type=float, default=None,
                    help="F with geometric singular values of condition number KAPPA "
                    "(default: Gaussian F)")  # fmt: skip
    ap.add_argument("--accuracy", type=float, default=None, help="accuracy= of the extreme path")
    ap.add_argument("--quantities", default=",".join(QUANTITIES))
    ap.add_argument("--markdown", default=None, help="append the table to this file")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}, 1 thread")  # fmt: skip
    print(HEADER)
    rows = run(
        shapes, a.dtypes.split(","), a.frameworks.split(","), a.repeat, a.svd_max_d,
        a.kappa, a.accuracy, tuple(a.quantities.split(",")),
    )  # fmt: skip
    if a.markdown:
        with open(a.markdown, "a", encoding="utf-8") as fh:
            fh.write(HEADER + "\n" + "\n".join(_line(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
