"""Table 1: immunizing a linear feature extractor on Ames house prices.

D_P = rows with MSZoning ≠ RL (309, target LotArea), D_H = rows with MSZoning = RL (1151, target
SalePrice); 78 inputs after :func:`condreg.experiments.data.load_house_prices`'s preprocessing
(Id dropped, ordinal categories fit on both tasks, median imputation, standardisation over both
tasks). Each method of :func:`condreg.immunize` runs from θ_0 = I with the paper's settings (100
epochs, η = 0.005, regression loss, λ's by the package's default gradient-norm balancing), and
is scored by Eq. 15: (i) = κ(H_H(θ))/κ(K_H), (ii) = κ(H_P(θ))/κ(K_P), RIR = (i)/(ii); success =
Definition 3.1 (a) + (b), (i) > 1 and (ii) ≤ 1; Definition 3.1 (c) by the best attainable D_P
loss on X_Pθ (least squares) beside the jointly trained head's. Identity (θ = I) is the
reference (RIR = 1). No hyper-parameter is tuned on these data.

Writes ``results.json``, ``table.md``, ``rir.png`` (ours vs the paper, per method) and
``kappa_history.png`` (κ(H_P), κ(H_H) per epoch, with κ at θ = I as reference lines), by
:mod:`condreg.experiments._house_report`.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from typing import Any

from condreg.experiments import UsageError
from condreg.experiments import _house_report as report
from condreg.experiments import _report as rp
from condreg.experiments import options as opt
from condreg.experiments._linear import (
    best_loss,
    check_task_ranks,
    data_setup,
    default_rtol,
    immunize_method,
    spectrum_numbers,
)
from condreg.experiments.data import HousePrices, house_price_dir, load_house_prices

__all__ = [
    "HELP",
    "add_arguments",
    "run",
    "resolve_data_dir",
    "PAPER_SETTINGS",
    "QUICK_SETTINGS",
]

#: One line for ``condreg reproduce --help``.
HELP = "Table 1: house prices (Ames; D_P LotArea, D_H SalePrice)"

PAPER_SETTINGS = {"epochs": 100, "lr": 0.005}
QUICK_SETTINGS = {"epochs": 20, "lr": 0.005}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this experiment's options to ``parser`` (``condreg reproduce house-prices``); the
    command line adds ``--out``, ``--seeds``, ``--no-progress`` and ``--threads``."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20 epochs instead of the paper's 100: about 2 s on a 2-core CPU (the full run: "
        "about 3 s); its numbers are not comparable with the paper's",
    )
    parser.add_argument(
        "--data",
        type=pathlib.Path,
        default=None,
        help="directory with train.csv (optionally D1.csv, D2.csv); default: the Ames data "
        "shipped with condreg (condreg/datasets/house_price/)",
    )
    parser.add_argument(
        "--encoding",
        choices=("ordinal", "onehot"),
        default="ordinal",
        help="categorical encoding, fit on both tasks (default ordinal)",
    )
    opt.add_linear_options(parser, epochs_default="100")
    opt.add_resume_option(parser, "seed")


def resolve_data_dir(data: str | pathlib.Path | None) -> pathlib.Path:
    """``data`` as a path if given, else the house-price data shipped with the package
    (:func:`condreg.experiments.data.house_price_dir`).

    Examples
    --------
    >>> resolve_data_dir("/data/ames")
    PosixPath('/data/ames')
    """
    return house_price_dir() if data is None else pathlib.Path(data)


def _settings(quick, data_dir, epochs, lr, methods, encoding, options) -> dict[str, Any]:
    """The run's checked settings (results.json, and the key of its saved units);
    :class:`condreg.experiments.UsageError` for a bad option."""
    rp.check_positive("--epochs", epochs, integer=True)
    rp.check_positive("--lr", lr)
    if encoding not in ("ordinal", "onehot"):
        raise UsageError(f"--encoding must be ordinal or onehot, got {encoding!r}")
    base = QUICK_SETTINGS if quick else PAPER_SETTINGS
    return {
        "epochs": int(epochs or base["epochs"]),
        "lr": float(lr or base["lr"]),
        "methods": rp.check_methods(methods),
        "task": "regression",
        "theta0": "identity",
        "lam_p": options.get("lam_p", "default (condreg.immunize)"),
        "lam_h": options.get("lam_h", "default (condreg.immunize)"),
        "options": {k: v for k, v in options.items() if k not in ("lam_p", "lam_h")},
        "encoding": encoding,
        "quick": quick,
        "data_dir": str(data_dir),
        "paper_settings": PAPER_SETTINGS,
    }


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    data: str | pathlib.Path | None = None,
    epochs: int | None = None,
    lr: float | None = None,
    methods: list[str] | None = None,
    encoding: str = "ordinal",
    resume: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run Table 1 and write results.json, table.md, units/ and plots into ``out_dir``.

    ``data``: the directory of the Kaggle files (default: the copy shipped with the package).
    Each seed (all methods) is one unit, saved to ``out_dir/units/`` when done; ``resume=True``
    keeps the seeds already there (same settings). ``options`` are passed to
    :func:`condreg.immunize` (e.g. ``lam_p``, ``lam_h``). Raises
    :class:`condreg.experiments.UsageError` for a bad option, before any work.
    """
    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    data_dir = resolve_data_dir(data)
    settings = _settings(quick, data_dir, epochs, lr, methods, encoding, options)
    # load: both tasks, checked, and the reference numbers at θ = I
    hp = load_house_prices(data_dir, encoding=encoding)
    check_task_ranks(hp.X_p, hp.X_h, where=str(data_dir))
    rtol = default_rtol(hp.X_p, hp.X_h)
    identity = spectrum_numbers(None, hp.X_p, hp.X_h, rtol=rtol)
    identity["loss_best"] = best_loss(hp.X_p, hp.y_p, task="regression", rtol=rtol)
    # units: one seed (every method) each, saved as soon as it is done
    seed_values = rp.seed_list(seeds)
    store = rp.UnitStore(out_dir, settings=settings, resume=resume)  # data_dir included
    runs = _runs(hp, store, seed_values, settings, options, progress)
    # summarize
    results = report.results(runs, identity, hp.info)
    notes = report.notes(results["methods"])
    if store.loaded:
        notes.append(f"--resume: seed(s) {', '.join(store.loaded)} taken from {store.dir}")
    # write
    payload = rp.write_outputs(
        out_dir,
        experiment="house-prices",
        settings=settings,
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - start,
        notes=notes,
        table=report.table(results, settings, len(seed_values), notes),
        title=f"Table 1 — house prices (Ames){' (quick)' if quick else ''}: ours beside the "
        "paper's",
    )
    report.plots(out_dir, identity, results["methods"], quick=quick)
    return payload


