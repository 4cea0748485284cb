"""The attack study's summary (per attacker, its searched configuration's deficit and steps to
target against the un-immunized model of the same seed; per attacker family the worst case), its
verdict per family, the search's edge count, table.md and figures."""

from __future__ import annotations

import collections
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from condreg.attacks import finetune_deficit, steps_to_target
from condreg_experiments import _report
from condreg_experiments.tamper.settings import Settings

__all__ = ["FAMILIES", "notes", "plots", "search_report", "summarise", "table", "timing"]
__all__ += ["title", "verdict"]

#: Attacker families of the verdict, weakest access first.
FAMILIES: dict[str, tuple[str, ...]] = {
    "Linear probe": ("linear_probe",),
    "Adaptive probe (whitened, least-squares start)": ("whitened_probe", "lstsq_probe"),
    "LoRA": ("lora_r8", "lora_r32"),
    "Block fine-tuning": ("finetune_block",),
    "Full fine-tuning": ("finetune_all",),
}

#: Each family's own problem: the tangent kernel (:func:`condreg.attacks.tangent_condition`)
#: of the parameters it trains — the head on the features, the block (LoRA trains a low-rank
#: update of the block's weights: its kernel is the block's, restricted), every parameter.
OWN_KAPPA: dict[str, str] = {
    "Linear probe": "probe",
    "Adaptive probe (whitened, least-squares start)": "probe",
    "LoRA": "block",
    "Block fine-tuning": "block",
    "Full fine-tuning": "all",
}

ATTACKER_LABELS = {
    "linear_probe": "linear probe",
    "whitened_probe": "whitened probe",
    "lstsq_probe": "lstsq-start probe",
    "lora_r8": "LoRA r8",
    "lora_r32": "LoRA r32",
    "finetune_block": "block FT",
    "finetune_all": "full FT",
}
OPT_LABELS = {"sgd": "SGD", "adamw": "AdamW"}
SCHED_LABELS = {"constant": "const", "warmup_cosine": "w+cos"}
DOMAIN_LABELS = {"same": "same domain (MNIST 5–9)", "cross": "cross domain (sklearn digits 5–9)"}
KAPPA_KINDS = ("probe", "block", "all")


def _label(m: str) -> str:
    return _report.METHOD_LABELS.get(m, m)


def _geomean(values: Sequence[float]) -> float:
    v = np.asarray(values, dtype=float)
    return float(np.exp(np.mean(np.log(v)))) if np.all(v > 0) else math.nan


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    """``mean_std`` with ``ci95``, the half-width of the 95 % Student-t interval of the mean
    (``t₀.₉₇₅,ₙ₋₁ · std / √n``; ``None`` for one value or a NaN)."""
    out = _report.mean_std(values)
    n = out["n"]
    if n < 2 or not math.isfinite(out["std"]):
        return {**out, "ci95": None}
    from scipy.stats import t

    return {**out, "ci95": float(t.ppf(0.975, n - 1) * out["std"] / math.sqrt(n))}


def fmt_ci(ms: dict, digits: int = 2) -> str:
    """``mean ± half-width`` (the 95 % interval), or the mean alone for one seed."""
    if ms["mean"] is None or math.isnan(ms["mean"]):
        return "n/a"
    text = f"{ms['mean']:.{digits}f}"
    return text + (f" ± {ms['ci95']:.{digits}f}" if ms.get("ci95") is not None else "")


def _deficit(run: dict, ref: dict, chance: float) -> float:
    """The deficit, NaN (undefined) where the identity itself never rose above chance."""
    try:
        return finetune_deficit(run["test_acc"], ref["test_acc"], run["steps"], chance=chance)
    except ValueError:
        return math.nan


