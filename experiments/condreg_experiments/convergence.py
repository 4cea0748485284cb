"""Fig. 1: how fast linear probing converges on the immunized features (Eq. 16): on house prices
and one MNIST pair (default 1-7, 0/1 targets), θ = I and each method's θ are probed on D_H and D_P
by :func:`condreg.metrics.probe_convergence`."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import pathlib
import time
from typing import Any

import numpy as np

from condreg.metrics import probe_convergence
from condreg_experiments import UsageError
from condreg_experiments import _report as rp
from condreg_experiments import options as opt
from condreg_experiments._linear import (
    TOLERANCE_FACTORS,
    check_task_ranks,
    immunize_method,
    spectrum_numbers,
    stopped_early,
)
from condreg_experiments._runner import UnitStore, run_units

__all__ = ["HELP", "add_arguments", "digits_closed", "linear_datasets", "run"]

#: Probing steps of the full run and of ``--quick``.
PAPER_STEPS = 500
QUICK_STEPS = 50
#: The immunization step size (the paper's η, both datasets).
LR = 0.005

#: One line for ``condreg reproduce --help``.
HELP = "Fig. 1: linear-probing convergence (Eq. 16)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``condreg reproduce convergence`` (keywords of :func:`run`)."""
    parser.add_argument(
        "--data",
        type=pathlib.Path,
        help="house-price directory (default: the Ames data shipped with condreg)",
    )
    parser.add_argument("--pair", type=opt.parse_pairs, help="the MNIST (P, H) pair (default 1-7)")
    parser.add_argument(
        "--steps",
        type=opt.positive_int,
        help=f"probing gradient steps (exact line search; default {PAPER_STEPS}, "
        f"--quick {QUICK_STEPS})",
    )
    parser.add_argument("--methods", type=opt.method_list, help=opt.METHODS_HELP)
    opt.add_resume_option(parser, "(seed, dataset, θ)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small, fast version: the quick immunization settings of house-prices and "
        f"mnist-pairs (fewer epochs, 250 positive images), {QUICK_STEPS} probing steps; "
        "about 3 s on a 2-core CPU",
    )


