"""Algorithm 1 per-epoch cost, in units of one GEMM of the epoch's size, measured in one process.

The unit is one ``(N×D)·(D×D)`` matrix product (N = 600 rows per task, D = 784 at raw MNIST
size), timed next to the epochs so that the ratio does not depend on the machine or its load.
One epoch of :func:`condreg.immunize`'s loop (the factored iterate: θ's basis parts kept apart,
the features ``Aθ`` moved by each step) and one of the public, dense
:func:`condreg.algorithm.step` are timed per method on a raw-pixel MNIST pair
(condreg_experiments.data's digit tasks: 500 images of the digit + 100 others, the authors'
normalisation ``(x/255 − 0.1307)/0.3081``), after :func:`condreg.algorithm.prepare` has
decomposed the data once. Optionally (``--reference``) the same is done for the reference
code's approach: form the ``D×D`` Hessians ``θᵀKθ`` and ``eigh`` both every epoch.

With ``--setup``, the four methods' whole runs on the pair (``--epochs``, the experiment's
settings: classification, η = 0.005) are timed twice, interleaved: once sharing one
:func:`condreg.algorithm.setup_data` (built inside the timing, as ``mnist-pairs`` does per
pair), once each run setting up its own data; the ratio is what the shared setup saves.

Usage:  python benchmarks/bench_immunize.py [--pair 1 7] [--repeat 5] [--threads 1] [--setup]

Compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np

import condreg
from condreg import algorithm


def _task(X: np.ndarray, y: np.ndarray, digit: int) -> tuple[np.ndarray, np.ndarray]:
    from condreg_experiments.data import mnist_digit_task

    t = mnist_digit_task(X, y, digit)
    return (t.X - 0.1307) / 0.3081, t.y


def _median(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def reference_epoch(X_p: np.ndarray, X_h: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """The reference approach's decompositions: two ``D×D`` Hessians and their ``eigh``."""
    K_p, K_h = X_p.T @ X_p, X_h.T @ X_h
    _, V = np.linalg.eigh(theta.T @ K_p @ theta)
    _, W = np.linalg.eigh(theta.T @ K_h @ theta)
    return theta - 1e-3 * theta @ (V @ W.T)


def full_decomposition(enabled: bool):
    """Context: while ``enabled``, the eager epoch decomposes fully (eigh with vectors, or the SVD
    of ``R``) as a traced one does, instead of values plus the extreme clusters' vectors."""
    import contextlib

    from condreg.algorithm import _step

    @contextlib.contextmanager
    def switch():
        saved = _step._eager
        if enabled:
            _step._eager = lambda F: False
        try:
            yield
        finally:
            _step._eager = saved

    return switch()


def epoch_cost(
    X_p, y_p, X_h, method: str, task: str, repeat: int, kind: str = "loop"
) -> tuple[float, tuple]:
    """Median seconds of one epoch (after one warm-up epoch): ``kind="loop"``, immunize's
    (:func:`condreg.algorithm._step.advance` on the factored iterate); ``"step"``, the public
    :func:`condreg.algorithm.step` (θ dense); ``"full"``, that step with the full decomposition
    (:func:`full_decomposition`)."""
    from condreg.algorithm import _factored, _step

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", condreg.ImmunizationWarning)
        problem, state = algorithm.prepare(X_p, y_p, X_h, method=method, task=task)
    if kind == "loop":
        cross = _factored.cross_basis(problem)
        box = [_factored.Tracked.start(problem, state)]

        def advance() -> None:
            box[0] = _step.advance(problem, box[0], cross)[0]
    else:
        box = [state]

        def advance() -> None:
            box[0] = algorithm.step(problem, box[0])[0]

    def one() -> None:
        with full_decomposition(kind == "full"):
            advance()

    one()
    return _median(one, repeat), problem.paths


