"""What one call costs at small shapes, as same-process ratios to the same math by hand.

- NumPy ``condreg.r_ill(S)`` against ``np.linalg.svd(S, compute_uv=False)`` plus the formula
  (Eq. 12 on the singular values), at 4×6 and 64×784 (``gram=False``);
- PyTorch forward + backward of ``condreg.r_ill(F, gram=True)`` against autodiff through
  ``torch.linalg.svdvals(F)`` with the same formula on ``σ²``, at 4×6 and 64×784;
- the distinct condreg functions one call enters (``sys.setprofile``), NumPy ``r_ill(S,
  gram=True)`` and PyTorch forward + backward, at 64×784;
- with ``--jax``, the equations of ``jax.make_jaxpr(jax.grad(r_ill(F, gram=True)))`` (nested
  ones counted; float64) and of autodiff through ``svd`` values.

float64, one thread, process CPU time (``time.process_time``: on a shared host the time spent
waiting for a core is not counted), the minimum over ``--repeat`` rounds of ``--number`` calls,
the methods interleaved. Compare the ratios, not the microseconds.

Usage: ``python benchmarks/bench_small.py [--repeat 7] [--number 200] [--jax]``
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import condreg  # noqa: E402


def r_ill_by_hand(s, k=None):
    """Eq. 12 on descending values ``s`` (all counted)."""
    k = s.shape[-1] if k is None else k
    return 1.0 / ((s * s).sum() / (2 * k) - 0.5 * s[-1] ** 2)


def _best(fns: dict, repeat: int, number: int) -> dict:
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.process_time()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.process_time() - t0) / number)
    return best


def path_length(fn) -> int:
    root = str(Path(condreg.__file__).parent) + "/"
    seen: set = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            seen.add((frame.f_code.co_filename, frame.f_code.co_name))

    fn()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return len(seen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--jax", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"condreg from {Path(condreg.__file__).parent}")
    for shape in ((4, 6), (64, 784)):
        S = rng.standard_normal(shape)
        F = torch.asarray(S)
        number = args.number if shape == (4, 6) else max(args.number // 20, 3)

        def ours_torch(F=F):
            X = F.clone().requires_grad_()
            condreg.r_ill(X, gram=True).backward()

        def hand_torch(F=F):
            X = F.clone().requires_grad_()
            s = torch.linalg.svdvals(X)
            r_ill_by_hand(s * s).backward()

        fns = {
            "numpy ours": lambda S=S: condreg.r_ill(S),
            "numpy hand": lambda S=S: r_ill_by_hand(np.linalg.svd(S, compute_uv=False)),
            "torch ours": ours_torch,
            "torch svdvals-AD": hand_torch,
        }
        t = _best(fns, args.repeat, number)
        print(
            f"{shape[0]}x{shape[1]}: NumPy r_ill {t['numpy ours'] * 1e6:.0f} us = "
            f"{t['numpy ours'] / t['numpy hand']:.2f}x svd+formula "
            f"({t['numpy hand'] * 1e6:.0f} us);"
            f" torch fwd+bwd {t['torch ours'] * 1e6:.0f} us = "
            f"{t['torch ours'] / t['torch svdvals-AD']:.2f}x svdvals-AD "
            f"({t['torch svdvals-AD'] * 1e6:.0f} us)"
        )
    S = rng.standard_normal((64, 784))
    F = torch.asarray(S)

    def torch_call():
        X = F.clone().requires_grad_()
        condreg.r_ill(X, gram=True).backward()

    print(
        "path at 64x784 (distinct condreg functions): NumPy r_ill(gram=True) "
        f"{path_length(lambda: condreg.r_ill(S, gram=True))}, r_ill_grad "
        f"{path_length(lambda: condreg.r_ill_grad(S, gram=True))}, torch fwd+bwd "
        f"{path_length(torch_call)}"
    )
    if args.jax:
        import jax

        jax.config.update("jax_enable_x64", True)  # this benchmark's process only
        from jax.extend.core import jaxprs_in_params

        def count(jaxpr) -> int:
            return sum(1 + sum(count(j) for j in jaxprs_in_params(e.params)) for e in jaxpr.eqns)

        X = jax.numpy.asarray(S)
        ours = jax.make_jaxpr(jax.grad(lambda A: condreg.r_ill(A, gram=True)))(X)
        hand = jax.make_jaxpr(
            jax.grad(lambda A: r_ill_by_hand(jax.numpy.linalg.svd(A, compute_uv=False) ** 2))
        )(X)
        counts = collections.Counter(e.primitive.name for e in ours.jaxpr.eqns)
        print(
            f"JAX grad jaxpr equations at 64x784 float64: condreg {count(ours.jaxpr)}, "
            f"autodiff through svd values {count(hand.jaxpr)}; top primitives "
            f"{counts.most_common(5)}"
        )


if __name__ == "__main__":
    main()
