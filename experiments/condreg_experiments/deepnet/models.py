"""The networks of the deep-net study, each split into stem (frozen) -> block (immunized) -> head:
the small ``rescnn`` / ``vit`` and torchvision / timm ``resnet18``, ``vit_b_*`` with local weights.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import torch
from torch import nn

from condreg_experiments import UsageError


@dataclasses.dataclass(frozen=True)
class Target:
    """One preconditioned weight: ``K = layer_gram(shape, input of module)``."""

    name: str
    module: nn.Module
    param: nn.Parameter
    shape: nn.Module


@dataclasses.dataclass
class Parts:
    """stem (frozen) -> block (immunized) -> head; ``feature_dim`` = the block's output width."""

    stem: nn.Module
    block: nn.Module
    head: nn.Module
    feature_dim: int
    n_classes: int
    new_head: bool = True  # False: the supplied weights' head already fits D_P's classes
    immunized: str = ""  # what the block is, in words (results.json)


def precond_targets(block: nn.Module) -> list[Target]:
    """Every ``nn.Linear`` / ``nn.Conv2d`` weight of ``block`` and every fused
    ``nn.MultiheadAttention`` input projection, with the module whose input defines its ``K``."""
    out: list[Target] = []
    internal: set[int] = set()
    for name, mod in block.named_modules():
        if isinstance(mod, nn.MultiheadAttention):
            # out_proj's forward (and so a hook on its input) never runs: supervised gradient only
            internal.add(id(mod.out_proj))
            if mod.in_proj_weight is not None:
                w = mod.in_proj_weight
                shape = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
                out.append(Target(f"{name}.in_proj_weight", mod, w, shape))
        elif isinstance(mod, (nn.Linear, nn.Conv2d)) and id(mod) not in internal:
            out.append(Target(f"{name}.weight", mod, mod.weight, mod))
    return out


class _Basic(nn.Module):
    """conv3×3 (stride s) → ReLU → conv3×3 (groups) ; + 1×1 conv shortcut (stride s)."""

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, groups=groups)
        self.short = nn.Conv2d(c_in, c_out, 1, stride=stride)

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + self.short(x))


class _Bottleneck(nn.Module):
    """1×1 (reduce) → ReLU → 3×3 → ReLU → 1×1 (expand) ; + 1×1 shortcut."""

    def __init__(self, c_in: int, c_mid: int, c_out: int):
        super().__init__()
        self.reduce = nn.Conv2d(c_in, c_mid, 1)
        self.conv = nn.Conv2d(c_mid, c_mid, 3, padding=1)
        self.expand = nn.Conv2d(c_mid, c_out, 1)
        self.short = nn.Conv2d(c_in, c_out, 1)

    def forward(self, x):
        h = torch.relu(self.conv(torch.relu(self.reduce(x))))
        return torch.relu(self.expand(h) + self.short(x))


