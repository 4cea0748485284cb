"""Algorithm 1 (condition-number regularized gradient descent) and the paper's baselines.

:func:`immunize` pre-trains a linear extractor ``f_θ(x) = xᵀθ`` so that linear probing on ``X_h``
is ill-conditioned while ``(X_P, y_P)`` stays well-conditioned (docs/math.md §2, §5), with any
method of :data:`REGISTRY`. Functional interface: :func:`setup_data`, :func:`prepare`,
:func:`step` (pure, jit-able) and :func:`evaluate`; defaults in ``docs/immunization.md``.
"""

from __future__ import annotations

from condreg import _linalg  # noqa: F401  (the engine; tests patch it to detect late validation)
from condreg.algorithm._loop import immunize
from condreg.algorithm._methods import (
    METHOD_LABELS,
    METHODS,
    REGISTRY,
    Method,
    imma_gradient,
    preconditioned_gradient,
)
from condreg.algorithm._prepare import prepare
from condreg.algorithm._problem import (
    HISTORY_KEYS,
    STOP_REASONS,
    ImmunizationResult,
    ImmunizationWarning,
    Problem,
    State,
    TaskData,
)
from condreg.algorithm._setup import TASKS, DataSetup, setup_data
from condreg.algorithm._step import RECORD_FIELDS, evaluate, step

__all__ = [
    "immunize",
    "ImmunizationResult",
    "ImmunizationWarning",
    "preconditioned_gradient",
    "prepare",
    "setup_data",
    "DataSetup",
    "step",
    "evaluate",
    "Problem",
    "State",
    "TaskData",
    "Method",
    "REGISTRY",
    "METHODS",
    "METHOD_LABELS",
    "TASKS",
    "HISTORY_KEYS",
    "RECORD_FIELDS",
    "STOP_REASONS",
    "imma_gradient",
]
