"""Reproductions of the paper's experiments (docs/math.md §8), one module per experiment.

Each module of :data:`EXPERIMENTS` exposes ``HELP`` (one line for ``condreg reproduce --help``),
``add_arguments(parser)`` (its options; needs no array framework) and ``run(out_dir, *, quick,
seeds, progress, **options) -> dict``, which writes ``results.json``, ``table.md`` and PNG plots
into ``out_dir`` and returns the ``results.json`` payload. Modules are imported on demand.
"""

from __future__ import annotations

#: Experiment name (as on the command line) -> module under condreg.experiments.
EXPERIMENTS: dict[str, str] = {
    "house-prices": "house_prices",
    "mnist-pairs": "mnist_pairs",
    "convergence": "convergence",
    "deepnet": "deepnet",
    "attacks": "attacks",
    "ablation": "ablation",
}


class UsageError(ValueError):
    """A bad experiment option, raised before any work: ``condreg reproduce`` exits with 2."""


__all__ = ["EXPERIMENTS", "UsageError"]