class _Encoder(nn.Module):
    """One pre-norm transformer layer with explicit ``qkv`` / ``proj`` / MLP ``nn.Linear``s."""

    def __init__(self, d: int, heads: int = 4, mlp: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, mlp * d), nn.Linear(mlp * d, d)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(n, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.mT / (q.shape[-1] ** 0.5), dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(n, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class _Tokens(nn.Module):
    def __init__(self, d: int, patch: int = 7, side: int = 28):
        super().__init__()
        self.embed = nn.Conv2d(1, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(0.02 * torch.randn(1, (side // patch) ** 2 + 1, d))

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos


class _ClsBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.layer, self.ln = _Encoder(d), nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(self.layer(x))[:, 0]


def build_small(arch: str, feature_dim: int, n_classes: int) -> Parts:
    """A fresh ``rescnn`` or ``vit`` (pre-trained on D_P by the study); ``|`` marks the block.

    rescnn: 28×28 → conv(16) → pool → basic(16→32, s2) | basic(32→64, s2, grouped) →
    bottleneck(64→32→D) → global average pool. vit: 16 patch tokens of 7×7 pixels + class
    token | one transformer layer → normed class token.
    """
    d = feature_dim
    if arch == "rescnn":
        stem = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), _Basic(16, 32, 2)
        )  # 28 → 14 → 7
        block = nn.Sequential(
            _Basic(32, 64, 2, groups=2),
            _Bottleneck(64, 32, d),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )  # 7 → 4 → 1
        what = "last two residual blocks (grouped basic block + bottleneck), 7 conv weights"
    elif arch == "vit":
        stem, block = _Tokens(d), _ClsBlock(d)
        what = "the transformer layer (qkv, proj, fc1, fc2 Linear weights)"
    else:
        raise UsageError(f"unknown small arch {arch!r}")
    return Parts(stem, block, nn.Linear(d, n_classes), d, n_classes, True, what)


class _Appended(nn.Module):
    """``block`` (frozen) followed by an identity-initialised ``Linear(D, D)`` θ."""

    def __init__(self, block: nn.Module, d: int):
        super().__init__()
        self.frozen = block
        self.theta = nn.Linear(d, d, bias=False)
        with torch.no_grad():
            self.theta.weight.copy_(torch.eye(d))

    def forward(self, x):
        return self.theta(self.frozen(x))


def with_theta(parts: Parts) -> Parts:
    """The appended-θ variant: the pre-trained block frozen, a D×D identity layer θ after it."""
    d = parts.feature_dim
    block = _Appended(parts.block, d)
    for p in block.frozen.parameters():
        p.requires_grad_(False)
    return dataclasses.replace(parts, block=block, immunized=f"appended θ ({d}×{d})")


def split_resnet(model: nn.Module, n_classes: int | None = None) -> Parts:
    """Split a torchvision-style ResNet: stem = conv1…layer3, block = layer4 + pooling, head = fc
    (a fresh ``Linear`` when ``n_classes`` differs)."""
    names = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "fc")
    for name in (*names, "avgpool"):
        if not hasattr(model, name):
            raise ValueError(f"not a torchvision-style ResNet: it has no attribute {name!r}")
    m: Any = model
    stem = nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool, m.layer1, m.layer2, m.layer3)
    block = nn.Sequential(m.layer4, m.avgpool, nn.Flatten())
    return _with_head(stem, block, m.fc, n_classes, "layer4 (the last two conv blocks)")


def _with_head(stem, block, head, n_classes, what) -> Parts:
    d = head.in_features
    new_head = n_classes is not None and n_classes != head.out_features
    if new_head:
        head = nn.Linear(d, n_classes)
    return Parts(stem, block, head, d, head.out_features, new_head, what)


class _TVStem(nn.Module):
    def __init__(self, model: Any):
        super().__init__()
        enc = model.encoder
        self.conv_proj, self.class_token = model.conv_proj, model.class_token
        self.pos_embedding, self.dropout = enc.pos_embedding, enc.dropout
        self.front = nn.Sequential(*list(enc.layers)[:-1])

    def forward(self, x):  # torchvision's VisionTransformer._process_input + encoder
        x = self.conv_proj(x)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
        cls = self.class_token.expand(x.shape[0], -1, -1)
        return self.front(self.dropout(torch.cat([cls, x], dim=1) + self.pos_embedding))


class _TimmStem(nn.Module):
    def __init__(self, model: Any):
        super().__init__()
        self.vit = model
        self.front = nn.Sequential(*list(model.blocks)[:-1])

    def forward(self, x):
        x = self.vit._pos_embed(self.vit.patch_embed(x))
        if hasattr(self.vit, "norm_pre"):
            x = self.vit.norm_pre(x)
        return self.front(x)


class _LastCls(nn.Module):
    def __init__(self, last: nn.Module, norm: nn.Module):
        super().__init__()
        self.last, self.ln = last, norm

    def forward(self, x):
        return self.ln(self.last(x))[:, 0]


def split_vit(model: nn.Module, n_classes: int | None = None) -> Parts:
    """Split a torchvision or timm ViT: stem = embeddings + all encoder blocks but the last;
    block = the last encoder block + final norm + class token; head."""
    m: Any = model
    what = "the last encoder block (attention in_proj/out_proj and MLP Linear weights)"
    if hasattr(m, "encoder") and hasattr(m, "_process_input"):  # torchvision
        heads = m.heads
        head = heads[-1] if isinstance(heads, nn.Sequential) else heads
        block = _LastCls(list(m.encoder.layers)[-1], m.encoder.ln)
        return _with_head(_TVStem(m), block, head, n_classes, what)
    if hasattr(m, "blocks") and hasattr(m, "patch_embed"):  # timm
        block = _LastCls(list(m.blocks)[-1], m.norm)
        return _with_head(_TimmStem(m), block, m.head, n_classes, what)
    raise ValueError("not a torchvision or timm VisionTransformer")


def load_weights(model: nn.Module, weights: pathlib.Path | None) -> None:
    """Load a local state dict (``{"state_dict": …}`` / ``{"model": …}`` wrappers accepted)."""
    if weights is None:
        return
    path = pathlib.Path(weights)
    if not path.is_file():
        raise FileNotFoundError(f"--weights {str(path)!r} is not a file")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    model.load_state_dict(state)


def build_large(arch: str, weights: pathlib.Path | None, n_classes: int) -> Parts:
    """torchvision ``resnet18`` / ``vit_b_16`` / ``vit_b_32`` or ``timm:<vit name>``."""
    if arch in ("resnet18", "vit_b_16", "vit_b_32"):
        try:
            import torchvision
        except ImportError as exc:
            raise UsageError(
                "--arch resnet18/vit_b_16/vit_b_32 needs torchvision matching your torch build; "
                "or use --arch timm:<name> with timm installed, or the CPU archs rescnn, vit"
            ) from exc
        model = getattr(torchvision.models, arch)(weights=None)
    elif arch.startswith("timm:"):
        try:
            import timm
        except ImportError as exc:
            raise UsageError("--arch timm:<name> needs timm (pip install timm)") from exc
        if "resnet" in arch:
            raise UsageError("timm ResNets are not supported; use --arch resnet18 (torchvision)")
        model = timm.create_model(arch[5:], pretrained=False)
    else:
        raise UsageError(
            f"unknown arch {arch!r}; expected rescnn, vit, resnet18, vit_b_16, vit_b_32 or "
            "timm:<vit>"
        )
    load_weights(model, weights)
    return (split_resnet if arch == "resnet18" else split_vit)(model, n_classes)
