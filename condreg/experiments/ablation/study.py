"""The ablation's plan, data, unit execution (resumable, in worker processes) and assembly."""

from __future__ import annotations

import multiprocessing
import pathlib
import time
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from condreg.experiments import _report as rp
from condreg.experiments import house_prices, mnist_pairs
from condreg.experiments._linear import kappa_features
from condreg.experiments._mnist_units import default_jobs, limit_worker_threads
from condreg.experiments.ablation import report, switches_of
from condreg.experiments.ablation import units as un
from condreg.experiments.ablation.released import released_house_prices, ridge_floor_kappa
from condreg.experiments.data import house_price_dir, load_house_prices, load_mnist

__all__ = ["Plan", "load_data", "execute", "unit_specs"]


@dataclass(frozen=True)
class Plan:
    """What one ablation run does (validated by :func:`condreg.experiments.ablation.run`)."""

    out_dir: pathlib.Path
    quick: bool
    seeds: list[int]
    protocols: list[str]
    pairs: list[tuple[int, int]]
    datasets: list[str]
    jobs: int | None
    resume: bool
    progress: bool
    max_steps: list[float]

    def schedule(self, dataset: str) -> dict[str, Any]:
        """condreg's default settings of ``dataset`` (the default experiments', quick or not)."""
        module = house_prices if dataset == "house" else mnist_pairs
        return dict(module.QUICK_SETTINGS if self.quick else module.PAPER_SETTINGS)


def _task_data(X_p, y_p, X_h, y_h, task: str) -> dict[str, Any]:
    return dict(X_p=X_p, y_p=y_p, X_h=X_h, y_h=y_h, task=task, inputs=un.input_kappas(X_p, X_h))


def _raw_digit_inputs(X: np.ndarray, y: np.ndarray, digits) -> dict[str, Any]:
    """Per digit, both κ's of the released MNIST input (one digit's 784 normalised pixels)."""
    out = {}
    for d in digits:
        Xd = (X[y == d] - mnist_pairs.RAW_MEAN) / mnist_pairs.RAW_STD
        kappa, rank = kappa_features(Xd)
        n, ridge = int(Xd.shape[0]), ridge_floor_kappa(Xd)
        top = float(np.linalg.norm(Xd, 2) ** 2) / n
        out[str(d)] = dict(
            n_images=n, nonzero=kappa, rank=rank, ridge=ridge, lambda_max_per_image=top
        )
    return out


def load_data(plan: Plan) -> dict[str, Any]:
    """Every task the plan needs (DataError before any work)."""
    data: dict[str, Any] = {}
    if "house" in plan.datasets:
        hp = load_house_prices(house_price_dir())
        rel = released_house_prices(house_price_dir())
        data["house"] = {
            t: _task_data(d.X_p, d.y_p, d.X_h, d.y_h, "regression")
            for t, d in (("condreg", hp), ("released", rel))
        }
    if "mnist" in plan.datasets:
        s = plan.schedule("mnist")
        X_raw, y = load_mnist()
        X, n_features = mnist_pairs.prepare_inputs(X_raw, s["pool"], s["min_pixel_activity"])
        digits = sorted({d for p in plan.pairs for d in p})
        mnist: dict[Any, Any] = {"n_features": n_features}
        sizes = {k: s[k] for k in ("n_positive", "negative_fraction")}
        for seed in plan.seeds:
            tasks = mnist_pairs.build_tasks(X, y, digits, seed=seed, **sizes)
            for p, h in plan.pairs:
                tp, th = tasks[p], tasks[h]
                mnist[(seed, (p, h))] = _task_data(tp.X, tp.y, th.X, th.y, "classification")
        mnist["raw_inputs"] = _raw_digit_inputs(X_raw, y, digits)
        data["mnist"] = mnist
    return data


