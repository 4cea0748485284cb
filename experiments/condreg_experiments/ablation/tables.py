"""table.md of the ablation: one line per (row, method) with (i), (ii), RIR (geometric means and
medians), successes at three (i) thresholds and three rank tolerances, under both κ's."""

from __future__ import annotations

import math
from typing import Any

from condreg_experiments import _report as rp
from condreg_experiments.ablation import LABELS, METHODS
from condreg_experiments.ablation import factors as fc

TITLES = {"house": "House prices (Table 1)", "mnist": "MNIST digit pairs (Table 2)"}

_LEGEND = (
    "Each line: one method in one row, over its runs (n = seeds × pairs). RIR, (i) = κ(H_H)/κ(K_H) "
    "and (ii) = κ(H_P)/κ(K_P) are geometric means over the runs (RIR's median in brackets), κ over "
    "the nonzero singular values at the run's rank tolerance. Successes: (ii) ≤ 1 and (i) > 1, "
    "≥ 2, ≥ 10 (Definition 3.1 (a) asks (i) ≫ 1); then (i) > 1 at 10× and 100× the rank "
    "tolerance; then the RIR and (i) > 1 successes by the released ridge-floor κ. Last column: "
    "runs on which Ours' RIR exceeds Opt κ's (nonzero κ)."
)


def _f(x: float | None, digits: int = 3) -> str:
    return rp.fmt_number(x, digits)


def _counts(s: dict[str, Any]) -> str:
    return ", ".join(f"{s['successes_by_i'][k]}/{s['n']}" for k in rp.I_THRESHOLDS)


def _rtol_counts(s: dict[str, Any]) -> str:
    return ", ".join(f"{s['successes_by_rtol'][f'{f}x']}/{s['n']}" for f in (10, 100))


def _lines(row: dict[str, Any], name: str, extra=None) -> list[list[str]]:
    """The table lines of one row: one per method (``extra(method)``: cells after the name)."""
    out = []
    for m, by_way in row["methods"].items():
        a, b = by_way["nonzero"], by_way["ridge"]
        vs = row["ours_vs_opt"]["nonzero"] if m == "condreg" else None
        cells = [name + (" †" if row["stopped_early"] else ""), LABELS[m]]
        cells += list(extra(m, a) if extra else [])
        cells += [f"{_f(a['rir']['geomean'])} ({_f(a['rir']['median'])})"]
        cells += [_f(a["i"]["geomean"]), _f(a["ii"]["geomean"]), _counts(a), _rtol_counts(a)]
        cells += [f"{_f(b['rir']['geomean'])} ({b['successes_by_i']['i>1']}/{b['n']})"]
        cells.append("" if vs is None else f"{vs['ours_ahead']}/{vs['n']}")
        out.append(cells)
        name = ""
    return out


_HEAD = ["RIR (median)", "(i)", "(ii)", "success (i) > 1, ≥ 2, ≥ 10"]
_HEAD += ["(i) > 1 at 10×, 100× rtol", "ridge κ: RIR (success)", "Ours > Opt κ"]


def _switch_table(results: dict[str, Any], dataset: str) -> str:
    names = {"condreg": "condreg (default)", "released": "**released (all switches)**"}
    lines = []
    for row in (r for r in results["rows"] if r["dataset"] == dataset):
        lines += _lines(row, names.get(row["protocol"], "+ " + row["protocol"]))
    return rp.markdown_table(["protocol", "method", *_HEAD], lines)


def _factor_table(rows: list[dict[str, Any]]) -> str:
    def extra(m: str, s: dict[str, Any]) -> list[str]:
        length = s["path_length"]
        total = "—" if not math.isfinite(length["h"]) else f"{_f(length['p'])} / {_f(length['h'])}"
        return [str(steps), total]

    lines = []
    for row in rows:
        steps = row["runs"][next(iter(row["runs"]))][0].get("steps_run", "—")
        lines += _lines(row, f"`{row['protocol']}`", extra)
    head = ["row", "method", "steps", "step length Σ (D_P / D_H term)", *_HEAD]
    what = "\n".join(f"- `{r['protocol']}`: {r['what']}" for r in rows)
    return rp.markdown_table(head, lines) + "\n" + what + "\n"


