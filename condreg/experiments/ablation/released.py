"""What the ablation emulates of the authors' released code, and what that code logged.

The released code (``amberyzheng/model-immunization-cond-num``; its configs, ``dataset.py``,
``models/linear.py``, ``models/model.py``, ``utils/loss.py``, ``utils/log.py``) differs from the
paper's printed algorithm; :data:`RELEASED_SWITCHES` names each difference that this experiment
can switch on, one at a time, inside the experiment only (``condreg.immunize`` never does any of
it). This module holds the released protocol's *definitions*: its condition number
(:func:`ridge_floor_kappa`), its house-price preprocessing (:func:`released_house_prices`), its
configuration values (:data:`RELEASED_CONFIG`) and the numbers its authors logged
(:data:`LOGGED`, from the wandb run logs committed in that repository's history).

NumPy only.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "RELEASED_SWITCHES",
    "SWITCHES_BY_DATASET",
    "RELEASED_CONFIG",
    "LOGGED",
    "RIDGE_FLOOR",
    "PANDAS_NA_VALUES",
    "ReleasedHousePrices",
    "ridge_floor_kappa",
    "ridge_floor_spectrum",
    "released_house_prices",
    "encode_column",
]

#: The released code's choices this experiment can emulate, one switch each (name -> what it
#: does when on). Off, every switch is condreg's default (docs/ablation.md).
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

#: Switches that exist per dataset (MNIST keeps condreg's pooled tasks: the released MNIST
#: input, 784 raw pixels of one digit with a constant label, is docs/math.md §9.5's defect).
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
    # utils/loss.py kappa_loss: 1 / log κ(S_H) + lambda_cond · log κ(S_P), lambda_cond = 1e-5
    "opt_kappa": {"lam_p": 1e-5, "lam_h": 1.0},
}

#: The released κ's floor: eigvalsh(S + RIDGE_FLOOR·I), σ_min = min eigenvalue > RIDGE_FLOOR.
RIDGE_FLOOR = 1e-6

#: What the authors' runs printed (wandb output.log in the released repository's commit
#: dc536a8, removed from the tree by the next commit): "X1/X2 condition" are κ(K_P), κ(K_H)
#: by the ridge-floor κ of the training rows, "A1/A2" κ(H_P), κ(H_H) after training.
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
        "rir": 105.46678932580377,
        "protocol": "configs/mnist.yaml with max_epochs 1; full MNIST (5923 images per digit), "
        "784 raw pixels",
    },
}

#: pandas' default missing-value strings (``read_csv``), as the released dataset.py reads them.
PANDAS_NA_VALUES: frozenset[str] = frozenset(
    "|#N/A|#N/A N/A|#NA|-1.#IND|-1.#QNAN|-NaN|-nan|1.#IND|1.#QNAN|<NA>|N/A|NA|NULL|NaN|None|"
    "n/a|nan|null".split("|")
)


def ridge_floor_spectrum(F: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The released κ's spectrum of ``S = FᵀF``: eigenvalues (ascending) and eigenvectors of
    ``S + 1e-6·I``, and the indices of σ_max (the last) and σ_min (the first above 1e-6).

    Raises :class:`condreg.experiments.data.DataError` when no eigenvalue exceeds the floor."""
    F = np.asarray(F, dtype=np.float64)
    S = F.T @ F + RIDGE_FLOOR * np.eye(F.shape[1])
    w, V = np.linalg.eigh(S)
    above = np.flatnonzero(w > RIDGE_FLOOR)
    if above.size == 0:
        from condreg.experiments.data import DataError

        raise DataError("ridge-floor κ: no eigenvalue of FᵀF + 1e-6·I exceeds 1e-6")
    return w, V, int(above[0]), int(w.size - 1)


def ridge_floor_kappa(F: np.ndarray) -> float:
    """The released code's κ(FᵀF): ``λ_max/λ_min`` of ``eigvalsh(FᵀF + 1e-6·I)``, λ_min the
    smallest eigenvalue above 1e-6 (``utils/loss.py``'s ``condition_number``, exponentiated).

    On a rank-deficient ``FᵀF`` the zero eigenvalues become ≈ 1e-6 (plus rounding), so this is
    ≈ λ_max/1e-6: a number set by the floor, not by the data's smallest nonzero direction."""
    w, _, lo, hi = ridge_floor_spectrum(F)
    return float(math.exp(math.log(w[hi]) - math.log(w[lo])))


@dataclass(frozen=True)
class ReleasedHousePrices:
    """The released house-price tasks: ``X_p``, ``y_p`` (D1: LotArea), ``X_h``, ``y_h`` (D2:
    SalePrice), the first ``rows`` rows of each file, float32 values held in float64;
    ``columns`` the 79 feature names (``Id`` first)."""

    X_p: np.ndarray
    y_p: np.ndarray
    X_h: np.ndarray
    y_h: np.ndarray
    columns: tuple[str, ...]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def encode_column(values: Sequence[str]) -> np.ndarray:
    """One column as pandas reads it, after ``fillna(0)`` and (object columns) LabelEncoder on
    ``astype(str)``: numeric when every present value is a number (an all-missing column too),
    missing → 0; else the sorted distinct strings' codes, missing → the string ``"0"``."""
    missing = [v in PANDAS_NA_VALUES for v in values]
    present = [v for v, m in zip(values, missing, strict=True) if not m]
    if all(_is_number(v) for v in present):
        return np.array([0.0 if m else float(v) for v, m in zip(values, missing, strict=True)])
    text = ["0" if m else v for v, m in zip(values, missing, strict=True)]
    codes = {s: i for i, s in enumerate(sorted(set(text)))}
    return np.array([float(codes[s]) for s in text])


def _released_file(path: pathlib.Path, label: str, rows: int) -> tuple[np.ndarray, ...]:
    from condreg.experiments.data import DataError, read_csv_table

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
    y_std = y.std(ddof=1)
    y = (y - y.mean()) / (y_std if y_std else 1.0)
    as32 = X.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)
    return as32[0][:rows], as32[1][:rows], tuple(columns)


def released_house_prices(data_dir: str | pathlib.Path, rows: int = 200) -> ReleasedHousePrices:
    """D1.csv / D2.csv of ``data_dir`` preprocessed as the released ``dataset.py`` does.

    Each file on its own: features = every column but LotArea and SalePrice (``Id`` included);
    missing values (pandas' default NA strings) → 0; text columns label-encoded by their sorted
    distinct values (per file: the same category may get different codes in D1 and D2); every
    feature standardised by the file's mean and sample std (std 0 → 1), the target likewise;
    float32; the first ``rows`` rows (the released training subset).

    Raises :class:`condreg.experiments.data.DataError` when a file is missing, lacks a needed
    column, has too few rows, or the two files' feature columns differ.
    """
    from condreg.experiments.data import DataError

    data_dir = pathlib.Path(data_dir)
    paths = [data_dir / "D1.csv", data_dir / "D2.csv"]
    for path in paths:
        if not path.is_file():
            raise DataError(
                f"{path}: missing; the released preprocessing needs the split files D1.csv and "
                f"D2.csv"
            )
    X_p, y_p, cols_p = _released_file(paths[0], "LotArea", rows)
    X_h, y_h, cols_h = _released_file(paths[1], "SalePrice", rows)
    if cols_p != cols_h:
        raise DataError(f"{data_dir}: D1.csv and D2.csv have different columns")
    return ReleasedHousePrices(X_p, y_p, X_h, y_h, cols_p)