def unit_specs(plan: Plan) -> list[tuple[str, Any, dict[str, Any]]]:
    """Every unit: ``(key, data key, spec)``; ``kind`` default / emulated / sweep."""
    out = []
    for dataset in plan.datasets:
        s = plan.schedule(dataset)
        training = {"epochs": s["epochs"], "lr": s["lr"], "methods": list(un.METHODS)}
        for seed, pair in product(plan.seeds, [None] if dataset == "house" else plan.pairs):
            tail = f"_seed{seed}" + ("" if pair is None else f"_pair{pair[0]}-{pair[1]}")
            where = (dataset, "condreg") if dataset == "house" else (dataset, (seed, pair))
            base = {"dataset": dataset, "seed": seed, **training, "pair": pair}
            for name in plan.protocols:
                sw = switches_of(name, dataset)
                if name == "condreg" or sw:  # else a switch that does not exist for this dataset
                    key = (dataset, "released") if "released_preprocessing" in sw else where
                    kind = "default" if name == "condreg" else "emulated"
                    spec = {**base, "kind": kind, "protocol": name, "switches": sw}
                    out.append((f"{dataset}_{name}{tail}", key, spec))
            for ms in [ms for ms in plan.max_steps if ms != 0.3]:
                spec = {**base, "kind": "sweep", "protocol": f"max_step={ms}", "switches": []}
                out.append((f"{dataset}_max_step{ms}{tail}", where, {**spec, "max_step": ms}))
    for key, _, spec in out:
        spec["key"] = key
    return out


def _run_units(plan: Plan, data, todo, store, done: dict[str, Any]) -> None:
    """Compute the ``todo`` units (costliest first), saving each as it finishes."""
    jobs = plan.jobs or default_jobs(len(todo))
    cost = {"emulated": 2.0, "default": 1.0, "sweep": 1.0}
    todo = sorted(todo, key=lambda u: -(cost[u[2]["kind"]] + ("minibatch" in u[2]["switches"])))
    args = [(data[key[0]][key[1]], spec) for _, key, spec in todo]

    def finish(results) -> None:
        for result in rp.progress(results, enabled=plan.progress, desc="ablation", total=len(args)):
            done[result["spec"]["key"]] = result
            store.save(result["spec"]["key"], result)

    if jobs == 1 or len(todo) <= 1:
        finish(map(un.run_unit_packed, args))
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes=jobs, initializer=limit_worker_threads) as workers:
        finish(workers.imap_unordered(un.run_unit_packed, args))


def _defaults(plan: Plan) -> dict[str, Any]:
    """The default experiments themselves (their own folders, their results.json payloads)."""
    out = {}
    kw = dict(quick=plan.quick, seeds=len(plan.seeds), progress=plan.progress, resume=plan.resume)
    if "house" in plan.datasets:
        out["house"] = house_prices.run(plan.out_dir / "default-house-prices", **kw)
    if "mnist" in plan.datasets:
        out["mnist"] = mnist_pairs.run(
            plan.out_dir / "default-mnist-pairs", **kw, pairs=list(plan.pairs), jobs=plan.jobs
        )
    return out


def execute(plan: Plan, data: dict[str, Any], start: float) -> dict[str, Any]:
    """Run the default experiments and every unit, then write the outputs."""
    settings = {
        "quick": plan.quick,
        "protocols": plan.protocols,
        "datasets": plan.datasets,
        "pairs": [list(p) for p in plan.pairs],
        "house": plan.schedule("house"),
        "mnist": plan.schedule("mnist"),
        "methods": list(un.METHODS),
        "max_steps": plan.max_steps,
    }
    defaults = _defaults(plan)
    specs = unit_specs(plan)
    store = rp.UnitStore(plan.out_dir, settings=settings, resume=plan.resume)
    done = {key: saved for key, _, _ in specs if (saved := store.load(key)) is not None}
    todo = [unit for unit in specs if unit[0] not in done]
    compute_start = time.perf_counter()
    _run_units(plan, data, todo, store, done)
    timing = {
        "units": len(specs),
        "units_resumed": len(specs) - len(todo),
        "compute_wall_s": time.perf_counter() - compute_start,
        "unit_seconds_total": float(sum(done[k]["seconds"] for k, _, _ in todo)),
        "unit_cpu_s_total": float(sum(done[k].get("cpu_s", 0.0) for k, _, _ in todo)),
    }
    results = report.assemble(plan, data, defaults, [(k, s) for k, _, s in specs], done)
    results["timing"] = timing
    return report.write(plan, settings, results, time.perf_counter() - start, store)
