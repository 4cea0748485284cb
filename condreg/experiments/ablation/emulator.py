"""The released code (``amberyzheng/model-immunization-cond-num``) as the ablation emulates it: its
switches, config, κ, preprocessing, logs, Algorithm 1 with its choices on (:class:`Protocol`)."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from condreg.experiments.data import DataError, read_csv_table

__all__ = ["RELEASED_SWITCHES", "SWITCHES_BY_DATASET", "RELEASED_CONFIG", "LOGGED", "RIDGE_FLOOR"]
__all__ += ["PANDAS_NA_VALUES", "ReleasedHousePrices", "ridge_floor_kappa", "ridge_floor_spectrum"]
__all__ += ["released_house_prices", "encode_column", "Protocol", "Trained", "emulate", "Adam"]
__all__ += ["regularizer_gradient", "batches", "TaskArrays", "prepare_task", "precondition"]
__all__ += ["initial_parameters", "head_only_loss"]

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

#: What the authors' runs printed (wandb output.log in the released repository's commit dc536a8):
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


_EPS = np.finfo(np.float64).eps

#: The quantity each method puts on D_P ("p") and D_H ("h"); IMMA's "h" is its attacker.
_TERMS = {
    "condreg": {"p": "r_well", "h": "r_ill"},
    "r_ill_only": {"h": "r_ill"},
    "opt_kappa": {"p": "log_kappa", "h": "inv_log_kappa"},
}


@dataclass(frozen=True)
class Protocol:
    """One training protocol: a dataset's switches turned on, condreg's epochs, lr, step clip."""

    dataset: str
    switches: frozenset[str]
    epochs: int
    lr: float
    task: str
    max_step: float = 0.3
    imma_steps: int = 5

    def on(self, name: str) -> bool:
        """Whether the released choice ``name`` is switched on."""
        return name in self.switches

    @property
    def config(self) -> dict[str, float]:
        """The released config of this dataset."""
        return RELEASED_CONFIG[self.dataset]


@dataclass
class Trained:
    """An emulated run: θ, the bias (None without ``linear_init``), why it stopped, λ's, epochs."""

    theta: np.ndarray
    bias: np.ndarray | None
    stopped: str = "completed"
    lam: dict[str, float] = field(default_factory=dict)
    epochs_run: int = 0


def _spectrum(F: np.ndarray, ridge_kappa: bool) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(eigenvalues, eigenvectors, index of σ_min, of σ_max) of ``FᵀF``, condreg's or released."""
    if ridge_kappa:
        return ridge_floor_spectrum(F)
    R = np.linalg.qr(F, mode="r") if F.shape[0] > F.shape[1] else F
    _, s, Vh = np.linalg.svd(R, full_matrices=False)
    rank = int(np.sum(s > max(F.shape) * _EPS * s[0])) if s[0] > 0 else 0
    if rank < 1:
        raise FloatingPointError("features of rank 0")
    return s * s, Vh.T, rank - 1, 0


def regularizer_gradient(
    F: np.ndarray, quantity: str, *, ridge_kappa: bool, normaliser: int | None
) -> tuple[np.ndarray, float]:
    """``(∇_S f, f)``, S = FᵀF, f = ``quantity``; p = D, k = rank, or both ``normaliser``."""
    mu, V, lo, hi = _spectrum(F, ridge_kappa)
    S = F.T @ F
    s_max, s_min = float(mu[hi]), float(mu[lo])
    v_max, v_min = V[:, hi], V[:, lo]
    fro2 = float(np.sum(S * S))
    if quantity == "log_kappa":
        G = np.outer(v_max, v_max) / s_max - np.outer(v_min, v_min) / s_min
        return G, math.log(s_max) - math.log(s_min)
    if quantity == "r_well":
        p = normaliser or F.shape[1]
        return s_max * np.outer(v_max, v_max) - S / p, 0.5 * s_max**2 - fro2 / (2 * p)
    # the rank: the eigenvalues κ counts (nonzero singular values; above the ridge floor)
    k = normaliser or (int(np.sum(mu > RIDGE_FLOOR)) if ridge_kappa else lo + 1)
    den = fro2 / (2 * k) - 0.5 * s_min**2
    if not 0 < den < 1e150:
        raise FloatingPointError(f"R_ill's denominator is {den:.3g} (pole, or θ blew up)")
    return (s_min * np.outer(v_min, v_min) - S / k) / den**2, 1.0 / den


