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

from condreg.experiments import _report as rp
from condreg.experiments._linear import immunize_method, spectrum_numbers

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
    from condreg.data import load_house_prices
    from condreg.experiments.house_prices import _resolve_data_dir

    hp = load_house_prices(_resolve_data_dir(data))
    return hp.X_p, hp.y_p, hp.X_h, hp.y_h


def _mnist_pair(pair, quick, seed):
    from condreg.data import load_mnist
    from condreg.experiments import mnist_pairs as mp

    base = mp.QUICK_SETTINGS if quick else mp.PAPER_SETTINGS
    X, y = load_mnist()
    X, _ = mp.prepare_inputs(X, base["pool"], base["min_pixel_activity"])
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

    Without house-price data (``data`` None and no ``../shared/data/house_price``) only the MNIST
    pair is run, with a note. ``seeds`` > 1 averages the curves' endpoints over seeds.
    """
    from condreg.experiments import house_prices as hpmod
    from condreg.experiments import mnist_pairs as mp

    start = time.perf_counter()
    out_dir = rp.prepare_out_dir(out_dir)
    if isinstance(pair, list):
        pair = pair[0]
    pair = tuple(pair) if pair is not None else (1, 7)
    steps = int(steps or (QUICK_STEPS if quick else PAPER_STEPS))
    methods = list(methods or rp.METHODS)
    seed_values = rp.seed_list(seeds)
    notes: list[str] = []

    datasets: dict[str, dict[str, Any]] = {}
    try:
        datasets["house-prices"] = {
            "loader": lambda seed: _house_pair(data),
            "task": "regression",
            "epochs": (hpmod.QUICK_SETTINGS if quick else hpmod.PAPER_SETTINGS)["epochs"],
        }
        hpmod._resolve_data_dir(data)
    except FileNotFoundError as exc:
        datasets.pop("house-prices")
        notes.append(f"house prices skipped: {exc}")
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
        numbers.setdefault(name, {}).setdefault(method, []).append(
            {
                k: res[k]
                for k in ("i", "ii", "rir", "kappa_H_P", "kappa_H_H", "kappa_K_P", "kappa_K_H")
            }
        )

    final = {
        name: {
            m: {task: rp.mean_std([c[-1] for c in cs]) for task, cs in by_task.items()}
            for m, by_task in by_method.items()
        }
        for name, by_method in curves.items()
    }
    results = {"final_norm_ratio": final, "rir": numbers, "curves": curves}
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


def _table(final, numbers, steps, notes) -> str:
    text = ""
    for name, by_method in final.items():
        rows = []
        for m in ["identity", *[x for x in rp.METHODS if x in by_method]]:
            if m not in by_method:
                continue
            rir = rp.mean_std([r["rir"] for r in numbers[name][m]])
            rows.append(
                [
                    rp.METHOD_LABELS[m],
                    rp.fmt_mean_std(by_method[m]["D_P"]),
                    rp.fmt_mean_std(by_method[m]["D_H"]),
                    rp.fmt_mean_std(rir),
                ]
            )
        text += (
            f"## {name}\n\n"
            + rp.markdown_table(["θ", f"norm ratio after {steps} steps, D_P", "… D_H", "RIR"], rows)
            + "\n"
        )
    text += (
        "Norm ratio ‖w_t − w*‖²/‖w_0 − w*‖² (Eq. 16), gradient descent with exact line search "
        "from w_0 = 0. Lower = faster probing. The paper shows these as curves (Fig. 1) without "
        "a table; the immunized D_H curve should stay above Identity's, the D_P curve not.\n"
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
                style = {"color": "k", "ls": "--"} if m == "identity" else {}
                ax.plot(t, np.maximum(c, 1e-300), label=rp.METHOD_LABELS[m], **style)
            ax.set_yscale("log")
            ax.set_xlabel("probing step t")
            ax.set_ylabel("‖w_t − w*‖² / ‖w_0 − w*‖²")
            ax.set_title(f"{name}: {task}")
    axes[0, 1].legend(fontsize=8)
    fig.suptitle("Fig. 1 analogue: linear probing with exact line search")
    rp.save_figure(fig, out_dir / "convergence.png")
