"""The ablation's results: rows per protocol, the inputs' κ, the schedule sweep, table and plots."""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import product
from typing import Any

import numpy as np

from condreg.experiments import _report as rp
from condreg.experiments.ablation import DP_TOLERANCE, figures, switches_of, tables
from condreg.experiments.ablation.released import LOGGED, RELEASED_SWITCHES
from condreg.experiments.ablation.units import METHODS

__all__ = ["assemble", "write", "WAYS"]

#: The two scorings: condreg's κ (nonzero singular values) and the released ridge-floor κ.
WAYS = ("nonzero", "ridge")


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
                "source": "condreg.immunize (the default experiment)"
                if protocol == "condreg"
                else "emulated (condreg.experiments.ablation.emulator)",
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
        out["house"] = {k: v["inputs"] for k, v in data["house"].items()}
        ours, log = out["house"]["released"]["ridge"], LOGGED["house"]
        out["house"]["logged"] = dict(log)
        diff = {k: ours[k] / float(log[k]) - 1.0 for k in ("kappa_K_P", "kappa_K_H")}
        out["house"]["rel_diff_to_logged"] = diff
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
        chosen, passed = {}, {}
        for m in METHODS:
            ok = [ms for ms in steps if table[str(ms)][m]["dp_loss"] <= ref_loss + DP_TOLERANCE]
            chosen[m] = max(ok) if ok else min(steps)
            passed[m] = bool(ok)
        out[dataset] = {
            "max_steps": list(steps),
            "by_max_step": table,
            "head_only_dp_loss": ref_loss,
            "dp_tolerance": DP_TOLERANCE,
            "chosen_max_step": chosen,
            "any_step_passes": passed,
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
    n = min(len(c) for c in curves)
    return [_geomean([c[t] for c in curves]) for t in range(n)]


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


def write(plan, settings, results, runtime_s, store) -> dict[str, Any]:
    """results.json, table.md, ranking.png, schedule.png."""
    notes = tables.notes(results, store)
    quick = " (quick: not the full run)" if plan.quick else ""
    payload = rp.write_outputs(
        plan.out_dir,
        experiment="ablation",
        settings=settings,
        seeds=plan.seeds,
        results=results,
        runtime_s=runtime_s,
        notes=notes,
        table=tables.table(plan, results, notes),
        title=f"Ablation — condreg's protocol → the released code's{quick}",
    )
    figures.ranking(plan, results, plan.out_dir / "ranking.png")
    figures.schedule(plan, results, plan.out_dir / "schedule.png")
    return payload
