"""The ablation's results: rows per protocol, the inputs' κ, the schedule sweep, table and plots."""

from __future__ import annotations

import math
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
    i, ii = (float(np.mean([e[way][k] for e in entries])) for k in ("i", "ii"))
    successes = int(sum(e[way]["success"] for e in entries))
    return {
        "mean_rir": float(np.mean(rir)),
        "median_rir": float(np.median(rir)),
        "geomean_rir": _geomean(rir),
        "mean_i": i,
        "mean_ii": ii,
        "successes": successes,
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
    return {
        "log10_ratio": logs,
        "ours_ahead": int(np.sum(arr > 0)),
        "n": len(logs),
        "median_log10_ratio": median,
    }


def _runs(protocol, dataset, specs, done, defaults) -> tuple[dict[str, list], bool]:
    """Per method, one row's scored runs; and whether a default re-run gave the same RIR."""
    runs: dict[str, list] = {m: [] for m in METHODS}
    identical = True
    for key, spec in specs:
        if spec["dataset"] == dataset and spec["protocol"] == protocol:
            unit = done[key]["methods"]
            for m in METHODS:
                entry = {"where": _where(spec), "seed": spec["seed"], **unit[m]}
                if protocol == "condreg":
                    official = _default_numbers(defaults, spec, m)
                    identical &= official["rir"] == unit[m]["condreg_rir"]
                    entry["nonzero"] = {**unit[m]["nonzero"], **official}
                runs[m].append(entry)
    return runs, identical


def _rows(plan, specs, done, defaults) -> tuple[list[dict[str, Any]], dict[str, bool]]:
    rows, identical = [], {}
    for dataset in plan.datasets:
        for protocol in plan.protocols:
            sw = switches_of(protocol, dataset)
            if protocol != "condreg" and not sw:
                continue
            runs, same = _runs(protocol, dataset, specs, done, defaults)
            if protocol == "condreg":
                identical[dataset] = same
            stopped = sorted({e["stopped"] for r in runs.values() for e in r} - {"completed"})
            rows.append(
                {
                    "dataset": dataset,
                    "protocol": protocol,
                    "switches": sw,
                    "source": "condreg.immunize (the default experiment)"
                    if protocol == "condreg"
                    else "emulated (condreg.experiments.ablation.emulator)",
                    "methods": {m: {w: _summary(runs[m], w) for w in WAYS} for m in METHODS},
                    "ours_vs_opt": {w: _versus(runs, w) for w in WAYS},
                    "runs": {
                        m: [
                            {
                                "where": e["where"],
                                "seed": e["seed"],
                                **{w: e[w] for w in WAYS},
                                "stopped": e["stopped"],
                            }
                            for e in runs[m]
                        ]
                        for m in METHODS
                    },
                    "stopped_early": stopped,
                }
            )
    return rows, identical


def _inputs(data) -> dict[str, Any]:
    """κ(K_P), κ(K_H) at θ = I under both scorings, beside the authors' logged values."""
    out: dict[str, Any] = {}
    if "house" in data:
        out["house"] = {k: v["inputs"] for k, v in data["house"].items()}
        ours = out["house"]["released"]["ridge"]
        log = LOGGED["house"]
        out["house"]["logged"] = dict(log)
        diff = {k: ours[k] / float(log[k]) - 1.0 for k in ("kappa_K_P", "kappa_K_H")}
        out["house"]["rel_diff_to_logged"] = diff
    if "mnist" in data:
        mn = data["mnist"]
        pooled = [v["inputs"] for k, v in mn.items() if isinstance(k, tuple)]
        ks = {w: [p[w][k] for p in pooled for k in ("kappa_K_P", "kappa_K_H")] for w in WAYS}
        out["mnist"] = {
            "pooled": {
                w: {"kappa_K_min": float(min(ks[w])), "kappa_K_max": float(max(ks[w]))}
                for w in WAYS
            },
            "n_features": mn["n_features"],
            "raw_digit_tasks": mn["raw_inputs"],
            "logged": dict(LOGGED["mnist"]),
        }
    return out


def _sweep(plan, specs, done) -> dict[str, Any]:
    """RIR against ``max_step`` and the epoch, and the D_P-only choice of ``max_step``."""
    out, steps = {}, plan.max_steps
    for dataset in plan.datasets:
        by_step: dict[float, dict[str, list]] = {ms: {m: [] for m in METHODS} for ms in steps}
        ref, curves = [], {m: [] for m in METHODS}
        for key, spec in specs:
            if spec["dataset"] != dataset or spec["kind"] == "emulated":
                continue
            unit = done[key]["methods"]
            ms = spec.get("max_step") or 0.3
            for m in METHODS:
                by_step[ms][m].append(unit[m])
                if spec["kind"] == "default":
                    curves[m].append(unit[m]["history_rir"])
            if "head_only_loss" in unit:
                ref.append(unit["head_only_loss"])
        ref_loss = float(np.mean(ref))  # every default unit has one
        table = {
            str(ms): {
                m: {
                    "geomean_rir": _geomean([r["nonzero"]["rir"] for r in rs]),
                    "successes": int(sum(r["nonzero"]["success"] for r in rs)),
                    "n": len(rs),
                    "dp_loss": float(np.mean([r["loss_final"] for r in rs])),
                }
                for m, rs in by_step[ms].items()
            }
            for ms in steps
        }
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
            "rir_by_epoch": {m: _geomean_curve(c) for m, c in curves.items()},
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
    rows, identical = _rows(plan, specs, done, defaults)
    return {
        "switches": dict(RELEASED_SWITCHES),
        "rows": rows,
        "default_rerun_identical": identical,
        "inputs": _inputs(data),
        "schedule": _sweep(plan, specs, done),
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
