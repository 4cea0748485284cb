"""Summaries over seeds, the markdown table and the plots of the deep-net study."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from condreg_experiments import _report
from condreg_experiments.convergence import digits_closed

PAPER_NOTE = (
    "The paper immunizes ImageNet-pre-trained ResNet18 (last two conv blocks) and ViT (last "
    "block) against Stanford Cars / Country211 on GPUs. This run is a CPU-sized analogue on the "
    "5,000-image MNIST subset (digits 0-4 vs 5-9; a residual CNN's last two blocks and a "
    "one-layer transformer, 128-d features, Eq. 17 groups of 100 < 128): the numbers are "
    "comparable in kind, not in magnitude."
)

QUICK_NOTE = (
    "**Quick run — a smoke test of the pipeline, not comparable with the paper nor with the "
    "full run** (fewer images, seeds and steps; `condreg reproduce deepnet` without --quick "
    "for the study)."
)

_RATIOS = ("rir_theta0", "i", "ii")  # summarised geometrically over seeds
_SCALARS = ("acc_p_before", "acc_p_after", "probe_h_final_acc")
_SCALARS += ("probe_p_final_acc", "probe_h_converged", "probe_p_converged")
_NO_REF = ("opt_kappa", "identity")  # methods without the paired comparison against Opt κ


def _name(m: str) -> str:
    return _report.METHOD_LABELS.get(m, m)


def _paired(rows_m: list[dict], rows_ref: list[dict]) -> dict[str, Any]:
    """Per-seed RIR_θ0 of a method against Opt κ's on the same seed."""
    ratio = [a["rir_theta0"] / b["rir_theta0"] for a, b in zip(rows_m, rows_ref, strict=True)]
    return {
        "rir_ratio_per_seed": ratio,
        "wins": int(sum(r > 1 for r in ratio)),
        "seeds": len(ratio),
        "rir_ratio": _report.ratio_summary(ratio),
    }


def _steps_summary(steps: list[int | None]) -> dict[str, Any]:
    reached = [x for x in steps if x is not None]
    median = float(np.median(reached)) if reached else None
    return {"per_seed": steps, "reached": len(reached), "median": median}


def _fmt_steps(st: dict[str, Any], limit: int) -> str:
    n = len(st["per_seed"])
    return f"{st['median']:.0f} ({st['reached']}/{n})" if st["reached"] else f"> {limit} (0/{n})"


def _fmt_attack(summ: dict[str, Any], attacker: str, limit: int) -> str:
    st = summ["attacker_steps_h"][attacker]
    red = st["reduction"]["mean"]
    if red < 0:  # the last iterate's loss is above the start (heavy-ball transient)
        return f"{_fmt_steps(st, limit)}; {red:.2g} (loss above the start)"
    return f"{_fmt_steps(st, limit)}; {100 * red:.1f} %"


def _summary(rows: list[dict], ident: list[dict], ref: list[dict] | None) -> dict[str, Any]:
    mean_std, ratios = _report.mean_std, _report.ratio_summary
    summ: dict[str, Any] = {k: ratios([r[k] for r in rows]) for k in _RATIOS}
    summ |= {k: mean_std([r[k] for r in rows]) for k in _SCALARS}
    summ["successes_by_i"] = _report.success_counts((r["i"], r["ii"]) for r in rows)
    for task in ("h", "p"):
        kappas = [r[f"kappa_{task}_full"] for r in rows]
        summ[f"kappa_{task}_full_ratio"] = ratios([k["immunized"] / k["theta0"] for k in kappas])
    summ["probe_h_converged_gap"] = mean_std(
        [r["probe_h_converged"] - i["probe_h_converged"] for r, i in zip(rows, ident, strict=True)]
    )
    summ["probe_h_steps_to_target"] = _steps_summary([r["probe_h_steps_to_target"] for r in rows])
    attacks = [r["attacker_steps_h"] for r in rows]
    summ["attacker_steps_h"] = {
        a: _steps_summary([x[a]["steps_to"] for x in attacks])
        | {"reduction": mean_std([x[a]["reduction"] for x in attacks])}
        for a in attacks[0]
    }
    summ["rir_by_group_size"] = {
        size: ratios([r["rir_by_group_size"][size]["rir_theta0"] for r in rows])
        for size in rows[0]["rir_by_group_size"]
    }
    for key in ("probe_h", "probe_p"):
        arr = np.array([r[key]["test_acc"] for r in rows])
        summ[f"{key}_steps"] = rows[0][key]["steps"]
        summ[f"{key}_mean_curve"] = arr.mean(0).tolist()
        summ[f"{key}_std_curve"] = arr.std(0, ddof=1 if len(rows) > 1 else 0).tolist()
    summ["norm_ratio_h_mean_curve"] = np.array([r["norm_ratio_h"] for r in rows]).mean(0).tolist()
    summ["reg_step"] = rows[0]["reg_step"]
    if ref is not None:
        summ["vs_opt_kappa"] = _paired(rows, ref)
    return summ


