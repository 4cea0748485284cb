"""The ablation's results (rows per protocol, inputs' κ, the schedule sweep), table and plots."""

from __future__ import annotations

import math
import pathlib
from collections import defaultdict
from itertools import product
from typing import Any

import numpy as np

from condreg.experiments import _report as rp
from condreg.experiments.ablation import DP_TOLERANCE, LABELS, METHODS, switches_of
from condreg.experiments.ablation.emulator import LOGGED, RELEASED_SWITCHES

__all__ = ["assemble", "write", "WAYS", "table", "notes", "ranking", "schedule"]

#: The two scorings: condreg's κ (nonzero singular values) and the released ridge-floor κ.
WAYS = ("nonzero", "ridge")
_TITLE = {"house": "House prices (Table 1)", "mnist": "MNIST digit pairs (Table 2)"}
_SHORT = {"house": "house prices", "mnist": "MNIST pairs"}
_SOURCE = {"condreg": "condreg.immunize (the default experiment)"}


def _where(spec: dict[str, Any]) -> str:
    pair = spec.get("pair")
    return "" if pair is None else f"{pair[0]}-{pair[1]}"


def _default_numbers(defaults, spec, method: str) -> dict[str, Any]:
    """The default experiment's own (i), (ii), RIR, success of this (seed, pair) and method."""
    res = defaults[spec["dataset"]]
    k = res["seeds"].index(spec["seed"])
    if spec["dataset"] == "house":
        run = res["results"]["methods"][method]["runs"][k]
    else:
        run = res["results"]["per_pair"][method][_where(spec)][k]
    return {key: run[key] for key in ("i", "ii", "rir", "success")}


def _summary(entries: list[dict[str, Any]], way: str) -> dict[str, Any]:
    rir = np.array([e[way]["rir"] for e in entries], dtype=float)
    return {
        "mean_rir": float(np.mean(rir)),
        "median_rir": float(np.median(rir)),
        "geomean_rir": _geomean(rir),
        "mean_i": float(np.mean([e[way]["i"] for e in entries])),
        "mean_ii": float(np.mean([e[way]["ii"] for e in entries])),
        "successes": int(sum(e[way]["success"] for e in entries)),
        "n": len(entries),
    }


def _versus(runs: dict[str, list], way: str) -> dict[str, Any]:
    """Ours against Opt κ on each run: log10 of the RIR ratio, on how many runs Ours is ahead."""
    logs = []
    for a, b in zip(runs["condreg"], runs["opt_kappa"], strict=True):
        x, y = a[way]["rir"], b[way]["rir"]
        good = x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)
        logs.append(math.log10(x / y) if good else float("nan"))
    arr = np.array(logs)
    median = float(np.nanmedian(arr)) if np.isfinite(arr).any() else None
    ahead = int(np.sum(arr > 0))
    return dict(log10_ratio=logs, ours_ahead=ahead, n=len(logs), median_log10_ratio=median)


def _rows(plan, groups, defaults) -> tuple[list[dict[str, Any]], dict[str, bool]]:
    """A row per (dataset, protocol) run; per dataset, whether the default re-run gave its RIR."""
    rows, identical = [], {}
    for dataset, protocol in product(plan.datasets, plan.protocols):
        if (dataset, protocol) not in groups:
            continue  # a switch that does not exist for this dataset
        runs: dict[str, list] = {m: [] for m in METHODS}
        for spec, unit in groups[dataset, protocol]:
            at = {"where": _where(spec), "seed": spec["seed"]}
            for m in METHODS:
                entry = {**at, "nonzero": unit[m]["nonzero"], "ridge": unit[m]["ridge"]}
                if protocol == "condreg":
                    official = _default_numbers(defaults, spec, m)
                    same = official["rir"] == unit[m]["condreg_rir"]
                    identical[dataset] = identical.get(dataset, True) and same
                    entry["nonzero"] = {**entry["nonzero"], **official}
                runs[m].append({**entry, "stopped": unit[m]["stopped"]})
        stopped = sorted({e["stopped"] for r in runs.values() for e in r} - {"completed"})
        rows.append(
            {
                "dataset": dataset,
                "protocol": protocol,
                "switches": switches_of(protocol, dataset),
                "source": _SOURCE.get(protocol, "emulated (condreg.experiments.ablation.emulator)"),
                "methods": {m: {w: _summary(runs[m], w) for w in WAYS} for m in METHODS},
                "ours_vs_opt": {w: _versus(runs, w) for w in WAYS},
                "runs": runs,
                "stopped_early": stopped,
            }
        )
    return rows, identical


