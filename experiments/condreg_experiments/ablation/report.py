"""The ablation's results: per row and method, (i), (ii) and RIR as geometric means and medians,
successes at three (i) thresholds and three rank tolerances, under both κ's; then the files."""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import product
from typing import Any

import numpy as np

from condreg_experiments import _report as rp
from condreg_experiments._linear import TOLERANCE_FACTORS
from condreg_experiments.ablation import DP_TOLERANCE, METHODS, switches_of
from condreg_experiments.ablation import factors as fc
from condreg_experiments.ablation.released import LOGGED, RELEASED_SWITCHES

#: The two scorings: condreg's κ (nonzero singular values) and the released ridge-floor κ.
WAYS = ("nonzero", "ridge")


def _where(spec: dict[str, Any]) -> str:
    pair = spec.get("pair")
    return "" if pair is None else f"{pair[0]}-{pair[1]}"


def summary(entries: list[dict[str, Any]], way: str) -> dict[str, Any]:
    """(i), (ii), RIR over runs (geometric), successes at (i) > 1, ≥ 2, ≥ 10 and, for the
    nonzero-σ κ, the (i) > 1 successes at 10× and 100× the rank tolerance."""
    e = [x[way] for x in entries]
    out: dict[str, Any] = {k: rp.ratio_summary([x[k] for x in e]) for k in ("i", "ii", "rir")}
    out["successes_by_i"] = rp.success_counts((x["i"], x["ii"]) for x in e)
    out["n"] = len(e)
    if way == "nonzero":
        out["successes_by_rtol"] = {"1x": out["successes_by_i"]["i>1"]} | {
            f"{f}x": int(sum(x["tolerance"][f"{f}x"]["success"] for x in e))
            for f in TOLERANCE_FACTORS[1:]
        }
    lengths = [x.get("path_length") or {} for x in entries]
    out["path_length"] = {
        k: float(np.mean([v.get(k, math.nan) for v in lengths])) for k in ("p", "h")
    }
    out["dp_loss"] = float(np.mean([x.get("loss_final", math.nan) for x in entries]))
    return out


def versus(runs: dict[str, list], way: str) -> dict[str, Any] | None:
    """Ours against Opt κ run by run: log10 of the RIR ratio, on how many runs Ours is ahead."""
    if not {"condreg", "opt_kappa"} <= set(runs):
        return None
    logs = []
    for a, b in zip(runs["condreg"], runs["opt_kappa"], strict=True):
        x, y = a[way]["rir"], b[way]["rir"]
        good = x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)
        logs.append(math.log10(x / y) if good else float("nan"))
    arr = np.array(logs)
    median = float(np.nanmedian(arr)) if np.isfinite(arr).any() else None
    ahead = int(np.sum(arr > 0))
    return dict(log10_ratio=logs, ours_ahead=ahead, n=len(logs), median_log10_ratio=median)


