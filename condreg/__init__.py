"""condreg: the condition number of a matrix as a differentiable training signal.

Backend-neutral (Python Array API) condition number, the regularizers R_well and R_ill of
*Model Immunization from a Condition Number Perspective* (ICML 2025), their closed-form
(sub)gradients, and the paper's Algorithm 1, metrics and experiments.

``import condreg`` imports no array framework; PyTorch and JAX adapters load on first use.
"""

from __future__ import annotations

from condreg._api import (
    condition_number,
    condition_number_grad,
    r_ill,
    r_ill_grad,
    r_well,
    r_well_grad,
)
from condreg._errors import PoleError, RankError, TiedExtremeError

__version__ = "0.1.0"

# Submodules and names loaded on first use (they may import SciPy/plotting; never a framework).
_LAZY_MODULES = ("algorithm", "attacks", "metrics", "testing", "experiments")
_LAZY_NAMES = {
    "immunize": "condreg.algorithm",
    "ImmunizationResult": "condreg.algorithm",
    "ImmunizationWarning": "condreg.algorithm",
}


def __getattr__(name: str):
    import importlib

    if name in _LAZY_MODULES:
        return importlib.import_module(f"condreg.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    raise AttributeError(f"module 'condreg' has no attribute {name!r}")


__all__ = [
    "ImmunizationResult",
    "ImmunizationWarning",
    "PoleError",
    "RankError",
    "TiedExtremeError",
    "__version__",
    "condition_number",
    "condition_number_grad",
    "immunize",
    "r_ill",
    "r_ill_grad",
    "r_well",
    "r_well_grad",
]
