"""Fig. 1: how fast linear probing converges on the immunized features (Eq. 16).

For each dataset pair -- house prices (D_P: LotArea task, D_H: SalePrice task) and one MNIST digit
pair (default P = 1, H = 7, the tasks of :mod:`condreg.experiments.mnist_pairs`) -- and for
Identity (θ = I) and each method's θ from :func:`condreg.immunize` (same settings as Table 1 /
Table 2), run linear probing min_w ‖Xθw − y‖² by gradient descent with exact line search from
w_0 = 0 (:func:`condreg.metrics.probe_convergence`) on D_H and on D_P, and plot the norm ratio
‖w_t − w*‖² / ‖w_0 − w*‖² against t (w* the minimum-norm least-squares solution). Immunization
should make the D_H curve flatter than Identity's and leave the D_P curve at least as steep.

For MNIST the probe's targets are the 0/1 task labels (ℓ2 probing, Eq. 8), although θ was
trained with the logistic loss.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import numpy as np

from condreg.experiments import UsageError
from condreg.experiments import _report as rp
from condreg.experiments._linear import (
    TOLERANCE_FACTORS,
    check_task_ranks,
    immunize_method,
    spectrum_numbers,
    stopped_early,
)

__all__ = ["run", "norm_ratio_curve"]

PAPER_STEPS = 500
QUICK_STEPS = 50


def norm_ratio_curve(A: np.ndarray, y: np.ndarray, steps: int) -> np.ndarray:
    """Eq. 16 for ``A = Xθ``: norm ratios ``[1, r_1, …, r_steps]`` (condreg.metrics, or fallback).

    The fallback (used only if :func:`condreg.metrics.probe_convergence` is unavailable)
    implements the same recipe: w_0 = 0, g = 2Aᵀ(Aw − y), α* = gᵀg / (2 gᵀAᵀA g),
    w* = pinv(A) y.
    """
    try:
        from condreg.metrics import probe_convergence
    except ImportError:  # pragma: no cover - API in flux
        probe_convergence = None
    if probe_convergence is not None:
        out = probe_convergence(A, y, steps)
        for name in ("norm_ratio", "norm_ratios", "ratios"):
            if isinstance(out, dict) and name in out:
                out = out[name]
                break
            if hasattr(out, name):
                out = getattr(out, name)
                break
        curve = np.asarray(out, dtype=np.float64).reshape(-1)
        return curve if curve.size == steps + 1 else np.concatenate([[1.0], curve])[: steps + 1]
    A = np.asarray(A, dtype=np.float64)
    w_star = np.linalg.lstsq(A, y, rcond=None)[0]
    w = np.zeros(A.shape[1])
    e0 = float(np.sum((w - w_star) ** 2))
    ratios = [1.0]
    for _ in range(steps):
        g = 2 * A.T @ (A @ w - y)
        Ag = A @ g
        denom = 2 * float(Ag @ Ag)
        if denom <= 0:
            ratios.append(ratios[-1])
            continue
        w = w - float(g @ g) / denom * g
        ratios.append(float(np.sum((w - w_star) ** 2)) / e0)
    return np.asarray(ratios)


def _house_pair(data: Any):
    from condreg.experiments.data import load_house_prices

    hp = load_house_prices(data)
    check_task_ranks(hp.X_p, hp.X_h, where=str(data or "house prices"))
    return hp.X_p, hp.y_p, hp.X_h, hp.y_h


def _mnist_pair(pair, quick, seed):
    from condreg.experiments.data import load_mnist
    from condreg.experiments import mnist_pairs as mp

    base = mp.QUICK_SETTINGS if quick else mp.PAPER_SETTINGS
    X, y = load_mnist()
    preset = mp.INPUT_PRESETS["pooled"]
    X, _ = mp.prepare_inputs(X, preset["pool"], preset["min_pixel_activity"], preset["normalize"])
    tasks = mp.build_tasks(
        X,
        y,
        pair,
        seed=seed,
        n_positive=base["n_positive"],
        negative_fraction=base["negative_fraction"],
    )
    tp, th = tasks[pair[0]], tasks[pair[1]]
    return tp.X, tp.y, th.X, th.y


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    data: str | pathlib.Path | None = None,
    pair: list[tuple[int, int]] | tuple[int, int] | None = None,
    steps: int | None = None,
    methods: list[str] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run Fig. 1 and write results.json, table.md and ``convergence.png`` into ``out_dir``.

    ``data`` is the house-price directory (default: the copy shipped with the package).
    ``seeds`` > 1 averages the curves' endpoints over seeds.
    """
    from condreg.experiments import house_prices as hpmod
    from condreg.experiments import mnist_pairs as mp

    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    if isinstance(pair, list):
        if len(pair) != 1:
            raise UsageError(f"--pair takes one (P, H) digit pair, got {len(pair)}")
        pair = pair[0]
    pair = tuple(pair) if pair is not None else (1, 7)
    if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(range(10)):
        raise UsageError(f"--pair needs two distinct digits 0-9, got {pair!r}")
    rp.check_positive("--steps", steps, integer=True)
    steps = int(steps or (QUICK_STEPS if quick else PAPER_STEPS))
    methods = rp.check_methods(methods)
    seed_values = rp.seed_list(seeds)
    notes: list[str] = []

    datasets: dict[str, dict[str, Any]] = {
        "house-prices": {
            "loader": lambda seed: _house_pair(data),
            "task": "regression",
            "epochs": (hpmod.QUICK_SETTINGS if quick else hpmod.PAPER_SETTINGS)["epochs"],
        }
    }
    datasets[f"mnist-{pair[0]}-{pair[1]}"] = {
        "loader": lambda seed: _mnist_pair(pair, quick, seed),
        "task": "classification",
        "epochs": (mp.QUICK_SETTINGS if quick else mp.PAPER_SETTINGS)["epochs"],
    }
    lr = 0.005
    settings = {
        "steps": steps,
        "methods": methods,
        "lr": lr,
        "quick": quick,
        "mnist_pair": list(pair),
        "datasets": list(datasets),
        "epochs": {k: v["epochs"] for k, v in datasets.items()},
        "probe": "gradient descent with exact line search from w_0 = 0 (Eq. 16)",
    }

    jobs = [(s, name, m) for s in seed_values for name in datasets for m in ["identity", *methods]]
    curves: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    numbers: dict[str, dict[str, list[dict[str, Any]]]] = {}
    cache: dict[tuple[int, str], Any] = {}
    for seed, name, method in rp.progress(jobs, enabled=progress, desc="convergence"):
        if (seed, name) not in cache:
            cache[(seed, name)] = datasets[name]["loader"](seed)
        X_p, y_p, X_h, y_h = cache[(seed, name)]
        if method == "identity":
            theta = np.eye(X_p.shape[1])
            res = spectrum_numbers(None, X_p, X_h)
        else:
            res = immunize_method(
                method,
                X_p,
                y_p,
                X_h,
                y_h=y_h,
                task=datasets[name]["task"],
                epochs=datasets[name]["epochs"],
                lr=lr,
                seed=seed,
                **options,
            )
            theta = res.pop("_theta")
            res.pop("history", None)
        entry = curves.setdefault(name, {}).setdefault(method, {"D_P": [], "D_H": []})
        entry["D_P"].append(norm_ratio_curve(X_p @ theta, y_p, steps).tolist())
        entry["D_H"].append(norm_ratio_curve(X_h @ theta, y_h, steps).tolist())
        keep = ("i", "ii", "rir", "kappa_H_P", "kappa_H_H", "kappa_K_P", "kappa_K_H")
        keep += () if method == "identity" else ("rtol", "success", "tolerance", "stopped")
        numbers.setdefault(name, {}).setdefault(method, []).append({k: res[k] for k in keep})

    final = {
        name: {
            m: {task: rp.mean_std([c[-1] for c in cs]) for task, cs in by_task.items()}
            for m, by_task in by_method.items()
        }
        for name, by_method in curves.items()
    }
    immunized = [
        r for by in numbers.values() for m, rs in by.items() if m != "identity" for r in rs
    ]
    results = {
        "final_norm_ratio": final,
        "rir": numbers,
        "curves": curves,
        "stopped_early": stopped_early(immunized),
    }
    notes += _flip_notes(numbers)
    payload = rp.write_outputs(
        out_dir,
        experiment="convergence",
        settings=settings,
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - start,
        notes=notes,
        table=_table(final, numbers, steps, notes),
        title="Fig. 1 — linear-probing convergence (Eq. 16, exact line search)",
    )
    _plot(out_dir, curves, steps)
    return payload