def _entry(unit_m: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    keep = ("nonzero", "ridge", "stopped", "path_length", "loss_final", "steps_run")
    return {"where": _where(spec), "seed": spec["seed"]} | {
        k: unit_m[k] for k in keep if k in unit_m
    }


def _row(name: str, methods, units, extra: dict[str, Any]) -> dict[str, Any]:
    """One row: per method its runs and summaries under both κ's, Ours against Opt κ."""
    runs = {m: [_entry(u[m], spec) for spec, u in units] for m in methods}
    stopped = sorted({e["stopped"] for r in runs.values() for e in r} - {"completed"})
    return extra | {
        "protocol": name,
        "methods": {m: {w: summary(runs[m], w) for w in WAYS} for m in methods},
        "ours_vs_opt": {w: versus(runs, w) for w in WAYS},
        "runs": runs,
        "stopped_early": stopped,
    }


def _default_numbers(defaults, spec, method: str) -> dict[str, Any]:
    """The default experiment's own (i), (ii), RIR, success of this (seed, pair) and method."""
    res = defaults[spec["dataset"]]
    k = res["seeds"].index(spec["seed"])
    if spec["dataset"] == "house":
        run = res["results"]["methods"][method]["runs"][k]
    else:
        run = res["results"]["per_pair"][method][_where(spec)][k]
    out = {key: run[key] for key in ("i", "ii", "rir", "success")}
    return out | {"success_by_i": rp.success_by_i(out["i"], out["ii"])}


def _switch_rows(plan, groups, defaults) -> tuple[list[dict[str, Any]], dict[str, bool]]:
    """A row per (dataset, protocol); per dataset, whether the default re-run gave its RIR."""
    rows, identical = [], {}
    for dataset, protocol in product(plan.datasets, plan.protocols):
        units = groups.get(("switches", dataset, protocol))
        if not units:
            continue  # a switch that does not exist for this dataset
        if protocol == "condreg":
            for spec, unit in units:
                for m in METHODS:
                    official = _default_numbers(defaults, spec, m)
                    same = official["rir"] == unit[m]["condreg_rir"]
                    identical[dataset] = identical.get(dataset, True) and same
                    unit[m] = {**unit[m], "nonzero": {**unit[m]["nonzero"], **official}}
        source = (
            "condreg.immunize (the default experiment)"
            if protocol == "condreg"
            else ("emulated (condreg_experiments.ablation.emulator)")
        )
        extra = {"dataset": dataset, "switches": switches_of(protocol, dataset), "source": source}
        rows.append(_row(protocol, METHODS, units, extra))
    return rows, identical


def _factor_rows(plan, groups) -> dict[str, list[dict[str, Any]]]:
    """Per dataset, each factor's row (the default and the minibatch bundle first)."""
    out = {}
    for dataset in plan.datasets:
        rows = []
        for name in fc.factors_of(dataset):
            units = groups.get(("factors", dataset, name), [])
            if units:
                extra = {"what": fc.FACTORS[name], "fields": units[0][0]["fields"]}
                rows.append(_row(name, fc.FACTOR_METHODS, units, extra))
        out[dataset] = rows
    return out


def _rule_results(plan, groups, chosen) -> dict[str, Any]:
    """Per dataset and variant: its grid (D_P loss against the reference), the chosen value and
    the runs at it (every seed and pair), summarised."""
    out: dict[str, Any] = {}
    for dataset in plan.datasets:
        variants = {}
        for name, (method, what, _sw, _pre, knob) in fc.RULES.items():
            units = groups.get(("rules", dataset, name), [])
            if not units:
                continue
            c = chosen[dataset][name]
            grid = defaultdict(list)
            for spec, u in units:
                if spec["seed"] == plan.factor_seeds[0]:
                    grid[spec["value"]].append((u[method], u["head_only_loss"]))
            table = {
                f"{v:g}": {
                    "dp_loss": float(np.mean([r["loss_final"] for r, _ in runs])),
                    "reference": float(np.mean([ref for _, ref in runs])),
                    "completed": all(r["stopped"] == "completed" for r, _ in runs),
                    "rir": rp.geomean(r["nonzero"]["rir"] for r, _ in runs),
                }
                for v, runs in sorted(grid.items())
            }
            at = [(spec, u) for spec, u in units if spec["value"] == c["chosen"]]
            row = _row(name, [method], at, {"what": what, "knob": knob, "method": method})
            variants[name] = row | {"grid": table, **c}
        paper = rp.PAPER_HOUSE_PRICES if dataset == "house" else None
        out[dataset] = {"variants": variants, "paper": paper, "dp_tolerance": DP_TOLERANCE}
        out[dataset]["ranking"] = _rule_ranking(variants)
    return out


#: Under each step rule, Ours' variant against Opt κ's (plain and preconditioned).
RULE_PAIRS = {
    "clip": ("ours_clip", "opt_clip", "opt_clip_precond"),
    "fixed λ, GD": ("ours_fixed_gd", "opt_fixed_gd", "opt_fixed_gd_precond"),
    "fixed λ, Adam": ("ours_fixed_adam", "opt_fixed_adam", "opt_fixed_adam_precond"),
}


def _rule_ranking(variants: dict[str, Any]) -> dict[str, Any]:
    """Per step rule, on how many runs (same seed and pair) Ours' RIR exceeds Opt κ's."""
    out = {}
    for rule, (ours, *opts) in RULE_PAIRS.items():
        if ours not in variants:
            continue
        for opt in (o for o in opts if o in variants):
            runs = {"condreg": variants[ours]["runs"]["condreg"]}
            runs["opt_kappa"] = variants[opt]["runs"]["opt_kappa"]
            out[f"{ours} vs {opt}"] = {"rule": rule} | versus(runs, "nonzero")
    return out


def _released_mnist(plan, groups, data) -> dict[str, Any] | None:
    """The released MNIST protocol on its own tasks, beside the authors' logged run."""
    if "released_mnist" not in plan.parts or "mnist" not in plan.datasets:
        return None
    rows = {}
    for row in fc.RELEASED_MNIST_ROWS:
        units = groups.get(("released_mnist", "mnist", row), [])
        if units:
            extra = {"what": fc.RELEASED_MNIST_ROWS[row], "fields": units[0][0]["fields"]}
            rows[row] = _row(row, fc.FACTOR_METHODS, units, extra)
    inputs = {
        f"{p}-{h}": data["mnist"][("raw", plan.factor_seeds[0], (p, h))]["inputs"]
        for p, h in plan.raw_pairs
    }
    seed = plan.factor_seeds[0]
    n = {
        f"{p}-{h}": int(data["mnist"][("raw", seed, (p, h))]["X_p"].shape[0])
        for p, h in plan.raw_pairs
    }
    return {"logged": dict(LOGGED["mnist"]), "inputs": inputs, "images_per_digit": n, "rows": rows}


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
        pooled = [v["inputs"] for k, v in mn.items() if isinstance(k, tuple) and k[0] != "raw"]
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
    rir = rp.geomean([r["nonzero"]["rir"] for r in runs])
    median = float(np.median([r["nonzero"]["rir"] for r in runs]))
    successes = int(sum(r["nonzero"]["success"] for r in runs))
    dp_loss = float(np.mean([r["loss_final"] for r in runs]))
    return dict(
        geomean_rir=rir, median_rir=median, successes=successes, n=len(runs), dp_loss=dp_loss
    )


def _sweep(plan, groups) -> dict[str, Any]:
    """RIR against ``max_step`` and the epoch, and the D_P-only choice of ``max_step``."""
    out, steps = {}, plan.max_steps
    for dataset in plan.datasets:
        default, table = groups[("switches", dataset, "condreg")], {}
        for ms in steps:
            units = default if ms == 0.3 else groups[("sweep", dataset, f"max_step={ms}")]
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
                m: _by_epoch([u[m]["history_rir"] for _, u in default]) for m in METHODS
            },
        }
    return out


