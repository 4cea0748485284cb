"""Deep-net immunization (the paper's Table 3 / Fig. 3) at a scale a CPU can run:
``condreg reproduce deepnet``.

By default two small networks are pre-trained on MNIST digits 0–4 (D_P) and **their own block
weights** are immunized against digits 5–9 (D_H): a residual CNN's last two residual blocks (seven
``nn.Conv2d`` weights, one of them grouped) and a one-layer transformer on 7×7 patch tokens (its
qkv, proj and MLP ``nn.Linear`` weights) — the paper's ResNet18 / ViT set-ups in miniature, with
128-d features, more than Eq. 17's groups of 100 samples. Each regularizer gradient reaches each
immunized weight left-preconditioned by the Gram matrix of that layer's input
(:func:`condreg.torch.nn.layer_gram`, :func:`condreg.torch.nn.left_precondition`); see
:mod:`~condreg.experiments.deepnet.training`. ``target="theta"`` instead trains only an
identity-initialised D×D layer appended after the frozen block (the linear setting).

Every method's step is chosen by the same sweep on D_P-only criteria; five seeds by default;
RIR_θ0 (Eq. 17) with its group-size sensitivity; D_P accuracy; linear probing on D_H (steps to a
target accuracy and the converged accuracy gap). Large models: ``arch="resnet18"`` /
``"vit_b_16"`` / ``"vit_b_32"`` / ``"timm:<vit>"`` with ``weights``, ``pretrain_dir``,
``harmful_dir`` and ``device="cuda"`` use the same per-layer preconditioner.

Modules: :mod:`.settings` (typed options), :mod:`.data`, :mod:`.models`, :mod:`.training`,
:mod:`.evaluate`, :mod:`.study` (one arch and seed), :mod:`.report` (tables, plots). Importing
this package imports no torch; :func:`run` checks torch and the options first.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

from condreg.experiments import _report
from condreg.experiments.deepnet.settings import METHODS, QUICK, Settings, resolve

__all__ = ["DEFAULTS", "METHODS", "QUICK", "Settings", "run"]

#: The default settings (``condreg reproduce deepnet``).
DEFAULTS = Settings()


def _run_arch(arch, s, seed_values, store: _report.UnitStore, *, progress):
    """Every seed of one arch, the sweep seed first; each (arch, seed) is a unit of ``store``
    (``out_dir/units/``), reused under ``resume`` when its settings are identical."""
    from condreg.experiments.deepnet import study

    order = [s.sweep_seed] + [x for x in seed_values if x != s.sweep_seed]
    records, sweep_record, steps = {}, None, None
    for seed in order:
        key = f"{arch.replace(':', '_')}-seed{seed}"
        done = store.load(key)
        if done is None:
            rec, sw = study.run_seed(arch, s, seed, steps, progress)
            done = {"record": rec, "sweep": sw}
            store.save(key, done)
        if seed == s.sweep_seed:
            sweep_record = done["sweep"]
            steps = {m: r["chosen"] for m, r in sweep_record.items() if isinstance(r, dict)}
        records[seed] = done["record"]
    # (the sweep seed chooses the steps; it is reported only if it is one of the seeds)
    return [records[x] for x in seed_values], sweep_record


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 5,
    progress: bool = True,
    resume: bool = False,
    **options: Any,
) -> dict:
    """Run the deep-net study and write results.json, table.md, probe_curves.png and
    kappa_history.png into ``out_dir`` (one record per (arch, seed) under ``out_dir/units/``).

    ``options`` are fields of :class:`Settings` (``--quick`` applies :data:`QUICK` first).
    ``seeds``: seeds 0..seeds−1 (default 5). ``resume=True`` keeps every (arch, seed) already
    completed in ``out_dir/units/`` and runs only the others (:class:`condreg.experiments.
    _report.UnitStore`; a unit made with other settings raises
    :class:`condreg.experiments.UsageError`). Raises ``UsageError`` for a bad option before any
    work.
    """
    t_start = time.perf_counter()
    s = resolve(quick, options)
    seed_values = _report.seed_list(seeds)
    out_dir = _report.prepare_out_dir(out_dir)
    import torch

    from condreg.experiments.deepnet import report

    old_threads = torch.get_num_threads()
    if s.num_threads is not None:
        torch.set_num_threads(int(s.num_threads))
    store = _report.UnitStore(out_dir, settings=s.to_json(), resume=resume)
    per_arch, sweeps = {}, {}
    try:
        for arch in s.arch:
            per_arch[arch], sweeps[arch] = _run_arch(arch, s, seed_values, store, progress=progress)
    finally:
        torch.set_num_threads(old_threads)
    summaries = {a: report.summaries(per_arch[a], s.methods) for a in s.arch}
    records = {a: per_arch[a][0] for a in s.arch}
    failures = [
        f"{a}: {m} failed on seed {r['seed']} and is left out: {why}"
        for a in s.arch
        for r in per_arch[a]
        for m, why in r["failed"].items()
    ]
    report.plots(out_dir, summaries, per_arch)
    settings = {**s.to_json(), "quick": quick, "seeds": seeds, "resume": resume}
    settings.update(torch_version=torch.__version__, torch_threads=s.num_threads)
    results = {
        "summary": summaries,
        "per_seed": per_arch,
        "sweep": sweeps,
        "setup": {
            a: {
                "immunized": records[a]["immunized"],
                "immunized_weights": records[a]["immunized_weights"],
                "immunized_parameters": records[a]["immunized_parameters"],
                "feature_dim": records[a]["feature_dim"],
                "rir_group_size": s.rir_group_size,
                "feature_dim_exceeds_group_size": records[a]["feature_dim"] > s.rir_group_size,
                "n_train": records[a]["n_train"],
            }
            for a in s.arch
        },
        "paper": _report.PAPER_DEEPNET,
    }
    return _report.write_outputs(
        out_dir,
        experiment="deepnet",
        settings=settings,
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - t_start,
        notes=([report.PAPER_NOTE] if not s.large else []) + failures,
        table=report.table(summaries, s, records, seed_values)
        + "".join(f"\n- {line}" for line in failures),
        title="Deep-net immunization (Table 3 / Fig. 3 analogue)",
    )