def pair_cost(X_p, y_p, X_h, y_h, methods, epochs: int, repeat: int) -> tuple[float, float]:
    """Median CPU seconds of the methods' runs on one pair: with one shared setup (built inside
    the timing) and with each run setting up its own data, interleaved (A, B, A, B, ...). CPU
    time of this process (``time.process_time``): with ``--threads 1`` it is the work done,
    whatever else the machine runs."""

    def run(shared: bool) -> None:
        setup = algorithm.setup_data(X_p, X_h) if shared else None
        for method in methods:
            condreg.immunize(
                X_p, y_p, X_h, method=method, task="classification", epochs=epochs,
                y_h=y_h if method == "imma" else None, setup=setup, warn=False,
            )  # fmt: skip

    run(True)  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeat):
        for shared in (True, False):
            t0 = time.process_time()
            run(shared)
            times[shared].append(time.process_time() - t0)
    return statistics.median(times[True]), statistics.median(times[False])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=int, nargs=2, default=(1, 7), metavar=("P", "H"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: all)")
    parser.add_argument("--methods", default=",".join(algorithm.METHODS))
    parser.add_argument("--reference", action="store_true", help="also time the D×D approach")
    parser.add_argument(
        "--compare-full",
        action="store_true",
        help="also time the public step, dense and with the full decomposition (eigh / SVD of R "
        "with all vectors)",
    )
    parser.add_argument("--setup", action="store_true", help="time shared vs own data setups")
    parser.add_argument("--epochs", type=int, default=30, help="epochs per run (--setup)")
    args = parser.parse_args()
    from condreg_experiments.data import load_mnist

    X, y = load_mnist()
    X_p, y_p = _task(X, y, args.pair[0])
    X_h, y_h = _task(X, y, args.pair[1])
    limits = None
    if args.threads is not None:
        from threadpoolctl import threadpool_limits

        from condreg_experiments._report import load_blas_libraries

        load_blas_libraries()  # SciPy's own OpenBLAS too

        limits = threadpool_limits(args.threads)
    rng = np.random.default_rng(0)
    A = rng.standard_normal(X_p.shape)
    B = rng.standard_normal((X_p.shape[1], X_p.shape[1]))
    gemm = _median(lambda: A @ B, 3 * args.repeat)
    if args.setup:
        methods = args.methods.split(",")
        shared, own = pair_cost(X_p, y_p, X_h, y_h, methods, args.epochs, args.repeat)
        print(
            f"{len(methods)} methods x {args.epochs} epochs on raw MNIST {args.pair[0]}->"
            f"{args.pair[1]}: one shared setup {shared:.3f} s CPU, a setup per run {own:.3f} s; "
            f"shared/own = {shared / own:.3f}"
        )
        return
    rows = []
    for method in args.methods.split(","):
        seconds, paths = epoch_cost(X_p, y_p, X_h, method, "classification", args.repeat)
        dense = full = None
        if args.compare_full:
            dense, _ = epoch_cost(X_p, y_p, X_h, method, "classification", args.repeat, "step")
            full, _ = epoch_cost(X_p, y_p, X_h, method, "classification", args.repeat, "full")
        rows.append((method, seconds, paths, dense, full))
    gemm = min(gemm, _median(lambda: A @ B, 3 * args.repeat))  # the unit, before and after
    if args.reference:
        theta = np.eye(X_p.shape[1])
        ref = _median(lambda: reference_epoch(X_p, X_h, theta), args.repeat)
    threads = "all" if args.threads is None else args.threads
    print(
        f"Algorithm 1 epoch on raw MNIST {args.pair[0]}->{args.pair[1]} "
        f"({X_p.shape[0]}x{X_p.shape[1]} and {X_h.shape[0]}x{X_h.shape[1]}), float64, "
        f"BLAS threads: {threads}; unit: one ({X_p.shape[0]}x{X_p.shape[1]})·"
        f"({X_p.shape[1]}x{X_p.shape[1]}) GEMM = {gemm * 1e3:.2f} ms"
    )
    print(
        "| method | s / epoch (immunize) | GEMMs / epoch | decomposition (P, H) "
        "| public step (dense θ), GEMMs | its full decomposition, GEMMs |"
    )
    print("|---|---|---|---|---|---|")
    for method, seconds, paths, dense, full in rows:
        others = " | ".join("—" if x is None else f"{x / gemm:.1f}" for x in (dense, full))
        cost = f"{seconds:.4f} | {seconds / gemm:.1f}"
        print(f"| {method} | {cost} | {', '.join(paths)} | {others} |")
    if args.reference:
        print(f"| D×D eigh of both Hessians (reference) | {ref:.4f} | {ref / gemm:.1f} | eigh |")
    if limits is not None:
        limits.unregister()


if __name__ == "__main__":
    main()
