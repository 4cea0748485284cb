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
    fig, axes = rp.new_figure(
        1, n, figsize=(6.6 * n, 0.6 * len(plan.protocols) + 2.4), squeeze=False
    )
    for ax, dataset in zip(axes[0], plan.datasets, strict=True):
        rows = [r for r in results["rows"] if r["dataset"] == dataset]
        y = np.arange(len(rows))[::-1]
        for yy, row in zip(y, rows, strict=True):
            for way, marker in (("nonzero", "o"), ("ridge", "D")):
                v = row["ours_vs_opt"][way]
                x = v["median_log10_ratio"]
                if x is None:
                    continue
                colour = "tab:blue" if x > 0 else "tab:green"
                face = colour if way == "nonzero" else "none"
                ax.scatter([x], [yy], marker=marker, s=60, color=colour, facecolors=face, zorder=3)
                if v["n"] > 1:
                    dy = 4 if way == "nonzero" else -10
                    ax.annotate(
                        f"{v['ours_ahead']}/{v['n']}",
                        (x, yy),
                        fontsize=7,
                        xytext=(4, dy),
                        textcoords="offset points",
                    )
        lim = (
            max(
                1.0,
                *(
                    abs(r["ours_vs_opt"][w]["median_log10_ratio"] or 0)
                    for r in rows
                    for w in ("nonzero", "ridge")
                ),
            )
            * 1.15
        )
        ax.axvspan(0, lim, color="tab:blue", alpha=0.07)
        ax.axvspan(-lim, 0, color="tab:green", alpha=0.07)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlim(-lim, lim)
        ax.set_yticks(y, [_row_label(r) for r in rows], fontsize=7)
        ax.set_xlabel("log10(RIR Ours / RIR Opt κ)  (median over runs)")
        ax.text(
            0.98,
            0.01,
            "Ours ahead →\n(paper's ranking)",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            color="tab:blue",
        )
        ax.text(
            0.02,
            0.01,
            "← Opt κ ahead",
            transform=ax.transAxes,
            ha="left",
            va="bottom",
            fontsize=8,
            color="tab:green",
        )
        ax.set_title(
            f"{_DATASET[dataset]}: ● κ over nonzero σ, ◇ released ridge-floor κ", fontsize=9
        )
    quick = " (quick)" if plan.quick else ""
    fig.suptitle(f"Which released-code switch moves the Ours-vs-Opt κ ranking{quick}")
    fig.supxlabel(
        "† some runs diverged or stopped early (θ = the last finite one). ◇ on "
        "rank-deficient Hessians the ridge-floor κ is ≈ λ_max/1e-6 or not, by the sign "
        "of rounding errors (docs/ablation.md).",
        fontsize=7,
    )
    rp.save_figure(fig, path)


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
            chosen = s["chosen_max_step"][m]
            bottom.scatter(
                [chosen],
                [s["by_max_step"][str(chosen)][m]["geomean_rir"]],
                marker="*",
                s=220,
                color=colour,
                edgecolor="k",
                zorder=4,
            )
        for ax in (top, bottom):
            ax.set_yscale("log")
            ax.axhline(1.0, color="k", lw=0.8, ls=":")
        top.set(xlabel="epoch", ylabel="RIR (nonzero-σ κ; geometric mean)")
        bottom.axvline(0.3, color="k", ls="--", lw=0.8)
        bottom.set(
            xlabel="max_step (dashed: default 0.3; ★: chosen by the D_P-only rule)",
            ylabel="RIR at the last epoch",
        )
        top.set_title(f"{_DATASET[dataset]}: RIR against the epoch", fontsize=9)
        bottom.set_title(f"{_DATASET[dataset]}: RIR against max_step", fontsize=9)
        top.legend(fontsize=7)
    quick = " (quick)" if plan.quick else ""
    fig.suptitle(f"Does the verdict depend on the schedule?{quick}")
    rp.save_figure(fig, path)
