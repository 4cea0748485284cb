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
        The names and ``(W.shape[0], -1)`` views, in module order.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.weights import weight_matrices
    >>> conv, lazy = torch.nn.Conv2d(3, 4, 3), torch.nn.LazyLinear(2)  # lazy: not yet a matrix
    >>> net = torch.nn.Sequential(conv, torch.nn.Flatten(), lazy)
    >>> [(n, tuple(W.shape)) for n, W in weight_matrices(net)]
    [('0.weight', (4, 27))]
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

    Parameters
    ----------
    model : torch.nn.Module
        The network.
    penalty : {"r_well", "condition_number", "log_condition_number"}
        The per-matrix penalty (see the module documentation).
    module_filter, name_filter : optional
        The selection of :func:`weight_matrices`.
    normalize : bool
        ``"r_well"`` of ``W/‖W‖_F`` (the norm detached), scale-free (default).
    reduction : {"sum", "mean"}
        Over the selected matrices.

    Returns
    -------
    torch.Tensor
        0-d, on the parameters' device and dtype, differentiable with respect to them.

    Raises
    ------
    ValueError
        When no parameter is selected (a filter that matches nothing is almost always a
        mistake) or for an unknown ``penalty``/``reduction``.
    condreg.RankError
        For a zero weight.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.weights import weight_conditioning_loss
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> loss = 1e-2 * weight_conditioning_loss(net)   # add to the task loss
    >>> loss.backward()
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
        κ over the nonzero singular values of each selected matrix.

    Raises
    ------
    condreg.RankError
        For a zero weight.

    Examples
    --------
    >>> import torch
    >>> from condreg.torch.weights import weight_condition_numbers
    >>> weight_condition_numbers(torch.nn.Linear(3, 3))  # doctest: +SKIP
    {'weight': 2.7...}
    """
    return {
        name: float(condreg.condition_number(W.detach()))
        for name, W in weight_matrices(model, module_filter=module_filter, name_filter=name_filter)
    }
