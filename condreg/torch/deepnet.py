"""Deprecated: the deep-net study moved to :mod:`condreg.experiments.deepnet`.

``condreg.torch`` holds only the PyTorch adapters (autodiff rules, :mod:`condreg.torch.nn`); the
experiment (models, data, training, report) is a package of its own under
``condreg.experiments``. This module re-exports its entry point and will be removed.
"""

from __future__ import annotations

import warnings

from condreg.experiments.deepnet import DEFAULTS, METHODS, run

warnings.warn(
    "condreg.torch.deepnet moved to condreg.experiments.deepnet; import it from there",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["DEFAULTS", "METHODS", "run"]
