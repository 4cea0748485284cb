"""Immunization under stronger attackers (docs/attacks.md): on house prices and a few MNIST pairs,
θ = I and each method's θ are probed from ``w_0 = 0`` on D_H and D_P by every attacker of
:func:`condreg.attacks.probe`; the steps to 99 % of the achievable loss reduction and the slow-down
``steps(θ) / steps(I)``."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import pathlib
import time
from typing import Any

import numpy as np

from condreg_experiments import UsageError
from condreg_experiments import _report as rp
from condreg_experiments import options as opt
from condreg_experiments._linear import default_rtol, immunize_method, spectrum_numbers
from condreg_experiments._runner import UnitStore, run_units

__all__ = ["HELP", "add_arguments", "run", "PAPER_PAIRS", "QUICK_PAIRS", "FULL_STEPS"]
__all__ += ["QUICK_STEPS", "FRACTION"]

#: MNIST (P, H) pairs of the full and the quick run.
PAPER_PAIRS: list[tuple[int, int]] = [(0, 1), (3, 8), (1, 7)]
QUICK_PAIRS: list[tuple[int, int]] = [(3, 8)]
#: Probing iterations per attacker (full / --quick).
FULL_STEPS, QUICK_STEPS = 5000, 1000
#: Fractions of the achievable loss reduction: the target that counts as "reached", a deeper fit
#: where the small eigenvalues (so κ) set the pace (also summarised), and all recorded per run.
FRACTION, DEEP_FRACTION, FRACTIONS = 0.99, 0.9999, (0.9, 0.99, 0.999, 0.9999)
#: Points kept per curve in results.json (log-spaced step indices).
CURVE_POINTS = 120

TASKS = ("D_H", "D_P")

#: One line for ``condreg reproduce --help``.
HELP = "probing steps of θ = I and each method's θ under stronger attackers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``condreg reproduce attacks`` (keywords of :func:`run`)."""
    add, quick_pairs = parser.add_argument, ",".join(f"{p}-{h}" for p, h in QUICK_PAIRS)
    add("--data", type=pathlib.Path, help="house-price directory")
    add("--pairs", type=opt.parse_pairs, help="MNIST (P, H) pairs (0-1,3-8,1-7)")
    add("--steps", type=opt.positive_int, help=f"probing steps ({FULL_STEPS})")
    add("--epochs", type=opt.positive_int, help="immunization epochs")
    add("--methods", type=opt.method_list, help="subset of the methods")
    add(
        "--attackers",
        type=lambda text: [a.strip() for a in text.split(",") if a.strip()],
        help="comma-separated subset of gd_exact,gd,momentum,nesterov,adam,lbfgs,lstsq",
    )
    add("--fraction", type=float, help=f"loss-reduction target ({FRACTION})")
    opt.add_resume_option(parser, "(seed, dataset, θ)")
    add(
        "--quick",
        action="store_true",
        help=f"a small, fast version: house prices and the pair {quick_pairs}, the quick "
        f"immunization settings of house-prices and mnist-pairs, {QUICK_STEPS} probing steps "
        "per attacker; about 10 s on a 2-core CPU",
    )


@dataclasses.dataclass(frozen=True)
class Settings(opt.StudySettings):
    """The knobs of ``condreg reproduce attacks`` besides the data and the pairs."""

    STUDY = "attacks"
    QUICK = {"steps": QUICK_STEPS}
    POSITIVE = ("steps",)

    steps: int = FULL_STEPS
    epochs: int | None = None  # None: house-prices' and mnist-pairs' own
    methods: tuple[str, ...] | None = None  # None: every method
    attackers: tuple[str, ...] | None = None  # None: every attacker of condreg.attacks.probe
    fraction: float = FRACTION

    def checked(self) -> Settings:
        from condreg.attacks import ATTACKERS

        rp.check_positive("--epochs", self.epochs, integer=True)
        methods = tuple(rp.check_methods(self.methods))
        if self.attackers is not None:
            bad = [a for a in self.attackers if a not in ATTACKERS]
            if bad or not self.attackers:
                raise UsageError(
                    f"attacks: unknown attacker(s) {bad}; choose from {', '.join(ATTACKERS)}"
                )
        fraction = self.fraction
        if isinstance(fraction, bool) or not (
            isinstance(fraction, (int, float)) and 0 < fraction < 1
        ):
            raise UsageError(f"attacks: --fraction must be in (0, 1), got {fraction!r}")
        attackers = tuple(a for a in ATTACKERS if a in (self.attackers or ATTACKERS))
        return dataclasses.replace(self, methods=methods, attackers=attackers)


