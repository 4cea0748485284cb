"""The released code (``amberyzheng/model-immunization-cond-num``) as the ablation reads it: its
switches, configs, κ, preprocessing (house prices, MNIST) and the authors' committed logs."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from condreg_experiments.data import DataError, read_csv_table

#: The released code's choices the ablation emulates: name -> what it does when on (off: condreg's).
RELEASED_SWITCHES: dict[str, str] = {
    "ridge_kappa": "κ from eigvalsh(S + 1e-6·I), σ_min = the smallest eigenvalue above 1e-6, in "
    "the regularizers and Opt κ's objective (condreg: κ over the nonzero singular values)",
    "right_precond": "K⁻¹ multiplies the θ-gradient on the right (output index), not the left",
    "adam": "Adam (β = 0.9, 0.999; ε = 1e-8) on θ, bias and head, not plain gradient descent",
    "linear_init": "θ and a bias from nn.Linear's default init (U(±1/√D)), head ω ~ N(0, 1) "
    "(condreg: θ = I, no bias, ω = 0)",
    "raw_normaliser": "R_well's and R_ill's normaliser = the raw input's last axis (house: the "
    "number of features; MNIST: 28), not p and the rank k",
    "fixed_lambda": "the configs' fixed λ_P / λ_H (house 100 / 1e7, MNIST 1 / 5e7; Opt κ 1e-5 / "
    "1, utils/loss.py's kappa_loss), no step clipping (condreg: λ balanced at θ_0, every "
    "regularizer step clipped to max_step)",
    "config_schedule": "the configs' epochs and learning rate (house 10 / 5e-3, MNIST 30 / 1e-3)",
    "minibatch": "mini-batches of 64 row pairs (drop_last; house on 2 devices, gradients "
    "averaged), the regularizers and the preconditioner's K per batch with a ridge (1 for D_P, "
    "lambda_reg for D_H: house 1, MNIST 1e-7)",
    "released_preprocessing": "house prices as dataset.py: every column but LotArea and "
    "SalePrice (Id included), fillna(0), label-encoded per file, standardised per file "
    "(std 0 → 1), float32, the first 200 rows of each file",
}

#: Switches per dataset (MNIST keeps condreg's pooled tasks; docs/math.md §9.5).
SWITCHES_BY_DATASET: dict[str, tuple[str, ...]] = {
    "house": tuple(RELEASED_SWITCHES),
    "mnist": tuple(s for s in RELEASED_SWITCHES if s != "released_preprocessing"),
}

#: The released configs (configs/house_price.yaml, configs/mnist.yaml) and code constants.
RELEASED_CONFIG: dict[str, dict[str, float]] = {
    "house": {
        "epochs": 10,
        "lr": 5e-3,
        "lam_p": 100.0,
        "lam_h": 1e7,
        "ridge_p": 1.0,
        "ridge_h": 1.0,
        "batch": 64,
        "devices": 2,
        "rows": 200,
    },
    "mnist": {
        "epochs": 30,
        "lr": 1e-3,
        "lam_p": 1.0,
        "lam_h": 5e7,
        "ridge_p": 1.0,
        "ridge_h": 1e-7,
        "batch": 64,
        "devices": 1,
        "normaliser": 28,
    },
    "opt_kappa": {"lam_p": 1e-5, "lam_h": 1.0},
}

#: The released κ's floor: eigvalsh(S + RIDGE_FLOOR·I), σ_min = min eigenvalue > RIDGE_FLOOR.
RIDGE_FLOOR = 1e-6

#: What the authors' runs printed (wandb output.log, committed in the released repository at
#: dc536a8 and removed by the next commit):
#: κ(K_P), κ(K_H) ("X1/X2 condition") and κ(H_P), κ(H_H) ("A1/A2") by the ridge-floor κ.
LOGGED: dict[str, dict[str, float | str]] = {
    "house": {
        "source": "wandb/run-20250608_031141-b400gz2b/files/output.log (and 3 identical runs)",
        "kappa_K_P": 1795161651.0645268,
        "kappa_K_H": 2009611173.1950781,
        "kappa_H_P": 394404313.74806696,
        "kappa_H_H": 531779644.03056484,
        "ii": 0.21970406593422162,
        "i": 0.26461817645305435,
        "rir": 1.2044300378686656,
        "protocol": "configs/house_price.yaml: 10 epochs, 2 GPUs, lr 5e-3, λ 100 / 1e7",
    },
    "mnist": {
        "source": "wandb/run-20250608_032358-ikncuytd/files/output.log",
        "pair": "0-1",
        "kappa_K_P": 3108297500759.5996,
        "kappa_K_H": 1727520316176.9072,
        "kappa_H_P": 215216254250.395,
        "kappa_H_H": 12615119762991.012,
        "i": 12615119762991.012 / 1727520316176.9072,
        "ii": 215216254250.395 / 3108297500759.5996,
        "rir": 105.46678932580377,
        "steps": 92,
        "images_per_digit": 5923,
        "protocol": "configs/mnist.yaml with max_epochs 1: one epoch of 92 batches of 64 image "
        "pairs (5923 per digit, full MNIST), 784 raw pixels, D_P = digit 0 (label 0), D_H = "
        "digit 1 (label 1)",
    },
}

#: pandas' default missing-value strings (``read_csv``), as the released dataset.py reads them.
PANDAS_NA_VALUES: frozenset[str] = frozenset(
    "|#N/A|#N/A N/A|#NA|-1.#IND|-1.#QNAN|-NaN|-nan|1.#IND|1.#QNAN|<NA>|N/A|NA|NULL|NaN|None|"
    "n/a|nan|null".split("|")
)


def ridge_floor_spectrum(F: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """``(w, V, lo, hi)``: eigh(``FᵀF + 1e-6·I``), w[lo] the least above 1e-6 (none: DataError)."""
    F = np.asarray(F, dtype=np.float64)
    w, V = np.linalg.eigh(F.T @ F + RIDGE_FLOOR * np.eye(F.shape[1]))
    above = np.flatnonzero(w > RIDGE_FLOOR)
    if above.size == 0:
        raise DataError("ridge-floor κ: no eigenvalue of FᵀF + 1e-6·I exceeds 1e-6")
    return w, V, int(above[0]), int(w.size - 1)


def ridge_floor_kappa(F: np.ndarray) -> float:
    """The released κ(FᵀF): λ_max/λ_min of ``FᵀF + 1e-6·I``, λ_min the least above 1e-6."""
    w, _, lo, hi = ridge_floor_spectrum(F)
    return float(math.exp(math.log(w[hi]) - math.log(w[lo])))


@dataclass(frozen=True)
class ReleasedHousePrices:
    """The released house-price tasks (float32 values in float64) and the 79 feature names."""

    X_p: np.ndarray
    y_p: np.ndarray
    X_h: np.ndarray
    y_h: np.ndarray
    columns: tuple[str, ...]


def encode_column(values: Sequence[str]) -> np.ndarray:
    """One column as pandas reads it, after ``fillna(0)`` and (text) LabelEncoder's sorted codes."""
    missing = [v in PANDAS_NA_VALUES for v in values]
    try:
        return np.array([0.0 if m else float(v) for v, m in zip(values, missing, strict=True)])
    except ValueError:  # a text column
        text = ["0" if m else v for v, m in zip(values, missing, strict=True)]
        codes = {s: i for i, s in enumerate(sorted(set(text)))}
        return np.array([float(codes[s]) for s in text])


