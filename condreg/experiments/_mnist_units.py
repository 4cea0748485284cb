"""The units of work of ``condreg reproduce mnist-pairs``: one (seed, pair), every method.

:func:`run_unit` runs the methods of one unit (in this process or in a worker),
:func:`run_units` runs a list of them, in ``jobs`` spawned worker processes with one BLAS thread
each (the costliest unit first, :func:`largest_first`) or in this process, and hands each
finished unit to a callback (which saves it for ``--resume``).
"""

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

#: What every unit of one run shares: (methods, epochs, lr, options for condreg.immunize,
#: cross_check).
Shared = tuple[Sequence[str], int, float, Mapping[str, Any], bool]


def default_jobs(n_units: int) -> int:
    """Worker processes for ``n_units`` units: ``min(os.cpu_count(), 8, n_units // 2)``, at
    least 1 (starting a worker costs about a second, more than splitting two units saves)."""
    return max(1, min(os.cpu_count() or 1, 8, n_units // 2))


def largest_first(todo: list[tuple[int, tuple[int, int]]], tasks_by_seed) -> list:
    """``todo`` ordered by cost, the costliest (seed, pair) unit first (ties keep their order):
    on a pool of workers the last units to finish are then the cheapest, so no worker waits
    long for the other at the end. A unit's cost is ``Σ r²·(r + D)`` over its two tasks, ``r``
    the rank of the task's inputs (each epoch decomposes the ``r×D`` features of both); each
    task's rank is computed once, from the singular values of its inputs."""
    task_cost: dict[tuple[int, int], float] = {}
    for seed, pair in todo:
        for digit in pair:
            if (seed, digit) not in task_cost:
                X = tasks_by_seed[seed][digit].X
                r = kappa_features(X)[1]
                task_cost[(seed, digit)] = float(r * r * (r + X.shape[1]))
    return sorted(todo, key=lambda u: -sum(task_cost[(u[0], d)] for d in u[1]))


def run_unit(seed: int, pair: tuple[int, int], tp: Any, th: Any, shared: Shared) -> dict:
    """One (seed, pair): every method on (D_P = task ``tp``, D_H = task ``th``), the tasks
    decomposed once for all of them (:func:`condreg.experiments._linear.data_setup`, built here,
    in the worker).

    Returns ``{"seed", "pair", "kappas", "loss_best_input", "methods", "seconds", "cpu_s",
    "worker"}``; ``methods`` maps each method to :func:`condreg.experiments._linear.
    immunize_method`'s numbers (without θ and the history), ``loss_best_input`` is the best
    attainable D_P loss on the inputs themselves (θ = I, :func:`best_loss`).
    """
    methods, epochs, lr, options, cross_check = shared
    start, cpu_start = time.perf_counter(), time.process_time()
    by_method = {}
    setup = data_setup(tp.X, th.X, options)  # the tasks decomposed once for all methods
    pair_spectra = PairSpectra(tp.X, th.X, tasks=setup.tasks)  # κ(K_P), κ(K_H) likewise
    for method in methods:
        res = immunize_method(
            method,
            tp.X,
            tp.y,
            th.X,
            y_h=th.y,
            task="classification",
            epochs=epochs,
            lr=lr,
            seed=seed,
            pair=pair_spectra,
            cross_check=cross_check,
            setup=setup,
            **options,
        )
        res.pop("_theta")
        res.pop("history", None)  # 90 × 4 histories would bloat results.json
        by_method[method] = res
    first = by_method[methods[0]]
    kappas = ("kappa_K_P", "kappa_K_H", "rank_K_P", "rank_K_H", "rtol")
    return {
        "seed": seed,
        "pair": list(pair),
        "kappas": {k: first[k] for k in kappas},
        "loss_best_input": best_loss(
            tp.X, tp.y, task="classification", rtol=first["rtol"], rank=first["rank_K_P"]
        ),
        "methods": by_method,
        "seconds": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu_start,
        "worker": os.getpid(),
    }


def _run_packed(args: tuple) -> dict[str, Any]:
    """:func:`run_unit` with its arguments in one tuple (for ``Pool.imap_unordered``)."""
    return run_unit(*args)


def limit_worker_threads() -> None:
    """Worker initializer: one BLAS thread in this worker process (the workers share the
    cores). The limit stays for the process's life; nothing is kept."""
    from threadpoolctl import threadpool_limits

    rp.load_blas_libraries()
    threadpool_limits(limits=1)


def run_units(
    todo: Sequence[tuple[int, tuple[int, int]]],
    tasks_by_seed: Mapping[int, Mapping[int, Any]],
    shared: Shared,
    *,
    jobs: int,
    progress: bool,
    done: Callable[[dict[str, Any]], None],
) -> None:
    """Run every (seed, pair) of ``todo`` and call ``done(unit)`` as each one finishes.

    ``jobs == 1`` (or a single unit) runs them here, in order; else ``jobs`` spawned workers
    (one BLAS thread each) take them costliest first. The pool is terminated on any exit, an
    error or an interrupt included (the units finished so far have been handed to ``done``).
    """

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
        # the workers start while the units are ordered, the costliest first
        order = largest_first(list(todo), tasks_by_seed)
        finished = workers.imap_unordered(_run_packed, [arguments(*u) for u in order])
        for unit in rp.progress(finished, **bar):
            done(unit)
