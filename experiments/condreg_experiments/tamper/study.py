"""The attack study's work: for each (architecture, harmful domain), seed after seed, pre-train on
D_P, immunize every method (the deep-net study's D_P-only step sweep on the first seed), save each
extractor, measure RIR_θ0 and D_P accuracy, and run every attacker × optimizer on it."""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from condreg.attacks import finetune_search, tangent_condition
from condreg_experiments.data import DataError
from condreg_experiments.deepnet import data as deep_data
from condreg_experiments.deepnet import models, training
from condreg_experiments.deepnet import study as deep_study
from condreg_experiments.deepnet.settings import SMALL_ARCHS
from condreg_experiments.tamper.settings import Settings

__all__ = ["FORMAT", "cross_digits", "harmful_task", "load_extractor", "load_images"]
__all__ += ["SeedRunner", "run_seed"]

#: The format tag of a saved extractor file (:func:`load_extractor`).
FORMAT = "condreg.tamper.extractor/1"

#: MNIST's normalisation (the small networks' input): ``(x − mean) / std`` on ``x`` in [0, 1].
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def cross_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8×8 handwritten digits (1,797 images, another source than MNIST) in MNIST's
    format: each image scaled to 20×20 (bilinear), centred in 28×28 with a 4-pixel border as in
    MNIST, intensities in [0, 1], MNIST-normalised; ``(X float32 (n, 1, 28, 28), y int64)``."""
    try:
        from scipy.ndimage import zoom
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - scikit-learn comes with mlxtend
        raise DataError(
            "the cross-domain task needs scikit-learn (pip install scikit-learn)"
        ) from exc
    digits = load_digits()
    small = np.clip(zoom(digits.images / 16.0, (1, 2.5, 2.5), order=1), 0.0, 1.0)
    X = np.zeros((small.shape[0], 28, 28), np.float32)
    X[:, 4:24, 4:24] = small
    X = ((X - MNIST_MEAN) / MNIST_STD).reshape(-1, 1, 28, 28).astype(np.float32)
    return X, digits.target.astype(np.int64)


def load_images(s: Any, domain: str) -> deep_data.Images:
    """The deep-net study's images with D_H from ``domain``: "same" (its own) or "cross" (D_H's
    digits from :func:`cross_digits`)."""
    images = deep_data.load_images(s)
    if domain == "same":
        return images
    X, y = cross_digits()
    pools = (images.pools[0], (X, y, tuple(s.harmful_digits)))
    return dataclasses.replace(images, pools=pools)


def _extractor(stem: nn.Module | None, block: nn.Module) -> nn.Sequential:
    layers = ([("stem", stem)] if stem is not None else []) + [("block", block)]
    return nn.Sequential(collections.OrderedDict(layers))


def _save(path: pathlib.Path, stem: nn.Module, block: nn.Module, info: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in _extractor(stem, block).state_dict().items()}
    tmp = path.with_suffix(".tmp")
    torch.save({"format": FORMAT, **info, "state_dict": state}, tmp)
    tmp.replace(path)


def load_extractor(path: str | pathlib.Path) -> tuple[nn.Sequential, dict[str, Any]]:
    """A feature extractor saved by ``condreg reproduce tamper`` and what it is.

    Parameters
    ----------
    path : str or pathlib.Path
        An ``extractors/<arch>-<domain>-seed<seed>-<method>.pt`` file of the study's output.

    Returns
    -------
    (torch.nn.Sequential, dict)
        The extractor ``stem → block`` in eval mode, mapping MNIST-normalised images
        ``(n, 1, 28, 28)`` (large models: their image folders' tensors) to features ``(n, D)``;
        and its record: ``arch``, ``method``, ``domain``, ``seed``, ``feature_dim``,
        ``reg_step``, ``settings`` (the run's, for :func:`harmful_task`).

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        Not a saved extractor of this format.

    docs/tamper.md shows it at work: an attack of one's own on the study's extractors.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no saved extractor at {str(path)!r}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not an extractor saved by condreg reproduce tamper")
    arch, n_p = payload["arch"], int(payload["n_classes_p"])
    if arch in SMALL_ARCHS:
        parts = models.build_small(arch, int(payload["feature_dim"]), n_p)
    else:
        parts = models.build_large(arch, None, n_p)
    net = _extractor(parts.stem, parts.block)
    net.load_state_dict(payload["state_dict"])
    info = {k: v for k, v in payload.items() if k not in ("state_dict", "format")}
    return net.eval(), info


def harmful_task(info: dict[str, Any]) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """The harmful task a saved extractor was attacked on: ``((X_train, y_train), (X_test,
    y_test))`` exactly as the study split it (MNIST-sized studies only).

    Parameters
    ----------
    info : dict
        The record :func:`load_extractor` returns.

    Returns
    -------
    tuple
        NumPy arrays; labels ``0 … 4``.
    """
    from condreg_experiments.deepnet.settings import resolve

    base = {k: v for k, v in info["settings"].items() if k not in ("arch",) and v is not None}
    base["arch"] = (info["arch"],)
    s = resolve(False, base)
    _, H = load_images(s, info["domain"]).tasks(int(info["seed"]))
    return (H.X_tr, H.y_tr), (H.X_te, H.y_te)


def _attacks(prep, H, stem, block, s: Settings, seed: int) -> dict[str, Any]:
    """Every attacker on ``stem → block``, its optimizer × schedule × rate found by
    :func:`condreg.attacks.finetune_search`. The attackers that keep the stem frozen (all but
    ``finetune_all``) run on its cached outputs: the same numbers, fewer operations."""
    cached = (prep.S["h_tr"], prep.Y["h_tr"]), (prep.S["h_te"], prep.Y["h_te"])
    images = (H.X_tr, H.y_tr), (H.X_te, H.y_te)
    out = {}
    for attacker in s.attackers:
        name, rank = ("lora", int(attacker[6:])) if attacker.startswith("lora_r") else (attacker, 8)
        full = name == "finetune_all"
        net = _extractor(stem if full else None, block)
        train, test = images if full else cached
        res = finetune_search(
            net,
            train,
            test,
            attacker=name,
            block="block",
            optimizers=s.optimizers,
            schedules=s.schedules,
            lr_grids=s.grids(),
            steps=s.attack_steps,
            short_steps=s.rung1_steps,
            keep=s.keep,
            max_extend=s.max_extend,
            val_fraction=s.attack_val_fraction,
            batch_size=s.attack_batch,
            eval_every=s.eval_every,
            rank=rank,
            n_classes=prep.n_h,
            seed=seed,
            device=prep.device,
        )
        out[attacker] = res.to_json()
    return out


def _tangent(prep, tasks, stem, block, s: Settings, seed: int) -> dict[str, Any]:
    """κ of the empirical tangent kernel of each attacker family's own problem, on the first
    ``tangent_batch`` training examples of D_H (``h``) and of D_P (``p``), the trained
    parameters with a fresh linear head of the harmful task's size (seeded, the same for every
    method): ``probe`` the head alone on the features, ``block`` the block and the head on the
    stem's outputs, ``all`` every parameter and the head on the images."""
    n = s.tangent_batch
    torch.manual_seed(seed)
    head = nn.Linear(prep.parts.feature_dim, prep.n_h).to(prep.device)
    out: dict[str, Any] = {}
    P, H = tasks
    for key, S, X in (("h", prep.S["h_tr"], H.X_tr), ("p", prep.S["p_tr"], P.X_tr)):
        S, X = S[:n].to(prep.device), torch.as_tensor(X[:n]).to(prep.device)
        F = training.batched_apply(block, S, device=prep.device).to(prep.device)
        out[key] = {
            "probe": tangent_condition(nn.Identity(), F, head=head),
            "block": tangent_condition(block, S, head=head),
            "all": tangent_condition(_extractor(stem, block), X, head=head),
        }
    return out


def _measures(prep, block, head, s: Settings, same: bool) -> dict[str, Any]:
    """D_P accuracy after immunization, RIR_θ0 (Eq. 17) with (i), (ii)."""
    F = {k: training.batched_apply(block, prep.S[k], device=prep.device) for k in ("p_tr", "h_tr")}
    F_te = training.batched_apply(block, prep.S["p_te"], device=prep.device)
    with torch.no_grad():
        acc = float((head(F_te.to(prep.device)).argmax(1).cpu() == prep.Y["p_te"]).float().mean())
    F_I, F_0 = {"p": F["p_tr"], "h": F["h_tr"]}, {"p": prep.F0["p_tr"], "h": prep.F0["h_tr"]}
    size = s.base.rir_group_size
    kw = dict(groups=s.base.rir_groups, sizes=[size], seed=prep.seed, same=same)
    rir = deep_study.rir_by_group_size(F_I, F_0, **kw)[size]
    return {"acc_p_before": prep.acc_before, "acc_p_after": acc} | {
        k: rir[k] for k in ("i", "ii", "rir_theta0")
    }


def _immunized(prep, s: Settings, steps: dict | None, progress: bool) -> tuple:
    """``(models, steps, sweep, failed)``: every method's immunized (block, head) at its step —
    chosen here by the D_P-only sweep when ``steps`` is None (a chain's first seed)."""
    base, sweep, ready, failed = s.base, None, {}, {}
    if steps is None:
        sweep, ready = deep_study.sweep(prep, base, progress)
        steps = {m: r["chosen"] for m, r in sweep.items() if isinstance(r, dict)}
    models_ = {"identity": (prep.parts.block, prep.parts.head)}
    data = (prep.S["p_tr"], prep.Y["p_tr"], prep.S["h_tr"], prep.Y["h_tr"])
    kw = dict(s=base, seed=prep.seed, device=prep.device, progress=progress)
    for method in base.methods:
        if method == "identity":
            continue
        if steps.get(method) is None:
            failed[method] = "failed at every swept step"
            continue
        try:
            imm = ready.get(method) or training.immunize(
                method, prep.parts, data, reg_step=steps[method], **kw
            )
        except deep_study.METHOD_FAILURES as exc:
            failed[method] = f"{type(exc).__name__}: {exc}"
            continue
        models_[method] = (imm.block, imm.head)
    return models_, steps, sweep, failed


def unit_key(arch: str, domain: str, seed: int) -> str:
    """The name of one (arch, domain, seed): its unit file and its extractors' prefix."""
    return f"{arch.replace(':', '_')}-{domain}-seed{seed}"


def run_seed(arch, domain, s: Settings, images, seed: int, steps, out_dir, progress) -> dict:
    """One (arch, domain, seed): pre-train, immunize (sweep first when ``steps`` is None), and
    for every method save the extractor, measure it and attack it."""
    t_seed, cpu_seed = time.perf_counter(), time.process_time()
    prep = deep_study.prepare(arch, s.base, images, seed, False)
    tasks = images.tasks(seed)
    H = tasks[1]
    models_, steps, sweep, failed = _immunized(prep, s, steps, False)
    tag, methods = unit_key(arch, domain, seed), {}
    for method, (block, head) in models_.items():
        t0 = time.perf_counter()
        step = steps.get(method)
        info = dict(arch=arch, method=method, domain=domain, seed=seed, reg_step=step)
        info.update(feature_dim=prep.parts.feature_dim, n_classes_p=prep.n_p)
        info["settings"] = s.base.to_json()
        name = f"extractors/{tag}-{method}.pt"
        _save(pathlib.Path(out_dir) / name, prep.parts.stem, block, info)
        rec = _measures(prep, block, head, s, same=method == "identity")
        rec.update(reg_step=step, extractor=name)
        rec["tangent"] = _tangent(prep, tasks, prep.parts.stem, block, s, seed)
        rec["attacks"] = _attacks(prep, H, prep.parts.stem, block, s, seed)
        methods[method] = rec | {"seconds": time.perf_counter() - t0}
        if progress:
            print(
                f"tamper: {tag}: {method} attacked in {methods[method]['seconds']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    n = {"h_train": int(prep.S["h_tr"].shape[0]), "h_test": int(prep.S["h_te"].shape[0])}
    return dict(
        arch=arch,
        domain=domain,
        seed=seed,
        methods=methods,
        failed=failed,
        steps=steps,
        sweep=sweep,
        n=n,
        n_classes_h=prep.n_h,
        seconds=time.perf_counter() - t_seed,
        cpu_s=time.process_time() - cpu_seed,
    )


class SeedRunner:
    """``runner((arch, domain, seed), first)``: :func:`run_seed` for the runner's chains (one per
    (arch, domain)); a chain's first seed sweeps, the others take its steps. Each copy (one per
    worker chain) reads the images of a domain once."""

    def __init__(self, s: Settings, out_dir: str, progress: bool) -> None:
        self.s, self.out_dir, self.progress = s, out_dir, progress
        self.images: dict[str, Any] = {}

    def __call__(self, key: tuple[str, str, int], first: dict | None) -> dict[str, Any]:
        arch, domain, seed = key
        if domain not in self.images:
            self.images[domain] = load_images(self.s.base, domain)
        steps = None if first is None else first["steps"]
        images = self.images[domain]
        return run_seed(arch, domain, self.s, images, seed, steps, self.out_dir, self.progress)
