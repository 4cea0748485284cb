"""The ablation's figures: ``factored.png`` (the minibatch switch's parts), ``step_rules.png``
((i) against (ii) per variant, the paper's points), ``ranking.png`` (the released switches) and
``schedule.png`` (RIR against the epoch and ``max_step``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from condreg_experiments import _report as rp
from condreg_experiments.ablation import LABELS, METHODS

_SHORT = {"house": "house prices", "mnist": "MNIST pairs"}
_MARKERS = {"condreg": "o", "opt_kappa": "s"}


def _log10(values) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    with np.errstate(all="ignore"):
        return np.where(np.isfinite(v) & (v > 0), np.log10(np.where(v > 0, v, 1.0)), np.nan)


def draw(plan, results: dict[str, Any]) -> None:
    """Every figure the results hold."""
    out = plan.out_dir
    tag = " (quick)" if plan.quick else ""
    if "factors" in results:
        factored(results["factors"], out / "factored.png", tag)
    if "rules" in results:
        step_rules(results["rules"], out / "step_rules.png", tag)
    if "rows" in results:
        ranking(plan, results, out / "ranking.png", tag)
        schedule(plan, results, out / "schedule.png", tag)


def factored(by_dataset: dict[str, list], path, tag: str) -> None:
    """Per dataset, (i), (ii) and RIR of every factored row: runs as dots, geometric means as
    large markers (filled: (ii) ≤ 1 and (i) > 1 on every run of the row)."""
    names = list(by_dataset)
    n_rows = max(len(rows) for rows in by_dataset.values())
    fig, axes = rp.new_figure(len(names), 3, figsize=(15, 0.42 * n_rows + 1.8), squeeze=False)
    for r, dataset in enumerate(names):
        rows = by_dataset[dataset]
        y = np.arange(len(rows))[::-1]
        for c, (key, title) in enumerate(
            (("i", "(i) κ(H_H)/κ(K_H): want > 1"), ("ii", "(ii) κ(H_P)/κ(K_P): want ≤ 1"),
             ("rir", "RIR = (i)/(ii)"))
        ):  # fmt: skip
            ax = axes[r, c]
            for k, m in enumerate(("condreg", "opt_kappa")):
                dy = 0.15 if k == 0 else -0.15
                for yy, row in zip(y, rows, strict=True):
                    runs = [e["nonzero"][key] for e in row["runs"][m]]
                    ax.scatter(_log10(runs), np.full(len(runs), yy + dy), s=6, alpha=0.35,
                               color=rp.METHOD_COLORS[m])  # fmt: skip
                    s = row["methods"][m]["nonzero"]
                    ok = s["successes_by_i"]["i>1"] == s["n"]
                    ax.scatter(_log10([s[key]["geomean"]]), [yy + dy], s=55, marker=_MARKERS[m],
                               color=rp.METHOD_COLORS[m], facecolors=None if ok else "none",
                               zorder=3)  # fmt: skip
            ax.axvline(0, color="k", lw=0.8)
            if key == "i":
                for t in (math.log10(2), 1.0):
                    ax.axvline(t, color="k", lw=0.6, ls=":")
            ax.set_yticks(y, [row["protocol"] for row in rows], fontsize=7)
            ax.set_xlabel(f"log10 {key} (dots: runs; markers: geometric mean)", fontsize=8)
            ax.set_title(f"{_SHORT[dataset]}{tag}: {title}", fontsize=9)
            ax.grid(alpha=0.3, axis="x")
        axes[r, 0].legend(handles=_handles(), fontsize=7, loc="best")
    fig.suptitle(
        "The released minibatch switch, split into its parts (condreg's κ over nonzero σ). "
        "Filled marker: every run succeeds ((i) > 1, (ii) ≤ 1); dotted: (i) = 2 and 10",
        fontsize=9,
    )
    rp.save_figure(fig, path)


def _handles() -> list[Any]:
    """Legend entries: a marker per method, filled = every run succeeds."""
    from matplotlib.lines import Line2D

    out = []
    for m in ("condreg", "opt_kappa"):
        for filled in (True, False):
            face = rp.METHOD_COLORS[m] if filled else "none"
            text = f"{LABELS[m]}, {'all succeed' if filled else 'some fail'}"
            out.append(Line2D([], [], ls="", marker=_MARKERS[m], color=rp.METHOD_COLORS[m],
                              markerfacecolor=face, label=text))  # fmt: skip
    return out


def step_rules(by_dataset: dict[str, Any], path, tag: str) -> None:
    """Per dataset, (i) against (ii) of every step-rule variant at its tuned value (geometric
    means; runs as dots), with the paper's Table 1 points; the success quadrant shaded."""
    names = list(by_dataset)
    fig, axes = rp.new_figure(1, len(names), figsize=(7.2 * len(names), 5.6), squeeze=False)
    for ax, dataset in zip(axes[0], names, strict=True):
        rules = by_dataset[dataset]
        for k, (name, v) in enumerate(rules["variants"].items()):
            m = v["method"]
            s = v["methods"][m]["nonzero"]
            runs = v["runs"][m]
            xs, ys = (
                _log10([e["nonzero"]["ii"] for e in runs]),
                _log10([e["nonzero"]["i"] for e in runs]),
            )
            colour = f"C{k}"
            ax.scatter(xs, ys, s=8, alpha=0.3, color=colour)
            x, y = _log10([s["ii"]["geomean"]])[0], _log10([s["i"]["geomean"]])[0]
            ax.scatter([x], [y], s=70, marker=_MARKERS[m], color=colour, zorder=3,
                       label=f"{name} ({v['knob']} {v['chosen']:g})")  # fmt: skip
        for m, p in (rules["paper"] or {}).items():
            if m in ("condreg", "opt_kappa"):
                ax.scatter([math.log10(p["ii"])], [math.log10(p["i"])], marker="*", s=260,
                           color=rp.METHOD_COLORS[m], edgecolor="k", zorder=4,
                           label=f"paper, {LABELS[m]}")  # fmt: skip
        ax.axvline(0, color="k", lw=0.8)
        ax.axhline(0, color="k", lw=0.8)
        (lo, hi), (bottom, top) = ax.get_xlim(), ax.get_ylim()
        ax.fill_between([lo, 0], 0, top, color="tab:green", alpha=0.08, lw=0)
        ax.set(xlim=(lo, hi), ylim=(bottom, top))
        ax.set(xlabel="log10 (ii) = κ(H_P)/κ(K_P) (want ≤ 0)", ylabel="log10 (i) (want > 0)")
        ax.set_title(f"{_SHORT[dataset]}{tag}: each variant at its D_P-tuned value", fontsize=9)
        ax.legend(fontsize=6, loc="best")
        ax.grid(alpha=0.3)
    fig.suptitle(
        "The step rule as a switch: (i) against (ii); circles Ours, squares Opt κ, ★ the paper's "
        "Table 1; success = upper left (green)",
        fontsize=9,
    )
    rp.save_figure(fig, path)