def held_out_score(res: dict) -> float:
    """The held-out score the search chose ``res``'s configuration by (its full-budget run's
    mean held-out accuracy over the evaluation steps)."""
    budget = res["settings"]["steps"]
    for r in res["sweep"]:
        same = (r["optimizer"], r["schedule"], r["lr"]) == (
            res["optimizer"],
            res["schedule"],
            res["lr"],
        )
        if same and r["steps"] == budget:
            return float(r["val_area"])
    raise ValueError("the chosen configuration is not in its sweep")


def _config(res: dict) -> dict[str, Any]:
    st = res["settings"]
    out = {k: res[k] for k in ("optimizer", "schedule", "lr")}
    return out | {k: st[k] for k in ("stopped", "capped", "chosen_at_grid_edge")}


def _cell(runs: list[dict], refs: list[dict], chance: float, s: Settings) -> dict[str, Any]:
    """One (method, attacker) over the seeds, each against its seed's identity."""
    deficits = [_deficit(r, f, chance) for r, f in zip(runs, refs, strict=True)]
    reach = [
        steps_to_target(r["test_acc"], f["test_acc"][-1], r["steps"], s.target_fraction)
        for r, f in zip(runs, refs, strict=True)
    ]
    hit = [x for x in reach if x is not None]
    acc = np.asarray([r["test_acc"] for r in runs])
    return {
        "deficit": mean_ci(deficits),
        "held": bool(np.all(np.asarray(deficits) >= s.holds_at)),
        "steps_to_target": reach,
        "steps_median": float(np.median(hit)) if hit else None,
        "never": len(reach) - len(hit),
        "final_acc": _report.mean_std(acc[:, -1]),
        "curve": acc.mean(0).tolist(),
        "steps": runs[0]["steps"],
        "config": [_config(r) for r in runs],
    }


def _family(attacks: list[dict], refs: list[dict], members, chance, s: Settings) -> dict:
    """The family's worst case over the seeds: on each seed the attacker picks the member whose
    searched configuration scores best on held-out data — on the immunized model and on the
    identity alike — and the deficit is that pick's against the identity's pick."""
    picks, ref_picks, deficits = [], [], []
    for att, ref in zip(attacks, refs, strict=True):
        m = max(members, key=lambda a: held_out_score(att[a]))
        r = max(members, key=lambda a: held_out_score(ref[a]))
        picks.append(m)
        ref_picks.append(r)
        deficits.append(_deficit(att[m], ref[r], chance))
    return {
        "deficit": mean_ci(deficits),
        "held": bool(np.all(np.asarray(deficits) >= s.holds_at)),
        "attacker": picks,
        "reference_attacker": ref_picks,
        "config": [_config(a[m]) for a, m in zip(attacks, picks, strict=True)],
    }


def summarise(units: dict[str, dict], s: Settings, seeds: Sequence[int]) -> dict[str, Any]:
    """``{arch: {domain: {"chance", "n", "methods": {method: {measures, "tangent",
    "cells": {attacker: …}, "families": {family: …}}}}}}``."""
    out: dict[str, Any] = {}
    for arch in s.base.arch:
        out[arch] = {}
        for domain in s.domains:
            doms = [units[f"{arch.replace(':', '_')}-{domain}-seed{seed}"] for seed in seeds]
            chance = 1.0 / doms[0]["n_classes_h"]
            methods: dict[str, Any] = {}
            for m in s.base.methods:
                rows = [d["methods"][m] for d in doms if m in d["methods"]]
                if len(rows) < len(doms):
                    methods[m] = {"failed": [d["failed"].get(m) for d in doms]}
                    continue
                refs = [d["methods"]["identity"] for d in doms]
                attacks = [r["attacks"] for r in rows]
                ref_attacks = [f["attacks"] for f in refs]
                cells = {
                    a: _cell([x[a] for x in attacks], [f[a] for f in ref_attacks], chance, s)
                    for a in s.attackers
                }
                families = {
                    fam: _family(attacks, ref_attacks, present, chance, s)
                    for fam, members in FAMILIES.items()
                    if (present := [a for a in members if a in s.attackers])
                }
                tangent = {
                    d: {k: _geomean([r["tangent"][d][k] for r in rows]) for k in KAPPA_KINDS}
                    for d in ("h", "p")
                }
                per_seed = {k: [r[k] for r in rows] for k in ("rir_theta0", "i", "ii")}
                per_seed |= {
                    f"kappa_{k}": [r["tangent"]["h"][k] for r in rows] for k in KAPPA_KINDS
                }
                methods[m] = {
                    "acc_p_before": _report.mean_std([r["acc_p_before"] for r in rows]),
                    "acc_p_after": _report.mean_std([r["acc_p_after"] for r in rows]),
                    **{k: _geomean([r[k] for r in rows]) for k in ("rir_theta0", "i", "ii")},
                    "tangent": tangent,
                    "per_seed": per_seed,
                    "reg_step": [r["reg_step"] for r in rows],
                    "cells": cells,
                    "families": families,
                }
            out[arch][domain] = {"chance": chance, "methods": methods, "n": doms[0]["n"]}
    return out


