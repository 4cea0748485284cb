"""The units of ``condreg reproduce mnist-pairs`` (one (seed, pair), every method, run here or in
spawned workers with one BLAS thread each), their summaries, table.md and Fig. 2."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from condreg_experiments import _linear as lin
from condreg_experiments import _report as rp

#: What every unit of one run shares: (methods, epochs, lr, immunize options, cross_check).
Shared = tuple[Sequence[str], int, float, Mapping[str, Any], bool]


def unit_cost(key: tuple[int, tuple[int, int]], tasks_by_seed) -> float:
    """A (seed, pair) unit's relative cost, to start the costliest first: ``Σ r²·(r + D)`` over
    its two tasks, ``r`` the inputs' rank."""
    seed, pair = key
    cost = 0.0
    for digit in pair:
        X = tasks_by_seed[seed][digit].X
        r = lin.kappa_features(X)[1]
        cost += float(r * r * (r + X.shape[1]))
    return cost


def run_unit(key: tuple[int, tuple[int, int]], data: tuple[Any, Any, Shared]) -> dict:
    """One (seed, pair): every method on (D_P, D_H) = ``data[:2]``, the tasks decomposed once;
    each method's numbers are kept without θ and the history."""
    (seed, pair), (tp, th, shared) = key, data
    methods, epochs, lr, options, cross_check = shared
    by_method = {}
    setup = lin.data_setup(tp.X, th.X, options)
    pair_spectra = lin.PairSpectra(tp.X, th.X, tasks=setup.tasks)
    kw = dict(task="classification", epochs=epochs, lr=lr, seed=seed, cross_check=cross_check)
    for method in methods:
        res = lin.immunize_method(
            method, tp.X, tp.y, th.X, y_h=th.y, pair=pair_spectra, setup=setup, **kw, **options
        )
        res.pop("_theta")
        res.pop("history", None)  # 90 × 4 histories would bloat results.json
        by_method[method] = res
    first = by_method[methods[0]]
    kappas = {k: first[k] for k in ("kappa_K_P", "kappa_K_H", "rank_K_P", "rank_K_H", "rtol")}
    best = lin.best_loss(
        tp.X, tp.y, task="classification", rtol=first["rtol"], rank=first["rank_K_P"]
    )
    return dict(seed=seed, pair=list(pair), kappas=kappas, loss_best_input=best, methods=by_method)


#: The paper publishes Ours' per-pair range and mean only, no per-pair values of any method.
PAPER_PER_PAIR_NOTE = (
    "the paper's per-pair values are not published (Ours: RIR 8.6–523 over the 90 pairs, "
    "mean 70.04), so no per-pair comparison or Spearman ρ is possible"
)


def collect(units: Mapping[Any, dict], pairs, seed_values, methods) -> dict[str, Any]:
    """``{"per_pair": {method: {"P-H": [run per seed]}}, "kappas", "loss_best_input"}``."""
    per_pair, kappas, inputs = {m: {} for m in methods}, {}, {}
    for seed in seed_values:
        for pair in pairs:
            unit, key = units[(seed, pair)], f"{pair[0]}-{pair[1]}"
            kappas.setdefault(key, unit["kappas"])
            inputs.setdefault(key, []).append(unit.get("loss_best_input", float("nan")))
            for method in methods:
                per_pair[method].setdefault(key, []).append(unit["methods"][method])
    return {"per_pair": per_pair, "kappas": kappas, "loss_best_input": inputs}


