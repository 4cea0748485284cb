"""The ablation's table.md and notes."""

from __future__ import annotations

from typing import Any

from condreg.experiments._report import fmt_number, markdown_table
from condreg.experiments.ablation.units import LABELS, METHODS

__all__ = ["table", "notes"]

_DATASET = {"house": "House prices (Table 1)", "mnist": "MNIST digit pairs (Table 2)"}


def _fmt(x: float | None, digits: int = 3) -> str:
    return fmt_number(x, digits)


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
    return markdown_table(head, rows)


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
    return markdown_table(["inputs", *kappas, "the authors' log (ridge)"], rows)


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
    return markdown_table(head, rows) + (
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
        parts += [f"## {_DATASET[dataset]}\n", _rows_table(results, dataset), note]
    parts += ["## The inputs' condition numbers at θ = I\n", _inputs_table(results)]
    for dataset in plan.datasets:
        title = f"\n## RIR against max_step — {_DATASET[dataset]}\n"
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