def _families(summary: dict):
    """``(arch, domain, method, family, fcell, measures)`` of every immunized family cell."""
    for arch, by_domain in summary.items():
        for domain, dom in by_domain.items():
            for m, meas in dom["methods"].items():
                if m == "identity" or "families" not in meas:
                    continue
                for fam, fcell in meas["families"].items():
                    yield arch, domain, m, fam, fcell, meas


def _spearman(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def _kept_utility(meas: dict, s: Settings) -> bool:
    return meas["acc_p_after"]["mean"] >= meas["acc_p_before"]["mean"] - s.utility_drop


def verdict(summary: dict, s: Settings) -> dict[str, Any]:
    """Per attacker family: per method the (arch, domain) cells its worst case held (deficit ≥
    ``holds_at`` on every seed) while D_P accuracy was kept (within ``utility_drop``), and those
    held only by losing it; per (method, arch, domain) the worst-case deficit with its 95 %
    interval; the largest mean deficit among the methods that kept D_P, and where; the Spearman
    ρ of the per-seed deficit with log κ of the family's own problem (its tangent kernel on
    D_H), with log (i) and with log RIR_θ0."""
    out = {}
    for family in FAMILIES:
        rows = [c for c in _families(summary) if c[3] == family]
        if not rows:
            continue
        held: dict[str, dict[str, int]] = {}
        worst, xs, xi, xk, ys = [], [], [], [], []
        for arch, domain, m, _fam, fc, meas in rows:
            h = held.setdefault(m, {"held": 0, "held_losing_dp": 0, "cells": 0})
            h["cells"] += 1
            kept = _kept_utility(meas, s)
            if fc["held"]:
                h["held" if kept else "held_losing_dp"] += 1
            worst.append(
                {"arch": arch, "domain": domain, "method": m, "kept_dp": kept}
                | {k: fc["deficit"][k] for k in ("mean", "ci95", "values")}
            )
            own = meas["per_seed"][f"kappa_{OWN_KAPPA[family]}"]
            for k, d in enumerate(fc["deficit"]["values"]):
                if math.isnan(d):
                    continue
                xs.append(math.log(meas["per_seed"]["rir_theta0"][k]))
                xi.append(math.log(meas["per_seed"]["i"][k]))
                xk.append(math.log(own[k]))
                ys.append(d)
        kept_rows = [w for w in worst if w["kept_dp"] and not math.isnan(w["mean"])]
        top = max(kept_rows, key=lambda w: w["mean"]) if kept_rows else None
        out[family] = {
            "held": held,
            "worst_case": worst,
            "max_deficit": None if top is None else top["mean"],
            "max_deficit_ci95": None if top is None else top["ci95"],
            "max_at": None if top is None else {k: top[k] for k in ("arch", "domain", "method")},
            "own_kappa": OWN_KAPPA[family],
            "spearman_log_own_kappa": _spearman(xk, ys),
            "spearman_log_i": _spearman(xi, ys),
            "spearman_log_rir": _spearman(xs, ys),
            "n_points": len(ys),
        }
    return out


def search_report(units: dict[str, dict]) -> dict[str, Any]:
    """The searches' edge count: how many chosen configurations (and rate lines) ended at an
    edge of the rates tried, why (``diverged``, ``flat``, ``cap``), and every capped one by
    name; the runs they cost in full-budget equivalents."""
    chosen: collections.Counter = collections.Counter()
    lines: collections.Counter = collections.Counter()
    capped, capped_lines, cost = [], [], []
    n_lines = 0
    for key, u in sorted(units.items()):
        for m, rec in u["methods"].items():
            for a, res in rec["attacks"].items():
                st, name = res["settings"], f"{key}/{m}/{a}"
                chosen[st["stopped"]] += 1
                if st["capped"]:
                    capped.append(
                        f"{name} ({res['optimizer']}, {res['schedule']}, lr {res['lr']:g})"
                    )
                for ln in st["lines"]:
                    n_lines += 1
                    lines[ln["stopped"]] += 1
                    if ln["capped"]:
                        capped_lines.append(f"{name}: {ln['optimizer']}/{ln['schedule']}")
                cost.append(sum(r["steps"] for r in res["sweep"]) / st["steps"])
    n = sum(chosen.values())
    at_edge = sum(chosen[k] for k in ("diverged", "flat", "cap"))
    return {
        "searches": n,
        "chosen_at_edge": at_edge,
        "chosen_capped": len(capped),
        "chosen_stopped": dict(chosen),
        "capped": capped,
        "lines": n_lines,
        "lines_at_edge": sum(lines[k] for k in ("diverged", "flat", "cap")),
        "lines_capped": len(capped_lines),
        "lines_stopped": dict(lines),
        "capped_lines": capped_lines,
        "full_run_equivalents": {
            "mean": float(np.mean(cost)) if cost else None,
            "max": float(np.max(cost)) if cost else None,
        },
        "runs": sum(
            len(res["sweep"])
            for u in units.values()
            for rec in u["methods"].values()
            for res in rec["attacks"].values()
        ),
    }


def _verdict_lines(v: dict, s: Settings) -> list[str]:
    lines = []
    drop = f"{100 * s.utility_drop:g}"
    for family, f in v.items():
        held = f["held"]
        kept = [f"{_label(m)} {h['held']}/{h['cells']}" for m, h in held.items()]
        lost = [
            f"{_label(m)} {h['held_losing_dp']}" for m, h in held.items() if h["held_losing_dp"]
        ]
        n = max(h["cells"] for h in held.values())
        head = (
            f"held in {', '.join(kept)} cells"
            if any(h["held"] for h in held.values())
            else f"**held nowhere** (0 of {n} cells per method)"
        )
        extra = f"; held only by losing > {drop} points of D_P accuracy: {', '.join(lost)}"
        extra = extra if lost else ""
        at = f["max_at"]
        if at is None:
            top = f"no method kept D_P accuracy within {drop} points"
        else:
            ms = {"mean": f["max_deficit"], "ci95": f["max_deficit_ci95"]}
            top = (
                f"largest worst-case deficit with D_P kept {fmt_ci(ms)} "
                f"({_label(at['method'])}, {at['arch']}, {at['domain']} domain)"
            )
        rho = ", ".join(
            f"ρ(deficit, log {name}) = {_report.fmt_number(f[key], 2)}"
            for name, key in (
                (f"κ_{f['own_kappa']}", "spearman_log_own_kappa"),
                ("(i)", "spearman_log_i"),
                ("RIR_θ0", "spearman_log_rir"),
            )
        )
        lines.append(
            f"- **{family}**: {head}{extra}. The {top}; Spearman {rho} over {f['n_points']} "
            "immunized runs."
        )
    return lines


def _deficit_text(cell: dict) -> str:
    text = fmt_ci(cell["deficit"])
    return f"**{text}**" if cell["held"] else text


def _steps_text(cell: dict, budget: int) -> str:
    n = len(cell["steps_to_target"])
    if cell["steps_median"] is None:
        return f"> {budget} (0/{n})"
    return f"{cell['steps_median']:g} ({n - cell['never']}/{n})"


def _pct(ms: dict) -> str:
    return f"{100 * ms['mean']:.1f}" + (f" ± {100 * ms['std']:.1f}" if ms["n"] > 1 else "")


def _tables(summary: dict, s: Settings) -> list[str]:
    names = [ATTACKER_LABELS[a] for a in s.attackers]
    fams = [f for f in FAMILIES if any(a in s.attackers for a in FAMILIES[f])]
    out = []
    for arch, by_domain in summary.items():
        for domain, dom in by_domain.items():
            where = f"{arch}, {DOMAIN_LABELS[domain]}"
            head = ["method", "D_P acc % before → after", "RIR_θ0", "(i)", "(ii)", *fams]
            frows, rows, srows, krows = [], [], [], []
            for m, meas in dom["methods"].items():
                if "cells" not in meas:
                    frows.append([_label(m), "failed", *[""] * (len(head) - 2)])
                    continue
                lost = "" if _kept_utility(meas, s) else " (lost)"
                acc = f"{_pct(meas['acc_p_before'])} → {_pct(meas['acc_p_after'])}{lost}"
                kap = [_report.fmt_number(meas[k], 3) for k in ("rir_theta0", "i", "ii")]
                fam = [_deficit_text(meas["families"][f]) for f in fams]
                frows.append([_label(m), acc, *kap, *fam])
                rows.append([_label(m), *[_deficit_text(meas["cells"][a]) for a in s.attackers]])
                srows.append(
                    [
                        _label(m),
                        *[_steps_text(meas["cells"][a], s.attack_steps) for a in s.attackers],
                    ]
                )
                tg = meas["tangent"]
                krows.append(
                    [
                        _label(m),
                        *[_report.fmt_number(tg[d][k], 3) for d in "hp" for k in KAPPA_KINDS],
                    ]
                )
            out.append(
                _report.section(
                    f"{where}: worst case per attacker family (deficit, mean ± 95 % interval)",
                    head,
                    frows,
                )
            )
            out.append(
                _report.section(
                    f"{where}: deficit per attacker at its searched configuration",
                    ["method", *names],
                    rows,
                )
            )
            title = (
                f"{where}: steps to {100 * s.target_fraction:g} % of the identity's final accuracy "
                "(median over the seeds that reach it)"
            )
            out.append(_report.section(title, ["method", *names], srows))
            khead = ["method", *[f"κ_{k} on {d}" for d in ("D_H", "D_P") for k in KAPPA_KINDS]]
            out.append(
                _report.section(
                    f"{where}: κ of the empirical tangent kernel (geometric mean over the seeds; "
                    "identity = before immunization)",
                    khead,
                    krows,
                )
            )
    return out


def timing(units: dict[str, dict], done) -> dict[str, Any]:
    """The runner's timing (``done``), with the number of searches."""
    attacks = [
        a for u in units.values() for m in u["methods"].values() for a in m["attacks"].values()
    ]
    return done.timing(attacks=len(attacks))


def table(
    summary: dict,
    s: Settings,
    seeds: Sequence[int],
    *,
    quick: bool,
    timing_: dict[str, Any],
    search: dict[str, Any],
) -> str:
    """table.md: the verdict per attacker family first, the search, then the matrices."""
    paras = []
    if quick:
        paras.append(
            "**Quick run: a smoke test of the pipeline, not the study** (1 seed, short budgets, "
            "a small search)."
        )
    paras.append(
        f"What held, per attacker family — a cell (arch × domain) is held when the family's "
        f"worst-case deficit is ≥ {s.holds_at:g} on every seed and the method kept D_P accuracy "
        f"within {100 * s.utility_drop:g} points:"
    )
    paras.append("\n".join(_verdict_lines(verdict(summary, s), s)))
    grids = "; ".join(f"{OPT_LABELS[o]} {[f'{g:.3g}' for g in s.grids()[o]]}" for o in s.optimizers)
    paras.append(
        f"Deficit = 1 − ∫(acc − chance) / ∫(acc_identity − chance) over the budget of "
        f"{s.attack_steps} steps (batch {s.attack_batch}, evaluated every {s.eval_every}), "
        f"against the un-immunized extractor of the same seed under the same search "
        f"(0 = no protection, 1 = stuck at chance; **bold** = ≥ {s.holds_at:g} on every seed); "
        f"mean ± the 95 % Student-t interval over seeds {list(seeds)}. Every attacker's "
        f"optimizer × schedule ({', '.join(s.schedules)}) × rate is found by "
        f"`condreg.attacks.finetune_search` on {100 * s.attack_val_fraction:g} % of D_H's "
        f"training split held out: starting grids {grids}, extended by their step beyond an "
        f"edge (at most {s.max_extend} rates per side); successive halving: every configuration "
        f"for {s.rung1_steps} steps, the best {s.keep} for the full budget. A family's worst "
        "case: on each seed, its member whose searched configuration scores best on held-out "
        "data, against the identity's pick. RIR_θ0, (i), (ii), κ: geometric means over the "
        "seeds. Immunization step: each method's largest swept step keeping D_P validation "
        "accuracy (D_P only)."
    )
    sr, t = search, timing_
    capped = "; ".join(sr["capped"]) or "none"
    paras.append(
        f"The search: {sr['searches']} searches, {sr['runs']} runs "
        f"({_report.fmt_number(sr['full_run_equivalents']['mean'], 3)} full-budget runs each on "
        f"average). Chosen configurations at an edge of the rates tried: "
        f"{sr['chosen_at_edge']} of {sr['searches']} (stopped: {sr['chosen_stopped']}); capped: "
        f"{sr['chosen_capped']} ({capped}). Rate lines at an edge: {sr['lines_at_edge']} of "
        f"{sr['lines']}, capped {sr['lines_capped']}. The {t['units_computed']} unit(s) computed "
        f"now took {t['units_cpu_s']:.0f} CPU-s ({t['units_seconds']:.0f} s of wall time in "
        f"their workers), {t['compute_wall_s']:.0f} s wall on {t['jobs']} worker(s); "
        f"{t['units_resumed']} unit(s) kept by --resume."
    )
    return "\n\n".join(paras + _tables(summary, s))


def title(quick: bool) -> str:
    """table.md's title."""
    return "Fine-tuning attacks on immunized deep nets" + (" — quick" if quick else "")


def notes(s: Settings) -> list[str]:
    """The study's caveats (results.json)."""
    return [
        "LoRA's own problem is measured by the block's tangent kernel (κ_block): LoRA trains a "
        "low-rank update of the block's weights, and its adapters' kernel at their zero start is "
        "a restriction of the block's.",
        "κ of the tangent kernels is measured at the weights before the attack, with the "
        "squared-loss linearization (condreg.attacks.tangent_condition states its limits).",
        "The attackers that freeze the stem (all but full fine-tuning) run on its cached outputs: "
        "the same computation as through the whole extractor in eval mode.",
        "A rate whose mini-batch or evaluation loss stops being finite keeps its last finite "
        "evaluation for the rest of the budget (the attacker keeps its last good checkpoint).",
    ]


def _heatmap(out_dir: pathlib.Path, summary: dict, s: Settings) -> pathlib.Path:
    from matplotlib.colors import TwoSlopeNorm

    panels = [(a, d) for a in summary for d in summary[a]]
    fams = [f for f in FAMILIES if any(a in s.attackers for a in FAMILIES[f])]
    fig, axes = _report.new_figure(
        len(panels), 1, figsize=(2.0 * len(fams) + 3.0, 2.9 * len(panels)), squeeze=False
    )
    methods = list(s.base.methods)
    norm = TwoSlopeNorm(vmin=-0.5, vcenter=0.0, vmax=1.0)
    image = None
    for ax, (arch, domain) in zip(axes.flat, panels, strict=True):
        dom = summary[arch][domain]["methods"]
        grid = np.full((len(methods), len(fams)), np.nan)
        for i, m in enumerate(methods):
            for j, f in enumerate(fams):
                fc = dom.get(m, {}).get("families", {}).get(f)
                if fc is None:
                    continue
                grid[i, j] = fc["deficit"]["mean"]
                mark = " ✓" if fc["held"] and m != "identity" else ""
                ci = fc["deficit"]["ci95"]
                text = "n/a" if math.isnan(grid[i, j]) else f"{grid[i, j]:.2f}{mark}"
                text += f"\n±{ci:.2f}" if ci is not None and not math.isnan(grid[i, j]) else ""
                dark = not math.isnan(grid[i, j]) and not -0.3 < grid[i, j] < 0.6
                ax.text(
                    j, i, text, ha="center", va="center", fontsize=7, color="w" if dark else "k"
                )
        image = ax.imshow(np.clip(grid, -0.5, 1.0), cmap="RdBu_r", norm=norm, aspect="auto")
        ax.set_xticks(range(len(fams)), [f.split(" (")[0] for f in fams])
        lost = {m for m in methods if "cells" in dom.get(m, {}) and not _kept_utility(dom[m], s)}
        ax.set_yticks(range(len(methods)), [_label(m) + " †" * (m in lost) for m in methods])
        ax.tick_params(axis="x", labelsize=8, rotation=15)
        ax.set_title(f"{arch}, {domain} domain", fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.6, label="worst-case deficit (0 = no protection)")
    fig.suptitle(
        f"Worst-case fine-tuning deficit per family (mean ± 95 % interval; red = protected);\n"
        f"✓ = ≥ {s.holds_at:g} on every seed; † = the method lost > {100 * s.utility_drop:g} "
        "points of D_P accuracy",
        fontsize=10,
    )
    return _report.save_figure(fig, out_dir / "deficit_heatmap.png")


def _grid_axes(summary: dict, s: Settings):
    rows = [(a, d) for a in summary for d in summary[a]]
    fig, axes = _report.new_figure(
        len(rows),
        len(s.attackers),
        figsize=(3.0 * len(s.attackers), 2.7 * len(rows)),
        squeeze=False,
    )
    return rows, fig, axes


def _curves(out_dir: pathlib.Path, summary: dict, s: Settings) -> pathlib.Path:
    rows, fig, axes = _grid_axes(summary, s)
    for r, (arch, domain) in enumerate(rows):
        dom = summary[arch][domain]
        for c, a in enumerate(s.attackers):
            ax = axes[r, c]
            for m, meas in dom["methods"].items():
                cell = meas.get("cells", {}).get(a)
                if cell is not None:
                    ax.plot(
                        cell["steps"],
                        100 * np.asarray(cell["curve"]),
                        color=_report.METHOD_COLORS.get(m),
                        label=_label(m),
                        lw=2.2 if m in ("identity", "condreg") else 1.2,
                    )
            ax.axhline(100 * dom["chance"], color="k", ls=":", lw=0.8)
            ax.set_title(f"{arch}, {domain}: {ATTACKER_LABELS[a]}", fontsize=9)
            ax.set(xlabel="attack step", ylabel="D_H test acc. %" if c == 0 else None)
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(
        "Harmful-task accuracy under attack at each searched configuration (mean over seeds; "
        "dotted: chance)"
    )
    return _report.save_figure(fig, out_dir / "attack_curves.png")


def best_so_far(res: dict) -> list[float]:
    """The running maximum of the held-out accuracy at the end of each run (whatever its
    budget), in the order the search tried the configurations."""
    vals = [r["val_final"] if r["val_final"] is not None else 0.0 for r in res["sweep"]]
    return np.maximum.accumulate(np.asarray(vals, dtype=float)).tolist()


def _best_so_far(out_dir: pathlib.Path, units: dict, summary: dict, s: Settings, seeds):
    rows, fig, axes = _grid_axes(summary, s)
    for r, (arch, domain) in enumerate(rows):
        us = [units[f"{arch.replace(':', '_')}-{domain}-seed{x}"] for x in seeds]
        for c, a in enumerate(s.attackers):
            ax = axes[r, c]
            for m in s.base.methods:
                curves = [
                    best_so_far(u["methods"][m]["attacks"][a]) for u in us if m in u["methods"]
                ]
                if not curves:
                    continue
                n = max(len(v) for v in curves)
                padded = np.asarray([v + [v[-1]] * (n - len(v)) for v in curves])
                ax.plot(
                    np.arange(1, n + 1),
                    100 * padded.mean(0),
                    color=_report.METHOD_COLORS.get(m),
                    label=_label(m) + (" (reference)" if m == "identity" else ""),
                    lw=2.2 if m in ("identity", "condreg") else 1.2,
                    ls="--" if m == "identity" else "-",
                )
            ax.set_title(f"{arch}, {domain}: {ATTACKER_LABELS[a]}", fontsize=9)
            ax.set(
                xlabel="configurations tried",
                ylabel="best held-out D_H acc. %" if c == 0 else None,
            )
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(
        "Best held-out harmful accuracy against configurations tried (mean over seeds; the "
        f"first runs are {s.rung1_steps}-step, the last {s.keep}+ the full {s.attack_steps})"
    )
    return _report.save_figure(fig, out_dir / "best_so_far.png")


def _scatter(out_dir: pathlib.Path, summary: dict, s: Settings) -> pathlib.Path:
    from matplotlib.ticker import NullFormatter

    fams = [f for f in FAMILIES if any(a in s.attackers for a in FAMILIES[f])]
    fig, axes = _report.new_figure(1, len(fams), figsize=(3.6 * len(fams), 3.4), squeeze=False)
    for ax, family in zip(axes[0], fams, strict=True):
        kind = OWN_KAPPA[family]
        for _, _, m, fam, fc, meas in _families(summary):
            if fam == family:
                ax.scatter(
                    meas["per_seed"][f"kappa_{kind}"],
                    fc["deficit"]["values"],
                    s=12,
                    color=_report.METHOD_COLORS.get(m),
                    alpha=0.7,
                )
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on a short range
        ax.axhline(0, color="k", lw=0.8)
        ax.set(title=family.split(" (")[0], xlabel=f"κ_{kind} on D_H (log)", ylabel="deficit")
        ax.grid(alpha=0.3)
    for m in s.base.methods:
        if m != "identity":
            axes[0, 0].scatter([], [], color=_report.METHOD_COLORS.get(m), label=_label(m))
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(
        "Does the attacker's own κ predict the deficit? One point per (model, family, seed)"
    )
    return _report.save_figure(fig, out_dir / "kappa_vs_deficit.png")


def plots(out_dir, units, summary: dict, s: Settings, seeds) -> list[pathlib.Path]:
    """deficit_heatmap.png, attack_curves.png, best_so_far.png, kappa_vs_deficit.png."""
    out_dir = pathlib.Path(out_dir)
    paths = [_heatmap(out_dir, summary, s), _curves(out_dir, summary, s)]
    return paths + [_best_so_far(out_dir, units, summary, s, seeds), _scatter(out_dir, summary, s)]