def _flip_notes(numbers) -> list[str]:
    """A note for every run whose verdict changes between 1×, 10× and 100× the rank tolerance."""
    notes = []
    for name, by_method in numbers.items():
        for m, runs in by_method.items():
            for r in runs:
                if m != "identity" and r["tolerance"]["flips"]:
                    rirs = ", ".join(
                        f"{rp.fmt_number(r['tolerance'][f'{f}x']['rir'], 3)} at {f}×"
                        for f in TOLERANCE_FACTORS
                    )
                    notes.append(
                        f"{name}, {rp.METHOD_LABELS[m]}: the verdict flips with the rank "
                        f"tolerance (RIR {rirs} rtol)"
                    )
    return notes


def _table(final, numbers, steps, notes) -> str:
    text = ""
    for name, by_method in final.items():
        rows = []
        for m in ["identity", *[x for x in rp.METHODS if x in by_method]]:
            if m not in by_method:
                continue
            runs = numbers[name][m]
            rir = rp.mean_std([r["rir"] for r in runs])
            if m == "identity":
                verdict = "—"
            else:
                verdict = " / ".join(
                    f"{sum(r['tolerance'][f'{f}x']['success'] for r in runs)}/{len(runs)}"
                    for f in TOLERANCE_FACTORS
                )
            rows.append(
                [
                    rp.METHOD_LABELS[m],
                    rp.fmt_mean_std(by_method[m]["D_P"]),
                    rp.fmt_mean_std(by_method[m]["D_H"]),
                    rp.fmt_mean_std(rir),
                    verdict,
                ]
            )
        header = ["θ", f"norm ratio after {steps} steps, D_P", "… D_H", "RIR"]
        header.append("success at 1× / 10× / 100× rtol")
        text += f"## {name}\n\n" + rp.markdown_table(header, rows) + "\n"
    text += (
        "Norm ratio ‖w_t − w*‖²/‖w_0 − w*‖² (Eq. 16), gradient descent with exact line search "
        "from w_0 = 0. Lower = faster probing. The paper shows these as curves (Fig. 1) without "
        "a table; the immunized D_H curve should stay above Identity's, the D_P curve not. "
        "Success = (i) > 1 and (ii) ≤ 1 at the run's rank tolerance rtol on σ(Xθ), and at 10× "
        "and 100× it.\n"
    )
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return text


def _plot(out_dir: pathlib.Path, curves, steps) -> None:
    names = list(curves)
    fig, axes = rp.new_figure(len(names), 2, figsize=(10, 3.6 * len(names)), squeeze=False)
    t = np.arange(steps + 1)
    for row, name in enumerate(names):
        for col, task in enumerate(("D_P", "D_H")):
            ax = axes[row, col]
            for m, by_task in curves[name].items():
                c = np.mean(np.asarray(by_task[task]), axis=0)
                style = {"ls": "--"} if m == "identity" else {}
                ax.plot(
                    t,
                    np.maximum(c, 1e-300),
                    label=rp.METHOD_LABELS[m],
                    color=rp.METHOD_COLORS[m],
                    **style,
                )
            ax.set_yscale("log")
            ax.set_xlabel("probing step t")
            ax.set_ylabel("‖w_t − w*‖² / ‖w_0 − w*‖²")
            ax.set_title(f"{name}: {task}")
    axes[0, 1].legend(fontsize=8)
    fig.suptitle("Fig. 1 analogue: linear probing with exact line search")
    rp.save_figure(fig, out_dir / "convergence.png")