def _settings(quick, data, pairs, given, options):
    """``(settings, datasets)``: the options checked (UsageError) and resolved, the data loaded."""
    from condreg_experiments import mnist_pairs as mp
    from condreg_experiments.convergence import linear_datasets

    if options:
        raise UsageError(
            f"attacks: unknown option(s) {', '.join(sorted(options))}; this experiment takes "
            "data, pairs, steps, epochs, methods, attackers, fraction"
        )
    s = Settings.resolve(quick, given)
    pairs = opt.check_pairs(pairs, QUICK_PAIRS if quick else PAPER_PAIRS)
    datasets, data_dir = linear_datasets(data, pairs, quick, s.epochs)  # bad data fail here
    settings = dict(steps=s.steps, fraction=s.fraction)
    settings.update(fractions_recorded=sorted({*FRACTIONS, float(s.fraction)}))
    settings.update(methods=list(s.methods), attackers=list(s.attackers))
    settings["datasets"] = list(datasets)
    settings.update({k: {d: v[k] for d, v in datasets.items()} for k in ("epochs", "lr")})
    settings.update(mnist_pairs=[list(p) for p in pairs])
    n_positive = mp.Settings.resolve(quick, {}).n_positive
    settings.update(mnist_inputs={"preset": "pooled", "n_positive": n_positive})
    settings.update(data_dir=str(data_dir), quick=quick, w0="zeros")
    settings["attacker_settings"] = "condreg.attacks.probe defaults (none tuned)"
    return settings, datasets


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    data: str | pathlib.Path | None = None,
    pairs: list[tuple[int, int]] | None = None,
    resume: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Attack θ = I and each method's θ with every attacker; write results.json, table.md,
    ``attack_curves.png`` (D_H), ``attack_curves_pretrain.png`` (D_P) and units/ (one per
    (seed, dataset, θ), kept by ``resume``) into ``out_dir``; ``options``: the fields of
    :class:`Settings`. Raises :class:`condreg_experiments.UsageError` for a bad option, before
    any work."""
    out_dir = rp.check_out_dir(out_dir)
    start, seed_values = time.perf_counter(), rp.seed_list(seeds)
    settings, datasets = _settings(quick, data, pairs, Settings.take(options), options)
    out_dir = rp.prepare_out_dir(out_dir)
    unit_settings = {k: v for k, v in settings.items() if k not in ("methods", "datasets")}
    store = UnitStore(out_dir, settings=unit_settings, resume=resume)  # a unit per θ
    probes, curves, immunization, timing = _units(datasets, settings, seed_values, progress, store)
    keys = [f"{f:g}" for f in settings["fractions_recorded"]]
    slowdown = {key: _slowdowns(probes, settings["steps"], key) for key in keys}
    summary = {key: _summary(tab, settings) for key, tab in slowdown.items()}
    results = dict(immunization=immunization, probes=probes, slowdown=slowdown, summary=summary)
    results.update(curves=curves, timing=timing)
    notes = _notes(probes) + store.note("unit(s)")
    fields = dict(settings=settings, seeds=seed_values, results=results, notes=notes)
    fields.update(start=start, table=_table(results, settings))
    title = "Immunization under stronger attackers: probing steps to 99 % of the loss reduction"
    if quick:
        title += " — quick: fewer pairs, epochs and steps, not comparable with the full run"
    payload = rp.write_outputs(out_dir, experiment="attacks", title=title, **fields)
    for task, fname in (("D_H", "attack_curves.png"), ("D_P", "attack_curves_pretrain.png")):
        _plot(out_dir / fname, curves, task, settings)
    return payload


def _branch(tree: dict, *keys: str) -> dict:
    """``tree[k1][k2]…``, creating the missing levels."""
    for key in keys:
        tree = tree.setdefault(key, {})
    return tree


def _unit(spec, settings, seed: int, method: str) -> dict[str, Any]:
    """One (seed, dataset, θ): the immunization's numbers, every attacker's record and curve on
    both tasks (as saved in units/, so that a resumed unit equals a fresh one)."""
    X_p, y_p, X_h, y_h = spec["loader"](seed)
    rtol = default_rtol(X_p, X_h)
    if method == "identity":
        theta, numbers = None, spectrum_numbers(None, X_p, X_h, rtol=rtol)
    else:
        kw = {k: spec[k] for k in ("task", "epochs", "lr")}
        numbers = immunize_method(method, X_p, y_p, X_h, y_h=y_h, seed=seed, **kw)
        theta = numbers.pop("_theta")
    entry = {k: numbers.get(k) for k in ("i", "ii", "rir", "kappa_H_P", "kappa_H_H", "success")}
    unit: dict[str, Any] = {"immunization": entry, "probes": {}, "curves": {}}
    for task, X, y in (("D_H", X_h, y_h), ("D_P", X_p, y_p)):
        for attacker in settings["attackers"]:
            rec, curve = _attack(theta, X, y, attacker, settings, rtol, seed)
            _branch(unit, "probes", task)[attacker] = rec
            _branch(unit, "curves", task)[attacker] = curve
    return rp.from_jsonable(rp.to_jsonable(unit))


def _units(datasets, settings, seed_values, progress, store) -> tuple[dict, dict, dict, dict]:
    """Every (seed, dataset, θ) attacked on both tasks, from ``store`` or computed and saved
    there: ``(probes, curves, immunization, timing)``."""
    thetas = ["identity", *settings["methods"]]
    keys = [(s, d, m) for s in seed_values for d in datasets for m in thetas]

    def compute(key: tuple) -> dict[str, Any]:
        seed, name, method = key
        return _unit(datasets[name], settings, seed, method)

    names = {k: "seed{}_{}_{}".format(*k) for k in keys}
    done = run_units(store, names, compute, jobs=1, progress=progress, desc="attacks")
    probes, curves, immunization = {}, {}, {}
    for (seed, name, method), unit in done.units.items():
        _branch(immunization, name).setdefault(method, []).append(unit["immunization"])
        for task, by_attacker in unit["probes"].items():
            for attacker, rec in by_attacker.items():
                _branch(probes, name, task, method).setdefault(attacker, []).append(rec)
                if seed == seed_values[0]:
                    _branch(curves, name, task, method)[attacker] = unit["curves"][task][attacker]
    return probes, curves, immunization, done.timing()


def _attack(theta, X, y, attacker, settings, rtol, seed) -> tuple[dict, dict]:
    """One probe of ``Xθ``: its record and its excess-loss curve at log-spaced steps."""
    from condreg.attacks import probe, steps_to_reduction

    steps, fractions = settings["steps"], settings["fractions_recorded"]
    res = probe(theta, X, y, attacker=attacker, steps=steps, rtol=rtol)
    loss, loss_min = np.asarray(res.loss, dtype=np.float64), float(res.loss_min)
    total = loss[0] - loss_min
    excess = (loss - loss_min) / total if total > 0 else np.zeros_like(loss)
    rec = {"steps_to": {f"{f:g}": steps_to_reduction(res.loss, res.loss_min, f) for f in fractions}}
    rec.update(loss_initial=float(loss[0]), loss_min=loss_min, loss_final=float(loss[-1]))
    ratio = float(np.asarray(res.norm_ratio)[-1])
    rec.update(excess_final=float(excess[-1]), norm_ratio_final=ratio, kappa=res.kappa)
    rec.update(rank=res.rank, params=dict(res.params), seed=seed)
    idx = np.unique(np.round(np.geomspace(1, steps, CURVE_POINTS)).astype(int))
    idx = np.concatenate([[0], idx])
    return rec, {"t": idx.tolist(), "excess": excess[idx].tolist()}


def _ratio(rec, ref, steps: int, key: str) -> dict[str, Any]:
    """Slow-down ``steps(θ)/steps(I)`` to ``key`` of the run ``rec`` against ``ref`` (θ = I), with
    censoring: bound "=", ">=" (θ censored), "<=" (I censored) or None (both censored)."""
    t_theta, t_ident = rec["steps_to"][key], ref["steps_to"][key]
    factor, bound = None, None
    if t_ident is not None:
        factor = (t_theta if t_theta is not None else steps + 1) / max(t_ident, 1)
        bound = "=" if t_theta is not None else ">="
    elif t_theta is not None:
        factor, bound = t_theta / (steps + 1), "<="
    return {"factor": factor, "bound": bound, "seed": rec["seed"]}


def _slowdowns(probes, steps, key):
    """Each seed's slow-down to the fraction ``key``, by dataset, task, θ and attacker."""
    out: dict[str, Any] = {}
    for name, by_task in probes.items():
        for task, by_method in by_task.items():
            for method, by_att in by_method.items():
                for attacker, recs in by_att.items():
                    refs = by_method["identity"][attacker]
                    vals = [_ratio(r, ref, steps, key) for r, ref in zip(recs, refs, strict=True)]
                    _branch(out, name, task, method)[attacker] = vals
    return out


