"""The PyTorch work of :func:`condreg.attacks.tangent_condition` (arguments and docs there):
the Jacobian of a batch's outputs with respect to the chosen parameters by ``torch.func``, and
its κ by condreg's Gram route."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

import condreg


def tangent_condition(
    extractor: Any, X: Any, *, block: str | None, head: Any, rtol: float | None
) -> float:
    """κ(J Jᵀ) of the trained parameters on the batch ``X`` (see the public function)."""
    where = "tangent_condition"
    if not isinstance(extractor, nn.Module):
        raise TypeError(f"{where}: extractor must be a torch.nn.Module, got {type(extractor)}")
    if head is not None and not isinstance(head, nn.Module):
        raise TypeError(f"{where}: head must be a torch.nn.Module, got {type(head)}")
    if not isinstance(X, (torch.Tensor, np.ndarray)):
        raise TypeError(f"{where}: X must be a torch.Tensor or numpy.ndarray, got {type(X)}")
    net = nn.Sequential(extractor) if head is None else nn.Sequential(extractor, head)
    if block is None:
        chosen = {f"0.{n}": p for n, p in extractor.named_parameters()}
    else:
        mods = dict(extractor.named_modules())
        if not isinstance(block, str) or block == "" or block not in mods:
            known = ", ".join(n for n in mods if n and "." not in n) or "none"
            raise ValueError(f"{where}: extractor has no submodule {block!r} (top level: {known})")
        chosen = {f"0.{block}.{n}": p for n, p in mods[block].named_parameters()}
    if head is not None:
        chosen |= {f"1.{n}": p for n, p in head.named_parameters()}
    if not chosen:
        raise ValueError(f"{where}: no parameters to train (an empty block and no head)")
    first = next(iter(chosen.values()))
    X = torch.as_tensor(X)
    if X.ndim < 1 or X.shape[0] == 0:
        raise ValueError(f"{where}: X must be a batch (n, …) with n >= 1, got {tuple(X.shape)}")
    if X.is_complex():
        raise ValueError(f"{where}: X must be real, got {X.dtype}")
    if X.is_floating_point():
        X = X.to(first.dtype)
        if not bool(torch.isfinite(X).all()):
            raise ValueError(f"{where}: X contains NaN or Inf")
    X = X.to(first.device)
    params = {k: p.detach() for k, p in chosen.items()}
    rest = {k: v.detach() for k, v in (*net.named_parameters(), *net.named_buffers())}
    rest = {k: v for k, v in rest.items() if k not in params}

    def one(p: dict, x: torch.Tensor) -> torch.Tensor:
        return functional_call(net, (p, rest), (x.unsqueeze(0),)).squeeze(0)

    flags = [m.training for m in net.modules()]
    net.eval()
    try:
        out = one(params, X[0])
        if out.ndim != 1:
            raise ValueError(
                f"{where}: the network must return (n, K) outputs, got (n, {tuple(out.shape)})"
            )
        jac = vmap(jacrev(one), in_dims=(None, 0))(params, X)
    finally:
        for m, w in zip(net.modules(), flags, strict=True):
            m.train(w)
    n, k = X.shape[0], out.shape[0]
    J = torch.cat([j.reshape(n * k, -1) for j in jac.values()], dim=1)
    return float(condreg.condition_number(J.detach(), gram=True, rtol=rtol))
