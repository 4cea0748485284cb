"""The attack study's summary (deficits and steps to target against the un-immunized model of the
same seed), its verdict per attacker family, table.md and figures."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from condreg.attacks import finetune_deficit, steps_to_target
from condreg_experiments import _report
from condreg_experiments.tamper.settings import Settings

__all__ = ["FAMILIES", "notes", "plots", "summarise", "table", "timing", "title", "verdict"]

#: Attacker families of the verdict, weakest access first.
FAMILIES: dict[str, tuple[str, ...]] = {
    "Linear probe": ("linear_probe",),
    "LoRA (r 8, 32)": ("lora_r8", "lora_r32"),
    "Block fine-tuning": ("finetune_block",),
    "Full fine-tuning": ("finetune_all",),
}

ATTACKER_LABELS = {
    "linear_probe": "linear probe",
    "lora_r8": "LoRA r8",
    "lora_r32": "LoRA r32",
    "finetune_block": "block FT",
    "finetune_all": "full FT",
}
OPT_LABELS = {"sgd": "SGD", "adamw": "AdamW"}
DOMAIN_LABELS = {"same": "same domain (MNIST 5–9)", "cross": "cross domain (sklearn digits 5–9)"}


def _label(m: str) -> str:
    return _report.METHOD_LABELS.get(m, m)


def _geomean(values: Sequence[float]) -> float:
    v = np.asarray(values, dtype=float)
    return float(np.exp(np.mean(np.log(v)))) if np.all(v > 0) else math.nan


def _deficit(run: dict, ref: dict, chance: float) -> float:
    """The deficit, NaN (undefined) where the identity itself never rose above chance."""
    try:
        return finetune_deficit(run["test_acc"], ref["test_acc"], run["steps"], chance=chance)
    except ValueError:
        return math.nan


def _cell(runs: list[dict], refs: list[dict], chance: float, s: Settings) -> dict[str, Any]:
    """One (method, attacker, optimizer) over the seeds, each against its seed's identity."""
    deficits = [_deficit(r, f, chance) for r, f in zip(runs, refs, strict=True)]
    reach = [
        steps_to_target(r["test_acc"], f["test_acc"][-1], r["steps"], s.target_fraction)
        for r, f in zip(runs, refs, strict=True)
    ]
    hit = [x for x in reach if x is not None]
    acc = np.asarray([r["test_acc"] for r in runs])
    return {
        "deficit": _report.mean_std(deficits),
        "held": bool(np.all(np.asarray(deficits) >= s.holds_at)),
        "steps_to_target": reach,
        "steps_median": float(np.median(hit)) if hit else None,
        "never": len(reach) - len(hit),
        "final_acc": _report.mean_std(acc[:, -1]),
        "curve": acc.mean(0).tolist(),
        "steps": runs[0]["steps"],
        "lr": [r["lr"] for r in runs],
        "lr_at_grid_edge": sum(bool(r["settings"].get("chosen_at_grid_edge")) for r in runs),
    }


def summarise(units: dict[str, dict], s: Settings, seeds: Sequence[int]) -> dict[str, Any]:
    """``{arch: {domain: {"chance", "methods": {method: {measures, "cells": {cell: …}}}}}}``."""
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
                cells = {
                    c: _cell(
                        [r["attacks"][c] for r in rows], [f["attacks"][c] for f in refs], chance, s
                    )
                    for c in rows[0]["attacks"]
                }
                methods[m] = {
                    "acc_p_before": _report.mean_std([r["acc_p_before"] for r in rows]),
                    "acc_p_after": _report.mean_std([r["acc_p_after"] for r in rows]),
                    **{k: _geomean([r[k] for r in rows]) for k in ("rir_theta0", "i", "ii")},
                    "per_seed": {k: [r[k] for r in rows] for k in ("rir_theta0", "i", "ii")},
                    "reg_step": [r["reg_step"] for r in rows],
                    "cells": cells,
                }
            out[arch][domain] = {"chance": chance, "methods": methods, "n": doms[0]["n"]}
    return out


def _cells(summary: dict, s: Settings):
    """``(arch, domain, method, attacker, optimizer, cell, measures)`` of every immunized cell."""
    for arch, by_domain in summary.items():
        for domain, dom in by_domain.items():
            for m, meas in dom["methods"].items():
                if m == "identity" or "cells" not in meas:
                    continue
                for key, cell in meas["cells"].items():
                    attacker, optimizer = key.split("/")
                    yield arch, domain, m, attacker, optimizer, cell, meas


