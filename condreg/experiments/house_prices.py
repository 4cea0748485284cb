"""Table 1: immunizing a linear feature extractor on Ames house prices.

D_P = rows with MSZoning ≠ RL (309, target LotArea), D_H = rows with MSZoning = RL (1151, target
SalePrice); 78 inputs after :func:`condreg.experiments.data.load_house_prices`'s preprocessing (Id dropped,
ordinal categories fit on both tasks, median imputation, standardisation over both tasks). Each
method of :func:`condreg.immunize` runs from θ_0 = I with the paper's settings (100 epochs,
η = 0.005, regression loss, λ's by the package's default gradient-norm balancing), and is scored
by Eq. 15: (i) = κ(H_H(θ))/κ(K_H), (ii) = κ(H_P(θ))/κ(K_P), RIR = (i)/(ii). Identity (θ = I) is
the reference (RIR = 1). No hyper-parameter is tuned on these data.

Writes ``results.json``, ``table.md``, ``rir.png`` (ours vs the paper, per method) and
``kappa_history.png`` (κ(H_P), κ(H_H) per epoch, when the history records them).
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import numpy as np

from condreg.experiments.data import house_price_dir, load_house_prices
from condreg.experiments import UsageError
from condreg.experiments import _report as rp
from condreg.experiments._linear import (
    TOLERANCE_FACTORS,
    check_task_ranks,
    default_rtol,
    immunize_method,
    spectrum_numbers,
    stopped_early,
    summarise_runs,
)

__all__ = ["run", "PAPER_SETTINGS", "QUICK_SETTINGS"]

PAPER_SETTINGS = {"epochs": 100, "lr": 0.005}
QUICK_SETTINGS = {"epochs": 20, "lr": 0.005}


def _resolve_data_dir(data: Any) -> pathlib.Path:
    """``data`` if given, else the house-price data shipped with the package."""
    return house_price_dir() if data is None else pathlib.Path(data)


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
    methods = rp.check_methods(methods)
    rp.check_positive("--epochs", epochs, integer=True)
    rp.check_positive("--lr", lr)
    if encoding not in ("ordinal", "onehot"):
        raise UsageError(f"--encoding must be ordinal or onehot, got {encoding!r}")
    data_dir = _resolve_data_dir(data)
    base = QUICK_SETTINGS if quick else PAPER_SETTINGS
    settings = {
        "epochs": int(epochs or base["epochs"]),
        "lr": float(lr or base["lr"]),
        "methods": methods,
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
    hp = load_house_prices(data_dir, encoding=encoding)
    check_task_ranks(hp.X_p, hp.X_h, where=str(data_dir))
    seed_values = rp.seed_list(seeds)
    identity = spectrum_numbers(None, hp.X_p, hp.X_h, rtol=default_rtol(hp.X_p, hp.X_h))
    store = rp.UnitStore(out_dir, settings=settings, resume=resume)  # data_dir included

    units = {s: store.load(f"seed{s}") for s in seed_values}
    jobs = [(s, m) for s in seed_values if units[s] is None for m in methods]
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
            **options,
        )
        res.pop("_theta")
        fresh.setdefault(seed, {})[method] = res
        if len(fresh[seed]) == len(methods):
            units[seed] = fresh[seed]
            store.save(f"seed{seed}", fresh[seed])
    runs = {m: [units[s][m] for s in seed_values] for m in methods}

    method_results = {
        m: {
            "summary": summarise_runs(
                r,
                (
                    "i",
                    "ii",
                    "rir",
                    "kappa_H_P",
                    "kappa_H_H",
                    "loss_initial",
                    "loss_final",
                    "runtime_s",
                ),
            ),
            "successes": int(sum(x["success"] for x in r)),
            "successes_by_rtol": {
                f"{f}x": int(sum(x["tolerance"][f"{f}x"]["success"] for x in r))
                for f in TOLERANCE_FACTORS
            },
            "runs": r,
        }
        for m, r in runs.items()
    }
    results = {
        "data": {
            "n_p": hp.info["n_p"],
            "n_h": hp.info["n_h"],
            "n_features": hp.info["n_features"],
            "kappa_K_P": identity["kappa_K_P"],
            "kappa_K_H": identity["kappa_K_H"],
            "rank_K_P": identity["rank_K_P"],
            "rank_K_H": identity["rank_K_H"],
            "preprocessing": hp.info,
        },
        "identity": identity,
        "methods": method_results,
        "paper": rp.PAPER_HOUSE_PRICES,
        "stopped_early": stopped_early([x for r in runs.values() for x in r]),
    }
    notes = _notes(method_results)
    if store.loaded:
        notes.append(f"--resume: seed(s) {', '.join(store.loaded)} taken from {store.dir}")
    payload = rp.write_outputs(
        out_dir,
        experiment="house-prices",
        settings=settings,
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - start,
        notes=notes,
        table=_table(identity, method_results, settings, hp.info, len(seed_values), notes),
        title="Table 1 — house prices (Ames): ours beside the paper's",
    )
    _plots(out_dir, identity, method_results)
    return payload


def _notes(method_results: dict[str, Any]) -> list[str]:
    notes = []
    for m, r in method_results.items():
        n = len(r["runs"])
        if r["successes"] < n:
            s = r["summary"]
            notes.append(
                f"{rp.METHOD_LABELS[m]} did not immunize in {n - r['successes']} of {n} run(s) "
                f"(success = (i) > 1 and (ii) <= 1; mean RIR {rp.fmt_number(s['rir']['mean'])}, "
                f"(ii) {rp.fmt_number(s['ii']['mean'])})"
            )
        for x in r["runs"]:
            t = x["tolerance"]
            if t["flips"]:
                verdicts = ", ".join(
                    f"{'success' if t[f'{f}x']['success'] else 'failure'} (RIR "
                    f"{rp.fmt_number(t[f'{f}x']['rir'], 3)}) at {f}× rtol"
                    for f in TOLERANCE_FACTORS
                )
                notes.append(
                    f"{rp.METHOD_LABELS[m]}, seed {x['seed']}: the verdict flips with the rank "
                    f"tolerance: {verdicts}"
                )
            if x["stopped"] != "completed":
                notes.append(f"{rp.METHOD_LABELS[m]}, seed {x['seed']}: {x['stopped']}")
        for w in sorted(
            {w for x in r["runs"] for w in x["warnings"] if "did not succeed" not in w}
        ):
            notes.append(f"{rp.METHOD_LABELS[m]}: warning from condreg.immunize: {w}")
    return notes


def _table(identity, method_results, settings, info, n_seeds, notes) -> str:
    rows = [[rp.METHOD_LABELS["identity"], "1", "1", "1", "—", "—", "—", "—", "—", "1"]]
    for m in rp.METHODS:
        if m not in method_results:
            continue
        s = method_results[m]["summary"]
        p = rp.PAPER_HOUSE_PRICES[m]
        rows.append(
            [
                rp.METHOD_LABELS[m],
                rp.fmt_mean_std(s["i"]),
                rp.fmt_mean_std(s["ii"]),
                rp.fmt_mean_std(s["rir"]),
                rp.fmt_number(p["i"]),
                rp.fmt_number(p["ii"]),
                rp.fmt_number(p["rir"]),
                f"{method_results[m]['successes']}/{len(method_results[m]['runs'])}",
                " / ".join(
                    f"{method_results[m]['successes_by_rtol'][f'{f}x']}/{len(method_results[m]['runs'])}"
                    for f in TOLERANCE_FACTORS[1:]
                ),
                rp.fmt_mean_std(s["loss_final"], 3),
            ]
        )
    text = rp.markdown_table(
        [
            "method",
            "(i) ours",
            "(ii) ours",
            "RIR ours",
            "(i) paper",
            "(ii) paper",
            "RIR paper",
            "success",
            "success at 10× / 100× rtol",
            "D_P loss",
        ],
        rows,
    )
    text += (
        f"\nκ(K_P) = {rp.fmt_number(identity['kappa_K_P'])} (rank {identity['rank_K_P']} of "
        f"{info['n_features']}), κ(K_H) = {rp.fmt_number(identity['kappa_K_H'])} (rank "
        f"{identity['rank_K_H']}); κ over the nonzero singular values.\n\n"
        f"Settings: {settings['epochs']} epochs, η = {settings['lr']}, θ_0 = I, "
        f"λ_P = {settings['lam_p']!s}, λ_H = {settings['lam_h']!s}, {info['encoding']} "
        f"categories; "
        f"{n_seeds} seed(s) (mean ± sample std). (i) = κ(H_H(θ))/κ(K_H), "
        f"(ii) = κ(H_P(θ))/κ(K_P), RIR = (i)/(ii); success = (i) > 1 and (ii) ≤ 1 "
        f"(Definition 3.1 (a), (b)), at the run's rank tolerance rtol = "
        f"{rp.fmt_number(method_results[next(iter(method_results))]['runs'][0]['rtol'], 3)} on "
        f"σ(Xθ) and at 10× and 100× it. "
        f"D_P loss: the pre-training task's relative squared error "
        f"mean((Xθω − y)²)/mean(y²) after training (1 at ω = 0; Definition 3.1 (c)).\n"
    )
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return text


def _plots(out_dir: pathlib.Path, identity, method_results) -> None:
    methods = [m for m in rp.METHODS if m in method_results]
    fig, axes = rp.new_figure(1, 3, figsize=(13, 3.8))
    x = np.arange(len(methods))
    for ax, key, label in zip(
        axes, ("i", "ii", "rir"), ("(i) κ(H_H)/κ(K_H)", "(ii) κ(H_P)/κ(K_P)", "RIR"), strict=True
    ):
        ours = [method_results[m]["summary"][key]["mean"] for m in methods]
        err = [method_results[m]["summary"][key]["std"] for m in methods]
        paper = [rp.PAPER_HOUSE_PRICES[m][key] for m in methods]
        colours = [rp.METHOD_COLORS[m] for m in methods]
        ax.bar(x - 0.2, ours, 0.4, yerr=err, label="ours", color=colours)
        ax.bar(x + 0.2, paper, 0.4, label="paper", color=colours, alpha=0.35, hatch="//")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xticks(x, [rp.METHOD_LABELS[m] for m in methods], rotation=20, fontsize=8)
        ax.set_title(label)
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor="0.45", label="ours"),
        Patch(facecolor="0.45", alpha=0.35, hatch="//", label="paper"),
    ]
    axes[0].legend(handles=handles, fontsize=8)
    fig.suptitle("House prices: Eq. 15 per method (log scale; dashed = identity)")
    rp.save_figure(fig, out_dir / "rir.png")

    have = [
        m
        for m in methods
        if {"kappa_hp", "kappa_hh"} <= set(method_results[m]["runs"][0]["history"])
    ]
    if have:
        fig, axes = rp.new_figure(1, 2, figsize=(10, 3.8))
        for m in have:
            h = method_results[m]["runs"][0]["history"]
            colour = rp.METHOD_COLORS[m]
            axes[0].plot(h["kappa_hp"], label=rp.METHOD_LABELS[m], color=colour)
            axes[1].plot(h["kappa_hh"], label=rp.METHOD_LABELS[m], color=colour)
        for ax, title in zip(axes, ("κ(H_P(θ_t))", "κ(H_H(θ_t))"), strict=True):
            ax.set_yscale("log")
            ax.set_xlabel("epoch")
            ax.set_title(title)
        axes[0].axhline(identity["kappa_K_P"], color="k", ls="--", lw=0.8)
        axes[1].axhline(identity["kappa_K_H"], color="k", ls="--", lw=0.8)
        axes[0].set_ylabel("κ (nonzero spectrum, log scale)")
        axes[1].legend(fontsize=8)
        fig.suptitle("House prices: κ during immunization (dashed = κ(K), i.e. θ = I)")
        rp.save_figure(fig, out_dir / "kappa_history.png")
