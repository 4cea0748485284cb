"""Pre-training on D_P and immunization of the block's own weights (Algorithm 1 for deep nets;
the step, the per-layer preconditioning and the λ balancing: docs/deepnet.md).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F_

import condreg
from condreg.torch.nn import layer_gram, left_precondition
from condreg_experiments import _report
from condreg_experiments.deepnet.models import Parts, Target, precond_targets


def batched_apply(module, X, *, device, batch: int = 512, dtype=None) -> torch.Tensor:
    """``module(X)`` in batches under ``no_grad`` on ``device``; a CPU tensor (``dtype``)."""
    outs = []
    with torch.no_grad():
        for i in range(0, X.shape[0], batch):
            xb = torch.as_tensor(X[i : i + batch]).to(device)
            if dtype is not None and xb.is_floating_point():
                xb = xb.to(dtype)
            out = module(xb).cpu()
            outs.append(out if dtype is None else out.to(dtype))
    return torch.cat(outs)


def pretrain(
    parts: Parts, X, y, *, full: bool, epochs: int, lr: float, seed: int, device, progress
) -> None:
    """Train stem + block + head (``full``) or else only a new head with Adam on D_P."""
    torch.manual_seed(seed)
    if full:
        net = torch.nn.Sequential(parts.stem, parts.block, parts.head).to(device)
        Xt = torch.as_tensor(X)
    elif parts.new_head:
        net = parts.head.to(device)
        body = torch.nn.Sequential(parts.stem, parts.block).eval()
        Xt = batched_apply(body, X, device=device)
    else:
        return
    yt = torch.as_tensor(y)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in _report.progress(range(int(epochs)), enabled=progress, desc="pre-train on D_P"):
        perm = torch.randperm(Xt.shape[0], generator=gen)
        for i in range(0, Xt.shape[0], 64):
            idx = perm[i : i + 64]
            loss = F_.cross_entropy(net(Xt[idx].to(device)), yt[idx].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()


Terms = list[tuple[str, torch.Tensor]]


@dataclasses.dataclass(frozen=True)
class Method:
    """One immunization method: ``terms(F_p, F_h, y_h, ctx)`` returns ``[(batch, value)]``
    (``batch`` "p" or "h": the batch whose λ and ``K`` the term gets)."""

    terms: Callable[..., Terms]
    preconditioned: bool


def _unit(F: torch.Tensor) -> torch.Tensor:
    """``F / ‖F‖_F`` (norm detached)."""
    return F / torch.linalg.vector_norm(F.detach())


def _imma_attack_loss(y_h, F_h, n_classes: int, inner_steps: int, inner_lr):
    """Cross-entropy of a fresh linear probe after ``inner_steps`` differentiable GD steps."""
    A = F_.pad(F_h, (0, 1), value=1.0)
    if inner_lr is None:
        with torch.no_grad():
            lam_max = float(torch.linalg.matrix_norm(A.detach(), ord=2)) ** 2 / A.shape[0]
        inner_lr = 1.0 / max(lam_max, 1e-30)
    W = torch.zeros(A.shape[1], n_classes, dtype=F_h.dtype, device=F_h.device)
    onehot = F_.one_hot(y_h, n_classes).to(F_h.dtype)
    for _ in range(int(inner_steps)):
        p = torch.softmax(A @ W, dim=1)
        W = W - inner_lr * (A.T @ (p - onehot)) / A.shape[0]
    return F_.cross_entropy(A @ W, y_h)


def _r_ill_only(F_p, F_h, y_h, ctx) -> Terms:
    return [("h", condreg.r_ill(_unit(F_h), gram=True))]


def _ours(F_p, F_h, y_h, ctx) -> Terms:
    return [("p", condreg.r_well(_unit(F_p), gram=True)), *_r_ill_only(F_p, F_h, y_h, ctx)]


def _opt_kappa(F_p, F_h, y_h, ctx) -> Terms:
    k_p = condreg.condition_number(F_p, gram=True)
    k_h = condreg.condition_number(F_h, gram=True)
    return [("p", torch.log(k_p)), ("h", 1.0 / torch.log(k_h))]


def _imma(F_p, F_h, y_h, ctx) -> Terms:
    loss = _imma_attack_loss(y_h, F_h, ctx["n_h"], ctx["inner_steps"], ctx["inner_lr"])
    return [("h", -loss)]


#: The immunizing methods (the study adds "identity", the un-immunized reference).
METHOD_REGISTRY: dict[str, Method] = {
    "r_ill_only": Method(_r_ill_only, preconditioned=True),
    "imma": Method(_imma, preconditioned=False),
    "opt_kappa": Method(_opt_kappa, preconditioned=False),
    "condreg": Method(_ours, preconditioned=True),
}


@contextlib.contextmanager
def _record_inputs(targets: Sequence[Target], store: dict[int, torch.Tensor]):
    """Keep each immunized module's (first) input, detached, in ``store``."""

    def hook(module, args):
        store[id(module)] = args[0].detach()

    mods = {id(t.module): t.module for t in targets}.values()
    handles = [m.register_forward_pre_hook(hook) for m in mods]
    try:
        yield store
    finally:
        for h in handles:
            h.remove()


