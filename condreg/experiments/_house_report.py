"""Summaries, table.md and plots of ``condreg reproduce house-prices`` (Table 1).

:func:`results` summarises each method's runs over the seeds (Eq. 15, success by Definition 3.1
(a) + (b) at three rank tolerances, Definition 3.1 (c)'s D_P losses); :func:`table`,
:func:`notes` and :func:`plots` write them.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from condreg.experiments import _report as rp
from condreg.experiments._linear import TOLERANCE_FACTORS, stopped_early, summarise_runs

__all__ = ["results", "notes", "table", "plots"]

#: The per-run numbers summarised over seeds (mean ± std).
SUMMARY_KEYS = (
    "i",
    "ii",
    "rir",
    "kappa_H_P",
    "kappa_H_H",
    "loss_initial",
    "loss_final",
    "loss_best",
    "runtime_s",
)


def results(runs: Mapping[str, list[dict]], identity: Mapping[str, Any], info) -> dict[str, Any]:
    """The ``results`` of results.json: the data, θ = I, each method's summary and runs."""
    methods = {
        m: {
            "summary": summarise_runs(r, SUMMARY_KEYS),
            "successes": int(sum(x["success"] for x in r)),
            "successes_by_rtol": {
                f"{f}x": int(sum(x["tolerance"][f"{f}x"]["success"] for x in r))
                for f in TOLERANCE_FACTORS
            },
            # Definition 3.1 (c): runs whose X_Pθ kept the rank of X_P (θ invertible on it)
            "runs_rank_kept": int(sum(x["rank_H_P"] == x["rank_K_P"] for x in r)),
            "runs": r,
        }
        for m, r in runs.items()
    }
    return {
        "data": {
            "n_p": info["n_p"],
            "n_h": info["n_h"],
            "n_features": info["n_features"],
            "kappa_K_P": identity["kappa_K_P"],
            "kappa_K_H": identity["kappa_K_H"],
            "rank_K_P": identity["rank_K_P"],
            "rank_K_H": identity["rank_K_H"],
            # Definition 3.1 (c) at θ = I: the least-squares D_P loss on the inputs
            "loss_best_input": identity["loss_best"],
            "preprocessing": info,
        },
        "identity": identity,
        "methods": methods,
        "paper": rp.PAPER_HOUSE_PRICES,
        "stopped_early": stopped_early([x for r in runs.values() for x in r]),
    }


def notes(method_results: Mapping[str, Any]) -> list[str]:
    """One line per failed method, verdict flip, early stop and distinct warning."""
    out = []
    for m, r in method_results.items():
        label, n = rp.METHOD_LABELS[m], len(r["runs"])
        if r["successes"] < n:
            s = r["summary"]
            out.append(
                f"{label} did not immunize in {n - r['successes']} of {n} run(s) (Definition 3.1 "
                f"(a) + (b): (i) > 1 and (ii) <= 1; mean RIR {rp.fmt_number(s['rir']['mean'])}, "
                f"(i) {rp.fmt_number(s['i']['mean'])}, (ii) {rp.fmt_number(s['ii']['mean'])})"
            )
        for x in r["runs"]:
            t = x["tolerance"]
            if t["flips"]:
                verdicts = ", ".join(
                    f"{'success' if t[f'{f}x']['success'] else 'failure'} (RIR "
                    f"{rp.fmt_number(t[f'{f}x']['rir'], 3)}) at {f}× rtol"
                    for f in TOLERANCE_FACTORS
                )
                out.append(
                    f"{label}, seed {x['seed']}: the verdict flips with the rank tolerance: "
                    f"{verdicts}"
                )
            if x["stopped"] != "completed":
                out.append(f"{label}, seed {x['seed']}: {x['stopped']}")
        warned = {w for x in r["runs"] for w in x["warnings"] if "did not succeed" not in w}
        out += [f"{label}: warning from condreg.immunize: {w}" for w in sorted(warned)]
    return out


