"""The extreme-cluster route where it is taken, with and without it, as a same-process ratio.

One 1024×512 float64 matrix (``min(N, D) >= EXTREME_MIN``): PyTorch forward + backward of
``condreg.r_ill(F, gram=True)`` on a CPU tensor, and NumPy ``condreg.r_ill_grad(F, gram=True)``,
each timed with the route (``EXTREME_MIN = 128``, the default) and without it (the threshold
raised out of reach: the Gram ``eigh`` with all vectors), interleaved, one thread, process CPU
time, the minimum over ``--repeat`` rounds. The route stays only where the ratio is >= 1.3.

Usage: ``python benchmarks/bench_extreme.py [--repeat 11]``
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import condreg  # noqa: E402
from condreg import _spectrum  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=11)
    args = ap.parse_args()
    torch.set_num_threads(1)
    F = np.random.default_rng(0).standard_normal((1024, 512))
    T = torch.asarray(F)

    def torch_call() -> None:
        condreg.r_ill(T.clone().requires_grad_(), gram=True).backward()

    def numpy_call() -> None:
        condreg.r_ill_grad(F, gram=True)

    default = _spectrum.EXTREME_MIN
    for name, fn in (("torch r_ill fwd+bwd", torch_call), ("NumPy r_ill_grad", numpy_call)):
        best = {"with": float("inf"), "without": float("inf")}
        try:
            for _ in range(args.repeat):
                for mode, limit in (("with", default), ("without", 10**9)):
                    _spectrum.EXTREME_MIN = limit
                    fn()  # warm
                    t0 = time.process_time()
                    fn()
                    best[mode] = min(best[mode], time.process_time() - t0)
        finally:
            _spectrum.EXTREME_MIN = default
        ratio = best["without"] / best["with"]
        print(
            f"{name}: {best['with']:.4f} s with the route, {best['without']:.4f} s without: "
            f"{ratio:.2f}x"
        )


if __name__ == "__main__":
    main()
