"""The ablation's table.md and notes."""

from __future__ import annotations

from typing import Any

from condreg.experiments.ablation.units import METHODS

__all__ = ["table", "notes"]

_LABEL = {"condreg": "Ours", "r_ill_only": "R_ill only", "opt_kappa": "Opt κ", "imma": "IMMA"}
_DATASET = {"house": "House prices (Table 1)", "mnist": "MNIST digit pairs (Table 2)"}


def _fmt(x: float | None, digits: int = 3) -> str:
    from condreg.experiments._report import fmt_number

    return fmt_number(x, digits)


def _rir(row: dict[str, Any], method: str, dataset: str) -> str:
    """RIR (nonzero / ridge) and successes: house the mean over seeds, MNIST the mean over
    pairs (and seeds)."""
    a, b = (row["methods"][method][w] for w in ("nonzero", "ridge"))
    return (
        f"{_fmt(a['mean_rir'])} / {_fmt(b['mean_rir'])} "
        f"({a['successes']}/{a['n']}, {b['successes']}/{b['n']})"
    )


def _versus(row: dict[str, Any]) -> str:
    a, b = row["ours_vs_opt"]["nonzero"], row["ours_vs_opt"]["ridge"]
    return f"{a['ours_ahead']}/{a['n']} / {b['ours_ahead']}/{b['n']}"


def _rows_table(results: dict[str, Any], dataset: str) -> str:
    from condreg.experiments._report import markdown_table

    rows = []
    for row in results["rows"]:
        if row["dataset"] != dataset:
            continue
        name = "condreg (default)" if row["protocol"] == "condreg" else row["protocol"]
        if row["protocol"] == "released":
            name = "**released (all switches)**"
        rows.append([name, *(_rir(row, m, dataset) for m in METHODS), _versus(row)])
    head = ["protocol", *(f"{_LABEL[m]} RIR" for m in METHODS), "Ours > Opt κ"]
    return markdown_table(head, rows)


def _inputs_table(results: dict[str, Any]) -> str:
    from condreg.experiments._report import markdown_table

    inp = results["inputs"]
    rows = []
    if "house" in inp:
        h = inp["house"]
        for prep in ("condreg", "released"):
            n, r = h[prep]["nonzero"], h[prep]["ridge"]
            rows.append([f"house, {prep} preprocessing", _fmt(n["kappa_K_P"], 4),
                         _fmt(n["kappa_K_H"], 4), _fmt(r["kappa_K_P"], 10),
                         _fmt(r["kappa_K_H"], 10), "—"])  # fmt: skip
        log = h["logged"]
        d = h["rel_diff_to_logged"]
        rows[-1][-1] = (
            f"{log['kappa_K_P']!r} / {log['kappa_K_H']!r} (ours differ by "
            f"{d['kappa_K_P']:.1e} / {d['kappa_K_H']:.1e})"
        )
    if "mnist" in inp:
        m = inp["mnist"]
        p = m["pooled"]
        rows.append([f"MNIST pooled tasks ({m['n_features']} inputs), all pairs",
                     f"{_fmt(p['nonzero']['kappa_K_min'])} – {_fmt(p['nonzero']['kappa_K_max'])}",
                     "", f"{_fmt(p['ridge']['kappa_K_min'])} – {_fmt(p['ridge']['kappa_K_max'])}",
                     "", "—"])  # fmt: skip
        raw = m["raw_digit_tasks"]
        log = m["logged"]
        for d in ("0", "1"):
            if d in raw:
                r = raw[d]
                logged = log["kappa_K_P"] if d == "0" else log["kappa_K_H"]
                rows.append([f"MNIST raw pixels, digit {d} only ({r['n_images']} images)",
                             _fmt(r["nonzero"], 4), "", _fmt(r["ridge"], 4), "",
                             f"{logged!r} (5923 images of full MNIST)"])  # fmt: skip
    head = ["inputs", "κ(K_P) nonzero", "κ(K_H) nonzero", "κ(K_P) ridge", "κ(K_H) ridge",
            "the authors' log (ridge)"]  # fmt: skip
    return markdown_table(head, rows)


def _sweep_table(results: dict[str, Any], dataset: str) -> str:
    from condreg.experiments._report import markdown_table

    s = results["schedule"][dataset]
    rows = []
    for ms in s["max_steps"]:
        entry = s["by_max_step"][str(ms)]
        rows.append([f"{ms:g}" + (" (default)" if ms == 0.3 else "")] + [
            f"{_fmt(entry[m]['geomean_rir'])} ({entry[m]['successes']}/{entry[m]['n']}), "
            f"{_fmt(entry[m]['dp_loss'], 3)}" for m in METHODS])  # fmt: skip
    chosen = ", ".join(
        f"{_LABEL[m]} {s['chosen_max_step'][m]:g}"
        + ("" if s["any_step_passes"][m] else " (no step passes: the smallest)")
        for m in METHODS
    )
    return markdown_table(
        ["max_step", *(f"{_LABEL[m]}: RIR (success), D_P loss" for m in METHODS)], rows
    ) + (  # fmt: skip
        f"\nD_P-only rule (the largest max_step whose D_P loss is at most "
        f"{s['dp_tolerance']:g} above the head trained alone on θ = I, "
        f"{_fmt(s['head_only_dp_loss'], 3)}): {chosen}.\n"
    )


def table(plan, results: dict[str, Any], notes_: list[str]) -> str:
    """table.md's body."""
    parts = []
    for dataset in plan.datasets:
        parts.append(f"## {_DATASET[dataset]}\n")
        parts.append(_rows_table(results, dataset))
        parts.append(
            "\nEach cell: RIR by κ over the nonzero singular values / by the released "
            "ridge-floor κ (successes (i) > 1 and (ii) ≤ 1 under each). "
            + ("Mean over seeds." if dataset == "house" else "Mean over the pairs.")
            + " Last column: runs on which Ours' RIR exceeds Opt κ's (nonzero / ridge).\n"
        )
    parts.append("## The inputs' condition numbers at θ = I\n")
    parts.append(_inputs_table(results))
    for dataset in plan.datasets:
        parts.append(f"\n## RIR against max_step — {_DATASET[dataset]}\n")
        parts.append(_sweep_table(results, dataset))
    if notes_:
        parts.append("\n" + "\n".join(f"- {n}" for n in notes_) + "\n")
    return "\n".join(parts)


def notes(results: dict[str, Any], store) -> list[str]:
    """Runs that stopped early, the default rows' identity check, resumed units."""
    out = []
    for dataset, same in results["default_rerun_identical"].items():
        if not same:
            out.append(f"{dataset}: the re-run of condreg.immunize for the ridge-floor scoring "
                       f"did not reproduce the default experiment's RIR exactly")  # fmt: skip
    for row in results["rows"]:
        for reason in row["stopped_early"]:
            out.append(f"{row['dataset']}, {row['protocol']}: a run {reason}")
    if store.loaded:
        out.append(f"--resume: {len(store.loaded)} unit(s) taken from {store.dir}")
    return out