def summarise(per_pair, pairs, seed_values) -> dict[str, Any]:
    """Each method's statistics over the pairs (per seed, then mean ± std over seeds) and runs."""
    out = {}
    for method, by_pair in per_pair.items():
        per_seed = [[by_pair[f"{p[0]}-{p[1]}"][k] for p in pairs] for k in range(len(seed_values))]
        rirs = [np.array([r["rir"] for r in runs]) for runs in per_seed]
        succ = {
            f: [sum(r["tolerance"][f"{f}x"]["success"] for r in runs) for runs in per_seed]
            for f in lin.TOLERANCE_FACTORS
        }
        by_i = [rp.success_counts((r["i"], r["ii"]) for r in runs) for runs in per_seed]
        all_runs = [r for runs in by_pair.values() for r in runs]
        all_rir = np.array([r["rir"] for r in all_runs])
        best = [r.get("loss_best", float("nan")) for r in all_runs]
        flips = sorted(k for k, rs in by_pair.items() if any(r["tolerance"]["flips"] for r in rs))
        out[method] = {
            "rir": rp.ratio_summary(all_rir),
            "geomean_rir_by_seed": [rp.geomean(r) for r in rirs],
            "i": rp.ratio_summary([r["i"] for r in all_runs]),
            "ii": rp.ratio_summary([r["ii"] for r in all_runs]),
            "successes": rp.mean_std(succ[1]),
            "successes_by_rtol": {f"{f}x": rp.mean_std(succ[f]) for f in lin.TOLERANCE_FACTORS},
            "successes_by_i": {k: rp.mean_std([c[k] for c in by_i]) for k in rp.I_THRESHOLDS},
            "n_pairs": len(pairs),
            "pairs_with_i_at_most_1": int(sum(r["i"] <= 1 for r in all_runs)),
            "pairs_with_ii_above_1": int(sum(r["ii"] > 1 for r in all_runs)),
            "pairs_with_rir_at_most_1": int(sum(r["rir"] <= 1 for r in all_runs)),
            "verdict_flips_with_rtol": flips,
            "runs_not_completed": sorted({r["stopped"] for r in all_runs} - {"completed"}),
            "mean_loss_final": float(np.mean([r["loss_final"] for r in all_runs])),
            "mean_loss_best": float(np.mean(best)),
            "max_loss_best": float(np.max(best)),
            "runs_separable": int(sum(b < lin.SEPARABLE_LOSS for b in best)),
            "runs_rank_kept": int(sum(r["rank_H_P"] == r["rank_K_P"] for r in all_runs)),
            "n_runs": len(all_runs),
            "rtol_range": [min(r["rtol"] for r in all_runs), max(r["rtol"] for r in all_runs)],
        }
    return out


def timing(done, methods) -> dict[str, Any]:
    """The runner's timing (``done``: :class:`~condreg_experiments._runner.Units`), with the
    means per pair of the units computed now and the full run (90 pairs × 4 methods on
    ``done.jobs`` workers) extrapolated from them."""
    computed = [done.units[k] for k in done.computed]

    def per_pair(values):  # the mean over the units computed now
        return float(np.mean(values)) if len(values) else None

    def method_sum(key):
        return per_pair([sum(r[key] for r in u["methods"].values()) for u in computed])

    mean_pair_s = per_pair(list(done.seconds.values()))
    full_s = None
    if mean_pair_s is not None:
        full_s = mean_pair_s * 90 * len(rp.METHODS) / len(methods) / max(done.jobs, 1)
    return done.timing(
        mean_seconds_per_pair_all_methods=mean_pair_s,
        mean_immunize_s_per_pair=method_sum("runtime_s"),
        mean_scoring_s_per_pair=method_sum("scoring_s"),
        extrapolated_full_run_s=full_s,
    )


def results(collected, summary, timing_, n_features, tasks, cross_check) -> dict[str, Any]:
    """The ``results`` of results.json."""
    per_pair = collected["per_pair"]
    runs = [r for by_pair in per_pair.values() for rs in by_pair.values() for r in rs]
    diffs = [r["check_rel_diff"] for r in runs if r.get("check_rel_diff") is not None]
    best = collected["loss_best_input"]  # Definition 3.1 (c) at θ = I, per pair and seed
    sizes = {
        str(d): {"n_positive": t.n_positive, "n_negative": t.n_negative} for d, t in tasks.items()
    }
    data = dict(n_features=n_features, task_sizes=sizes, kappas=collected["kappas"])
    mean_best = float(np.mean([v for vs in best.values() for v in vs]))
    data.update(loss_best_input=best, mean_loss_best_input=mean_best)
    out = dict(data=data, methods=summary, per_pair=per_pair, timing=timing_, paper=rp.PAPER_MNIST)
    out["paper_per_pair"] = None  # not published (PAPER_PER_PAIR_NOTE)
    out["stopped_early"] = lin.stopped_early(runs)
    # whether NumPy's SVD recomputed every κ, and the largest relative difference
    out["cross_check"] = {"enabled": bool(cross_check), "max_rel_diff": max(diffs, default=None)}
    return out