def batches(n_pairs: int, protocol: Protocol, rng: np.random.Generator) -> list[list[Any]]:
    """One epoch's steps, each one row-index array (``None``: all rows) per device."""
    if not protocol.on("minibatch"):
        return [[None]]
    size, devices = int(protocol.config["batch"]), int(protocol.config["devices"])
    perm = rng.permutation(n_pairs)
    shards = [perm[r::devices] for r in range(devices)]
    n_steps = min(len(s) // size for s in shards)
    return [[s[j * size : (j + 1) * size] for s in shards] for j in range(n_steps)]


@dataclass
class TaskArrays:
    """One task: inputs, labels, both scaled for condreg's loss, K⁺, the released ridge."""

    X: np.ndarray
    y: np.ndarray | None
    Xs: np.ndarray
    ys: np.ndarray | None
    pinv: np.ndarray
    ridge: float


def prepare_task(X: np.ndarray, y: np.ndarray | None, task: str, ridge: float) -> TaskArrays:
    """K⁺ (rtol ``max(N, D)·eps``), X·√N/σ₁(X), regression y / RMS (as ``condreg.immunize``)."""
    _, s, Vh = np.linalg.svd(X, full_matrices=False)
    keep = s > max(X.shape) * _EPS * s[0]
    pinv = (Vh[keep].T / s[keep] ** 2) @ Vh[keep]
    scale = math.sqrt(X.shape[0]) / s[0]
    ys = y
    if y is not None and task == "regression":
        ys = y / (math.sqrt(float(np.mean(y * y))) or 1.0)
    return TaskArrays(X, y, X * scale, ys, pinv, ridge)


def _loss_derivative(z: np.ndarray, y: np.ndarray, task: str) -> np.ndarray:
    if task == "regression":
        return 2.0 * (z - y)
    return 0.5 * (1.0 + np.tanh(0.5 * z)) - y


def _supervised(t: TaskArrays, rows, theta, bias, omega, protocol: Protocol):
    """The D_P loss's gradients in θ, bias and ω on ``rows`` (raw loss under Adam)."""
    X, y = (t.X, t.y) if protocol.on("adam") else (t.Xs, t.ys)
    if rows is not None:
        X, y = X[rows], y[rows]
    phi = X @ theta + (0.0 if bias is None else bias)
    d1 = _loss_derivative(phi @ omega, y, protocol.task) / X.shape[0]
    g_theta = np.outer(X.T @ d1, omega)
    g_bias = None if bias is None else float(np.sum(d1)) * omega
    return g_theta, g_bias, phi.T @ d1


def precondition(g: np.ndarray, t: TaskArrays, B: np.ndarray, protocol: Protocol) -> np.ndarray:
    """K⁻¹ on the left (condreg) or the right; K⁺ of the task or the batch's (BᵀB + ridge·I)⁻¹."""
    right = protocol.on("right_precond")
    if protocol.on("minibatch"):
        K = B.T @ B + t.ridge * np.eye(B.shape[1])
        return np.linalg.solve(K, g.T).T if right else np.linalg.solve(K, g)
    return g @ t.pinv if right else t.pinv @ g


def _reg_direction(method, which, t: TaskArrays, rows, theta, bias, protocol: Protocol):
    """One regularizer term's unweighted (θ, bias) direction; None when the method has none."""
    quantity = _TERMS.get(method, {}).get(which)
    if quantity is None:
        return None
    B = t.X if rows is None else t.X[rows]
    F = B @ theta + (0.0 if bias is None else bias)
    raw = protocol.on("raw_normaliser")
    normaliser = int(protocol.config.get("normaliser", theta.shape[0])) if raw else None
    base = "log_kappa" if quantity == "inv_log_kappa" else quantity
    ridge = protocol.on("ridge_kappa")
    G, value = regularizer_gradient(F, base, ridge_kappa=ridge, normaliser=normaliser)
    if quantity == "inv_log_kappa":
        G = G * (-1.0 / value**2 if value > 0 else 0.0)
    dF = 2.0 * F @ G
    g_theta = B.T @ dF
    if method != "opt_kappa":
        g_theta = precondition(g_theta, t, B, protocol)
    return g_theta, (None if bias is None else dF.sum(axis=0))


def _gradients(method, P: TaskArrays, H: TaskArrays, rows, params, protocol, alpha):
    """One step's gradients on one device: ``{"sup": (θ, bias, ω), "p": …, "h": …}``."""
    from condreg.algorithm import imma_gradient

    theta, bias = params["theta"], params["bias"]
    out = {"sup": _supervised(P, rows, theta, bias, params["omega"], protocol)}
    out["p"] = _reg_direction(method, "p", P, rows, theta, bias, protocol)
    if method == "imma":
        X, y = (H.Xs, H.ys) if rows is None else (H.Xs[rows], H.ys[rows])
        grad = imma_gradient(theta, X, y, protocol.task, protocol.imma_steps, alpha, np)[1]
        out["h"] = (-grad, None)
    else:
        out["h"] = _reg_direction(method, "h", H, rows, theta, bias, protocol)
    return out


def _mean(parts: list[Any]) -> Any:
    """The average over devices of matching (nested tuples of) arrays; None stays None."""
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, (tuple, list)):
        return tuple(_mean([p[i] for p in parts]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _mean([p[k] for p in parts]) for k in first}
    return sum(parts) / len(parts)


def _rel_size(U: np.ndarray, theta: np.ndarray, preconditioned: bool) -> float:
    """A step's relative size: ``‖θ⁺U‖₂`` (preconditioned) or ``‖U‖_F·√D/‖θ‖_F``."""
    if preconditioned:
        E = np.linalg.lstsq(theta, U, rcond=None)[0]
        return float(np.linalg.norm(E, 2))
    return float(np.linalg.norm(U) * math.sqrt(theta.shape[1]) / np.linalg.norm(theta))


def _weights(method: str, grads, theta, protocol: Protocol, lr: float) -> dict[str, float]:
    """λ_P, λ_H: the released fixed ones (``fixed_lambda``, not IMMA), else condreg's rule."""
    if protocol.on("fixed_lambda") and method != "imma":
        config = RELEASED_CONFIG["opt_kappa" if method == "opt_kappa" else protocol.dataset]
        return {k: float(config[f"lam_{k}"]) for k in ("p", "h") if grads[k] is not None}
    pre = method in ("condreg", "r_ill_only")
    sizes = {k: _rel_size(lr * grads[k][0], theta, pre) for k in ("p", "h") if grads[k] is not None}
    step = protocol.max_step
    return {k: step / v if v > 0 and math.isfinite(v) else 1.0 for k, v in sizes.items()}


def _clip(method: str, U: np.ndarray, theta: np.ndarray, protocol: Protocol) -> float:
    """condreg's step clip ``min(1, max_step/size)``; 1 under Adam and the fixed λ's."""
    if protocol.on("adam") or (protocol.on("fixed_lambda") and method != "imma"):
        return 1.0
    size = _rel_size(U, theta, method in ("condreg", "r_ill_only"))
    return min(1.0, protocol.max_step / size) if size > 0 else 1.0


class Adam:
    """Adam as torch.optim.Adam with its defaults (β = 0.9, 0.999; ε = 1e-8; no decay)."""

    def __init__(self, lr: float) -> None:
        self.lr, self.t, self.m, self.v = lr, 0, {}, {}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict:
        self.t += 1
        out = {}
        for k, p in params.items():
            g = grads[k]
            self.m[k] = 0.9 * self.m.get(k, 0.0) + 0.1 * g
            self.v[k] = 0.999 * self.v.get(k, 0.0) + 0.001 * g * g
            v_hat = self.v[k] / (1 - 0.999**self.t)
            out[k] = p - self.lr * (self.m[k] / (1 - 0.9**self.t)) / (np.sqrt(v_hat) + 1e-8)
        return out


def _update(method, g, lam, params, protocol: Protocol, lr: float, adam: Adam | None):
    """The new ``{"theta", "bias", "omega"}`` after one step with the averaged gradients."""
    g_theta, g_bias, g_omega = g["sup"]
    if adam is not None:
        grads = {"theta": g_theta, "omega": g_omega}
        if params.get("bias") is not None:
            grads["bias"] = g_bias
        for k, w in lam.items():
            grads["theta"] = grads["theta"] + w * g[k][0]
            if "bias" in grads and g[k][1] is not None:
                grads["bias"] = grads["bias"] + w * g[k][1]
        new = adam.step({k: params[k] for k in grads}, grads)
        return new if "bias" in grads else new | {"bias": None}
    theta = params["theta"] - lr * g_theta
    bias = None if params["bias"] is None else params["bias"] - lr * g_bias
    for k, w in lam.items():
        U = lr * w * g[k][0]
        c = _clip(method, U, params["theta"], protocol)
        theta = theta - c * U
        if bias is not None and g[k][1] is not None:
            bias = bias - c * lr * w * g[k][1]
    return {"theta": theta, "bias": bias, "omega": params["omega"] - lr * g_omega}


def initial_parameters(D: int, protocol: Protocol, rng: np.random.Generator) -> dict[str, Any]:
    """θ = I, no bias, ω = 0; or (``linear_init``) nn.Linear's U(±1/√D) θ and bias, ω ~ N(0, 1)."""
    if not protocol.on("linear_init"):
        return {"theta": np.eye(D), "bias": None, "omega": np.zeros(D)}
    bound = 1.0 / math.sqrt(D)
    W = rng.uniform(-bound, bound, (D, D))  # nn.Linear's weight (out × in); θ = Wᵀ
    bias = rng.uniform(-bound, bound, D)
    return {"theta": W.T.copy(), "bias": bias, "omega": rng.standard_normal(D)}


def emulate(
    method: str,
    X_p: np.ndarray,
    y_p: np.ndarray,
    X_h: np.ndarray,
    y_h: np.ndarray | None,
    protocol: Protocol,
    *,
    seed: int = 0,
) -> Trained:
    """Train ``method`` (``y_h``: IMMA's attacker); a bad step ends it at the last finite θ."""
    epochs, lr = protocol.epochs, protocol.lr
    if protocol.on("config_schedule"):
        epochs, lr = int(protocol.config["epochs"]), float(protocol.config["lr"])
    P = prepare_task(X_p, y_p, protocol.task, float(protocol.config["ridge_p"]))
    H = prepare_task(X_h, y_h, protocol.task, float(protocol.config["ridge_h"]))
    rng = np.random.default_rng(seed)
    params = initial_parameters(X_p.shape[1], protocol, rng)
    top = np.linalg.norm(H.Xs @ params["theta"], 2) ** 2 / H.Xs.shape[0]
    alpha = 1.0 / ((2.0 if protocol.task == "regression" else 0.25) * top)
    adam = Adam(lr) if protocol.on("adam") else None
    n_pairs = min(X_p.shape[0], X_h.shape[0])
    lam: dict[str, float] | None = None
    stopped, epoch = "completed", 0
    for epoch in range(1, epochs + 1):
        for step in batches(n_pairs, protocol, rng):
            try:
                g = _mean([_gradients(method, P, H, r, params, protocol, alpha) for r in step])
                lam = _weights(method, g, params["theta"], protocol, lr) if lam is None else lam
                new = _update(method, g, lam, params, protocol, lr, adam)
            except (FloatingPointError, OverflowError, np.linalg.LinAlgError) as exc:
                stopped = f"stopped at epoch {epoch}: {exc}"
                break
            if not all(v is None or np.all(np.isfinite(v)) for v in new.values()):
                stopped = f"diverged at epoch {epoch}"
                break
            params = new
        if stopped != "completed":
            break
    return Trained(params["theta"], params["bias"], stopped, lam or {}, epoch)


def head_only_loss(X: np.ndarray, y: np.ndarray, task: str, epochs: int, lr: float) -> float:
    """The D_P loss of the head alone trained as ``condreg.immunize`` trains it (θ = I)."""
    t = prepare_task(X, y, task, 0.0)
    w = np.zeros(X.shape[1])
    for _ in range(epochs):
        w = w - lr * (t.Xs.T @ _loss_derivative(t.Xs @ w, t.ys, task) / len(t.ys))
    z = t.Xs @ w
    if task == "regression":
        return float(np.mean((z - t.ys) ** 2))
    return float(np.mean(np.logaddexp(0.0, z) - t.ys * z))
