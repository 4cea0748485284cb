"""The ablation's data, its scoring (two κ's, three rank tolerances, three (i) thresholds) and its
units: one (dataset, row, seed, pair) each, run here or in worker processes, saved for --resume."""

from __future__ import annotations

import math
import warnings
from itertools import product
from typing import Any

import numpy as np

from condreg_experiments import _report as rp
from condreg_experiments import _runner as rn
from condreg_experiments import house_prices, mnist_pairs
from condreg_experiments._linear import TOLERANCE_FACTORS, default_rtol, immunize_method
from condreg_experiments.ablation import emulator as em
from condreg_experiments.ablation import factors as fc
from condreg_experiments.ablation import released as rel
from condreg_experiments.data import house_price_dir, load_house_prices, load_mnist

_EPS = np.finfo(np.float64).eps


def _svdvals(F: np.ndarray) -> np.ndarray:
    return np.linalg.svd(np.asarray(F, dtype=np.float64), compute_uv=False)


def _kappa(s: np.ndarray, rtol: float) -> tuple[float, int]:
    """κ(FᵀF) and the rank over the singular values ``s`` above ``rtol·σ₁``."""
    if s.size == 0 or not s[0] > 0:
        return math.nan, 0
    kept = s[s > rtol * s[0]]
    return float((kept[0] / kept[-1]) ** 2), int(kept.size)


def input_kappas(X_p: np.ndarray, X_h: np.ndarray) -> dict[str, Any]:
    """κ(K_P), κ(K_H) at θ = I: nonzero σ at rtol (and 10×, 100× it, ``by_rtol``), ridge floor."""
    rtol = default_rtol(X_p, X_h)
    s_p, s_h = _svdvals(X_p), _svdvals(X_h)
    by_rtol = {}
    for f in TOLERANCE_FACTORS:
        (kp, rank_p), (kh, rank_h) = _kappa(s_p, f * rtol), _kappa(s_h, f * rtol)
        by_rtol[f"{f}x"] = dict(kappa_K_P=kp, kappa_K_H=kh, rank_K_P=rank_p, rank_K_H=rank_h)
    ridge = {"kappa_K_P": rel.ridge_floor_kappa(X_p), "kappa_K_H": rel.ridge_floor_kappa(X_h)}
    return {"rtol": rtol, "nonzero": {**by_rtol["1x"], "by_rtol": by_rtol}, "ridge": ridge}


def _eq15(k_hp: float, k_hh: float, k_kp: float, k_kh: float) -> dict[str, Any]:
    i, ii = k_hh / k_kh, k_hp / k_kp
    by_i = rp.success_by_i(i, ii)
    return dict(kappa_H_P=k_hp, kappa_H_H=k_hh, i=i, ii=ii, rir=i / ii, success=by_i["i>1"]) | {
        "success_by_i": by_i
    }


