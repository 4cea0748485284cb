"""The units of ``condreg reproduce mnist-pairs``: one (seed, pair), every method, run here or in
spawned workers with one BLAS thread each."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from condreg.experiments import _report as rp
from condreg.experiments._linear import (
    PairSpectra,
    best_loss,
    data_setup,
    immunize_method,
    kappa_features,
)

__all__ = ["default_jobs", "largest_first", "run_unit", "run_units", "limit_worker_threads"]

#: What every unit of one run shares: (methods, epochs, lr, immunize options, cross_check).
Shared = tuple[Sequence[str], int, float, Mapping[str, Any], bool]


def default_jobs(n_units: int) -> int:
    """Worker processes for ``n_units`` units: ``min(os.cpu_count(), 8, n_units // 2)``, >= 1."""
    return max(1, min(os.cpu_count() or 1, 8, n_units // 2))


def largest_first(todo: list[tuple[int, tuple[int, int]]], tasks_by_seed) -> list:
    """``todo``, costliest first (``Σ r²·(r + D)`` over the two tasks, ``r`` the inputs' rank)."""
    task_cost: dict[tuple[int, int], float] = {}
    for seed, pair in todo:
        for digit in pair:
            if (seed, digit) not in task_cost:
                X = tasks_by_seed[seed][digit].X
                r = kappa_features(X)[1]
                task_cost[(seed, digit)] = float(r * r * (r + X.shape[1]))
    return sorted(todo, key=lambda u: -sum(task_cost[(u[0], d)] for d in u[1]))


def run_unit(seed: int, pair: tuple[int, int], tp: Any, th: Any, shared: Shared) -> dict:
    """One (seed, pair): every method on (D_P = ``tp``, D_H = ``th``), the tasks decomposed once;
    each method's numbers are kept without θ and the history."""
    methods, epochs, lr, options, cross_check = shared
    start, cpu_start, by_method = time.perf_counter(), time.process_time(), {}
    setup = data_setup(tp.X, th.X, options)
    pair_spectra = PairSpectra(tp.X, th.X, tasks=setup.tasks)
    kw = dict(task="classification", epochs=epochs, lr=lr, seed=seed, cross_check=cross_check)
    for method in methods:
        res = immunize_method(
            method, tp.X, tp.y, th.X, y_h=th.y, pair=pair_spectra, setup=setup, **kw, **options
        )
        res.pop("_theta")
        res.pop("history", None)  # 90 × 4 histories would bloat results.json
        by_method[method] = res
    first = by_method[methods[0]]
    kappas = {k: first[k] for k in ("kappa_K_P", "kappa_K_H", "rank_K_P", "rank_K_H", "rtol")}
    best = best_loss(tp.X, tp.y, task="classification", rtol=first["rtol"], rank=first["rank_K_P"])
    unit = dict(seed=seed, pair=list(pair), kappas=kappas, loss_best_input=best, methods=by_method)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    return unit | dict(seconds=seconds, cpu_s=cpu_s, worker=os.getpid())


def _run_packed(args: tuple) -> dict[str, Any]:
    return run_unit(*args)


def limit_worker_threads() -> None:
    """Worker initializer: one BLAS thread in this worker process (the workers share the cores)."""
    from threadpoolctl import threadpool_limits

    rp.load_blas_libraries()
    threadpool_limits(limits=1)


def run_units(
    todo: list, tasks_by_seed: Mapping, shared: Shared, *, jobs: int, progress: bool, done: Callable
) -> None:
    """Run every (seed, pair) of ``todo`` here (``jobs == 1`` or one unit) or in ``jobs`` spawned
    workers, costliest first, and call ``done(unit)`` as each one finishes."""

    def arguments(seed: int, pair: tuple[int, int]) -> tuple:
        tasks = tasks_by_seed[seed]
        return seed, pair, tasks[pair[0]], tasks[pair[1]], shared

    bar = {"enabled": progress, "desc": "mnist-pairs", "total": len(todo)}
    if jobs == 1 or len(todo) <= 1:
        for seed, pair in rp.progress(todo, **bar):
            done(run_unit(*arguments(seed, pair)))
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes=jobs, initializer=limit_worker_threads) as workers:
        order = largest_first(list(todo), tasks_by_seed)
        finished = workers.imap_unordered(_run_packed, [arguments(*u) for u in order])
        for unit in rp.progress(finished, **bar):
            done(unit)