def _by_epoch(curves: list[list[float]]) -> list[float]:
    """The geometric mean over runs at each epoch (as far as every run goes)."""
    return [rp.geomean(column) for column in zip(*curves, strict=False)]


def assemble(plan, data, defaults, specs, done, chosen) -> dict[str, Any]:
    """The ``results`` of results.json (see docs/ablation.md)."""
    groups = defaultdict(list)  # (section, dataset, row) -> [(spec, its unit's methods)]
    for key, spec in specs:
        groups[spec["section"], spec["dataset"], spec["protocol"]].append(
            (spec, dict(done[key]["methods"]))
        )
    out: dict[str, Any] = {"switches": dict(RELEASED_SWITCHES), "inputs": _inputs(data)}
    if "switches" in plan.parts:
        rows, identical = _switch_rows(plan, groups, defaults)
        out.update(rows=rows, default_rerun_identical=identical, schedule=_sweep(plan, groups))
    if "factors" in plan.parts:
        out["factors"] = _factor_rows(plan, groups)
    if "rules" in plan.parts:
        out["rules"] = _rule_results(plan, groups, chosen)
    out["released_mnist"] = _released_mnist(plan, groups, data)
    return out


def notes(results: dict[str, Any], store) -> list[str]:
    """Runs that stopped early, the default rows' identity check, resumed units."""
    out = [
        f"{dataset}: the re-run of condreg.immunize for the ridge-floor scoring did not reproduce "
        "the default experiment's RIR exactly"
        for dataset, same in results.get("default_rerun_identical", {}).items()
        if not same
    ]
    rows = [(r["dataset"], r) for r in results.get("rows", [])]
    rows += [(d, r) for d, rs in results.get("factors", {}).items() for r in rs]
    rows += [(d, r) for d, v in results.get("rules", {}).items() for r in v["variants"].values()]
    rows += [
        ("mnist raw", r) for r in (results.get("released_mnist") or {}).get("rows", {}).values()
    ]
    seen = set()
    for dataset, row in rows:
        for reason in row["stopped_early"]:
            text = f"{dataset}, {row['protocol']}: a run {reason}"
            if text not in seen:
                seen.add(text)
                out.append(text)
    return out + store.note("unit(s)")


def write(plan, settings, results, start: float, store) -> dict[str, Any]:
    """results.json, table.md, ranking.png, factored.png, step_rules.png, schedule.png."""
    from condreg_experiments.ablation import plots, tables

    notes_ = notes(results, store)
    quick = " (quick: not the full run)" if plan.quick else ""
    payload = rp.write_outputs(
        plan.out_dir,
        experiment="ablation",
        settings=settings,
        seeds=plan.seeds,
        results=results,
        start=start,
        bullets=False,
        notes=notes_,
        table=tables.table(plan, results, notes_),
        title=f"Ablation — condreg's protocol → the released code's{quick}",
    )
    plots.draw(plan, results)
    return payload