def notes(results_: Mapping[str, Any], settings) -> list[str]:
    """One line per failure cause, verdict flip, early stop and distinct warning, then the
    inputs."""
    out = []
    for m, s in results_["methods"].items():
        label, n_pairs = rp.METHOD_LABELS[m], s["n_pairs"]
        if s["successes"]["mean"] < n_pairs:
            failed = n_pairs - s["successes"]["mean"]
            count = f"{failed:.0f}" if failed == round(failed) else f"{failed:.1f} (seed mean)"
            out.append(
                f"{label} failed Definition 3.1 (a) + (b) on {count} of {n_pairs} pairs ((i) <= 1 "
                f"on {s['pairs_with_i_at_most_1']}, (ii) > 1 on {s['pairs_with_ii_above_1']} "
                f"run(s))"
            )
        flips = s["verdict_flips_with_rtol"]
        if flips:
            shown = ", ".join(flips[:12]) + (" …" if len(flips) > 12 else "")
            by = ", ".join(
                f"{count_text(s['successes_by_rtol'][f'{f}x'], n_pairs)} at {f}× rtol"
                for f in lin.TOLERANCE_FACTORS
            )
            out.append(
                f"{label}: the verdict flips with the rank tolerance on {len(flips)} pair(s) "
                f"({shown}); successes {by}"
            )
        out += [f"{label}: a run stopped early: {why}" for why in s["runs_not_completed"]]
        runs = [r for rs in results_["per_pair"][m].values() for r in rs]
        warned = sorted({w for r in runs for w in r["warnings"] if "did not succeed" not in w})
        out += [f"{label}: warning from condreg.immunize: {w}" for w in warned[:3]]
    if settings["inputs"] == "pooled":
        out.append(
            f"inputs: {settings['pool']}×{settings['pool']} average pooling, pixels "
            f"active in > {settings['min_pixel_activity']:g} of the images: "
            f"{results_['data']['n_features']} features, not the paper's 784 raw pixels (--inputs "
            "raw for those)"
        )
    return out


def count_text(summary: dict[str, Any], n_pairs: int) -> str:
    """``"k/n"``, or ``"mean ± std of n"`` when the count differs between seeds."""
    if summary["std"] == 0:
        return f"{summary['mean']:g}/{n_pairs}"
    return f"{summary['mean']:.1f} ± {summary['std']:.1f} of {n_pairs}"


def _best_text(loss: float) -> str:
    """A best attainable logistic loss: the number, or "≈ 0 (separable)"."""
    return "≈ 0 (separable)" if loss < lin.SEPARABLE_LOSS else rp.fmt_number(loss, 3)


def _rows(summary, n_pairs: int, loss_input: float) -> list[list[str]]:
    best = _best_text(loss_input)
    rows = [[rp.METHOD_LABELS["identity"], "1", "1", "—", "1", "1", f"0/{n_pairs}", "—", "—"]]
    rows[0] += ["—", "0.693 (ω = 0)", best]
    for m in (m for m in rp.METHODS if m in summary):
        s, p = summary[m], rp.PAPER_MNIST[m]
        by, by_i, rir = s["successes_by_rtol"], s["successes_by_i"], s["rir"]
        row = [rp.METHOD_LABELS[m], _geo_text(rir, s["geomean_rir_by_seed"])]
        row += [rp.fmt_number(rir["median"], 3), rp.fmt_number(p["mean_rir"])]
        row += [rp.fmt_number(s["i"]["geomean"], 3), rp.fmt_number(s["ii"]["geomean"], 3)]
        row.append(" / ".join(count_text(by_i[k], n_pairs) for k in rp.I_THRESHOLDS))
        row.append(" / ".join(count_text(by[f"{f}x"], n_pairs) for f in lin.TOLERANCE_FACTORS[1:]))
        row.append(f"{p['successes']}/90")
        row.append(" – ".join(rp.fmt_number(rir[k], 3) for k in ("min", "median", "max")))
        row += [rp.fmt_number(s["mean_loss_final"], 3), _best_text(s["mean_loss_best"])]
        rows.append(row)
    return rows


def _geo_text(rir: dict[str, Any], by_seed: list[float]) -> str:
    """The geometric mean over every run, with the per-seed geometric means' range (seeds > 1)."""
    text = rp.fmt_number(rir["geomean"], 4)
    if len(by_seed) > 1:
        text += f" (seeds {rp.fmt_number(min(by_seed), 3)}–{rp.fmt_number(max(by_seed), 3)})"
    return text


def _loss_text(summary, loss_input: float, settings) -> str:
    """Definition 3.1 (c) in words, from what was measured."""
    n_runs = sum(s["n_runs"] for s in summary.values())
    kept = sum(s["runs_rank_kept"] for s in summary.values())
    separable = sum(s["runs_separable"] for s in summary.values())
    text = (
        "D_P loss, trained head: the mean logistic loss on D_P of the head trained jointly with "
        "θ (ln 2 = 0.693 at ω = 0), averaged over pairs. Best on Xθ (Definition 3.1 (c)): the "
        "lowest mean logistic loss any linear head reaches on X_Pθ (a converged probe over the "
        f"column space of X_Pθ), averaged over pairs; on the inputs (θ = I) "
        f"{_best_text(loss_input)}. "
    )
    lost = f"{n_runs - kept} of {n_runs} run(s) lost rank on X_P"
    text += f"{lin.RANK_KEPT_TEXT if kept == n_runs else lost}. "
    if separable == n_runs:
        text += (
            f"D_P is linearly separable on Xθ in every run (best loss < {lin.SEPARABLE_LOSS:g}, "
            f"infimum 0); the trained head's loss measures how far {settings['epochs']} epochs "
            f"of η = {settings['lr']:g} train the head, not what θ keeps. "
        )
    return text