def _inputs(data) -> dict[str, Any]:
    """κ(K_P), κ(K_H) at θ = I under both scorings, beside the authors' logged values."""
    out: dict[str, Any] = {}
    if "house" in data:
        house = {k: v["inputs"] for k, v in data["house"].items()}
        ours, log = house["released"]["ridge"], LOGGED["house"]
        diff = {k: ours[k] / float(log[k]) - 1.0 for k in ("kappa_K_P", "kappa_K_H")}
        out["house"] = {**house, "logged": dict(log), "rel_diff_to_logged": diff}
    if "mnist" in data:
        mn = data["mnist"]
        pooled = [v["inputs"] for k, v in mn.items() if isinstance(k, tuple)]
        ks = {w: [p[w][k] for p in pooled for k in ("kappa_K_P", "kappa_K_H")] for w in WAYS}
        span = {
            w: {"kappa_K_min": float(min(v)), "kappa_K_max": float(max(v))} for w, v in ks.items()
        }
        out["mnist"] = {
            "pooled": span,
            "n_features": mn["n_features"],
            "raw_digit_tasks": mn["raw_inputs"],
            "logged": dict(LOGGED["mnist"]),
        }
    return out


def _step_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric-mean RIR and successes (nonzero-σ κ), and the mean D_P loss of some runs."""
    rir = _geomean([r["nonzero"]["rir"] for r in runs])
    successes = int(sum(r["nonzero"]["success"] for r in runs))
    dp_loss = float(np.mean([r["loss_final"] for r in runs]))
    return dict(geomean_rir=rir, successes=successes, n=len(runs), dp_loss=dp_loss)


def _sweep(plan, groups) -> dict[str, Any]:
    """RIR against ``max_step`` and the epoch, and the D_P-only choice of ``max_step``."""
    out, steps = {}, plan.max_steps
    for dataset in plan.datasets:
        default, table = groups[dataset, "condreg"], {}
        for ms in steps:
            units = default if ms == 0.3 else groups[dataset, f"max_step={ms}"]
            table[str(ms)] = {m: _step_summary([u[m] for _, u in units]) for m in METHODS}
        ref_loss = float(np.mean([u["head_only_loss"] for _, u in default]))
        ok = {
            m: [ms for ms in steps if table[str(ms)][m]["dp_loss"] <= ref_loss + DP_TOLERANCE]
            for m in METHODS
        }
        out[dataset] = {
            "max_steps": list(steps),
            "by_max_step": table,
            "head_only_dp_loss": ref_loss,
            "dp_tolerance": DP_TOLERANCE,
            "chosen_max_step": {m: max(v) if v else min(steps) for m, v in ok.items()},
            "any_step_passes": {m: bool(v) for m, v in ok.items()},
            "rir_by_epoch": {
                m: _geomean_curve([u[m]["history_rir"] for _, u in default]) for m in METHODS
            },
        }
    return out


def _geomean(values) -> float:
    v = np.array(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.exp(np.mean(np.log(v)))) if v.size else float("nan")


def _geomean_curve(curves: list[list[float]]) -> list[float]:
    return [_geomean(column) for column in zip(*curves, strict=False)]


def assemble(plan, data, defaults, specs, done) -> dict[str, Any]:
    """The ``results`` of results.json (see docs/ablation.md)."""
    groups = defaultdict(list)  # (dataset, protocol) -> [(spec, its unit's methods)]
    for key, spec in specs:
        groups[spec["dataset"], spec["protocol"]].append((spec, done[key]["methods"]))
    rows, identical = _rows(plan, groups, defaults)
    return {
        "switches": dict(RELEASED_SWITCHES),
        "rows": rows,
        "default_rerun_identical": identical,
        "inputs": _inputs(data),
        "schedule": _sweep(plan, groups),
    }


def _fmt(x: float | None, digits: int = 3) -> str:
    return rp.fmt_number(x, digits)


def _count(entry: dict[str, Any], key: str = "successes") -> str:
    return f"{entry[key]}/{entry['n']}"


def _rir(row: dict[str, Any], method: str) -> str:
    """Mean RIR (nonzero / ridge) and successes of one method in one row."""
    a, b = (row["methods"][method][w] for w in ("nonzero", "ridge"))
    return f"{_fmt(a['mean_rir'])} / {_fmt(b['mean_rir'])} ({_count(a)}, {_count(b)})"


def _rows_table(results: dict[str, Any], dataset: str) -> str:
    names = {"condreg": "condreg (default)", "released": "**released (all switches)**"}
    rows = []
    for row in (r for r in results["rows"] if r["dataset"] == dataset):
        a, b = row["ours_vs_opt"]["nonzero"], row["ours_vs_opt"]["ridge"]
        versus = f"{_count(a, 'ours_ahead')} / {_count(b, 'ours_ahead')}"
        name = names.get(row["protocol"], row["protocol"])
        rows.append([name, *(_rir(row, m) for m in METHODS), versus])
    head = ["protocol", *(f"{LABELS[m]} RIR" for m in METHODS), "Ours > Opt κ"]
    return rp.markdown_table(head, rows)


def _inputs_table(results: dict[str, Any]) -> str:
    inp, keys = results["inputs"], ("kappa_K_P", "kappa_K_H")
    rows = []
    if "house" in inp:
        h = inp["house"]
        for prep in ("condreg", "released"):
            n, r = h[prep]["nonzero"], h[prep]["ridge"]
            kappas = [*(_fmt(n[k], 4) for k in keys), *(_fmt(r[k], 10) for k in keys)]
            rows.append([f"house, {prep} preprocessing", *kappas, "—"])
        log, d = h["logged"], h["rel_diff_to_logged"]
        rows[-1][-1] = (
            f"{log['kappa_K_P']!r} / {log['kappa_K_H']!r} (ours differ by "
            f"{d['kappa_K_P']:.1e} / {d['kappa_K_H']:.1e})"
        )
    if "mnist" in inp:
        m, p = inp["mnist"], inp["mnist"]["pooled"]
        span = {w: f"{_fmt(p[w]['kappa_K_min'])} – {_fmt(p[w]['kappa_K_max'])}" for w in p}
        name = f"MNIST pooled tasks ({m['n_features']} inputs), all pairs"
        rows.append([name, span["nonzero"], "", span["ridge"], "", "—"])
        raw = m["raw_digit_tasks"]
        for d, logged in (("0", m["logged"]["kappa_K_P"]), ("1", m["logged"]["kappa_K_H"])):
            if d in raw:
                r = raw[d]
                name = f"MNIST raw pixels, digit {d} only ({r['n_images']} images)"
                log = f"{logged!r} (5923 images of full MNIST)"
                rows.append([name, _fmt(r["nonzero"], 4), "", _fmt(r["ridge"], 4), "", log])
    kappas = [f"κ({k}) {w}" for w in ("nonzero", "ridge") for k in ("K_P", "K_H")]
    return rp.markdown_table(["inputs", *kappas, "the authors' log (ridge)"], rows)


def _sweep_table(results: dict[str, Any], dataset: str) -> str:
    s = results["schedule"][dataset]
    rows = []
    for ms in s["max_steps"]:
        e = s["by_max_step"][str(ms)]
        cells = [
            f"{_fmt(e[m]['geomean_rir'])} ({_count(e[m])}), {_fmt(e[m]['dp_loss'])}"
            for m in METHODS
        ]
        rows.append([f"{ms:g}" + (" (default)" if ms == 0.3 else ""), *cells])
    note = " (no step passes: the smallest)"
    chosen = ", ".join(
        f"{LABELS[m]} {s['chosen_max_step'][m]:g}" + ("" if s["any_step_passes"][m] else note)
        for m in METHODS
    )
    head = ["max_step", *(f"{LABELS[m]}: RIR (success), D_P loss" for m in METHODS)]
    return rp.markdown_table(head, rows) + (
        f"\nD_P-only rule (the largest max_step whose D_P loss is at most {s['dp_tolerance']:g} "
        f"above the head trained alone on θ = I, {_fmt(s['head_only_dp_loss'])}): {chosen}.\n"
    )


def table(plan, results: dict[str, Any], notes_: list[str]) -> str:
    """table.md's body."""
    parts = []
    for dataset in plan.datasets:
        mean = "Mean over seeds." if dataset == "house" else "Mean over the pairs."
        note = (
            "\nEach cell: RIR by κ over the nonzero singular values / by the released ridge-floor "
            f"κ (successes (i) > 1 and (ii) ≤ 1 under each). {mean} Last column: runs on which "
            "Ours' RIR exceeds Opt κ's (nonzero / ridge).\n"
        )
        parts += [f"## {_TITLE[dataset]}\n", _rows_table(results, dataset), note]
    parts += ["## The inputs' condition numbers at θ = I\n", _inputs_table(results)]
    for dataset in plan.datasets:
        title = f"\n## RIR against max_step — {_TITLE[dataset]}\n"
        parts += [title, _sweep_table(results, dataset)]
    if notes_:
        parts.append("\n" + "\n".join(f"- {n}" for n in notes_) + "\n")
    return "\n".join(parts)