def summaries(per_seed: list[dict], methods: Sequence[str]) -> dict[str, Any]:
    """``{method: summary}`` over the seeds of one arch (methods that completed on every seed)."""
    done = [m for m in methods if all(m in r["methods"] for r in per_seed)]
    ident = [r["methods"]["identity"] for r in per_seed]
    ref = [r["methods"]["opt_kappa"] for r in per_seed] if "opt_kappa" in done else None
    return {
        m: _summary([r["methods"][m] for r in per_seed], ident, None if m in _NO_REF else ref)
        for m in done
    }


def _pct(summ: dict[str, Any], key: str, digits: int = 3) -> str:
    percent = {k: 100 * v if k in ("mean", "std") else v for k, v in summ[key].items()}
    return _report.fmt_mean_std(percent, digits)


def _fmt_successes(summ: dict[str, Any]) -> str:
    n = summ["rir_theta0"]["n"]
    return " / ".join(f"{summ['successes_by_i'][k]}/{n}" for k in _report.I_THRESHOLDS)


def _row(m: str, summ: dict[str, Any], probe_steps: int) -> list[str]:
    vs = summ.get("vs_opt_kappa")
    return [
        _name(m),
        "—" if summ["reg_step"] is None else f"{summ['reg_step']:g}",
        *(_report.fmt_ratio(summ[k], 3) for k in ("i", "ii", "rir_theta0")),
        _fmt_successes(summ),
        "" if vs is None else f"{vs['wins']}/{vs['seeds']}",
        f"{_pct(summ, 'acc_p_before')} → {_pct(summ, 'acc_p_after')}",
        _pct(summ, "probe_h_final_acc"),
        _fmt_steps(summ["probe_h_steps_to_target"], probe_steps),
        _pct(summ, "probe_h_converged"),
        _pct(summ, "probe_h_converged_gap", 2),
    ]


def _arch_table(arch: str, summary: dict[str, Any], s, record: dict) -> list[str]:
    """The paragraphs of one arch: the main table, RIR_θ0 by group size, the attackers."""
    fm, table, items = _report.fmt_ratio, _report.markdown_table, summary.items()
    n_att = s.attack_steps
    first = next(iter(summary.values()))
    sizes, atts = first["rir_by_group_size"], list(first["attacker_steps_h"])
    head = ["method", "step", "(i)", "(ii)", "RIR_θ0", "success (i) > 1 / ≥ 2 / ≥ 10"]
    head += ["RIR > Opt κ (seeds)"]
    head += ["D_P acc % before → after", f"D_H probe acc @{s.probe_steps}", "steps to target"]
    head += ["converged probe %", "gap vs identity (pts)"]
    g_rows = [[_name(m), *(fm(x["rir_by_group_size"][k], 3) for k in sizes)] for m, x in items]
    a_rows = [[_name(m), *(_fmt_attack(x, a, n_att) for a in atts)] for m, x in items]
    return [
        f"### {arch}: {record['immunized']} — {record['immunized_parameters']} immunized weights; "
        f"D = {record['feature_dim']} features, Eq. 17 groups of {s.rir_group_size}",
        table(head, [_row(m, x, s.probe_steps) for m, x in items]),
        f"RIR_θ0 by Eq. 17 group size ({arch}):",
        table(["method", *(f"n = {k}" for k in sizes)], g_rows),
        f"Steps to 99 % of the achievable loss reduction, least-squares probe on D_H ({arch}; "
        f"condreg.attacks, at most {n_att} steps; median over the seeds that reach it; then the "
        f"mean fraction of the reduction reached at step {n_att}):",
        table(["method", *atts], a_rows),
    ]