def _spearman(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


_WHERE = ("arch", "domain", "method", "attacker", "optimizer")


def _kept_utility(meas: dict, s: Settings) -> bool:
    return meas["acc_p_after"]["mean"] >= meas["acc_p_before"]["mean"] - s.utility_drop


def verdict(summary: dict, s: Settings) -> dict[str, Any]:
    """Per attacker family: per method the cells held (deficit ≥ ``holds_at`` on every seed)
    while D_P accuracy was kept (within ``utility_drop``) and those held only by losing it; the
    largest mean deficit and where; the Spearman ρ of the per-seed deficit with log RIR_θ0 and
    with log (i) (κ on D_H)."""
    out = {}
    for family, members in FAMILIES.items():
        rows = [c for c in _cells(summary, s) if c[3] in members]
        if not rows:
            continue
        held = {m: {"held": 0, "held_losing_dp": 0, "cells": 0} for m in s.base.methods}
        xs, xi, ys = [], [], []
        for *_, m, _att, _opt, cell, meas in rows:
            h = held[m]
            h["cells"] += 1
            if cell["held"]:
                h["held" if _kept_utility(meas, s) else "held_losing_dp"] += 1
            for k, d in enumerate(cell["deficit"]["values"]):
                if math.isnan(d):
                    continue
                xs.append(math.log(meas["per_seed"]["rir_theta0"][k]))
                xi.append(math.log(meas["per_seed"]["i"][k]))
                ys.append(d)
        top = max(rows, key=lambda c: np.nan_to_num(c[5]["deficit"]["mean"], nan=-np.inf))
        out[family] = {
            "held": {m: h for m, h in held.items() if h["cells"]},
            "max_deficit": top[5]["deficit"]["mean"],
            "max_at": dict(zip(_WHERE, top[:5], strict=True)),
            "spearman_log_rir": _spearman(xs, ys),
            "spearman_log_i": _spearman(xi, ys),
            "n_points": len(ys),
        }
    return out


def _verdict_lines(v: dict, s: Settings) -> list[str]:
    lines = []
    for family, f in v.items():
        held = f["held"]
        immunized = {m: h for m, h in held.items() if m != "identity"}
        kept = [f"{_label(m)} {h['held']}/{h['cells']}" for m, h in immunized.items()]
        lost = [
            f"{_label(m)} {h['held_losing_dp']}" for m, h in held.items() if h["held_losing_dp"]
        ]
        n = max(h["cells"] for h in held.values())
        head = (
            f"held in {', '.join(kept)} cells"
            if any(h["held"] for h in immunized.values())
            else f"**held nowhere** (0 of {n} cells per method)"
        )
        drop = f"{100 * s.utility_drop:g}"
        extra = f"; held only by losing > {drop} points of D_P accuracy: {', '.join(lost)}"
        extra = extra if lost else ""
        at = f["max_at"]
        where = (
            f"{_label(at['method'])}, {at['arch']}, {at['domain']} domain, "
            f"{ATTACKER_LABELS[at['attacker']]}, {OPT_LABELS[at['optimizer']]}"
        )
        lines.append(
            f"- **{family}**: {head}{extra}. Largest mean deficit {f['max_deficit']:.2f} "
            f"({where}); "
            f"Spearman ρ(deficit, log RIR_θ0) = {_report.fmt_number(f['spearman_log_rir'], 2)}, "
            f"ρ(deficit, log (i)) = {_report.fmt_number(f['spearman_log_i'], 2)} over "
            f"{f['n_points']} immunized runs."
        )
    return lines


def _deficit_text(cell: dict) -> str:
    text = _report.fmt_mean_std(cell["deficit"], 2)
    return f"**{text}**" if cell["held"] else text


def _steps_text(cell: dict, budget: int) -> str:
    n = len(cell["steps_to_target"])
    if cell["steps_median"] is None:
        return f"> {budget} (0/{n})"
    return f"{cell['steps_median']:g} ({n - cell['never']}/{n})"


def _pct(ms: dict) -> str:
    return f"{100 * ms['mean']:.1f}" + (f" ± {100 * ms['std']:.1f}" if ms["n"] > 1 else "")


def _tables(summary: dict, s: Settings) -> list[str]:
    keys = [f"{a}/{o}" for a in s.attackers for o in s.optimizers]
    names = [f"{ATTACKER_LABELS[k.split('/')[0]]} {OPT_LABELS[k.split('/')[1]]}" for k in keys]
    out = []
    for arch, by_domain in summary.items():
        for domain, dom in by_domain.items():
            head = ["method", "D_P acc % before → after", "RIR_θ0", "(i)", "(ii)", *names]
            rows, srows = [], []
            for m, meas in dom["methods"].items():
                if "cells" not in meas:
                    rows.append([_label(m), "failed", *[""] * (len(head) - 2)])
                    continue
                lost = "" if _kept_utility(meas, s) else " (lost)"
                acc = f"{_pct(meas['acc_p_before'])} → {_pct(meas['acc_p_after'])}{lost}"
                kap = [_report.fmt_number(meas[k], 3) for k in ("rir_theta0", "i", "ii")]
                rows.append(
                    [_label(m), acc, *kap, *[_deficit_text(meas["cells"][k]) for k in keys]]
                )
                srows.append(
                    [_label(m), *[_steps_text(meas["cells"][k], s.attack_steps) for k in keys]]
                )
            where = f"{arch}, {DOMAIN_LABELS[domain]}"
            out.append(_report.section(f"{where}: fine-tuning deficit (mean ± std)", head, rows))
            title = (
                f"{where}: steps to {100 * s.target_fraction:g} % of the identity's final accuracy "
                "(median over the seeds that reach it)"
            )
            out.append(_report.section(title, ["method", *names], srows))
    return out


def timing(units: dict[str, dict], done) -> dict[str, Any]:
    """The runner's timing (``done``), with how many rates were chosen at an edge of their
    grid."""
    attacks = [
        a for u in units.values() for m in u["methods"].values() for a in m["attacks"].values()
    ]
    edge = sum(bool(a["settings"].get("chosen_at_grid_edge")) for a in attacks)
    return done.timing(attacks=len(attacks), rate_at_grid_edge=edge)


def table(
    summary: dict, s: Settings, seeds: Sequence[int], *, quick: bool, timing_: dict[str, Any]
) -> str:
    """table.md: the verdict per attacker family first, then the matrices."""
    paras = []
    if quick:
        paras.append(
            "**Quick run: a smoke test of the pipeline, not the study** (1 seed, short budgets, "
            "2-rate sweeps, so every chosen rate is at an edge of its grid)."
        )
    paras.append(
        f"What held, per attacker family — a cell (arch × domain × attacker × optimizer) is held "
        f"when the deficit is ≥ {s.holds_at:g} on every seed and the method kept D_P accuracy "
        f"within {100 * s.utility_drop:g} points:"
    )
    paras.append("\n".join(_verdict_lines(verdict(summary, s), s)))
    used = {
        (a.split("_r")[0] if a.startswith("lora") else a, o): s.grid(a, o)
        for a in s.attackers
        for o in s.optimizers
    }
    grids = "; ".join(f"{a} {OPT_LABELS[o]} {list(g)}" for (a, o), g in used.items())
    paras.append(
        f"Deficit = 1 − ∫(acc − chance) / ∫(acc_identity − chance) over the budget of "
        f"{s.attack_steps} steps (batch {s.attack_batch}, evaluated every {s.eval_every}), "
        f"against the un-immunized extractor of the same seed under the same attacker "
        f"(0 = no protection, 1 = stuck at chance; **bold** = ≥ {s.holds_at:g} on every seed). "
        f"Each attacker's learning rate is swept per model on {100 * s.attack_val_fraction:g} % "
        f"of D_H's training split held out ({grids}); the same grid and budget for every "
        f"method. Seeds {list(seeds)}. RIR_θ0, (i), (ii): geometric means over the seeds. "
        "Immunization step: each method's largest swept step keeping D_P validation accuracy "
        "(D_P only)."
    )
    t = timing_
    paras.append(
        f"Rates chosen at an edge of their grid: {t['rate_at_grid_edge']} of {t['attacks']} "
        f"attacks. The {t['units_computed']} unit(s) computed now took {t['units_cpu_s']:.0f} "
        f"CPU-s ({t['units_seconds']:.0f} s of wall time in their workers), "
        f"{t['compute_wall_s']:.0f} s wall on {t['jobs']} worker(s); {t['units_resumed']} "
        "unit(s) kept by --resume."
    )
    return "\n\n".join(paras + _tables(summary, s))


def title(quick: bool) -> str:
    """table.md's title."""
    return "Fine-tuning attacks on immunized deep nets" + (" — quick" if quick else "")


def notes(s: Settings) -> list[str]:
    """The study's caveats (results.json)."""
    return [
        "The attackers that freeze the stem (all but full fine-tuning) run on its cached outputs: "
        "the same computation as through the whole extractor in eval mode.",
        "A rate whose mini-batch or evaluation loss stops being finite keeps its last finite "
        "evaluation for the rest of the budget (the attacker keeps its last good checkpoint).",
    ]


def _heatmap(out_dir: pathlib.Path, summary: dict, s: Settings) -> pathlib.Path:
    from matplotlib.colors import TwoSlopeNorm

    panels = [(a, d, o) for a in summary for d in summary[a] for o in s.optimizers]
    ncols = len(s.optimizers)
    nrows = len(panels) // ncols
    fig, axes = _report.new_figure(nrows, ncols, figsize=(5.2 * ncols, 3.1 * nrows), squeeze=False)
    methods = list(s.base.methods)
    norm = TwoSlopeNorm(vmin=-0.5, vcenter=0.0, vmax=1.0)
    for ax, (arch, domain, o) in zip(axes.flat, panels, strict=True):
        dom = summary[arch][domain]["methods"]
        grid = np.full((len(methods), len(s.attackers)), np.nan)
        for i, m in enumerate(methods):
            for j, a in enumerate(s.attackers):
                cell = dom.get(m, {}).get("cells", {}).get(f"{a}/{o}")
                if cell is None:
                    continue
                grid[i, j] = cell["deficit"]["mean"]
                mark = " ✓" if cell["held"] and m != "identity" else ""
                text = "n/a" if math.isnan(grid[i, j]) else f"{grid[i, j]:.2f}{mark}"
                ax.text(j, i, text, ha="center", va="center", fontsize=8)
        image = ax.imshow(np.clip(grid, -0.5, 1.0), cmap="RdBu_r", norm=norm, aspect="auto")
        ax.set_xticks(range(len(s.attackers)), [ATTACKER_LABELS[a] for a in s.attackers])
        lost = {m for m in methods if "cells" in dom.get(m, {}) and not _kept_utility(dom[m], s)}
        ax.set_yticks(range(len(methods)), [_label(m) + " †" * (m in lost) for m in methods])
        ax.tick_params(axis="x", labelsize=8, rotation=20)
        ax.set_title(f"{arch}, {domain} domain, {OPT_LABELS[o]}", fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.6, label="fine-tuning deficit (0 = no protection)")
    fig.suptitle(
        f"Fine-tuning deficit (red = protected); ✓ = ≥ {s.holds_at:g} on every seed; "
        f"† = the method lost > {100 * s.utility_drop:g} points of D_P accuracy"
    )
    return _report.save_figure(fig, out_dir / "deficit_heatmap.png")


def _curves(out_dir: pathlib.Path, summary: dict, s: Settings, optimizer: str) -> pathlib.Path:
    rows = [(a, d) for a in summary for d in summary[a]]
    fig, axes = _report.new_figure(
        len(rows),
        len(s.attackers),
        figsize=(3.4 * len(s.attackers), 2.9 * len(rows)),
        squeeze=False,
    )
    for r, (arch, domain) in enumerate(rows):
        dom = summary[arch][domain]
        for c, a in enumerate(s.attackers):
            ax = axes[r, c]
            for m, meas in dom["methods"].items():
                cell = meas.get("cells", {}).get(f"{a}/{optimizer}")
                if cell is not None:
                    color = _report.METHOD_COLORS.get(m)
                    ax.plot(
                        cell["steps"],
                        100 * np.asarray(cell["curve"]),
                        color=color,
                        label=_label(m),
                        lw=2.2 if m in ("identity", "condreg") else 1.2,
                    )
            ax.axhline(100 * dom["chance"], color="k", ls=":", lw=0.8)
            ax.set_title(f"{arch}, {domain}: {ATTACKER_LABELS[a]}", fontsize=9)
            ax.set(xlabel="attack step", ylabel="D_H test acc. %" if c == 0 else None)
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(
        f"Harmful-task accuracy under attack ({OPT_LABELS[optimizer]}, mean over seeds; "
        "dotted: chance)"
    )
    return _report.save_figure(fig, out_dir / f"attack_curves_{optimizer}.png")


def _scatter(out_dir: pathlib.Path, summary: dict, s: Settings) -> pathlib.Path:
    fig, axes = _report.new_figure(
        1, len(FAMILIES), figsize=(4.0 * len(FAMILIES), 3.4), squeeze=False
    )
    for ax, (family, members) in zip(axes[0], FAMILIES.items(), strict=True):
        for _, _, m, att, _, cell, meas in _cells(summary, s):
            if att in members:
                ax.scatter(
                    meas["per_seed"]["rir_theta0"],
                    cell["deficit"]["values"],
                    s=12,
                    color=_report.METHOD_COLORS.get(m),
                    alpha=0.7,
                )
        ax.set_xscale("log")
        ax.axhline(0, color="k", lw=0.8)
        ax.set(title=family, xlabel="RIR_θ0 (log)", ylabel="deficit")
        ax.grid(alpha=0.3)
    for m in s.base.methods:
        if m != "identity":
            axes[0, 0].scatter([], [], color=_report.METHOD_COLORS.get(m), label=_label(m))
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Does κ predict the deficit? One point per (model, attack, seed)")
    return _report.save_figure(fig, out_dir / "kappa_vs_deficit.png")


def plots(out_dir, units, summary: dict, s: Settings, seeds) -> list[pathlib.Path]:
    """deficit_heatmap.png, attack_curves_<optimizer>.png, kappa_vs_deficit.png."""
    out_dir = pathlib.Path(out_dir)
    paths = [_heatmap(out_dir, summary, s)]
    paths += [_curves(out_dir, summary, s, o) for o in s.optimizers]
    return paths + [_scatter(out_dir, summary, s)]