def _summary(slowdown, settings):
    """Per task, method and attacker: the slow-downs' geometric mean (censored: their bound)."""
    out: dict[str, Any] = {}
    combos = itertools.product(TASKS, settings["methods"], settings["attackers"])
    for task, method, attacker in combos:
        every = [v for name in settings["datasets"] for v in slowdown[name][task][method][attacker]]
        vals = [v for v in every if v["factor"] is not None]
        n = len(vals)
        entry = {"geomean": None, "bound": None, "n": n, "n_unknown": len(every) - n}
        if vals:
            bounds = {v["bound"] for v in vals}
            entry["geomean"] = math.exp(float(np.mean([math.log(v["factor"]) for v in vals])))
            if n < len(every) or {"<=", ">="} <= bounds:
                entry["bound"] = "~"
            else:
                entry["bound"] = ">=" if ">=" in bounds else ("<=" if "<=" in bounds else "=")
        _branch(out, task, method)[attacker] = entry
    return out


def _fmt_factor(factor, bound) -> str:
    if factor is None:
        return "?"
    return {"=": "", ">=": "≥", "<=": "≤", "~": "≈"}[bound] + f"{rp.fmt_number(factor, 3)}×"


def _cell(recs, slows, steps, key, with_factor: bool) -> str:
    """Each seed's steps to ``key`` (``>steps``: censored) and, if asked, its slow-down."""
    parts = []
    for rec, sl in zip(recs, slows, strict=True):
        t = rec["steps_to"][key]
        text = str(t) if t is not None else f">{steps}"
        parts.append(text + (f" ({_fmt_factor(sl['factor'], sl['bound'])})" if with_factor else ""))
    return " / ".join(parts)


