"""The ablation's table.md and notes."""

from __future__ import annotations

from typing import Any

from condreg.experiments._report import fmt_number, markdown_table
from condreg.experiments.ablation.units import LABELS, METHODS

__all__ = ["table", "notes"]

_DATASET = {"house": "House prices (Table 1)", "mnist": "MNIST digit pairs (Table 2)"}


def _fmt(x: float | None, digits: int = 3) -> str:
    return fmt_number(x, digits)


def _rir(row: dict[str, Any], method: str) -> str:
    """Mean RIR (nonzero / ridge) and successes of one method in one row."""
    a, b = (row["methods"][method][w] for w in ("nonzero", "ridge"))
    return (
        f"{_fmt(a['mean_rir'])} / {_fmt(b['mean_rir'])} "
        f"({a['successes']}/{a['n']}, {b['successes']}/{b['n']})"
    )


def _rows_table(results: dict[str, Any], dataset: str) -> str:
    names = {"condreg": "condreg (default)", "released": "**released (all switches)**"}
    rows = []
    for row in (r for r in results["rows"] if r["dataset"] == dataset):
        a, b = row["ours_vs_opt"]["nonzero"], row["ours_vs_opt"]["ridge"]
        versus = f"{a['ours_ahead']}/{a['n']} / {b['ours_ahead']}/{b['n']}"
        name = names.get(row["protocol"], row["protocol"])
        rows.append([name, *(_rir(row, m) for m in METHODS), versus])
    head = ["protocol", *(f"{LABELS[m]} RIR" for m in METHODS), "Ours > Opt κ"]
    return markdown_table(head, rows)


def _inputs_table(results: dict[str, Any]) -> str:
    inp = results["inputs"]
    rows = []
    if "house" in inp:
        h = inp["house"]
        for prep in ("condreg", "released"):
            n, r = h[prep]["nonzero"], h[prep]["ridge"]
            rows.append(
                [
                    f"house, {prep} preprocessing",
                    _fmt(n["kappa_K_P"], 4),
                    _fmt(n["kappa_K_H"], 4),
                    _fmt(r["kappa_K_P"], 10),
                    _fmt(r["kappa_K_H"], 10),
                    "—",
                ]
            )
        log, d = h["logged"], h["rel_diff_to_logged"]
        rows[-1][-1] = (
            f"{log['kappa_K_P']!r} / {log['kappa_K_H']!r} (ours differ by "
            f"{d['kappa_K_P']:.1e} / {d['kappa_K_H']:.1e})"
        )
    if "mnist" in inp:
        m, p = inp["mnist"], inp["mnist"]["pooled"]
        span = {w: f"{_fmt(p[w]['kappa_K_min'])} – {_fmt(p[w]['kappa_K_max'])}" for w in p}
        rows.append(
            [
                f"MNIST pooled tasks ({m['n_features']} inputs), all pairs",
                span["nonzero"],
                "",
                span["ridge"],
                "",
                "—",
            ]
        )
        raw = m["raw_digit_tasks"]
        for d, logged in (("0", m["logged"]["kappa_K_P"]), ("1", m["logged"]["kappa_K_H"])):
            if d in raw:
                r = raw[d]
                rows.append(
                    [
                        f"MNIST raw pixels, digit {d} only ({r['n_images']} images)",
                        _fmt(r["nonzero"], 4),
                        "",
                        _fmt(r["ridge"], 4),
                        "",
                        f"{logged!r} (5923 images of full MNIST)",
                    ]
                )
    head = [
        "inputs",
        "κ(K_P) nonzero",
        "κ(K_H) nonzero",
        "κ(K_P) ridge",
        "κ(K_H) ridge",
        "the authors' log (ridge)",
    ]
    return markdown_table(head, rows)


def _sweep_table(results: dict[str, Any], dataset: str) -> str:
    s = results["schedule"][dataset]
    rows = []
    for ms in s["max_steps"]:
        entry = s["by_max_step"][str(ms)]
        rows.append(
            [f"{ms:g}" + (" (default)" if ms == 0.3 else "")]
            + [
                f"{_fmt(entry[m]['geomean_rir'])} ({entry[m]['successes']}/{entry[m]['n']}), "
                f"{_fmt(entry[m]['dp_loss'], 3)}"
                for m in METHODS
            ]
        )
    note = " (no step passes: the smallest)"
    chosen = ", ".join(
        f"{LABELS[m]} {s['chosen_max_step'][m]:g}" + ("" if s["any_step_passes"][m] else note)
        for m in METHODS
    )
    head = ["max_step", *(f"{LABELS[m]}: RIR (success), D_P loss" for m in METHODS)]
    return markdown_table(head, rows) + (
        f"\nD_P-only rule (the largest max_step whose D_P loss is at most {s['dp_tolerance']:g} "
        f"above the head trained alone on θ = I, {_fmt(s['head_only_dp_loss'], 3)}): {chosen}.\n"
    )


def table(plan, results: dict[str, Any], notes_: list[str]) -> str:
    """table.md's body."""
    parts = []
    for dataset in plan.datasets:
        mean = "Mean over seeds." if dataset == "house" else "Mean over the pairs."
        parts += [f"## {_DATASET[dataset]}\n", _rows_table(results, dataset)]
        parts += [
            "\nEach cell: RIR by κ over the nonzero singular values / by the released "
            f"ridge-floor κ (successes (i) > 1 and (ii) ≤ 1 under each). {mean} Last column: "
            "runs on which Ours' RIR exceeds Opt κ's (nonzero / ridge).\n"
        ]
    parts += ["## The inputs' condition numbers at θ = I\n", _inputs_table(results)]
    for dataset in plan.datasets:
        title = f"\n## RIR against max_step — {_DATASET[dataset]}\n"
        parts += [title, _sweep_table(results, dataset)]
    if notes_:
        parts.append("\n" + "\n".join(f"- {n}" for n in notes_) + "\n")
    return "\n".join(parts)


def notes(results: dict[str, Any], store) -> list[str]:
    """Runs that stopped early, the default rows' identity check, resumed units."""
    out = []
    for dataset, same in results["default_rerun_identical"].items():
        if not same:
            out.append(
                f"{dataset}: the re-run of condreg.immunize for the ridge-floor scoring "
                f"did not reproduce the default experiment's RIR exactly"
            )
    out += [
        f"{row['dataset']}, {row['protocol']}: a run {reason}"
        for row in results["rows"]
        for reason in row["stopped_early"]
    ]
    if store.loaded:
        out.append(f"--resume: {len(store.loaded)} unit(s) taken from {store.dir}")
    return out
