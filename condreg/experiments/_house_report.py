"""Summaries, table.md and plots of ``condreg reproduce house-prices`` (Table 1), and
:func:`write`, the results.json and table.md writer of the linear experiments."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from condreg.experiments import _report as rp
from condreg.experiments._linear import (
    RANK_KEPT_TEXT,
    TOLERANCE_FACTORS,
    stopped_early,
    summarise_runs,
)

__all__ = ["results", "notes", "table", "plots", "write", "section"]

#: The per-run numbers summarised over seeds (mean ± std).
SUMMARY_KEYS = ("i", "ii", "rir", "kappa_H_P", "kappa_H_H", "loss_initial", "loss_final")
SUMMARY_KEYS += ("loss_best", "runtime_s")


def write(out_dir, experiment: str, start: float, fields: dict, table: str, title: str) -> dict:
    """Write results.json (``fields``: settings, seeds, results, notes; the time since ``start``)
    and table.md (``table``, then the notes as bullets); return the payload."""
    if fields["notes"]:
        table = table.rstrip("\n") + "\n\n" + "\n".join(f"- {n}" for n in fields["notes"]) + "\n"
    fields = dict(fields, experiment=experiment, runtime_s=time.perf_counter() - start)
    return rp.write_outputs(out_dir, table=table, title=title, **fields)


def section(title: str, headers, rows) -> str:
    """A ``## title`` section of table.md holding a Markdown table."""
    return f"## {title}\n\n" + rp.markdown_table(headers, rows) + "\n"


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
    data = {k: info[k] for k in ("n_p", "n_h", "n_features")}
    data |= {k: identity[k] for k in ("kappa_K_P", "kappa_K_H", "rank_K_P", "rank_K_H")}
    # Definition 3.1 (c) at θ = I
    data |= {"loss_best_input": identity["loss_best"], "preprocessing": info}
    stopped = stopped_early([x for r in runs.values() for x in r])
    out = dict(data=data, identity=identity, methods=methods, paper=rp.PAPER_HOUSE_PRICES)
    return out | {"stopped_early": stopped}


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
    keys = ("i", "ii", "rir")
    return [
        rp.METHOD_LABELS[m],
        *(rp.fmt_mean_std(s[k]) for k in keys),
        *(rp.fmt_number(p[k]) for k in keys),
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
    if kept < n_runs:
        return text + f"{n_runs - kept} of {n_runs} run(s) lost rank on X_P."
    return text + (
        f"{RANK_KEPT_TEXT}; the trained head's loss differs because the head is trained "
        "jointly for a fixed number of epochs, not to convergence."
    )


_HEADERS = ["method", *(f"{k} {who}" for who in ("ours", "paper") for k in ("(i)", "(ii)", "RIR"))]
_HEADERS += ["success (Def. 3.1 (a) + (b))", "at 10× / 100× rtol", "D_P loss, trained head"]
_HEADERS += ["D_P loss, best on Xθ"]


def table(results_: Mapping[str, Any], settings, n_seeds: int) -> str:
    """table.md's body: the methods beside the paper's and how they were run."""
    identity, method_results = results_["identity"], results_["methods"]
    info = results_["data"]["preprocessing"]
    best = rp.fmt_number(identity["loss_best"], 3)
    rows = [[rp.METHOD_LABELS["identity"], "1", "1", "1", *["—"] * 5, "1 (ω = 0)", best]]
    rows += [_row(m, method_results[m]) for m in rp.METHODS if m in method_results]
    text = rp.markdown_table(_HEADERS, rows)
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
    return text


def plots(out_dir: pathlib.Path, identity, method_results, *, quick: bool) -> list[Any]:
    """Write ``rir.png`` (Eq. 15, ours beside the paper's) and ``kappa_history.png``."""
    tag = "[quick run] " if quick else ""
    paths = [_rir_plot(out_dir, method_results, tag)]
    kappas = {"kappa_hp", "kappa_hh"}
    have = [m for m in method_results if kappas <= set(method_results[m]["runs"][0]["history"])]
    have = [m for m in rp.METHODS if m in have]
    if have:
        paths.append(_history_plot(out_dir, identity, method_results, have, tag))
    return paths


_MARK_STYLE = dict(xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=12)


def _rir_plot(out_dir: pathlib.Path, method_results, tag: str) -> Any:
    from matplotlib.patches import Patch

    methods = [m for m in rp.METHODS if m in method_results]
    fig, axes = rp.new_figure(1, 3, figsize=(13, 3.8))
    x = np.arange(len(methods))
    labels = ("(i) κ(H_H)/κ(K_H)", "(ii) κ(H_P)/κ(K_P)", "RIR")
    for ax, key, label in zip(axes, ("i", "ii", "rir"), labels, strict=True):
        ours = [method_results[m]["summary"][key] for m in methods]
        paper = [rp.PAPER_HOUSE_PRICES[m][key] for m in methods]
        colours = [rp.METHOD_COLORS[m] for m in methods]
        err = [s["std"] for s in ours]
        ax.bar(x - 0.2, [s["mean"] for s in ours], 0.4, yerr=err, label="ours", color=colours)
        ax.bar(x + 0.2, paper, 0.4, label="paper", color=colours, alpha=0.35, hatch="//")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xticks(x, [rp.METHOD_LABELS[m] for m in methods], rotation=20, fontsize=8)
        ax.set_title(label)
    lo, hi = axes[2].get_ylim()
    axes[2].set_ylim(lo, hi * 4)  # room for the verdicts
    for k, r in enumerate(method_results[m] for m in methods):  # the verdict above our RIR bar
        top = r["summary"]["rir"]["mean"]
        mark, color = ("✓", "tab:green") if r["successes"] == len(r["runs"]) else ("✗", "tab:red")
        axes[2].annotate(mark, (x[k] - 0.2, top), color=color, **_MARK_STYLE)
    paper = Patch(facecolor="0.45", alpha=0.35, hatch="//", label="paper")
    axes[0].legend(handles=[Patch(facecolor="0.45", label="ours"), paper], fontsize=8)
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