def _rules_table(rules: dict[str, Any], dataset: str) -> str:
    lines = []
    for name, v in rules["variants"].items():
        m = v["method"]
        s = v["methods"][m]["nonzero"]
        grid = v["grid"][f"{v['chosen']:g}"]
        knob = f"{v['knob']} = {v['chosen']:g}" + ("" if v["any_passes"] else " (none passes)")
        paper = rules["paper"][m] if rules["paper"] else None
        dagger = " †" if v["stopped_early"] else ""
        cells = [f"`{name}`{dagger}", LABELS[m], v["what"], knob]
        cells.append(f"{_f(grid['dp_loss'])} / {_f(grid['reference'])}")
        cells += [_f(s["i"]["geomean"]), _f(s["ii"]["geomean"])]
        cells += [f"{_f(s['rir']['geomean'])} ({_f(s['rir']['median'])})", _counts(s)]
        cells.append("—" if paper is None else f"{paper['i']} / {paper['ii']} / {paper['rir']}")
        lines.append(cells)
    head = ["variant", "method", "rule", "tuned (D_P only)", "D_P loss / head alone"]
    head += ["(i)", "(ii)", "RIR (median)", "success (i) > 1, ≥ 2, ≥ 10", "paper (i) / (ii) / RIR"]
    note = (
        f"\nEach variant's knob is the largest value of its grid whose runs (seed "
        "0) all completed with a mean final D_P loss at most "
        f"{rules['dp_tolerance']:g} above the head trained alone on θ = I with the same optimizer, "
        "learning rate and epochs (none passes: the smallest); then every seed and pair runs at "
        "it. The grids: max_step "
        "(condreg's rule), learning rate (fixed λ or κ-loss weights). † a run stopped early.\n"
    )
    ranking = rp.markdown_table(
        ["rule", "Ours against", "Ours' RIR > Opt κ's (runs)"],
        [
            [r["rule"], f"`{key.split(' vs ')[1]}`", f"{r['ours_ahead']}/{r['n']}"]
            for key, r in rules["ranking"].items()
        ],
    )
    return rp.markdown_table(head, lines) + note + "\n" + ranking


def _released_mnist_table(rm: dict[str, Any]) -> str:
    log = rm["logged"]
    lines = [
        [
            "the authors' log (full MNIST, 5923 images per digit)",
            "Ours",
            str(log["steps"]),
            f"{log['i']:.3g} / {log['ii']:.3g} / {log['rir']:.5g}",
            "—",
            "—",
        ]
    ]
    for name, row in rm["rows"].items():
        for m, by_way in row["methods"].items():
            a, b = by_way["nonzero"], by_way["ridge"]
            steps = row["runs"][m][0].get("steps_run", "—")
            ridge = (
                f"{_f(b['i']['geomean'])} / {_f(b['ii']['geomean'])} / {_f(b['rir']['geomean'])}"
            )
            nonzero = (
                f"{_f(a['i']['geomean'])} / {_f(a['ii']['geomean'])} / {_f(a['rir']['geomean'])}"
            )
            counts = f"{_counts(a)}; ridge {_counts(b)}"
            dagger = " †" if row["stopped_early"] else ""
            lines.append([f"`{name}`{dagger}", LABELS[m], str(steps), ridge, nonzero, counts])
    head = ["row", "method", "steps", "ridge κ (as logged): (i) / (ii) / RIR"]
    head += ["nonzero κ: (i) / (ii) / RIR", "success (i) > 1, ≥ 2, ≥ 10"]
    images = ", ".join(f"{k}: {v} per digit" for k, v in rm["images_per_digit"].items())
    what = "\n".join(f"- `{k}`: {v}" for k, v in fc.RELEASED_MNIST_ROWS.items() if k in rm["rows"])
    return rp.markdown_table(head, lines) + (
        f"\nRaw pixels (x − 0.1307)/0.3081, D_P = all images of the first digit (label 0), D_H "
        f"of the second (label 1), as the released dataset.py builds the pair; the offline "
        f"subset ({images}); geometric means over the seeds. The log: {log['source']} "
        f"({log['protocol']}).\n{what}\n"
    )