def _row(m: str, r: Mapping[str, Any]) -> list[str]:
    s, p, n = r["summary"], rp.PAPER_HOUSE_PRICES[m], len(r["runs"])
    return [
        rp.METHOD_LABELS[m],
        rp.fmt_mean_std(s["i"]),
        rp.fmt_mean_std(s["ii"]),
        rp.fmt_mean_std(s["rir"]),
        rp.fmt_number(p["i"]),
        rp.fmt_number(p["ii"]),
        rp.fmt_number(p["rir"]),
        f"{r['successes']}/{n}",
        " / ".join(f"{r['successes_by_rtol'][f'{f}x']}/{n}" for f in TOLERANCE_FACTORS[1:]),
        rp.fmt_mean_std(s["loss_final"], 3),
        rp.fmt_mean_std(s["loss_best"], 3),
    ]


def _loss_text(method_results: Mapping[str, Any], loss_input: float) -> str:
    """Definition 3.1 (c) in words, from what was measured."""
    n_runs = sum(len(r["runs"]) for r in method_results.values())
    kept = sum(r["runs_rank_kept"] for r in method_results.values())
    text = (
        "D_P loss, trained head: the relative squared error mean((Xθω − y)²)/mean(y²) of the "
        "head trained jointly with θ (1 at ω = 0). Best on Xθ (Definition 3.1 (c)): the lowest "
        "relative squared error any linear head reaches on X_Pθ (least squares over its column "
        f"space); on the inputs (θ = I) {rp.fmt_number(loss_input, 3)}. "
    )
    if kept == n_runs:
        text += (
            "Every run kept the rank of X_P (θ invertible on its row space), so X_Pθ spans what "
            "X_P spans and the best attainable loss is the input's: θ takes nothing from the "
            "pre-training task that a head could use; the trained head's loss differs because "
            "the head is trained jointly for a fixed number of epochs, not to convergence."
        )
    else:
        text += f"{n_runs - kept} of {n_runs} run(s) lost rank on X_P."
    return text


def table(results_: Mapping[str, Any], settings, n_seeds: int, notes_: Sequence[str]) -> str:
    """table.md's body: the methods beside the paper's, how they were run, the notes."""
    identity, method_results = results_["identity"], results_["methods"]
    info = results_["data"]["preprocessing"]
    best = rp.fmt_number(identity["loss_best"], 3)
    rows = [[rp.METHOD_LABELS["identity"], "1", "1", "1", *["—"] * 5, "1 (ω = 0)", best]]
    rows += [_row(m, method_results[m]) for m in rp.METHODS if m in method_results]
    text = rp.markdown_table(
        [
            "method",
            "(i) ours",
            "(ii) ours",
            "RIR ours",
            "(i) paper",
            "(ii) paper",
            "RIR paper",
            "success (Def. 3.1 (a) + (b))",
            "at 10× / 100× rtol",
            "D_P loss, trained head",
            "D_P loss, best on Xθ",
        ],
        rows,
    )
    rtol = method_results[next(iter(method_results))]["runs"][0]["rtol"]
    text += (
        f"\nκ(K_P) = {rp.fmt_number(identity['kappa_K_P'])} (rank {identity['rank_K_P']} of "
        f"{info['n_features']}), κ(K_H) = {rp.fmt_number(identity['kappa_K_H'])} (rank "
        f"{identity['rank_K_H']}); κ over the nonzero singular values.\n\n"
        f"Settings: {settings['epochs']} epochs, η = {settings['lr']}, θ_0 = I, "
        f"λ_P = {settings['lam_p']!s}, λ_H = {settings['lam_h']!s}, {info['encoding']} "
        f"categories; {n_seeds} seed(s) (mean ± sample std). (i) = κ(H_H(θ))/κ(K_H), "
        f"(ii) = κ(H_P(θ))/κ(K_P), RIR = (i)/(ii). Success (Definition 3.1 (a) + (b)) = "
        f"(i) > 1 and (ii) ≤ 1, at the run's rank tolerance rtol = {rp.fmt_number(rtol, 3)} on "
        f"σ(Xθ) and at 10× and 100× it; the paper reports (i), (ii) and RIR, not a success "
        f"count, and does not state its rule. " + _loss_text(method_results, identity["loss_best"])
    )
    if settings["quick"]:
        text += f"\n\nQuick run ({settings['epochs']} epochs): not comparable with the paper's."
    if notes_:
        text += "\n\n" + "\n".join(f"- {n}" for n in notes_) + "\n"
    return text