def _runs(
    hp: HousePrices, store: rp.UnitStore, seed_values, settings, options, progress
) -> dict[str, list[dict[str, Any]]]:
    """Each method's run per seed, from ``store`` (``--resume``) or computed now, the data
    decomposed once for all of them (:func:`condreg.experiments._linear.data_setup`); a seed's
    runs are saved together as soon as its last method is done."""
    methods = settings["methods"]
    units = {s: store.load(f"seed{s}") for s in seed_values}
    jobs = [(s, m) for s in seed_values if units[s] is None for m in methods]
    setup = data_setup(hp.X_p, hp.X_h, options) if jobs else None  # decomposed once for all
    fresh: dict[int, dict[str, Any]] = {}
    for seed, method in rp.progress(jobs, enabled=progress, desc="house-prices"):
        res = immunize_method(
            method,
            hp.X_p,
            hp.y_p,
            hp.X_h,
            y_h=hp.y_h,
            task="regression",
            epochs=settings["epochs"],
            lr=settings["lr"],
            seed=seed,
            setup=setup,
            **options,
        )
        res.pop("_theta")
        fresh.setdefault(seed, {})[method] = res
        if len(fresh[seed]) == len(methods):
            units[seed] = fresh[seed]
            store.save(f"seed{seed}", fresh[seed])
    return {m: [units[s][m] for s in seed_values] for m in methods}
