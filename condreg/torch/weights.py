"""Keep the weight matrices of any PyTorch network well-conditioned (Nenov et al.'s use of R_well):
``loss = task_loss + 1e-2 * weight_conditioning_loss(model)`` (docs/immunization.md)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from torch import nn

import condreg

__all__ = ["DEFAULT_MODULES", "weight_matrices"]
__all__ += ["weight_conditioning_loss", "weight_condition_numbers"]

#: Module types whose ``weight`` is conditioned by default.
DEFAULT_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear,  # and nn.LazyLinear, a subclass
    nn.Bilinear,
    nn.Conv1d,  # and the lazy variants, subclasses
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)

_PENALTIES = ("r_well", "condition_number", "log_condition_number")
Penalty = Literal["r_well", "condition_number", "log_condition_number"]
ModuleFilter = Callable[[str, nn.Module], bool]
NameFilter = Callable[[str], bool] | str


def _name_predicate(name_filter: NameFilter | None) -> Callable[[str], object]:
    if name_filter is None:
        return lambda name: True
    if isinstance(name_filter, str):
        return re.compile(name_filter).search
    if callable(name_filter):
        return name_filter
    raise TypeError(f"name_filter must be a callable or a regular expression, got {name_filter!r}")


def weight_matrices(
    model: nn.Module,
    *,
    module_filter: ModuleFilter | None = None,
    name_filter: NameFilter | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, W.reshape(W.shape[0], -1))`` for each *direct* parameter with ``ndim >= 2``
    (default: only ``weight``) of the chosen modules whose name passes ``name_filter``, once each.

    Parameters
    ----------
    model : torch.nn.Module
        The network.
    module_filter : callable, optional
        ``module_filter(name, module) -> bool``; default: the types of :data:`DEFAULT_MODULES`.
    name_filter : callable or str, optional
        A predicate on the full parameter name, or a regular expression searched in it.

    Returns
    -------
    iterator of (str, torch.Tensor)
        The names and differentiable views, in module order.

    Examples
    --------
    >>> from torch import nn
    >>> from condreg.torch.weights import weight_matrices
    >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))
    >>> [(n, tuple(W.shape)) for n, W in weight_matrices(net)]  # LazyLinear: not yet a matrix
    [('0.weight', (4, 27))]
    """
    mfilter = module_filter or (lambda name, module: isinstance(module, DEFAULT_MODULES))
    npred = _name_predicate(name_filter)
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        if not mfilter(prefix, module):
            continue
        for pname, p in module.named_parameters(recurse=False):
            full = f"{prefix}.{pname}" if prefix else pname
            skip = (module_filter is None and pname != "weight") or id(p) in seen
            if skip or isinstance(p, nn.parameter.UninitializedParameter) or p.ndim < 2:
                continue
            if npred(full):
                seen.add(id(p))
                yield full, p.reshape(p.shape[0], -1)


def _penalty(W: torch.Tensor, penalty: str, normalize: bool) -> torch.Tensor:
    if penalty == "r_well":
        if normalize:
            nrm = torch.linalg.vector_norm(W.detach())
            W = W / torch.where(nrm > 0, nrm, torch.ones_like(nrm))
        return condreg.r_well(W)
    kappa = condreg.condition_number(W)
    return kappa if penalty == "condition_number" else torch.log(kappa)


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

    Parameters
    ----------
    model : torch.nn.Module
        The network.
    penalty : {"r_well", "condition_number", "log_condition_number"}
        Per matrix: ``R_well(W) = ½σ_1² − ‖W‖_F²/(2·min(m, n))``, ``κ(W)`` or ``log κ(W)``.
    module_filter, name_filter : optional
        The selection of :func:`weight_matrices`.
    normalize : bool
        ``"r_well"`` of ``W/‖W‖_F`` (the norm detached), scale-free (default).
    reduction : {"sum", "mean"}
        Over the selected matrices.

    Returns
    -------
    torch.Tensor
        0-d, differentiable with respect to the parameters.

    Raises
    ------
    ValueError
        When no parameter is selected or for an unknown ``penalty``/``reduction``.
    condreg.RankError
        For a zero weight.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.weights import weight_conditioning_loss
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> (1e-2 * weight_conditioning_loss(net)).backward()   # add it to the task loss
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    if penalty not in _PENALTIES:
        raise ValueError(f"penalty must be one of {_PENALTIES}, got {penalty!r}")
    selected = weight_matrices(model, module_filter=module_filter, name_filter=name_filter)
    terms = [_penalty(W, penalty, normalize) for _, W in selected]
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
    """``{name: κ(W)}`` of the selected weight matrices (Python floats; for logging).

    Parameters
    ----------
    model : torch.nn.Module
        The network.
    module_filter, name_filter : optional
        The selection of :func:`weight_matrices`.

    Returns
    -------
    dict of str to float

    Raises
    ------
    condreg.RankError
        For a zero weight.

    Examples
    --------
    >>> import torch, condreg.torch.weights
    >>> condreg.torch.weights.weight_condition_numbers(torch.nn.Linear(1, 1))  # 1×1: κ = 1
    {'weight': 1.0}
    """
    selected = weight_matrices(model, module_filter=module_filter, name_filter=name_filter)
    return {name: float(condreg.condition_number(W.detach())) for name, W in selected}