def _table(results, settings) -> str:
    """table.md's body: the slow-downs (geometric means), then each dataset's and task's steps."""
    steps, attackers = settings["steps"], settings["attackers"]
    key = f"{settings['fraction']:g}"
    text = ""
    if settings["methods"]:
        for k in dict.fromkeys((key, f"{DEEP_FRACTION:g}")):
            rows, summary = [], results["summary"][k]
            for m in settings["methods"]:
                both = [(summary["D_H"][m][a], summary["D_P"][m][a]) for a in attackers]
                cells = (" / ".join(_fmt_factor(s["geomean"], s["bound"]) for s in b) for b in both)
                rows.append([rp.METHOD_LABELS[m], *cells])
            title = f"Slow-down against θ = I to {float(k):.4g} of the loss reduction, D_H / D_P "
            title += "(geometric mean over the datasets)"
            text += rp.section(title, ["θ", *attackers], rows)
        text += (
            "A factor > 1 on D_H is immunization holding against that attacker; on D_P it "
            "should be ≤ 1 (the pre-training task stays easy). ≥: some runs did not reach the "
            f"target within {steps} steps (a lower bound); ≤: θ = I did not (an upper bound); ≈: "
            "bounds of both kinds, or some datasets censored for θ and θ = I alike (left out); "
            "?: censored for θ and θ = I alike everywhere.\n\n"
        )
    for (name, by_task), task in itertools.product(results["probes"].items(), TASKS):
        rows = []
        for m in ["identity", *settings["methods"]]:
            recs, slows = by_task[task][m], results["slowdown"][key][name][task][m]
            row = [rp.METHOD_LABELS[m]]
            row.append(" / ".join(rp.fmt_number(r["kappa"], 3) for r in recs[attackers[0]]))
            row += [_cell(recs[a], slows[a], steps, key, m != "identity") for a in attackers]
            immunized = results["immunization"][name][m]
            rows.append(row + [" / ".join(rp.fmt_number(r["rir"], 3) for r in immunized)])
        label = "D_H (the attack)" if task == "D_H" else "D_P (pre-training task)"
        title = f"{name}: {label}, steps to {float(key):.4g} of the loss reduction"
        text += rp.section(title, ["θ", "κ(AᵀA)", *attackers, "RIR"], rows)
    epochs = ", ".join(f"{k} {v}" for k, v in settings["epochs"].items())
    text += (
        f"Cells: probing steps until the loss ‖Xθw − y‖² has dropped by "
        f"{settings['fraction']:.4g} of the achievable reduction L(0) − L(w*), from w_0 = 0 "
        f"(>{steps}: not within {steps} steps), and in brackets the slow-down against θ = I with "
        f"the same attacker. κ(AᵀA) of the probed features A = Xθ over the nonzero spectrum "
        f"(rank tolerance max(N_P, N_H, D)·eps on σ, the run's). "
        f"Attackers with condreg.attacks.probe's documented defaults: gd_exact = exact line "
        f"search (Eq. 16), gd = step 1/L, momentum = Polyak heavy ball with the optimal "
        f"quadratic parameters, nesterov = step 1/L with (t−1)/(t+2) momentum, adam = lr 1e-3, "
        f"betas (0.9, 0.999), lbfgs = history 10 with exact line search, lstsq = closed form. "
        f"Immunization epochs: {epochs}. Values of several seeds are separated by /.\n"
    )
    return text


