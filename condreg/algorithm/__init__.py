"""Algorithm 1 (condition-number regularized gradient descent) and the paper's baselines.

:func:`immunize` pre-trains a linear feature extractor ``f_θ(x) = xᵀθ`` (``θ ∈ R^{D×D}``) and a
head ``ω`` so that linear probing on a harmful task ``X_H`` is ill-conditioned while the
pre-training task ``(X_P, y_P)`` stays well-conditioned (docs/math.md §2, §5). It runs on the
arrays' own library (NumPy, PyTorch on CPU or CUDA, JAX, any Array API namespace with ``linalg``)
and returns results in that namespace. See ``docs/immunization.md`` for the choice of every
default.

The methods are the entries of :data:`REGISTRY` (each a :class:`Method`: its weights, its
default-λ rule and its step), all run through the same harness — same data scaling, supervised
loss, step-size safety and λ rule — so they compare fairly:

``"condreg"``
    Algorithm 1 as printed: ``ω ← ω − η∇_ωL``;
    ``θ ← θ − η∇_θL − ηλ_P K_P⁻¹∇_θR_well(H_P) − ηλ_H K_H⁻¹∇_θR_ill(H_H)``. ``K⁻¹`` multiplies
    on the **left** (:mod:`condreg._precondition`); since ``∇_θ f(θᵀKθ) = 2KθG``,
    ``K⁻¹∇_θ f = 2θG`` is computed without forming ``K⁻¹`` (``G = ∇_H f``).
``"r_ill_only"``
    The same without the R_well term.
``"opt_kappa"``
    Plain gradient descent on ``λ_H / log κ(H_H) + λ_P log κ(H_P)`` (+ the supervised loss).
``"imma"``
    Bi-level (Zheng & Yeh 2024): ascent on the attacker's harmful loss after ``imma_steps``
    differentiable probe steps (exact adjoint of the unrolled inner loop).

The supported functional interface: :func:`setup_data` decomposes the data once into a
:class:`DataSetup` that every run on them may share (``setup=``); :func:`prepare` validates the
data and returns an immutable :class:`Problem` and the starting :class:`State`; :func:`step` is
one epoch (pure, jit-able); :func:`evaluate` records a state without stepping. :func:`immunize`
is ``prepare`` + a loop of ``step`` with health checks (a diverging run stops cleanly, keeping
the last healthy θ, and warns); its result records everything the run depended on, so
``resume=`` continues it exactly. Nothing is kept between calls outside these objects.

Numerical policy (in full in ``docs/immunization.md``): the regularizers see ``K̃ = c²K`` and the
supervised loss ``x̂ = x·2^k``, ``ŷ = y·2^{-e}`` with powers of two (exact rescalings, so a resumed
run is bit-identical); each regularizer step is clipped to relative size ``max_step``; default
λ's balance the two updates at ``θ_0``; one rank tolerance ``rtol`` on ``σ(Xθ)`` serves the loop,
the history and the final metrics.
"""

from __future__ import annotations

from condreg import _linalg  # noqa: F401  (the engine; tests patch it to detect late validation)
from condreg.algorithm._gradient import preconditioned_gradient
from condreg.algorithm._loop import immunize
from condreg.algorithm._methods import METHODS, REGISTRY, Method, imma_gradient
from condreg.algorithm._prepare import prepare
from condreg.algorithm._problem import Problem, State, TaskData
from condreg.algorithm._result import (
    HISTORY_KEYS,
    STOP_REASONS,
    ImmunizationResult,
    ImmunizationWarning,
)
from condreg.algorithm._setup import DataSetup, setup_data
from condreg.algorithm._step import RECORD_FIELDS, evaluate, step

#: The supervised tasks.
TASKS = ("regression", "classification")

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
    "TASKS",
    "HISTORY_KEYS",
    "RECORD_FIELDS",
    "STOP_REASONS",
    "imma_gradient",
]