def notes(results: dict[str, Any], store) -> list[str]:
    """Runs that stopped early, the default rows' identity check, resumed units."""
    out = [
        f"{dataset}: the re-run of condreg.immunize for the ridge-floor scoring did not reproduce "
        "the default experiment's RIR exactly"
        for dataset, same in results["default_rerun_identical"].items()
        if not same
    ]
    out += [
        f"{row['dataset']}, {row['protocol']}: a run {reason}"
        for row in results["rows"]
        for reason in row["stopped_early"]
    ]
    if store.loaded:
        out.append(f"--resume: {len(store.loaded)} unit(s) taken from {store.dir}")
    return out


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
        title = f"{_SHORT[dataset]}: ● κ over nonzero σ, ◇ released ridge-floor κ"
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
    return f"{name}{tail}\nsuccess: Ours {_count(ours)}, Opt κ {_count(opt)}"


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
        top.set_title(f"{_SHORT[dataset]}: RIR against the epoch", fontsize=9)
        bottom.set_title(f"{_SHORT[dataset]}: RIR against max_step", fontsize=9)
        top.legend(fontsize=7)
    quick = " (quick)" if plan.quick else ""
    fig.suptitle(f"Does the verdict depend on the schedule?{quick}")
    rp.save_figure(fig, path)


def write(plan, settings, results, runtime_s, store) -> dict[str, Any]:
    """results.json, table.md, ranking.png, schedule.png."""
    notes_ = notes(results, store)
    quick = " (quick: not the full run)" if plan.quick else ""
    payload = rp.write_outputs(
        plan.out_dir,
        experiment="ablation",
        settings=settings,
        seeds=plan.seeds,
        results=results,
        runtime_s=runtime_s,
        notes=notes_,
        table=table(plan, results, notes_),
        title=f"Ablation — condreg's protocol → the released code's{quick}",
    )
    ranking(plan, results, plan.out_dir / "ranking.png")
    schedule(plan, results, plan.out_dir / "schedule.png")
    return payload