def digits_closed(ratio: Any) -> np.ndarray:
    """``−log10`` of Eq. 16's norm ratios: the digits of the distance to the probe's optimum closed
    (higher = faster probing), clipped to [1e-16, 40] (NaN: 1e-16)."""
    r = np.asarray(ratio, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = -np.log10(np.clip(r, 1e-40, None))
    return np.clip(np.nan_to_num(d, nan=1e-16), 1e-16, 40.0)


@dataclasses.dataclass(frozen=True)
class Settings(opt.StudySettings):
    """The knobs of ``condreg reproduce convergence`` besides the pair."""

    STUDY = "convergence"
    QUICK = {"steps": QUICK_STEPS}
    POSITIVE = ("steps",)

    steps: int = PAPER_STEPS
    methods: tuple[str, ...] | None = None  # None: every method

    def checked(self) -> Settings:
        return dataclasses.replace(self, methods=tuple(rp.check_methods(self.methods)))


def _check(pair, given, quick) -> tuple[tuple[int, int], int, list[str]]:
    """The options, checked (UsageError) and resolved: ``(pair, steps, methods)``."""
    if isinstance(pair, list):
        if len(pair) != 1:
            raise UsageError(f"--pair takes one (P, H) digit pair, got {len(pair)}")
        pair = pair[0]
    pair = opt.check_pairs(None if pair is None else [pair], [(1, 7)])[0]
    s = Settings.resolve(quick, given)
    return pair, s.steps, list(s.methods)


def linear_datasets(
    data: str | pathlib.Path | None, pairs: list, quick: bool, epochs: int | None = None
) -> tuple[dict[str, dict[str, Any]], pathlib.Path]:
    """``({name: {"task", "epochs", "lr", "loader"}}, house-price directory)``: house prices and
    each MNIST pair as in house-prices / mnist-pairs; ``loader(seed)``: ``(X_p, y_p, X_h, y_h)``."""
    from condreg_experiments import house_prices as hpmod
    from condreg_experiments import mnist_pairs as mp
    from condreg_experiments.data import load_house_prices

    def spec(task: str, module: Any, loader: Any) -> dict[str, Any]:
        base = module.Settings.resolve(quick, {})
        return dict(task=task, epochs=int(epochs or base.epochs), lr=base.lr, loader=loader)

    data_dir = hpmod.resolve_data_dir(data)
    hp = load_house_prices(data_dir)
    house = hp.X_p, hp.y_p, hp.X_h, hp.y_h
    datasets = {"house-prices": spec("regression", hpmod, lambda seed: house)}
    X, y = mp.pooled_mnist()
    base = mp.Settings.resolve(quick, {})
    sizes = {"n_positive": base.n_positive, "negative_fraction": base.negative_fraction}
    for pair in pairs:

        def loader(seed: int, pair: tuple[int, int] = pair) -> tuple[np.ndarray, ...]:
            tp, th = mp.build_tasks(X, y, pair, seed=seed, **sizes).values()
            return tp.X, tp.y, th.X, th.y

        datasets[f"mnist-{pair[0]}-{pair[1]}"] = spec("classification", mp, functools.cache(loader))
    return datasets, data_dir


_KEEP = ("i", "ii", "rir", "kappa_H_P", "kappa_H_H", "kappa_K_P", "kappa_K_H")
_KEEP_RUN = ("rtol", "success", "tolerance", "stopped")


def _unit(spec, seed: int, method: str, steps: int, options) -> dict[str, Any]:
    """One (seed, dataset, θ): Eq. 16's curve on each task and the run's numbers."""
    X_p, y_p, X_h, y_h = spec["loader"](seed)
    if method == "identity":
        theta, res = np.eye(X_p.shape[1]), spectrum_numbers(None, X_p, X_h)
    else:
        kw = dict(task=spec["task"], epochs=spec["epochs"], lr=LR, seed=seed)
        res = immunize_method(method, X_p, y_p, X_h, y_h=y_h, **kw, **options)
        theta = res.pop("_theta")
    curves = {
        task: np.asarray(probe_convergence(X @ theta, y, steps)).tolist()
        for task, X, y in (("D_P", X_p, y_p), ("D_H", X_h, y_h))
    }
    keep = _KEEP if method == "identity" else _KEEP + _KEEP_RUN
    # as saved: a resumed unit and a fresh one are the same values
    return rp.from_jsonable(
        rp.to_jsonable({"curves": curves, "numbers": {k: res[k] for k in keep}})
    )


def _units(datasets, seed_values, methods, steps, progress, options, store) -> tuple:
    """``curves[name][method][task]`` (Eq. 16, a list per seed) and ``numbers[name][method]`` (a
    dict per seed) of every (seed, dataset, θ), each from ``store`` or computed and saved there;
    and the timing."""
    keys = [(s, name, m) for s in seed_values for name in datasets for m in ["identity", *methods]]

    def compute(key: tuple) -> dict[str, Any]:
        seed, name, method = key
        return _unit(datasets[name], seed, method, steps, options)

    done = run_units(
        store, {k: _key(*k) for k in keys}, compute, jobs=1, progress=progress, desc="convergence"
    )
    curves, numbers = {}, {}
    for (_, name, method), unit in done.units.items():
        entry = curves.setdefault(name, {}).setdefault(method, {"D_P": [], "D_H": []})
        for task in ("D_P", "D_H"):
            entry[task].append(unit["curves"][task])
        numbers.setdefault(name, {}).setdefault(method, []).append(unit["numbers"])
    return curves, numbers, done.timing()


def _key(seed: int, name: str, method: str) -> str:
    """The unit's file name in ``units/``."""
    return f"seed{seed}_{name}_{method}"


def _final(curves) -> dict[str, Any]:
    """Per dataset, θ and task: the norm ratio after the last step (geometric summary over
    seeds) and its −log10 (mean ± std)."""

    def last(cs) -> dict[str, Any]:
        digits = [float(digits_closed(c[-1])) for c in cs]
        return rp.ratio_summary([c[-1] for c in cs]) | {"digits": rp.mean_std(digits)}

    return {
        name: {m: {task: last(cs) for task, cs in by_task.items()} for m, by_task in by.items()}
        for name, by in curves.items()
    }


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    data: str | pathlib.Path | None = None,
    pair: list[tuple[int, int]] | tuple[int, int] | None = None,
    resume: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run Fig. 1 and write results.json, table.md, ``convergence.png`` and units/ (one per
    (seed, dataset, θ), kept by ``resume``) into ``out_dir``; ``pair`` defaults to (1, 7),
    ``options``: the fields of :class:`Settings`, the rest go to :func:`condreg.immunize`.
    Raises :class:`condreg_experiments.UsageError` for a bad option, before any work."""
    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    pair, steps, methods = _check(pair, Settings.take(options), quick)
    seed_values = rp.seed_list(seeds)
    datasets, data_dir = linear_datasets(data, [pair], quick)
    X_p, _, X_h, _ = datasets["house-prices"]["loader"](0)
    check_task_ranks(X_p, X_h, where=str(data or "house prices"))
    settings = dict(steps=steps, lr=LR, quick=quick, mnist_pair=list(pair))
    settings.update(datasets=list(datasets), epochs={k: v["epochs"] for k, v in datasets.items()})
    settings.update(data_dir=str(data_dir), immunize_options=dict(options))
    store = UnitStore(out_dir, settings=settings, resume=resume)  # a unit per method
    curves, numbers, timing = _units(
        datasets, seed_values, methods, steps, progress, options, store
    )
    final, notes = _final(curves), _flip_notes(numbers) + store.note("unit(s)")
    settings.update(methods=methods)
    settings.update(probe="gradient descent with exact line search from w_0 = 0 (Eq. 16)")
    immunized = [rs for by in numbers.values() for m, rs in by.items() if m != "identity"]
    results = {"final_norm_ratio": final, "rir": numbers, "curves": curves, "timing": timing}
    results["stopped_early"] = stopped_early([r for rs in immunized for r in rs])
    fields = dict(settings=settings, seeds=seed_values, results=results, notes=notes, start=start)
    title = "Fig. 1 — linear-probing convergence (Eq. 16, exact line search)"
    if quick:
        title += " — quick: fewer epochs and steps, not comparable with the paper"
    fields["table"] = _table(final, numbers, steps, quick)
    payload = rp.write_outputs(out_dir, experiment="convergence", title=title, **fields)
    _plot(out_dir, curves, steps, quick)
    return payload


def _flip_notes(numbers) -> list[str]:
    """A note for every run whose verdict changes between 1×, 10× and 100× the rank tolerance."""
    notes = []
    for name, by_method in numbers.items():
        for m, rs in by_method.items():
            for t in [r["tolerance"] for r in rs if m != "identity" and r["tolerance"]["flips"]]:
                rirs = ", ".join(
                    f"{rp.fmt_number(t[f'{f}x']['rir'], 3)} at {f}×" for f in TOLERANCE_FACTORS
                )
                notes.append(
                    f"{name}, {rp.METHOD_LABELS[m]}: the verdict flips with the rank tolerance "
                    f"(RIR {rirs} rtol)"
                )
    return notes


_QUICK_NOTE = (
    "**Quick run: fewer immunization epochs and probing steps; not comparable with the paper.**\n\n"
)


def _table(final, numbers, steps, quick: bool) -> str:
    """table.md's body: per dataset, each θ's norm ratios, RIR and verdicts."""
    text = _QUICK_NOTE if quick else ""
    header = ["θ", f"D_P: ratio after {steps} steps", "D_P: −log₁₀ ratio", "D_H: ratio"]
    header += ["D_H: −log₁₀ ratio", "RIR", "success at 1× / 10× / 100× rtol"]
    header += ["success at (i) ≥ 2 / ≥ 10"]
    for name, by_method in final.items():
        rows = []
        for m in [x for x in ("identity", *rp.METHODS) if x in by_method]:
            runs, cells = numbers[name][m], [rp.METHOD_LABELS[m]]
            for task in ("D_P", "D_H"):
                ratio = by_method[m][task]
                cells += [rp.fmt_ratio(ratio), rp.fmt_mean_std(ratio["digits"])]
            cells.append(rp.fmt_ratio(rp.ratio_summary([r["rir"] for r in runs])))
            factors = [] if m == "identity" else [f"{f}x" for f in TOLERANCE_FACTORS]
            counts = [sum(r["tolerance"][f]["success"] for r in runs) for f in factors]
            cells.append(" / ".join(f"{c}/{len(runs)}" for c in counts) or "—")
            by_i = rp.success_counts((r["i"], r["ii"]) for r in runs)
            thresholds = [f"{by_i[k]}/{len(runs)}" for k in ("i>=2", "i>=10")]
            cells.append("—" if m == "identity" else " / ".join(thresholds))
            rows.append(cells)
        text += rp.section(name, header, rows)
    text += (
        "Norm ratio ‖w_t − w*‖²/‖w_0 − w*‖² (Eq. 16), gradient descent with exact line search "
        "from w_0 = 0; −log₁₀ ratio = the decimal digits of the distance to w* closed (a ratio "
        "of 1 − 1e-9 is 4.3e-10 digits). Lower ratio, more digits = faster probing: immunization "
        "should give D_H fewer digits than Identity and D_P at least as many. The paper shows "
        "these as curves (Fig. 1) without a table. RIR over seeds: geometric mean ×/÷ geometric "
        "std. Success = (i) > 1 and (ii) ≤ 1 at the run's rank tolerance rtol on σ(Xθ), and at "
        "10× and 100× it; and (ii) ≤ 1 with (i) ≥ 2 or ≥ 10 (Definition 3.1 (a) asks (i) ≫ 1).\n"
    )
    return text


def _plot(out_dir: pathlib.Path, curves, steps: int, quick: bool) -> None:
    """convergence.png: per dataset and task, −log10 of Eq. 16's ratio on a log axis."""
    names = list(curves)
    fig, axes = rp.new_figure(len(names), 2, figsize=(10, 3.6 * len(names)), squeeze=False)
    t = np.arange(1, steps + 1)
    tag = " (quick)" if quick else ""
    for row, name in enumerate(names):
        for col, task in enumerate(("D_P", "D_H")):
            ax = axes[row, col]
            for m, by_task in curves[name].items():
                d = digits_closed(np.mean(np.asarray(by_task[task]), axis=0))[1:]
                style = {"ls": "--"} if m == "identity" else {}
                ax.plot(t, d, label=rp.METHOD_LABELS[m], color=rp.METHOD_COLORS[m], **style)
            ax.set_yscale("log")
            ax.minorticks_off()  # log-axis minor ticks cost more to draw than they show
            ax.set_xlabel("probing step t")
            ax.set_ylabel("−log₁₀ ‖w_t − w*‖² / ‖w_0 − w*‖²")
            want = "want below Identity" if task == "D_H" else "want at or above Identity"
            ax.set_title(f"{name}{tag}: {task} ({want})", fontsize=10)
            ax.grid(alpha=0.3)
    axes[0, 1].legend(fontsize=8)
    fig.suptitle(
        f"Fig. 1 analogue{tag}: linear probing with exact line search — digits of the distance "
        "to w* closed (higher = faster probing)",
        fontsize=10,
    )
    rp.save_figure(fig, out_dir / "convergence.png")