def plots(out_dir: pathlib.Path, identity, method_results, *, quick: bool) -> list[Any]:
    """Write ``rir.png`` (Eq. 15 per method, ours beside the paper's) and
    ``kappa_history.png`` (κ(H_P(θ_t)), κ(H_H(θ_t)) per epoch, with κ at θ = I as reference
    lines); returns the Matplotlib figures."""
    tag = "[quick run] " if quick else ""
    paths = [_rir_plot(out_dir, method_results, tag)]
    have = [
        m
        for m in rp.METHODS
        if m in method_results
        and {"kappa_hp", "kappa_hh"} <= set(method_results[m]["runs"][0]["history"])
    ]
    if have:
        paths.append(_history_plot(out_dir, identity, method_results, have, tag))
    return paths


def _rir_plot(out_dir: pathlib.Path, method_results, tag: str) -> Any:
    from matplotlib.patches import Patch

    methods = [m for m in rp.METHODS if m in method_results]
    fig, axes = rp.new_figure(1, 3, figsize=(13, 3.8))
    x = np.arange(len(methods))
    labels = ("(i) κ(H_H)/κ(K_H)", "(ii) κ(H_P)/κ(K_P)", "RIR")
    for ax, key, label in zip(axes, ("i", "ii", "rir"), labels, strict=True):
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
    lo, hi = axes[2].get_ylim()
    axes[2].set_ylim(lo, hi * 4)  # room for the verdicts
    for k, m in enumerate(methods):  # the verdict above our RIR bar
        ok = method_results[m]["successes"] == len(method_results[m]["runs"])
        top = method_results[m]["summary"]["rir"]["mean"]
        axes[2].annotate(
            "✓" if ok else "✗",
            (x[k] - 0.2, top),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            color="tab:green" if ok else "tab:red",
            fontsize=12,
        )
    handles = [
        Patch(facecolor="0.45", label="ours"),
        Patch(facecolor="0.45", alpha=0.35, hatch="//", label="paper"),
    ]
    axes[0].legend(handles=handles, fontsize=8)
    fig.suptitle(
        f"{tag}House prices: Eq. 15 per method (log scale; dashed: θ = I); "
        "✓ / ✗: ours succeeds / fails Def. 3.1 (a) + (b)"
    )
    rp.save_figure(fig, out_dir / "rir.png")
    return fig


def _history_plot(out_dir, identity, method_results, have, tag: str) -> Any:
    fig, axes = rp.new_figure(1, 2, figsize=(11, 4.0))
    for m in have:
        h = method_results[m]["runs"][0]["history"]
        kw = {"label": rp.METHOD_LABELS[m], "color": rp.METHOD_COLORS[m]}
        axes[0].plot(h["kappa_hp"], **kw)
        axes[1].plot(h["kappa_hh"], **kw)
    refs = (("κ(K_P)", identity["kappa_K_P"]), ("κ(K_H)", identity["kappa_K_H"]))
    titles = (
        "D_P: κ(H_P(θ_t)); at or below the line: Def. 3.1 (b)",
        "D_H: κ(H_H(θ_t)); above the line: Def. 3.1 (a)",
    )
    for ax, title, (name, ref) in zip(axes, titles, refs, strict=True):
        ax.axhline(ref, color="k", ls="--", lw=1.0, label=f"θ = I: {name} = {rp.fmt_number(ref)}")
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("κ (nonzero spectrum, log scale)")
    fig.suptitle(f"{tag}House prices: κ during immunization (seed 0; dashed: κ at θ_0 = I)")
    rp.save_figure(fig, out_dir / "kappa_history.png")
    return fig