def _term_grads(method: Method, terms: Terms, targets, inputs, ridge) -> dict[str, list]:
    weights = [t.param for t in targets]
    out = {}
    for name, value in terms:
        gs = torch.autograd.grad(value, weights, retain_graph=True, allow_unused=True)
        gs = [torch.zeros_like(w) if g is None else g for g, w in zip(gs, weights, strict=True)]
        if method.preconditioned:
            gs = [
                _precondition(t, g, inputs[name], ridge) for t, g in zip(targets, gs, strict=True)
            ]
        out[name] = gs
    return out


def _precondition(t: Target, g: torch.Tensor, inputs: dict, ridge) -> torch.Tensor:
    K = layer_gram(t.shape, inputs[id(t.module)])
    r = None if ridge is None else ridge * float(K.diagonal(dim1=-2, dim2=-1).mean())
    return left_precondition(t.shape, g, K, r)


def _norm(ts: Sequence[torch.Tensor]) -> float:
    return math.sqrt(sum(float(torch.sum(t.detach() ** 2)) for t in ts))


@dataclasses.dataclass
class Immunized:
    """The immunized copies of block and head, with λ's and the κ trajectory."""

    block: torch.nn.Module
    head: torch.nn.Module
    lam: dict[str, float]
    history: list[dict[str, float]]


def _copies(parts: Parts, device, dtype):
    block = copy.deepcopy(parts.block).to(device, dtype).eval()  # BN / dropout frozen
    head = copy.deepcopy(parts.head).to(device, dtype)
    frozen_part = getattr(block, "frozen", torch.nn.Module())  # the appended-θ variant
    frozen = {id(p) for p in frozen_part.parameters()}
    for p in block.parameters():
        p.requires_grad_(id(p) not in frozen)
    for p in head.parameters():
        p.requires_grad_(True)
    return block, head, [t for t in precond_targets(block) if t.param.requires_grad]


def immunize(
    method_name: str,
    parts: Parts,
    data,
    *,
    s,
    reg_step: float,
    seed: int,
    device,
    progress: bool = False,
) -> Immunized:
    """Immunize copies of ``parts.block`` / ``parts.head`` with one method.

    ``data = (S_P, y_P, S_H, y_H)``: cached stem outputs and labels; ``s``: the study's settings.
    Raises ``condreg.RankError`` / ``PoleError`` (degenerate batch), ``FloatingPointError``."""
    method = METHOD_REGISTRY[method_name]
    S_P, y_P, S_H, y_H = data
    torch.manual_seed(seed)
    block, head, targets = _copies(parts, device, S_P.dtype)
    params = [p for p in (*block.parameters(), *head.parameters()) if p.requires_grad]
    opt = torch.optim.SGD(params, lr=s.lr, momentum=s.momentum)
    gen = torch.Generator().manual_seed(seed + 1)
    extra = dict(n_h=int(y_H.max()) + 1, inner_steps=s.imma_inner_steps, inner_lr=s.imma_inner_lr)

    weights = [t.param for t in targets]
    idx = {id(w): i for i, w in enumerate(weights)}
    lam: dict[str, float] = {}
    history: list[dict[str, float]] = []
    steps = range(int(s.immunize_steps))
    for t in _report.progress(steps, enabled=progress, desc=f"immunize [{method_name}]"):
        ix, F, inputs = {}, {}, {"p": {}, "h": {}}
        for key, S in (("p", S_P), ("h", S_H)):
            ix[key] = torch.randint(S.shape[0], (min(s.batch_size, S.shape[0]),), generator=gen)
            with _record_inputs(targets, inputs[key]):
                F[key] = block(S[ix[key]].to(device))
            if not bool(torch.isfinite(F[key]).all()):
                raise FloatingPointError(f"immunization [{method_name}]: the features overflowed")
        sup = F_.cross_entropy(head(F["p"]), y_P[ix["p"]].to(device))
        terms = method.terms(F["p"], F["h"], y_H[ix["h"]].to(device), extra)
        reg = _term_grads(method, terms, targets, inputs, s.ridge)
        if not lam:  # balance on the first batch
            cap = reg_step * _norm(weights) / s.lr
            for name, gs in reg.items():
                g = _norm(gs)
                lam[name] = cap / g if math.isfinite(g) and g > 0 else 0.0
        if s.clip:  # no term's update larger than at step 0 (reg_step of ‖W‖ per step)
            for name, gs in reg.items():
                g = lam[name] * _norm(gs)
                if g > cap:
                    reg[name] = [x * (cap / g) for x in gs]
        sup_g = torch.autograd.grad(sup, params)
        for p, g in zip(params, sup_g, strict=True):
            total = g.clone()
            if id(p) in idx:
                for name, gs in reg.items():
                    total += lam[name] * gs[idx[id(p)]]
            p.grad = total
        opt.step()
        if not all(bool(torch.isfinite(p).all()) for p in params):
            raise FloatingPointError(f"immunization [{method_name}] diverged at step {t}")
        if t % 10 == 0 or t == int(s.immunize_steps) - 1:
            history.append(_history_row(t, sup, F["p"], F["h"], terms))
    return Immunized(block, head, lam, history)


def _history_row(t, sup, F_p, F_h, terms) -> dict[str, float]:
    with torch.no_grad():
        return {
            "step": t,
            "sup_loss": float(sup),
            "kappa_p": float(condreg.condition_number(F_p.detach(), gram=True)),
            "kappa_h": float(condreg.condition_number(F_h.detach(), gram=True)),
            **{f"reg_{n}": float(v) for n, v in terms},
        }
