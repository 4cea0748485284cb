"""``condreg reproduce ablation``: condreg's protocol, each of :data:`RELEASED_SWITCHES` alone and
all together (``released``), scored by two κ's, and a ``max_step`` sweep (docs/ablation.md): the
options, the plan, the data and the units (resumable, run in worker processes)."""

from __future__ import annotations

import argparse
import math
import multiprocessing
import pathlib
import time
import warnings
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from condreg.experiments import UsageError, house_prices, mnist_pairs
from condreg.experiments import _report as rp
from condreg.experiments._linear import default_rtol, immunize_method, kappa_features
from condreg.experiments._mnist_units import default_jobs, limit_worker_threads
from condreg.experiments.ablation import emulator as em
from condreg.experiments.ablation.emulator import RELEASED_SWITCHES, SWITCHES_BY_DATASET
from condreg.experiments.data import house_price_dir, load_house_prices, load_mnist

__all__ = ["HELP", "RELEASED_SWITCHES", "ABLATION_PAIRS", "QUICK_PAIRS", "MAX_STEPS", "METHODS"]
__all__ += ["LABELS", "DP_TOLERANCE", "add_arguments", "check_max_steps", "protocols", "run"]
__all__ += ["Plan", "load_data", "execute", "unit_specs", "score_two_ways", "input_kappas"]
__all__ += ["run_unit"]

HELP = "the paper's ranking explained: condreg's protocol → the released code's, switch by switch"

#: The MNIST (P, H) pairs of the full run, each both ways (0-1: the authors' logged run), and quick.
ABLATION_PAIRS: list[tuple[int, int]] = [
    pair for p, h in [(0, 1), (3, 8), (4, 9), (2, 7), (5, 6)] for pair in ((p, h), (h, p))
]
QUICK_PAIRS: list[tuple[int, int]] = [(0, 1), (3, 8)]

#: condreg's ``max_step`` values of the schedule sweep (0.3 is the default).
MAX_STEPS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4)

#: The D_P-only rule: the largest ``max_step`` whose D_P loss is at most this above θ = I's head.
DP_TOLERANCE = 0.02

DATASETS = ("house", "mnist")

#: The methods, in the paper's table order (Ours last), and their names in tables and plots.
METHODS: tuple[str, ...] = ("r_ill_only", "imma", "opt_kappa", "condreg")
LABELS = {"condreg": "Ours", "r_ill_only": "R_ill only", "opt_kappa": "Opt κ", "imma": "IMMA"}


def _protocol_list(text: str) -> list[str]:
    """An argparse type for ``--switches``: comma-separated switch names or ``released``."""
    try:
        return protocols([t.strip() for t in text.split(",") if t.strip()], DATASETS)[1:]
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dataset_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or set(names) - set(DATASETS):
        raise argparse.ArgumentTypeError(f"--datasets: choose from house,mnist; got {text!r}")
    return names


def _step_list(text: str) -> list[float]:
    try:
        return check_max_steps([float(t) for t in text.split(",") if t.strip()])
    except (ValueError, UsageError) as exc:
        raise argparse.ArgumentTypeError(f"--max-steps: {exc}") from None


