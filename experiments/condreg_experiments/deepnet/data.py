"""Data of the deep-net study (NumPy, no torch): stratified splits, MNIST tasks, image folders."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

import numpy as np

from condreg_experiments.data import DataError


@dataclasses.dataclass(frozen=True)
class Split:
    """One task's train / validation / test images (``X`` float32 ``(n, C, H, W)``) and labels."""

    X_tr: np.ndarray
    y_tr: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_te: np.ndarray
    y_te: np.ndarray
    n_classes: int


def split_indices(
    labels: np.ndarray,
    classes: Sequence[int],
    *,
    test_fraction: float,
    n_per_class: int | None,
    seed: int,
    val_fraction: float = 0.0,
) -> tuple[np.ndarray, ...]:
    """Stratified ``(train, test)``, or with ``val_fraction > 0`` ``(train, val, test)``, indices
    of at most ``n_per_class`` images per class. Raises ``ValueError`` when a class has too few
    images for every split to get one."""
    rng = np.random.default_rng(seed)
    need = 2 + (val_fraction > 0)
    train, val, test = [], [], []
    for c in classes:
        idx = np.flatnonzero(labels == c)
        if n_per_class is not None:
            idx = idx[: int(n_per_class)]
        if idx.size < need:
            raise ValueError(f"class {c} has {idx.size} images; need at least {need}")
        idx = rng.permutation(idx)
        n_test = min(max(1, int(round(test_fraction * idx.size))), idx.size - need + 1)
        n_val = 0
        if val_fraction > 0:
            n_val = min(max(1, int(round(val_fraction * idx.size))), idx.size - n_test - 1)
        test.append(idx[:n_test])
        val.append(idx[n_test : n_test + n_val])
        train.append(idx[n_test + n_val :])
    out = [np.sort(np.concatenate(a)) for a in (train, val, test)]
    return tuple(out) if val_fraction > 0 else (out[0], out[2])


def _split(X, y, classes, **kw) -> Split:
    tr, va, te = split_indices(y, classes, **kw)
    lut = np.full(int(y.max()) + 1, -1, np.int64)
    lut[list(classes)] = np.arange(len(classes))
    return Split(X[tr], lut[y[tr]], X[va], lut[y[va]], X[te], lut[y[te]], len(classes))


@dataclasses.dataclass(frozen=True)
class Images:
    """The images of one run, read once; ``pools``: ``(X, y, classes)`` of D_P and of D_H."""

    pools: tuple[tuple[np.ndarray, np.ndarray, tuple[int, ...]], ...]
    test_fraction: float
    val_fraction: float
    n_per_class: int | None

    def tasks(self, seed: int) -> tuple[Split, Split]:
        """The :class:`Split` of D_P and of D_H for ``seed``."""
        kw = dict(test_fraction=self.test_fraction, val_fraction=self.val_fraction)
        kw.update(n_per_class=self.n_per_class, seed=seed)
        P, H = (_split(X, y, classes, **kw) for X, y, classes in self.pools)
        return P, H


def load_images(s) -> Images:
    """The :class:`Images` of the study ``s``: normalised MNIST digits for the small archs, the
    image folders ``s.pretrain_dir`` / ``s.harmful_dir`` for a large one."""
    split = dict(test_fraction=s.test_fraction, val_fraction=s.val_fraction)
    if not s.large:
        from condreg_experiments.data import load_mnist

        X, y = load_mnist(s.mnist_dir)
        X = ((X.astype(np.float32) - 0.1307) / 0.3081).reshape(-1, 1, 28, 28)
        pools = ((X, y, tuple(s.pretrain_digits)), (X, y, tuple(s.harmful_digits)))
        return Images(pools, n_per_class=s.n_per_digit, **split)
    pools = []
    for root in (s.pretrain_dir, s.harmful_dir):
        X, y, names = load_image_folder(
            root, image_size=s.image_size, max_per_class=s.max_images_per_class
        )
        pools.append((X, y, tuple(range(len(names)))))
    return Images(tuple(pools), n_per_class=None, **split)


_IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
_MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
_STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]


def _read_image(path: pathlib.Path, image_size: int) -> np.ndarray:
    from PIL import Image

    resize = int(round(image_size * 8 / 7))
    with Image.open(path) as im:
        im = im.convert("RGB")
        w, h = im.size
        scale = resize / min(w, h)
        im = im.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BILINEAR)
        w, h = im.size
        left, top = (w - image_size) // 2, (h - image_size) // 2
        im = im.crop((left, top, left + image_size, top + image_size))
        arr = np.asarray(im, np.float32).transpose(2, 0, 1) / 255.0
    return (arr - _MEAN) / _STD


def load_image_folder(
    root: str | pathlib.Path, *, image_size: int, max_per_class: int | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(X float32 (N, 3, s, s), y int64, class_names)`` of the tree ``root/<class>/<image>``:
    RGB, shorter side resized to ``image_size · 8/7``, centre-cropped, ImageNet-normalised.
    Raises ``FileNotFoundError`` (no directory) or ``DataError`` (no classes or images)."""
    try:
        import PIL  # noqa: F401
    except ImportError as exc:  # pragma: no cover - Pillow comes with matplotlib
        raise ImportError("reading image folders needs Pillow (pip install pillow)") from exc
    root = pathlib.Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist or is not a directory")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{str(root)!r} has no class sub-folders (expected root/<class>/<image>)")
    xs, ys = [], []
    for ci, c in enumerate(classes):
        files = sorted(p for p in (root / c).iterdir() if p.suffix.lower() in _IMAGE_EXTS)
        for f in files[: None if max_per_class is None else int(max_per_class)]:
            xs.append(_read_image(f, image_size))
            ys.append(ci)
    if not xs:
        raise DataError(f"{str(root)!r} holds no images ({', '.join(_IMAGE_EXTS)})")
    return np.stack(xs), np.asarray(ys, np.int64), classes
