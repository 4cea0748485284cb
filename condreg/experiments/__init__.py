"""Reproductions of the paper's experiments (docs/math.md §8), one module per experiment.

Each module exposes the same three names:

- ``HELP: str`` -- one line for ``condreg reproduce --help``;
- ``add_arguments(parser: argparse.ArgumentParser) -> None`` -- declares the experiment's own
  command-line options (shared types and groups in :mod:`condreg.experiments.options`),
  ``--quick`` with a help text that says what its quick mode does and about how long it takes,
  and ``--resume`` where supported; importing the module and calling it needs no array framework
  (``condreg reproduce deepnet --help`` works without torch);
- ``run(out_dir: pathlib.Path, *, quick: bool = False, seeds: int = 1, progress: bool = True,
  **options) -> dict`` -- writes ``results.json``, ``table.md`` and PNG plots into ``out_dir``
  and returns the ``results.json`` payload.

The ``condreg reproduce <name>`` command (:mod:`condreg.cli`) builds its parser from them, adds
the common ``--out``, ``--seeds``, ``--no-progress`` and ``--threads``, and calls ``run``.

=============  ===============================================  ==========================
name           module                                           paper
=============  ===============================================  ==========================
house-prices   :mod:`condreg.experiments.house_prices`           Table 1
mnist-pairs    :mod:`condreg.experiments.mnist_pairs`            Table 2, Fig. 2
convergence    :mod:`condreg.experiments.convergence`            Fig. 1
deepnet        :mod:`condreg.experiments.deepnet`                Table 3, Fig. 3 (CPU-sized)
attacks        :mod:`condreg.experiments.attacks`                beyond the paper (Eq. 16's
                                                                 probe, stronger attackers)
ablation       :mod:`condreg.experiments.ablation`               condreg's protocol against
                                                                 the released code's
=============  ===============================================  ==========================

Modules are imported on demand (``import condreg.experiments`` imports none of them and no
array framework).
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
    """A bad experiment option (value out of range, unknown name, missing optional package).

    ``condreg reproduce`` prints its message on one line and exits with status 2; raise it
    *before* any work starts and before the output folder is created."""


__all__ = ["EXPERIMENTS", "UsageError"]