def title(quick: bool) -> str:
    """The ``# title`` of table.md."""
    base = "Deep-net immunization (Table 3 / Fig. 3 analogue)"
    return f"{base} — quick: not comparable with the paper" if quick else base


def failures(per_arch: dict[str, list[dict]]) -> list[str]:
    """One line per (arch, method, seed) whose immunization failed."""
    return [
        f"{a}: {m} failed on seed {r['seed']} and is left out: {why}"
        for a, rows in per_arch.items()
        for r in rows
        for m, why in r["failed"].items()
    ]


def setup(per_arch: dict[str, list[dict]], s) -> dict[str, dict[str, Any]]:
    """What was immunized, per arch (from the first seed's record)."""
    keys = ("immunized", "immunized_weights", "immunized_parameters", "feature_dim", "n_train")
    out = {}
    for a, rows in per_arch.items():
        out[a] = {k: rows[0][k] for k in keys} | {"rir_group_size": s.rir_group_size}
        out[a]["feature_dim_exceeds_group_size"] = rows[0]["feature_dim"] > s.rir_group_size
    return out


def _label(m: str) -> str:
    return _name(m).replace(" (condreg)", "").replace(" (θ = I)", "")


def ranking(summaries_by_arch: dict[str, dict]) -> list[str]:
    """The lead of table.md: per arch, the methods by RIR_θ0 (geometric mean over seeds), Ours
    against Opt κ seed by seed, and the caveat for every method whose (i) < 1 (D_H did not get
    harder)."""
    lines, fmt = [], _report.fmt_number
    for arch, summary in summaries_by_arch.items():
        rir = {m: summary[m]["rir_theta0"]["geomean"] for m in summary if m != "identity"}
        order = sorted(rir, key=lambda m: -rir[m])
        text = " > ".join(f"{_label(m)} {fmt(rir[m], 3)}" for m in order)
        vs = summary.get("condreg", {}).get("vs_opt_kappa")
        if vs is not None:
            wins, lost = vs["wins"], vs["seeds"] - vs["wins"]
            if wins >= lost:
                text += f"; Ours ahead of Opt κ on {wins} of {vs['seeds']} seeds"
            else:
                text += f"; **Opt κ ahead of Ours on {lost} of {vs['seeds']} seeds**"
        low = [m for m in order if summary[m]["i"]["geomean"] < 1]
        if low:
            names = ", ".join(f"{_label(m)} ({fmt(summary[m]['i']['geomean'], 2)})" for m in low)
            text += (
                f". Caveat: (i) < 1 for {names}: κ on D_H fell, so D_H did not get harder "
                "(Definition 3.1 (a) fails) whatever RIR_θ0 says"
            )
        lines.append(f"- **{arch}** — RIR_θ0 (geometric mean over seeds): {text}.")
    return lines


def table(
    summaries_by_arch: dict[str, dict],
    s,
    per_arch: dict[str, list[dict]],
    seeds: Sequence[int],
    *,
    quick: bool = False,
) -> str:
    """The whole ``table.md``: the ranking, one block per arch and the paper's Table 3."""
    paras = [QUICK_NOTE] if quick else []
    paras += ["Ranking by RIR_θ0 (Eq. 17; the paper has Ours best on both networks):"]
    paras.append("\n".join(ranking(summaries_by_arch)))
    paras.append(
        f"D_P = digits {list(s.pretrain_digits)}, D_H = digits {list(s.harmful_digits)}; "
        f"immunized: {'the block' if s.target == 'block' else 'an appended θ'}; seeds "
        f"{list(seeds)} ((i), (ii), RIR_θ0: geometric mean ×/÷ geometric std; accuracies: "
        f"mean ± std). Success: (ii) ≤ 1 and (i) > 1, ≥ 2, ≥ 10 (Definition 3.1 (a) asks "
        f"(i) ≫ 1), seeds counted. Step = each method's relative regularizer step chosen by "
        f"the sweep {list(s.reg_steps)} on seed {s.sweep_seed}'s D_P validation accuracy "
        f"(largest within {100 * s.acc_tolerance:g} points of the pre-trained). "
        "(i) = κ ratio on D_H (want ≫ 1), (ii) = on D_P (want ≤ 1). Probe: a fresh linear "
        "head on the frozen D_H features; GD at step 1/λ_max; steps to target = median first "
        "step reaching "
        f"{100 * s.probe_target:g}% of the identity's final GD accuracy (seeds reaching it); "
        "converged = L-BFGS."
    )
    for arch, summary in summaries_by_arch.items():
        paras += _arch_table(arch, summary, s, per_arch[arch][0])
    prow = [
        [k, _report.fmt_number(v["rir_theta0"]), f"{v['acc_before']:.2f}", f"{v['acc_after']:.2f}"]
        for k, v in _report.PAPER_DEEPNET.items()
    ]
    head = ["model / D_H", "RIR_θ0", "acc before %", "acc after %"]
    paras += ["Paper (Table 3, as reported; ImageNet as D_P, ours = condreg):"]
    paras += [_report.markdown_table(head, prow)]
    paras.append(PAPER_NOTE if not s.large else "Large-model run on user-supplied data.")
    return "\n\n".join(paras)