def _inputs_table(results: dict[str, Any]) -> str:
    inp, keys = results["inputs"], ("kappa_K_P", "kappa_K_H")
    rows = []
    if "house" in inp:
        h = inp["house"]
        for prep in ("condreg", "released"):
            n, r = h[prep]["nonzero"], h[prep]["ridge"]
            kappas = [*(_f(n[k], 4) for k in keys), *(_f(r[k], 10) for k in keys)]
            rows.append([f"house, {prep} preprocessing", *kappas, "—"])
        log, d = h["logged"], h["rel_diff_to_logged"]
        rows[-1][-1] = (
            f"{log['kappa_K_P']!r} / {log['kappa_K_H']!r} (ours differ by "
            f"{d['kappa_K_P']:.1e} / {d['kappa_K_H']:.1e})"
        )
    if "mnist" in inp:
        m, p = inp["mnist"], inp["mnist"]["pooled"]
        span = {w: f"{_f(p[w]['kappa_K_min'])} – {_f(p[w]['kappa_K_max'])}" for w in p}
        name = f"MNIST pooled tasks ({m['n_features']} inputs), all pairs"
        rows.append([name, span["nonzero"], "", span["ridge"], "", "—"])
        raw = m["raw_digit_tasks"]
        for d, logged in (("0", m["logged"]["kappa_K_P"]), ("1", m["logged"]["kappa_K_H"])):
            if d in raw:
                r = raw[d]
                name = f"MNIST raw pixels, digit {d} only ({r['n_images']} images)"
                log = f"{logged!r} (5923 images of full MNIST)"
                rows.append([name, _f(r["nonzero"], 4), "", _f(r["ridge"], 4), "", log])
    kappas = [f"κ({k}) {w}" for w in ("nonzero", "ridge") for k in ("K_P", "K_H")]
    return rp.markdown_table(["inputs", *kappas, "the authors' log (ridge)"], rows)


def _sweep_table(results: dict[str, Any], dataset: str) -> str:
    s = results["schedule"][dataset]
    rows = []
    for ms in s["max_steps"]:
        e = s["by_max_step"][str(ms)]
        cells = [
            f"{_f(e[m]['geomean_rir'])} ({e[m]['successes']}/{e[m]['n']}), {_f(e[m]['dp_loss'])}"
            for m in METHODS
        ]
        rows.append([f"{ms:g}" + (" (default)" if ms == 0.3 else ""), *cells])
    note = " (no step passes: the smallest)"
    chosen = ", ".join(
        f"{LABELS[m]} {s['chosen_max_step'][m]:g}" + ("" if s["any_step_passes"][m] else note)
        for m in METHODS
    )
    head = ["max_step", *(f"{LABELS[m]}: RIR geo. mean (success), D_P loss" for m in METHODS)]
    return rp.markdown_table(head, rows) + (
        f"\nD_P-only rule (the largest max_step whose D_P loss is at most {s['dp_tolerance']:g} "
        f"above the head trained alone on θ = I, {_f(s['head_only_dp_loss'])}): {chosen}.\n"
    )


def table(plan, results: dict[str, Any], notes_: list[str]) -> str:
    """table.md's body."""
    parts = [_LEGEND + " † : some run stopped early (θ = the last finite one).\n"]
    for dataset in plan.datasets if "factors" in results else []:
        title = f"## The minibatch switch, factored — {TITLES[dataset]} (Ours and Opt κ)\n"
        parts += [title, _factor_table(results["factors"][dataset])]
    for dataset in plan.datasets if "rules" in results else []:
        title = f"## The step rule and Opt κ's variants — {TITLES[dataset]}\n"
        parts += [title, _rules_table(results["rules"][dataset], dataset)]
    if results.get("released_mnist"):
        parts += ["## The released MNIST protocol on its own data (pair 0-1)\n"]
        parts.append(_released_mnist_table(results["released_mnist"]))
    for dataset in plan.datasets if "rows" in results else []:
        parts += [f"## The released switches, one at a time — {TITLES[dataset]}\n"]
        parts.append(_switch_table(results, dataset))
    parts += ["## The inputs' condition numbers at θ = I\n", _inputs_table(results)]
    for dataset in plan.datasets if "schedule" in results else []:
        parts += [
            f"\n## RIR against max_step — {TITLES[dataset]}\n",
            _sweep_table(results, dataset),
        ]
    if notes_:
        parts.append("\n" + "\n".join(f"- {n}" for n in notes_) + "\n")
    return "\n".join(parts)