def ranking(plan, results: dict[str, Any], path, tag: str) -> None:
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
        for span, x, ha, text, c in [
            ((0, lim), 0.98, "right", "Ours ahead →\n(paper's ranking)", "tab:blue"),
            ((-lim, 0), 0.02, "left", "← Opt κ ahead", "tab:green"),
        ]:
            ax.axvspan(*span, color=c, alpha=0.07)
            ax.text(x, 0.01, text, transform=ax.transAxes, ha=ha, va="bottom", fontsize=8, color=c)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlim(-lim, lim)
        ax.set_yticks(y, [_row_label(r) for r in rows], fontsize=7)
        ax.set_xlabel("log10(RIR Ours / RIR Opt κ)  (median over runs)")
        ax.set_title(f"{_SHORT[dataset]}: ● κ over nonzero σ, ◇ released ridge-floor κ", fontsize=9)
    fig.suptitle(f"Which released-code switch moves the Ours-vs-Opt κ ranking{tag}")
    fig.supxlabel(
        "† some runs diverged or stopped early (θ = the last finite one). ◇ on "
        "rank-deficient Hessians the ridge-floor κ is ≈ λ_max/1e-6 or not, by the sign "
        "of rounding errors (docs/ablation.md). Successes: (ii) ≤ 1 and (i) > 1 / ≥ 2 / ≥ 10.",
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

    def counts(s):
        return "/".join(str(s["successes_by_i"][k]) for k in rp.I_THRESHOLDS) + f" of {s['n']}"

    return f"{name}{tail}\nsuccess: Ours {counts(ours)}, Opt κ {counts(opt)}"


def schedule(plan, results: dict[str, Any], path, tag: str) -> None:
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
        bottom.set(xlabel=xlabel, ylabel="RIR at the last epoch (geometric mean)")
        top.set_title(f"{_SHORT[dataset]}: RIR against the epoch", fontsize=9)
        bottom.set_title(f"{_SHORT[dataset]}: RIR against max_step", fontsize=9)
        top.legend(fontsize=7)
    fig.suptitle(f"Does the verdict depend on the schedule?{tag}")
    rp.save_figure(fig, path)