def table(results_: Mapping[str, Any], settings, n_seeds: int) -> str:
    """table.md's body: the methods beside the paper's and how they were run."""
    summary, timing_, check = results_["methods"], results_["timing"], results_["cross_check"]
    data, first = results_["data"], next(iter(summary.values()))
    n_features, loss_input = data["n_features"], data["mean_loss_best_input"]
    n_pairs, (lo, hi) = first["n_pairs"], first["rtol_range"]
    factors = " / ".join(f"{f}×" for f in lin.TOLERANCE_FACTORS[1:])
    headers = ["method", "RIR ours, geometric mean", "RIR ours, median"]
    headers += ["RIR paper (arithmetic mean)", "(i) ours, geom. mean", "(ii) ours, geom. mean"]
    headers += ["success ours, (i) > 1 / ≥ 2 / ≥ 10 (Def. 3.1 (a) + (b))"]
    headers += [f"(i) > 1 at {factors} rtol"]
    headers += ["success paper (its rule not stated)", "RIR min – median – max (ours)"]
    headers += ["D_P loss, trained head", "D_P loss, best on Xθ"]
    text = rp.markdown_table(headers, _rows(summary, n_pairs, loss_input))
    rtols = rp.fmt_number(lo, 3) if lo == hi else f"{rp.fmt_number(lo, 3)}–{rp.fmt_number(hi, 3)}"
    inputs = "the 784 raw pixels, (x/255 − 0.1307)/0.3081 (the authors' preprocessing)"
    if settings["inputs"] != "raw":
        inputs = (
            f"{n_features} inputs ({settings['pool']}×{settings['pool']} pooling, pixels "
            f"active in > {settings['min_pixel_activity']:g} of the images)"
        )
    split = ""
    if timing_["mean_scoring_s_per_pair"] is not None:
        split = (
            f" (condreg.immunize {timing_['mean_immunize_s_per_pair']:.2f} s, scoring "
            f"{timing_['mean_scoring_s_per_pair']:.2f} s)"
        )
    text += (
        f"\n{n_pairs} ordered (P, H) pair(s); {settings['epochs']} epochs, η = {settings['lr']}, "
        f"θ_0 = I, binary logistic loss on D_P, {inputs}, {n_seeds} seed(s). RIR, (i) and (ii) "
        f"are ratios spanning orders of magnitude: summarised by geometric means (and the median) "
        f"over every run; counts are per seed (mean ± sample std over seeds). Success "
        f"(Definition 3.1 (a) + (b)) = (i) > 1 and (ii) ≤ 1 at the run's rank tolerance rtol "
        f"(σ_i of Xθ counted when > rtol·σ₁; rtol as recorded by condreg.immunize, {rtols}), "
        f"and again at 10× and 100× rtol; Definition 3.1 (a) asks (i) ≫ 1, so the successes "
        f"are also counted at (i) ≥ 2 and (i) ≥ 10 (with (ii) ≤ 1). The paper's 70.04 is an "
        f"arithmetic mean of its per-pair RIRs, which are not published. The "
        f"paper's counts (Ours 90, Opt κ 58, IMMA 1, R_ill only 0 of 90) are its own; it does "
        f"not state the rule behind them. Task d: digit d (label 1) vs a "
        f"{settings['negative_fraction']:g}× sample of other digits (label 0). "
        + _loss_text(summary, loss_input, settings)
        + _time_text(timing_, split)
    )
    if check["max_rel_diff"] is not None:
        text += (
            "Every κ recomputed from NumPy's SVD of Xθ (--cross-check): (i), (ii) and RIR "
            f"agree to {rp.fmt_number(check['max_rel_diff'], 2)} (largest relative "
            "difference).\n"
        )
    else:
        text += "Not cross-checked by an independent SVD (--cross-check does it).\n"
    return text + f"\nFig. 2 (ln_rir_heatmap.png): {PAPER_PER_PAIR_NOTE}.\n"