def check_max_steps(values) -> list[float]:
    """The sweep's ``max_step`` values (each in (0, 0.5), else UsageError), sorted, with 0.3."""
    values = [float(v) for v in values]
    if not values or not all(0 < v < 0.5 for v in values):
        raise UsageError(f"--max-steps: values must lie in (0, 0.5), got {values!r}")
    return sorted({*values, 0.3})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ablation's own options (the CLI adds ``--out``, ``--seeds`` and the like)."""
    from condreg.experiments.options import add_resume_option, parse_pairs, positive_int

    quick = (
        "house prices with 20 epochs and 2 MNIST pairs (0-1, 3-8) with 15 epochs and 250 images "
        "per digit, instead of 100 / 10 pairs / 30 epochs; about 1-2 minutes on 2 cores"
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    add_resume_option(parser, "unit (dataset, protocol, seed, pair)")
    switches = (
        "comma-separated released switches to try one at a time, and/or 'released' (all "
        "together); default: every one and released. Switches: " + ", ".join(RELEASED_SWITCHES)
    )
    steps = (
        "condreg's max_step values of the schedule sweep, comma-separated in (0, 0.5) (default: "
        "0.05,0.1,0.2,0.3,0.4; the default 0.3 is always included)"
    )
    for flag, kind, text in [
        ("--switches", _protocol_list, switches),
        ("--pairs", parse_pairs, "MNIST (P, H) pairs, e.g. 0-1,3-8 (default: the fixed set of 10)"),
        ("--datasets", _dataset_list, "house,mnist (default: both)"),
        ("--jobs", positive_int, "worker processes (default: the cores)"),
        ("--max-steps", _step_list, steps),
    ]:
        parser.add_argument(flag, type=kind, default=None, help=text)


def protocols(names: list[str] | None, datasets) -> list[str]:
    """``["condreg", *names]`` (None: every switch, then ``released``); UsageError if one is bad."""
    if names is None:
        return ["condreg", *RELEASED_SWITCHES, "released"]
    out, known = ["condreg"], [*RELEASED_SWITCHES, "released"]
    for name in names:
        if "+" in name:
            raise UsageError(
                f"--switches {name!r}: the released code never had that combination of choices; "
                "name single switches (each is tried alone) or 'released' (all together)"
            )
        if name not in known:
            raise UsageError(f"--switches: unknown switch {name!r}; choose from {', '.join(known)}")
        if name == "released_preprocessing" and "house" not in datasets:
            raise UsageError(
                "--switches released_preprocessing: the released code preprocesses only the house "
                "prices that way; add --datasets house"
            )
        if name in out:
            raise UsageError(f"--switches lists {name!r} twice")
        out.append(name)
    return out


def switches_of(protocol: str, dataset: str) -> list[str]:
    """The switches a protocol turns on for ``dataset`` (``released``: all that exist there)."""
    if protocol == "released":
        return list(SWITCHES_BY_DATASET[dataset])
    return [protocol] if protocol in SWITCHES_BY_DATASET[dataset] else []


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    switches: list[str] | None = None,
    pairs: list[tuple[int, int]] | None = None,
    datasets: list[str] | None = None,
    jobs: int | None = None,
    max_steps: list[float] | None = None,
    resume: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run the ablation; write results.json, table.md, ranking.png, schedule.png, units/.

    Returns the results.json payload; UsageError or DataError (unusable house files) before work.

    >>> from condreg.experiments import ablation
    >>> ablation.protocols(["adam", "released"], ("house",))
    ['condreg', 'adam', 'released']
    """
    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    datasets = list(datasets or DATASETS)
    if options:
        raise UsageError(
            f"ablation: unknown option(s) {', '.join(sorted(options))}; it takes "
            f"--switches, --pairs, --datasets, --jobs, --resume, --quick"
        )
    rp.check_positive("--seeds", seeds, integer=True)
    rp.check_positive("--jobs", jobs, integer=True)
    if set(datasets) - set(DATASETS):
        raise UsageError(f"--datasets: choose from house,mnist; got {datasets!r}")
    if pairs is not None:
        keys = [tuple(p) for p in pairs]
        bad = [p for p in keys if len(p) != 2 or p[0] == p[1] or not set(p) <= set(range(10))]
        if bad or not keys or len(set(keys)) != len(keys):
            raise UsageError(f"--pairs needs distinct (P, H) digit pairs 0-9, got {pairs!r}")
    protocol_names = protocols(switches, datasets)
    steps = check_max_steps(MAX_STEPS if max_steps is None else max_steps)
    pairs = [tuple(p) for p in (pairs or (QUICK_PAIRS if quick else ABLATION_PAIRS))]
    seed_list = rp.seed_list(seeds)
    plan = Plan(
        out_dir, quick, seed_list, protocol_names, pairs, datasets, jobs, resume, progress, steps
    )
    return execute(plan, load_data(plan), start)  # load_data: DataError before any work


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


def input_kappas(X_p: np.ndarray, X_h: np.ndarray) -> dict[str, dict[str, float]]:
    """κ(K_P), κ(K_H) at θ = I under both scorings (``"nonzero"`` with its ranks, ``"ridge"``)."""
    rtol = default_rtol(X_p, X_h)
    (kp, rank_p), (kh, rank_h) = kappa_features(X_p, rtol), kappa_features(X_h, rtol)
    return {
        "nonzero": {"kappa_K_P": kp, "kappa_K_H": kh, "rank_K_P": rank_p, "rank_K_H": rank_h},
        "ridge": {"kappa_K_P": em.ridge_floor_kappa(X_p), "kappa_K_H": em.ridge_floor_kappa(X_h)},
    }


def score_two_ways(
    theta: np.ndarray,
    bias: np.ndarray | None,
    X_p: np.ndarray,
    X_h: np.ndarray,
    inputs: dict[str, dict[str, float]],
) -> dict[str, dict[str, Any]]:
    """Eq. 15 of ``xᵀθ + b`` by each scoring given :func:`input_kappas` (non-finite θ: NaN)."""
    rtol = default_rtol(X_p, X_h)
    kappa = {"nonzero": lambda F: kappa_features(F, rtol)[0], "ridge": em.ridge_floor_kappa}
    out = {}
    finite = bool(np.all(np.isfinite(theta))) and (bias is None or bool(np.all(np.isfinite(bias))))
    F_p, F_h = (X @ theta if bias is None else X @ theta + bias for X in (X_p, X_h))
    for way in ("nonzero", "ridge"):
        k_hp, k_hh = (kappa[way](F_p), kappa[way](F_h)) if finite else (math.nan, math.nan)
        i, ii = k_hh / inputs[way]["kappa_K_H"], k_hp / inputs[way]["kappa_K_P"]
        ok = math.isfinite(i) and math.isfinite(ii) and i > 1 and ii <= 1
        out[way] = dict(kappa_H_P=k_hp, kappa_H_H=k_hh, i=i, ii=ii, rir=i / ii, success=bool(ok))
    return out


def _method(m: str, data: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """One method trained by the emulator (``emulated``) or ``condreg.immunize``, scored."""
    X_p, y_p, X_h, y_h, task = (data[k] for k in ("X_p", "y_p", "X_h", "y_h", "task"))
    if spec["kind"] == "emulated":
        protocol = em.Protocol(
            spec["dataset"], frozenset(spec["switches"]), spec["epochs"], spec["lr"], task
        )
        tr = em.emulate(m, X_p, y_p, X_h, y_h, protocol, seed=spec["seed"])
        entry = score_two_ways(tr.theta, tr.bias, X_p, X_h, data["inputs"])
        return entry | dict(stopped=tr.stopped, lam=tr.lam, epochs_run=tr.epochs_run)
    options = {k: spec[k] for k in ("epochs", "lr", "seed", "max_step") if k in spec}
    res = immunize_method(m, X_p, y_p, X_h, y_h=y_h, task=task, **options)
    entry = score_two_ways(res["_theta"], None, X_p, X_h, data["inputs"])
    entry.update(condreg_rir=res["rir"], history_rir=res["history"].get("rir", []))
    return entry | dict(loss_final=res["loss_final"], stopped=res["stopped"])


def run_unit(data: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Run one unit on ``data``, warnings dropped: ``{"spec", "methods", "seconds", "cpu_s"}``."""
    start, cpu_start = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        result = {m: _method(m, data, spec) for m in spec["methods"]}
        if spec["kind"] == "default":
            args = data["X_p"], data["y_p"], data["task"], spec["epochs"], spec["lr"]
            result["head_only_loss"] = em.head_only_loss(*args)
    seconds = time.perf_counter() - start
    return dict(spec=spec, methods=result, seconds=seconds, cpu_s=time.process_time() - cpu_start)


def run_unit_packed(args: tuple) -> dict[str, Any]:
    """:func:`run_unit` with its arguments in one tuple (for a process pool)."""
    return run_unit(*args)


def _task_data(X_p, y_p, X_h, y_h, task: str) -> dict[str, Any]:
    return dict(X_p=X_p, y_p=y_p, X_h=X_h, y_h=y_h, task=task, inputs=input_kappas(X_p, X_h))


def _raw_digit_inputs(X: np.ndarray, y: np.ndarray, digits) -> dict[str, Any]:
    """Per digit, both κ's of the released MNIST input (one digit's 784 normalised pixels)."""
    out = {}
    for d in digits:
        Xd = (X[y == d] - mnist_pairs.RAW_MEAN) / mnist_pairs.RAW_STD
        kappa, rank = kappa_features(Xd)
        n, ridge = int(Xd.shape[0]), em.ridge_floor_kappa(Xd)
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
        rel = em.released_house_prices(house_price_dir())
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
        training = {"epochs": s["epochs"], "lr": s["lr"], "methods": list(METHODS)}
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
    return [(key, where, {**spec, "key": key}) for key, where, spec in out]


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
        finish(map(run_unit_packed, args))
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes=jobs, initializer=limit_worker_threads) as workers:
        finish(workers.imap_unordered(run_unit_packed, args))


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
    from condreg.experiments.ablation import report

    settings = {
        "quick": plan.quick,
        "protocols": plan.protocols,
        "datasets": plan.datasets,
        "pairs": [list(p) for p in plan.pairs],
        "house": plan.schedule("house"),
        "mnist": plan.schedule("mnist"),
        "methods": list(METHODS),
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