def _released_file(path: pathlib.Path, label: str, rows: int) -> tuple[np.ndarray, ...]:
    header, table = read_csv_table(path)
    for needed in ("LotArea", "SalePrice", "Id"):
        if needed not in header:
            raise DataError(f"{path}: no {needed!r} column; cannot preprocess the released way")
    if len(table) < rows + 1:
        raise DataError(f"{path}: {len(table)} rows; the released protocol needs more than {rows}")
    columns = [c for c in header if c not in ("LotArea", "SalePrice")]
    data = {c: encode_column([r[j] for r in table]) for j, c in enumerate(header)}
    X = np.stack([data[c] for c in columns], axis=1)
    std = X.std(axis=0, ddof=1)
    X = (X - X.mean(axis=0)) / np.where(std == 0, 1.0, std)
    y = data[label]
    y = (y - y.mean()) / (y.std(ddof=1) or 1.0)
    return *(a.astype(np.float32).astype(np.float64)[:rows] for a in (X, y)), tuple(columns)


def released_house_prices(data_dir: str | pathlib.Path, rows: int = 200) -> ReleasedHousePrices:
    """D1.csv / D2.csv as the released ``dataset.py`` reads them, first ``rows`` rows; DataError."""
    data_dir = pathlib.Path(data_dir)
    paths = [data_dir / "D1.csv", data_dir / "D2.csv"]
    for path in paths:
        if not path.is_file():
            raise DataError(
                f"{path}: missing; the released preprocessing needs the split files "
                f"D1.csv and D2.csv"
            )
    X_p, y_p, cols_p = _released_file(paths[0], "LotArea", rows)
    X_h, y_h, cols_h = _released_file(paths[1], "SalePrice", rows)
    if cols_p != cols_h:
        raise DataError(f"{data_dir}: D1.csv and D2.csv have different columns")
    return ReleasedHousePrices(X_p, y_p, X_h, y_h, cols_p)


def released_mnist_tasks(
    X: np.ndarray, y: np.ndarray, pair: tuple[int, int], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X_P, y_P, X_H, y_H)`` of the released MNIST pair as dataset.py's ``BinaryDataset``
    builds it: every image of digit P with label 0, of digit H with label 1 (constant labels),
    as many of each as the rarer digit has, in random order (rows are paired by index); the 784
    raw pixels ``X`` (in [0, 1]) normalised as (x − 0.1307)/0.3081. DataError without images."""
    p, h = pair
    X = np.asarray(X, dtype=np.float64)
    rows = [np.flatnonzero(np.asarray(y) == d) for d in (p, h)]
    n = min(r.size for r in rows)
    if n < 2:
        raise DataError(f"released MNIST pair {p}-{h}: {n} image(s) of the rarer digit")
    rows = [rng.permutation(r)[:n] for r in rows]
    X_p, X_h = ((X[r] - 0.1307) / 0.3081 for r in rows)
    return X_p, np.zeros(n), X_h, np.ones(n)