def _time_text(timing_: Mapping[str, Any], split: str) -> str:
    """The mean time per pair of the units computed now (none when every unit was resumed)."""
    mean = timing_["mean_seconds_per_pair_all_methods"]
    if mean is None:
        return f"Every unit taken from --resume; {timing_['jobs']} worker(s). "
    return f"Mean time per pair (all methods, one worker): {mean:.2f} s{split}; " + (
        f"{timing_['jobs']} worker(s). "
    )


def _grids(per_pair, methods, digits):
    """ln RIR (mean over seeds) and failure (in any seed) per (P, H) cell, for each method."""
    grids, failed = {}, {}
    for m in methods:
        grid = np.full((len(digits), len(digits)), np.nan)
        bad = np.zeros(grid.shape, dtype=bool)
        for key, runs in per_pair[m].items():
            p, h = (digits.index(int(v)) for v in key.split("-"))
            grid[p, h] = float(np.mean(np.log([x["rir"] for x in runs])))
            bad[p, h] = not all(x["success"] for x in runs)
        grids[m], failed[m] = grid, bad
    return grids, failed


def _draw_panel(ax, m, grid, bad, digits, vmax):
    """One method's heat-map: colour = ln RIR, failed cells hatched and crossed."""
    from matplotlib.patches import Rectangle

    image = ax.imshow(grid, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    n_bad, n_run = int(bad.sum()), int(np.isfinite(grid).sum())
    paper = rp.PAPER_MNIST[m]["successes"]
    title = f"{rp.METHOD_LABELS[m]}: {n_run - n_bad}/{n_run} succeed (paper: {paper}/90)"
    ax.set_title(title, fontsize=9)
    ax.set(xlabel="harmful digit H (columns)", ylabel="pre-training digit P (rows)")
    ax.set_xticks(range(len(digits)), [str(d) for d in digits])
    ax.set_yticks(range(len(digits)), [str(d) for d in digits])
    for (r, c), v in np.ndenumerate(grid):
        if r == c:
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, color="0.85"))
        if not np.isfinite(v):
            continue
        if bad[r, c]:  # a failure: paled and hatched
            cell = Rectangle((c - 0.5, r - 0.5), 1, 1, fc=(1, 1, 1, 0.55), hatch="//", ec="0.3")
            ax.add_patch(cell)
        box = {"boxstyle": "round,pad=0.1", "fc": "w", "ec": "none", "alpha": 0.8}
        ax.text(c, r, f"{v:.1f}", ha="center", va="center", fontsize=6, bbox=box)
    return image


def heatmap(out_dir: pathlib.Path, per_pair, methods, pairs, *, quick: bool) -> Any:
    """Write and return Fig. 2, ``ln_rir_heatmap.png``: ln RIR per (P, H), a panel per method."""
    from matplotlib.patches import Patch

    ordered = [m for m in rp.METHODS if m in methods]
    digits = sorted({d for p in pairs for d in p})
    grids, failed = _grids(per_pair, ordered, digits)
    finite = np.concatenate([g[np.isfinite(g)] for g in grids.values()])
    paper_lo, paper_hi = math.log(8.6), math.log(523.0)
    vmax = max(float(np.max(np.abs(finite))) if finite.size else 1.0, paper_hi)
    ncols = 2 if len(ordered) > 1 else 1
    nrows = (len(ordered) + ncols - 1) // ncols
    side = 0.42 * len(digits) + 1.8
    figsize = (max(3.4, 1.05 * side) * ncols + 1.4, side * nrows + 0.8)
    fig, axes = rp.new_figure(nrows, ncols, figsize=figsize, squeeze=False)
    for ax, m in zip(axes.ravel(), ordered, strict=False):
        image = _draw_panel(ax, m, grids[m], failed[m], digits, vmax)
    for ax in axes.ravel()[len(ordered) :]:
        ax.set_visible(False)
    label = "ln RIR (0: θ = I); black bar: the paper's range of Ours, RIR 8.6–523"
    bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label=label)
    bar.ax.plot([0.5, 0.5], [paper_lo, paper_hi], color="k", lw=3)
    handles = [
        Patch(facecolor="w", edgecolor="0.3", hatch="//", label="fails Def. 3.1 (a) + (b)"),
        Patch(facecolor="0.85", label="P = H: not an experiment"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=7, frameon=False)
    fig.suptitle(
        f"{'[quick run] ' if quick else ''}Fig. 2: ln RIR per ordered pair "
        "(rows = pre-training digit P, columns = harmful digit H); red = harder to probe\n"
        f"The paper's per-pair values are not published: no per-pair comparison",
        fontsize=9,
    )
    rp.save_figure(fig, out_dir / "ln_rir_heatmap.png")
    return fig
