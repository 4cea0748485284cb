"""Reproductions of the paper's experiments (docs/math.md §8), one module per experiment, each with
``HELP``, ``add_arguments(parser)`` and ``run(out_dir, *, quick, seeds, progress, **options)``
(writes ``results.json``, ``table.md`` and plots; returns the ``results.json`` payload)."""

from __future__ import annotations

#: Experiment name (as on the command line) -> module under condreg.experiments.
EXPERIMENTS: dict[str, str] = {
    "house-prices": "house_prices",
    "mnist-pairs": "mnist_pairs",
    "convergence": "convergence",
    "deepnet": "deepnet",
    "attacks": "attacks",
    "ablation": "ablation",
    "tamper": "tamper",
}


class UsageError(ValueError):
    """A bad experiment option, raised before any work: ``condreg reproduce`` exits with 2."""


__all__ = ["EXPERIMENTS", "UsageError"]