def _notes(probes) -> list[str]:
    """Whether the closed form's optimum is the same for every θ, per (dataset, task)."""
    same, differ = [], []
    for name, by_task in probes.items():
        for task, by_method in by_task.items():
            mins = [r["loss_min"] for m in by_method.values() for r in m.get("lstsq", [])]
            if len(mins) > 1:
                spread = (max(mins) - min(mins)) / max(abs(max(mins)), 1e-300)
                (same if spread < 1e-8 else differ).append((f"{name} {task}", spread))
    notes = []
    if same:
        notes.append(
            f"the achievable loss L(w*) is the same for every θ on {len(same)} of "
            f"{len(same) + len(differ)} (dataset, task) (largest relative spread "
            f"{max(v for _, v in same):.1e}): an invertible θ cannot change what the closed-form "
            "attacker reaches"
        )
    for where, spread in differ:
        notes.append(
            f"{where}: the achievable loss L(w*) differs between the θ's (relative spread "
            f"{spread:.1e}): some θ lowered the rank of Xθ"
        )
    return notes


def _plot(path, curves, task, settings) -> None:
    """One panel per dataset and attacker: each θ's excess loss on ``task``, log-log."""
    from matplotlib.ticker import LogLocator

    steps, fraction, attackers = settings["steps"], settings["fraction"], settings["attackers"]
    names, thetas = list(curves), ["identity", *settings["methods"]]
    figsize = (2.3 * len(attackers) + 0.6, 2.3 * len(names) + 0.8)
    fig, axes = rp.new_figure(len(names), len(attackers), figsize=figsize, squeeze=False)
    floor = 1e-8
    for (row, name), (col, attacker) in itertools.product(enumerate(names), enumerate(attackers)):
        ax, by_theta = axes[row, col], {m: curves[name][task][m][attacker] for m in thetas}
        for m, c in by_theta.items():
            t = np.asarray(c["t"][1:], dtype=float)
            e = np.maximum(np.asarray(c["excess"][1:], dtype=float), floor)
            style = {"ls": "--", "lw": 1.4} if m == "identity" else {"lw": 1.2}
            ax.plot(t, e, color=rp.METHOD_COLORS[m], label=rp.METHOD_LABELS[m], **style)
        top = max(max(max(c["excess"]) for c in by_theta.values()), 1.0)
        ax.axhline(1 - fraction, color="k", lw=0.6, ls=":")
        ax.set(xscale="log", yscale="log", xlim=(1, steps), ylim=(floor / 2, min(top, 1e12) * 2))
        if attacker == "lstsq":
            ax.text(1.5, 1e-6, "w* at t = 1,\nevery θ", fontsize=8)
        if row == 0:
            ax.set_title(attacker, fontsize=10)
        if row == len(names) - 1:
            ax.set_xlabel("step t", fontsize=8)
        if col == 0:
            ax.set_ylabel(f"{name}\nexcess loss", fontsize=8)
        ax.tick_params(labelsize=7)
        # log axes' minor ticks cost most of the drawing time of 2×7 panels: drop them
        ax.xaxis.set_major_locator(LogLocator(base=10, numticks=5))
        ax.yaxis.set_major_locator(LogLocator(base=100, numticks=6))
        ax.minorticks_off()
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(thetas), fontsize=8)
    what = "harmful task D_H (the attack)" if task == "D_H" else "pre-training task D_P"
    fig.suptitle(
        f"{'Quick run — ' if settings['quick'] else ''}Linear probing of Xθ on the {what}: "
        f"(L(w_t) − L*) / (L(0) − L*), dotted = {1 - fraction:.0%} left",
        fontsize=10,
    )
    rp.save_figure(fig, path)
