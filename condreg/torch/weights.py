"""Keep the weight matrices of any PyTorch network well-conditioned (Nenov et al.'s use of R_well).

:func:`weight_conditioning_loss` sums a conditioning penalty over chosen weight matrices of a
module, as a differentiable 0-d tensor to add to the training loss::

    loss = task_loss + 1e-2 * weight_conditioning_loss(model)          # every Linear/Conv weight

Which parameters: by default the ``weight`` of every ``nn.Linear`` and ``nn.Conv1d/2d/3d``
(and their transposed and lazy variants). ``module_filter(name, module) -> bool`` chooses other
modules (every direct parameter with ``ndim >= 2`` of a chosen module is a candidate);
``name_filter`` (a callable on the full parameter name, e.g. ``"encoder.0.weight"``, or a regular
expression searched in it) narrows the choice. Each parameter ``W`` is reshaped to
``(W.shape[0], -1)``: ``(out, in·k·k)`` for a convolution (``(in, out/groups·k·k)`` for a
transposed one).

Penalties (per matrix, then summed, or averaged with ``reduction="mean"``):

- ``"r_well"`` (default): ``R_well(W) = ½σ_1² − ‖W‖_F²/(2p)``, ``p = min`` of the two sizes
  (docs/math.md §3; non-negative, zero iff ``W`` has full rank and κ = 1);
- ``"condition_number"``: ``κ(W) = σ_1/σ_k`` over the nonzero singular values;
- ``"log_condition_number"``: ``log κ(W)``.

``normalize=True`` (default) uses ``W/‖W‖_F`` (the norm detached) for ``"r_well"``, so the
penalty is independent of the scale of each weight (κ is scale-free anyway); the direction of
its gradient is unchanged. The derivatives are condreg's closed forms (minimum-norm subgradients
at tied extremes), never autodiff through an SVD. A zero weight raises :class:`condreg.RankError`
(eagerly), like every condreg function.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from torch import nn

import condreg

__all__ = [
    "DEFAULT_MODULES",
    "weight_condition_numbers",
    "weight_conditioning_loss",
    "weight_matrices",
]

#: Module types whose ``weight`` is conditioned by default.
DEFAULT_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Bilinear,
    nn.modules.conv._ConvNd,  # Conv1d/2d/3d, ConvTranspose*, their lazy variants
)

_PENALTIES = ("r_well", "condition_number", "log_condition_number")
Penalty = Literal["r_well", "condition_number", "log_condition_number"]
ModuleFilter = Callable[[str, nn.Module], bool]
NameFilter = Callable[[str], bool] | str


def _default_module_filter(name: str, module: nn.Module) -> bool:
    return isinstance(module, DEFAULT_MODULES)


def _name_predicate(name_filter: NameFilter | None) -> Callable[[str], bool]:
    if name_filter is None:
        return lambda name: True
    if isinstance(name_filter, str):
        pattern = re.compile(name_filter)
        return lambda name: pattern.search(name) is not None
    if callable(name_filter):
        return name_filter
    raise TypeError(f"name_filter must be a callable or a regular expression, got {name_filter!r}")


def weight_matrices(
    model: nn.Module,
    *,
    module_filter: ModuleFilter | None = None,
    name_filter: NameFilter | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, W.reshape(W.shape[0], -1))`` for every selected parameter (differentiable views).

    Selection: each module ``m`` named ``prefix`` with ``module_filter(prefix, m)`` true
    (default: the Linear/Conv types of :data:`DEFAULT_MODULES`, whose candidate is ``weight``
    only), each of its *direct* parameters ``W`` with ``W.ndim >= 2`` (for the default filter:
    ``weight``) whose full name ``prefix.param`` passes ``name_filter``. Shared parameters are
    visited once.
    """
    mfilter = module_filter or _default_module_filter
    npred = _name_predicate(name_filter)
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        if not mfilter(prefix, module):
            continue
        for pname, p in module.named_parameters(recurse=False):
            if module_filter is None and pname != "weight":
                continue
            if p is None or p.ndim < 2 or id(p) in seen:
                continue
            if isinstance(p, nn.parameter.UninitializedParameter):
                continue
            full = f"{prefix}.{pname}" if prefix else pname
            if not npred(full):
                continue
            seen.add(id(p))
            yield full, p.reshape(p.shape[0], -1)


def _penalty(W: torch.Tensor, penalty: str, normalize: bool) -> torch.Tensor:
    if penalty == "r_well":
        if normalize:
            nrm = torch.linalg.vector_norm(W.detach())
            W = W / torch.where(nrm > 0, nrm, torch.ones_like(nrm))
        return condreg.r_well(W)
    if penalty == "condition_number":
        return condreg.condition_number(W)
    if penalty == "log_condition_number":
        return torch.log(condreg.condition_number(W))
    raise ValueError(f"penalty must be one of {_PENALTIES}, got {penalty!r}")


def weight_conditioning_loss(
    model: nn.Module,
    penalty: Penalty = "r_well",
    *,
    module_filter: ModuleFilter | None = None,
    name_filter: NameFilter | None = None,
    normalize: bool = True,
    reduction: Literal["sum", "mean"] = "sum",
) -> torch.Tensor:
    """Sum (or mean) of ``penalty`` over the weight matrices :func:`weight_matrices` selects.

    Returns a 0-d tensor on the parameters' device and dtype, differentiable with respect to
    them. Raises ``ValueError`` when no parameter is selected (a filter that matches nothing is
    almost always a mistake) or for an unknown ``penalty``/``reduction``, and
    :class:`condreg.RankError` for a zero weight.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    if penalty not in _PENALTIES:
        raise ValueError(f"penalty must be one of {_PENALTIES}, got {penalty!r}")
    terms = [
        _penalty(W, penalty, normalize)
        for _, W in weight_matrices(model, module_filter=module_filter, name_filter=name_filter)
    ]
    if not terms:
        raise ValueError(
            "weight_conditioning_loss: no parameter selected (no Linear/Conv weight, or the "
            "filters match nothing)"
        )
    total = torch.stack(terms).sum()
    return total / len(terms) if reduction == "mean" else total


@torch.no_grad()
def weight_condition_numbers(
    model: nn.Module,
    *,
    module_filter: ModuleFilter | None = None,
    name_filter: NameFilter | None = None,
) -> dict[str, float]:
    """``{name: κ(W)}`` of the selected weight matrices (Python floats; for logging)."""
    return {
        name: float(condreg.condition_number(W.detach()))
        for name, W in weight_matrices(model, module_filter=module_filter, name_filter=name_filter)
    }