def score_two_ways(theta, bias, X_p, X_h, inputs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Eq. 15 of ``xᵀθ + b`` by κ over the nonzero σ (at the inputs' rtol, with 10× and 100×
    it under ``tolerance``) and by the ridge-floor κ; non-finite θ: NaN, never a success."""
    finite = bool(np.all(np.isfinite(theta))) and (bias is None or bool(np.all(np.isfinite(bias))))
    F_p, F_h = (X @ theta if bias is None else X @ theta + bias for X in (X_p, X_h))
    nan = dict(k_hp=math.nan, k_hh=math.nan)
    s_p, s_h = (_svdvals(F_p), _svdvals(F_h)) if finite else (np.zeros(0), np.zeros(0))
    tolerance = {}
    for f in TOLERANCE_FACTORS:
        ref = inputs["nonzero"]["by_rtol"][f"{f}x"]
        k_hp, k_hh = _kappa(s_p, f * inputs["rtol"])[0], _kappa(s_h, f * inputs["rtol"])[0]
        tolerance[f"{f}x"] = _eq15(k_hp, k_hh, ref["kappa_K_P"], ref["kappa_K_H"])
    ridge = inputs["ridge"]
    if finite:
        nan = dict(k_hp=rel.ridge_floor_kappa(F_p), k_hh=rel.ridge_floor_kappa(F_h))
    nonzero = tolerance.pop("1x") | {"tolerance": tolerance}
    return {
        "nonzero": nonzero,
        "ridge": _eq15(nan["k_hp"], nan["k_hh"], ridge["kappa_K_P"], ridge["kappa_K_H"]),
    }


def _method(m: str, data: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """One method trained by the emulator (``emulated``) or ``condreg.immunize``, scored."""
    X_p, y_p, X_h, y_h, task = (data[k] for k in ("X_p", "y_p", "X_h", "y_h", "task"))
    if spec["kind"] == "emulated":
        tr = em.emulate(m, X_p, y_p, X_h, y_h, fc.protocol_of(spec), seed=spec["seed"])
        entry = score_two_ways(tr.theta, tr.bias, X_p, X_h, data["inputs"])
        keep = ("stopped", "lam", "epochs_run", "steps_run", "loss_final", "path_length")
        return entry | {k: getattr(tr, k) for k in keep}
    options = {k: spec[k] for k in ("epochs", "lr", "seed", "max_step") if k in spec}
    res = immunize_method(m, X_p, y_p, X_h, y_h=y_h, task=task, **options)
    entry = score_two_ways(res["_theta"], None, X_p, X_h, data["inputs"])
    entry.update(condreg_rir=res["rir"], history_rir=res["history"].get("rir", []))
    return entry | dict(loss_final=res["loss_final"], stopped=res["stopped"])


def _reference_loss(data: dict[str, Any], spec: dict[str, Any]) -> float:
    """The D_P-only rule's reference: the head alone on θ = I, trained as the unit trains it."""
    protocol = fc.protocol_of(spec)
    args = data["X_p"], data["y_p"], data["task"], spec["epochs"], spec["lr"]
    return em.head_only_loss(*args, adam=protocol.on("adam"))


def run_unit(key: str, task: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """Run the unit ``key`` (``task``: its data and spec), warnings dropped:
    ``{"spec", "methods"}``."""
    data, spec = task
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        result = {m: _method(m, data, spec) for m in spec["methods"]}
        if spec["kind"] == "default":
            result["head_only_loss"] = _reference_loss(data, {**spec, "fields": {}})
        elif spec["section"] == "rules":
            result["head_only_loss"] = _reference_loss(data, spec)
    return dict(spec=spec, methods=result)


def _task_data(X_p, y_p, X_h, y_h, task: str) -> dict[str, Any]:
    return dict(X_p=X_p, y_p=y_p, X_h=X_h, y_h=y_h, task=task, inputs=input_kappas(X_p, X_h))


def _raw_digit_inputs(X: np.ndarray, y: np.ndarray, digits) -> dict[str, Any]:
    """Per digit, both κ's of the released MNIST input (one digit's 784 normalised pixels)."""
    out = {}
    for d in digits:
        Xd = (X[y == d] - mnist_pairs.RAW_MEAN) / mnist_pairs.RAW_STD
        s = _svdvals(Xd)
        kappa, rank = _kappa(s, max(Xd.shape) * _EPS)
        n, ridge = int(Xd.shape[0]), rel.ridge_floor_kappa(Xd)
        top = float(s[0] ** 2) / n
        out[str(d)] = dict(
            n_images=n, nonzero=kappa, rank=rank, ridge=ridge, lambda_max_per_image=top
        )
    return out


def load_data(plan) -> dict[str, Any]:
    """Every task the plan needs (DataError before any work)."""
    data: dict[str, Any] = {}
    if "house" in plan.datasets:
        hp = load_house_prices(house_price_dir())
        released = rel.released_house_prices(house_price_dir())
        data["house"] = {
            t: _task_data(d.X_p, d.y_p, d.X_h, d.y_h, "regression")
            for t, d in (("condreg", hp), ("released", released))
        }
    if "mnist" in plan.datasets:
        s = plan.schedule("mnist")
        X_raw, y = load_mnist()
        X, n_features = mnist_pairs.prepare_inputs(X_raw, s["pool"], s["min_pixel_activity"])
        pairs = sorted({*plan.pairs, *plan.factor_pairs})
        digits = sorted({d for p in pairs for d in p} | {d for p in plan.raw_pairs for d in p})
        mnist: dict[Any, Any] = {"n_features": n_features}
        sizes = {k: s[k] for k in ("n_positive", "negative_fraction")}
        for seed in sorted({*plan.seeds, *plan.factor_seeds}):
            tasks = mnist_pairs.build_tasks(X, y, digits, seed=seed, **sizes)
            for p, h in pairs:
                tp, th = tasks[p], tasks[h]
                mnist[(seed, (p, h))] = _task_data(tp.X, tp.y, th.X, th.y, "classification")
            for pair in plan.raw_pairs if "released_mnist" in plan.parts else []:
                arrays = rel.released_mnist_tasks(X_raw, y, pair, np.random.default_rng(seed))
                mnist[("raw", seed, pair)] = _task_data(*arrays, "classification")
        mnist["raw_inputs"] = _raw_digit_inputs(X_raw, y, digits)
        data["mnist"] = mnist
    return data


def _training(plan, dataset: str) -> dict[str, Any]:
    s = plan.schedule(dataset)
    return {"epochs": s["epochs"], "lr": s["lr"]}


def _where(dataset: str, seed: int, pair) -> Any:
    return "condreg" if dataset == "house" else (seed, tuple(pair))


def _tail(seed: int, pair) -> str:
    return f"_seed{seed}" + ("" if pair is None else f"_pair{pair[0]}-{pair[1]}")


def _switch_specs(plan, dataset: str) -> list[tuple[str, Any, dict[str, Any]]]:
    """The default row, one row per released switch (and ``released``), the max_step sweep."""
    from condreg_experiments.ablation import switches_of

    out = []
    for seed, pair in product(plan.seeds, [None] if dataset == "house" else plan.pairs):
        where = (dataset, _where(dataset, seed, pair))
        base = {"dataset": dataset, "seed": seed, "pair": pair, **_training(plan, dataset)}
        base |= {"methods": list(rp.METHODS), "section": "switches"}
        for name in plan.protocols:
            sw = switches_of(name, dataset)
            if name == "condreg" or sw:  # else a switch that does not exist for this dataset
                key = (dataset, "released") if "released_preprocessing" in sw else where
                kind = "default" if name == "condreg" else "emulated"
                spec = {**base, "kind": kind, "protocol": name, "fields": {"switches": sw}}
                out.append((f"{dataset}_{name}{_tail(seed, pair)}", key, spec))
        for ms in [ms for ms in plan.max_steps if ms != 0.3]:
            spec = {**base, "kind": "sweep", "protocol": f"max_step={ms}", "section": "sweep"}
            out.append(
                (f"{dataset}_max_step{ms}{_tail(seed, pair)}", where, {**spec, "max_step": ms})
            )
    return out


def _factor_specs(plan, data, dataset: str) -> list[tuple[str, Any, dict[str, Any]]]:
    """The parts of the minibatch switch, each a row (Ours and Opt κ, ``factor_seeds``)."""
    out = []
    training = _training(plan, dataset)
    for name in fc.factors_of(dataset):
        seeds = plan.factor_seeds
        if dataset == "house" and name in fc.DETERMINISTIC_FACTORS:
            seeds = seeds[:1]  # no random numbers: every seed is the same run
        for seed, pair in product(seeds, [None] if dataset == "house" else plan.factor_pairs):
            where = (dataset, _where(dataset, seed, pair))
            d = data[dataset][where[1]]
            (n_p, D), n_h = d["X_p"].shape, d["X_h"].shape[0]
            fields = fc.factor_fields(name, dataset, training["epochs"], n_p, n_h, D)
            spec = {"dataset": dataset, "seed": seed, "pair": pair, **training, "kind": "emulated"}
            spec |= {"section": "factors", "protocol": name, "fields": fields}
            spec["methods"] = list(fc.FACTOR_METHODS)
            out.append((f"{dataset}_factor_{name}{_tail(seed, pair)}", where, spec))
    return out


def rule_specs(plan, dataset: str, seeds, values: dict[str, list[float]]) -> list:
    """Step-rule units: each variant at each of its ``values``, on ``seeds`` (house: one)."""
    out = []
    training = _training(plan, dataset)
    if dataset == "house":  # full batch from θ = I: deterministic, the first seed is every seed
        seeds = [s for s in seeds if s == plan.factor_seeds[0]]
    for name, (method, *_rest) in fc.RULES.items():
        for value, seed in product(values[name], seeds):
            for pair in [None] if dataset == "house" else plan.factor_pairs:
                fields, lr = fc.rule_fields(name, value)
                spec = {"dataset": dataset, "seed": seed, "pair": pair, **training}
                spec |= {"kind": "emulated", "section": "rules", "protocol": name, "value": value}
                spec |= {"fields": fields, "methods": [method]}
                spec["lr"] = training["lr"] if lr is None else lr
                key = f"{dataset}_rule_{name}_{value:g}{_tail(seed, pair)}"
                out.append((key, (dataset, _where(dataset, seed, pair)), spec))
    return out


def _released_mnist_specs(plan, data) -> list[tuple[str, Any, dict[str, Any]]]:
    """The released MNIST protocol on raw single-digit tasks (and condreg's), per seed."""
    out = []
    logged = int(rel.LOGGED["mnist"]["steps"])
    rows = ["released_1_epoch"] if plan.quick else list(fc.RELEASED_MNIST_ROWS)
    for row, pair in product(rows, plan.raw_pairs):
        for seed in plan.factor_seeds[:1] if row == "condreg" else plan.factor_seeds:
            where = ("mnist", ("raw", seed, pair))
            n = data["mnist"][where[1]]["X_p"].shape[0]
            spec = {"dataset": "mnist", "seed": seed, "pair": pair, **_training(plan, "mnist")}
            spec |= {"kind": "emulated", "section": "released_mnist", "protocol": row}
            spec |= {"fields": fc.released_mnist_fields(row, n, logged)}
            spec["methods"] = list(fc.FACTOR_METHODS)
            out.append((f"mnist_raw_{row}{_tail(seed, pair)}", where, spec))
    return out


def unit_specs(plan, data) -> list[tuple[str, Any, dict[str, Any]]]:
    """Every unit of the first phase: ``(key, data key, spec)`` (the rules' tuning included)."""
    out = []
    for dataset in plan.datasets:
        if "switches" in plan.parts:
            out += _switch_specs(plan, dataset)
        if "factors" in plan.parts:
            out += _factor_specs(plan, data, dataset)
        if "rules" in plan.parts:
            out += rule_specs(plan, dataset, plan.factor_seeds[:1], plan.rule_grid(dataset))
    if "released_mnist" in plan.parts and "mnist" in plan.datasets:
        out += _released_mnist_specs(plan, data)
    return [(key, where, {**spec, "key": key}) for key, where, spec in out]


def choose_rule_values(plan, dataset: str, done: dict[str, Any], specs) -> dict[str, Any]:
    """Per variant, the largest value whose runs all completed with a mean D_P loss at most
    ``DP_TOLERANCE`` above the head's alone (the smallest if none passes), and the grid."""
    from condreg_experiments.ablation import DP_TOLERANCE

    grid: dict[str, dict[float, list]] = {name: {} for name in fc.RULES}
    for key, _, spec in specs:
        if spec["section"] == "rules" and spec["dataset"] == dataset:
            unit = done[key]["methods"]
            run = unit[spec["methods"][0]]
            grid[spec["protocol"]].setdefault(spec["value"], []).append(
                (run["loss_final"], unit["head_only_loss"], run["stopped"] == "completed")
            )
    out = {}
    for name, by_value in ((n, v) for n, v in grid.items() if v):
        passing = [
            v
            for v, runs in by_value.items()
            if all(ok for *_, ok in runs)
            and np.mean([a for a, _, _ in runs]) <= np.mean([b for _, b, _ in runs]) + DP_TOLERANCE
        ]
        chosen = max(passing) if passing else min(by_value)
        out[name] = {"chosen": chosen, "any_passes": bool(passing), "values": sorted(by_value)}
    return out


def run_units(plan, data, specs, store, done: dict[str, Any]):
    """The units of ``specs`` not ``done`` yet, from ``store`` (--resume) or computed (costliest
    first), each saved as it finishes and added to ``done``; the runner's result."""
    todo = {key: (where, spec) for key, where, spec in specs if key not in done}
    run = rn.run_units(
        store,
        {key: key for key in todo},
        run_unit,
        jobs=plan.jobs,
        progress=plan.progress,
        desc="ablation",
        cost=lambda key: _cost(todo[key][1]),
        payload=lambda key: (data[todo[key][0][0]][todo[key][0][1]], todo[key][1]),
    )
    done.update(run.units)
    return run


def _cost(spec: dict[str, Any]) -> float:
    """A rough relative cost of a unit, to start the longest first."""
    if spec["section"] == "released_mnist":
        return 100.0
    steps = spec.get("fields", {}).get("steps") or spec["epochs"]
    return len(spec["methods"]) * steps / spec["epochs"]


def default_experiments(plan) -> dict[str, Any]:
    """The default experiments themselves (their own folders, their results.json payloads)."""
    out = {}
    kw = dict(quick=plan.quick, seeds=len(plan.seeds), progress=plan.progress, resume=plan.resume)
    if "house" in plan.datasets and "switches" in plan.parts:
        out["house"] = house_prices.run(plan.out_dir / "default-house-prices", **kw)
    if "mnist" in plan.datasets and "switches" in plan.parts:
        out["mnist"] = mnist_pairs.run(
            plan.out_dir / "default-mnist-pairs", **kw, pairs=list(plan.pairs), jobs=plan.jobs
        )
    return out
