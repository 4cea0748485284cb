"""Table 1: immunizing a linear feature extractor on Ames house prices (docs/reproduction.md):
D_P MSZoning ≠ RL (target LotArea), D_H MSZoning = RL (SalePrice), θ_0 = I, Eq. 15, Def. 3.1.
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

__all__ = ["HELP", "add_arguments", "run", "resolve_data_dir", "PAPER_SETTINGS", "QUICK_SETTINGS"]

#: One line for ``condreg reproduce --help``.
HELP = "Table 1: house prices (Ames; D_P LotArea, D_H SalePrice)"

PAPER_SETTINGS = {"epochs": 100, "lr": 0.005}
QUICK_SETTINGS = {"epochs": 20, "lr": 0.005}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``condreg reproduce house-prices``."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20 epochs instead of the paper's 100: about 2 s on a 2-core CPU (the full run: "
        "about 3 s); its numbers are not comparable with the paper's",
    )
    parser.add_argument(
        "--data",
        type=pathlib.Path,
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
    """``data`` as a path, or the house-price data shipped with the package if None."""
    return house_price_dir() if data is None else pathlib.Path(data)


def _settings(quick, data_dir, epochs, lr, methods, encoding, options) -> dict[str, Any]:
    """The run's checked settings (results.json and the key of its saved units)."""
    rp.check_positive("--epochs", epochs, integer=True)
    rp.check_positive("--lr", lr)
    if encoding not in ("ordinal", "onehot"):
        raise UsageError(f"--encoding must be ordinal or onehot, got {encoding!r}")
    base = QUICK_SETTINGS if quick else PAPER_SETTINGS
    settings = dict(epochs=int(epochs or base["epochs"]), lr=float(lr or base["lr"]))
    settings.update(methods=rp.check_methods(methods), task="regression", theta0="identity")
    settings.update(rp.immunize_options(options))
    settings.update(encoding=encoding, quick=quick, data_dir=str(data_dir))
    return settings | {"paper_settings": PAPER_SETTINGS}


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
    """Run Table 1 and write results.json, table.md, units/ (one per seed, kept by ``resume``) and
    plots into ``out_dir``; ``options`` go to :func:`condreg.immunize`. Raises
    :class:`condreg.experiments.UsageError` for a bad option."""
    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    data_dir = resolve_data_dir(data)
    settings = _settings(quick, data_dir, epochs, lr, methods, encoding, options)
    hp = load_house_prices(data_dir, encoding=encoding)
    check_task_ranks(hp.X_p, hp.X_h, where=str(data_dir))
    rtol = default_rtol(hp.X_p, hp.X_h)
    identity = spectrum_numbers(None, hp.X_p, hp.X_h, rtol=rtol)
    identity["loss_best"] = best_loss(hp.X_p, hp.y_p, task="regression", rtol=rtol)
    seed_values = rp.seed_list(seeds)
    store = rp.UnitStore(out_dir, settings=settings, resume=resume)
    runs = _runs(hp, store, seed_values, settings, options, progress)
    results = report.results(runs, identity, hp.info)
    notes = report.notes(results["methods"])
    if store.loaded:
        notes.append(f"--resume: seed(s) {', '.join(store.loaded)} taken from {store.dir}")
    fields = dict(settings=settings, seeds=seed_values, results=results, notes=notes)
    title = f"Table 1 — house prices (Ames){' (quick)' if quick else ''}: ours beside the paper's"
    table = report.table(results, settings, len(seed_values))
    payload = report.write(out_dir, "house-prices", start, fields, table, title)
    report.plots(out_dir, identity, results["methods"], quick=quick)
    return payload


def _runs(hp: HousePrices, store, seed_values, settings, options, progress) -> dict[str, list]:
    """Each method's run per seed, from ``store`` or computed now; a seed's runs saved together."""
    methods = settings["methods"]
    units = {s: store.load(f"seed{s}") for s in seed_values}
    jobs = [(s, m) for s in seed_values if units[s] is None for m in methods]
    setup = data_setup(hp.X_p, hp.X_h, options) if jobs else None
    kw = dict(task="regression", epochs=settings["epochs"], lr=settings["lr"], setup=setup)
    kw["y_h"] = hp.y_h
    fresh: dict[int, dict[str, Any]] = {}
    for seed, method in rp.progress(jobs, enabled=progress, desc="house-prices"):
        res = immunize_method(method, hp.X_p, hp.y_p, hp.X_h, seed=seed, **kw, **options)
        res.pop("_theta")
        fresh.setdefault(seed, {})[method] = res
        if len(fresh[seed]) == len(methods):
            units[seed] = fresh[seed]
            store.save(f"seed{seed}", fresh[seed])
    return {m: [units[s][m] for s in seed_values] for m in methods}
