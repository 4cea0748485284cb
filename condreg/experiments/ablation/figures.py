"""The ablation's figures: ranking.png (Ours vs Opt κ per protocol) and schedule.png."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from condreg.experiments import _report as rp
from condreg.experiments.ablation.units import LABELS, METHODS

__all__ = ["ranking", "schedule"]

_DATASET = {"house": "house prices", "mnist": "MNIST pairs"}


def ranking(plan, results: dict[str, Any], path: pathlib.Path) -> None:
    """Per dataset and protocol, the median log10(RIR Ours / RIR Opt κ) under both scorings."""
    n = len(plan.datasets)
    size = (6.6 * n, 0.6 * len(plan.protocols) + 2.4)
    fig, axes = rp.new_figure(1, n, figsize=size, squeeze=False)
    for ax, dataset in zip(axes[0], plan.datasets, strict=True):
        rows = [r for r in results["rows"] if r["dataset"] == dataset]
        y = np.arange(len(rows))[::-1]
        for yy, row in zip(y, rows, strict=True):
            _mark(ax, row, yy)
        medians = [v["median_log10_ratio"] or 0 for r in rows for v in r["ours_vs_opt"].values()]
        lim = max(1.0, *map(abs, medians)) * 1.15
        sides = [
            ((0, lim), 0.98, "right", "Ours ahead →\n(paper's ranking)", "tab:blue"),
            ((-lim, 0), 0.02, "left", "← Opt κ ahead", "tab:green"),
        ]
        for span, x, ha, text, c in sides:
            ax.axvspan(*span, color=c, alpha=0.07)
            ax.text(x, 0.01, text, transform=ax.transAxes, ha=ha, va="bottom", fontsize=8, color=c)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlim(-lim, lim)
        ax.set_yticks(y, [_row_label(r) for r in rows], fontsize=7)
        ax.set_xlabel("log10(RIR Ours / RIR Opt κ)  (median over runs)")
        title = f"{_DATASET[dataset]}: ● κ over nonzero σ, ◇ released ridge-floor κ"
        ax.set_title(title, fontsize=9)
    quick = " (quick)" if plan.quick else ""
    fig.suptitle(f"Which released-code switch moves the Ours-vs-Opt κ ranking{quick}")
    fig.supxlabel(
        "† some runs diverged or stopped early (θ = the last finite one). ◇ on "
        "rank-deficient Hessians the ridge-floor κ is ≈ λ_max/1e-6 or not, by the sign "
        "of rounding errors (docs/ablation.md).",
        fontsize=7,
    )
    rp.save_figure(fig, path)


def _mark(ax, row: dict[str, Any], y) -> None:
    """One row's median log-ratio under each scoring (● nonzero, ◇ ridge), with Ours' lead."""
    for way, marker, dy in (("nonzero", "o", 4), ("ridge", "D", -10)):
        v = row["ours_vs_opt"][way]
        x = v["median_log10_ratio"]
        if x is None:
            continue
        colour = "tab:blue" if x > 0 else "tab:green"
        face = colour if way == "nonzero" else "none"
        ax.scatter([x], [y], marker=marker, s=60, color=colour, facecolors=face, zorder=3)
        if v["n"] > 1:
            lead = f"{v['ours_ahead']}/{v['n']}"
            ax.annotate(lead, (x, y), fontsize=7, xytext=(4, dy), textcoords="offset points")


def _row_label(row: dict[str, Any]) -> str:
    """The protocol (``†``: a run stopped early), then Ours' and Opt κ's successes."""
    names = {"condreg": "condreg default", "released": "RELEASED (all switches)"}
    name = names.get(row["protocol"], "+ " + row["protocol"])
    ours, opt = (row["methods"][m]["nonzero"] for m in ("condreg", "opt_kappa"))
    tail = " †" if row["stopped_early"] else ""
    counts = f"Ours {ours['successes']}/{ours['n']}, Opt κ {opt['successes']}/{opt['n']}"
    return f"{name}{tail}\nsuccess: {counts}"


def schedule(plan, results: dict[str, Any], path: pathlib.Path) -> None:
    """RIR against the epoch (top) and against ``max_step`` (bottom), condreg's protocol."""
    n = len(plan.datasets)
    fig, axes = rp.new_figure(2, n, figsize=(5.5 * n, 7.0), squeeze=False)
    for col, dataset in enumerate(plan.datasets):
        s = results["schedule"][dataset]
        top, bottom = axes[0][col], axes[1][col]
        for m in METHODS:
            colour = rp.METHOD_COLORS[m]
            curve = s["rir_by_epoch"][m]
            top.plot(np.arange(len(curve)), curve, color=colour, label=LABELS[m])
            xs = s["max_steps"]
            ys = [s["by_max_step"][str(x)][m]["geomean_rir"] for x in xs]
            bottom.plot(xs, ys, "o-", color=colour, label=LABELS[m])
            best = s["chosen_max_step"][m]
            y = s["by_max_step"][str(best)][m]["geomean_rir"]
            bottom.scatter([best], [y], marker="*", s=220, color=colour, edgecolor="k", zorder=4)
        for ax in (top, bottom):
            ax.set_yscale("log")
            ax.axhline(1.0, color="k", lw=0.8, ls=":")
        top.set(xlabel="epoch", ylabel="RIR (nonzero-σ κ; geometric mean)")
        bottom.axvline(0.3, color="k", ls="--", lw=0.8)
        xlabel = "max_step (dashed: default 0.3; ★: chosen by the D_P-only rule)"
        bottom.set(xlabel=xlabel, ylabel="RIR at the last epoch")
        top.set_title(f"{_DATASET[dataset]}: RIR against the epoch", fontsize=9)
        bottom.set_title(f"{_DATASET[dataset]}: RIR against max_step", fontsize=9)
        top.legend(fontsize=7)
    quick = " (quick)" if plan.quick else ""
    fig.suptitle(f"Does the verdict depend on the schedule?{quick}")
    rp.save_figure(fig, path)