def _figure(n_rows: int, n_cols: int, width: float):
    return _report.new_figure(n_rows, n_cols, figsize=(width, 3.8 * n_rows), squeeze=False)


def _style(m: str) -> dict[str, Any]:
    return {"label": _name(m), "color": _report.METHOD_COLORS.get(m)}


def _finish(row) -> None:
    for ax in row:
        ax.grid(alpha=0.3)
    row[0].legend(fontsize=8)


def _probe_figure(out_dir: pathlib.Path, summaries_by_arch: dict[str, dict], tag: str):
    fig, axes = _figure(len(summaries_by_arch), 3, 15)
    acc = dict(xlabel="probe GD steps (cross-entropy)", ylabel="held-out accuracy (%, mean ± std)")
    for r, (arch, summary) in enumerate(summaries_by_arch.items()):
        for m, summ in summary.items():
            kw = _style(m)
            for c, key in enumerate(("probe_h", "probe_p")):
                x = summ[f"{key}_steps"]
                mu, sd = (100 * np.asarray(summ[f"{key}_{k}_curve"]) for k in ("mean", "std"))
                axes[r, c].plot(x, mu, **kw)
                axes[r, c].fill_between(x, mu - sd, mu + sd, color=kw["color"], alpha=0.15)
            d = digits_closed(summ["norm_ratio_h_mean_curve"])
            axes[r, 2].semilogy(np.arange(1, d.size), d[1:], **kw)
        for c, what in enumerate(("D_H (harmful)", "D_P (control)")):
            axes[r, c].set(title=f"{arch}{tag}: linear probing on {what}", **acc)
        axes[r, 2].set_title(f"{arch}{tag}: Eq. 16, ℓ2 probe of D_H")
        axes[r, 2].minorticks_off()  # log-axis minor ticks cost more to draw than they show
        axes[r, 2].set_xlabel("probe steps t")
        axes[r, 2].set_ylabel("−log₁₀ ‖w_t − w*‖²/‖w_0 − w*‖²\n(lower = slower probing)")
        _finish(axes[r])
    return _report.save_figure(fig, out_dir / "probe_curves.png")


def _kappa_figure(out_dir: pathlib.Path, per_seed: dict[str, list], tag: str):
    fig, axes = _figure(len(per_seed), 2, 11)
    for r, (arch, records) in enumerate(per_seed.items()):
        for m, res in records[0]["methods"].items():
            if h := res["history"]:
                st = [row["step"] for row in h]
                axes[r, 0].semilogy(st, [row["kappa_h"] for row in h], **_style(m))
                axes[r, 1].semilogy(st, [row["kappa_p"] for row in h], **_style(m))
        seed = records[0]["seed"]
        axes[r, 0].set_title(f"{arch}{tag}: κ(H_H) of the batch features (seed {seed}; want ↑)")
        axes[r, 1].set_title(f"{arch}{tag}: κ(H_P) of the batch features (want ↓ or flat)")
        for ax in axes[r]:
            ax.set_xlabel("immunization step")
        _finish(axes[r])
    return _report.save_figure(fig, out_dir / "kappa_history.png")


def plots(
    out_dir: pathlib.Path,
    summaries_by_arch: dict[str, dict],
    per_seed: dict[str, list],
    *,
    quick: bool = False,
) -> list[pathlib.Path]:
    """Write probe_curves.png (mean ± std over seeds) and kappa_history.png (the first seed)."""
    tag = " (quick)" if quick else ""
    return [_probe_figure(out_dir, summaries_by_arch, tag), _kappa_figure(out_dir, per_seed, tag)]
