"""Algorithm 1 with the released code's choices on, each behind a switch (:class:`Protocol`): the
ablation's NumPy training loop. With nothing on it is condreg's Algorithm 1 (a test checks it
against :func:`condreg.immunize`); the released ``minibatch`` switch is also split into its parts
(batch size, step count, per-batch preconditioner, paired rows), each a field of its own."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from condreg_experiments.ablation.released import (
    RELEASED_CONFIG,
    RIDGE_FLOOR,
    ridge_floor_spectrum,
)

_EPS = np.finfo(np.float64).eps

#: The quantity each method puts on D_P ("p") and D_H ("h"); IMMA's "h" is its attacker.
_TERMS = {
    "condreg": {"p": "r_well", "h": "r_ill"},
    "r_ill_only": {"h": "r_ill"},
    "opt_kappa": {"p": "log_kappa", "h": "inv_log_kappa"},
}


@dataclass(frozen=True)
class Protocol:
    """One training protocol: a dataset's released switches on, condreg's epochs, lr and step
    clip, and the parts of the ``minibatch`` switch on their own: ``batch`` rows per step
    (None: all), ``steps`` in all (None: ``epochs`` epochs), ``batch_precond`` (the batch's
    ``(BᵀB + ridge·I)⁻¹`` instead of the task's K⁺), ``paired_rows`` (D_H's rows are D_P's row
    indices, so only its first min(N_P, N_H) rows are used); ``exact_steps``: every regularizer
    step exactly ``max_step`` long (condreg: at most); ``precondition_opt_kappa``: K⁺ on Opt κ's
    gradient too. ValueError for a combination that means nothing."""

    dataset: str
    switches: frozenset[str]
    epochs: int
    lr: float
    task: str
    max_step: float = 0.3
    imma_steps: int = 5
    batch: int | None = None
    steps: int | None = None
    batch_precond: bool = False
    paired_rows: bool = False
    exact_steps: bool = False
    precondition_opt_kappa: bool = False

    def __post_init__(self) -> None:
        minibatch = "minibatch" in self.switches
        if self.batch_precond and self.batch is None and not minibatch:
            raise ValueError("batch_precond needs a batch size (or the minibatch switch)")
        if minibatch and (self.batch is not None or self.paired_rows or self.batch_precond):
            raise ValueError("the minibatch switch already sets the batch, its K and the pairing")
        if self.exact_steps and ("fixed_lambda" in self.switches or "adam" in self.switches):
            raise ValueError("exact_steps sizes condreg's clipped steps: not with fixed λ or Adam")
        if self.batch is not None and self.batch < 1 or self.steps is not None and self.steps < 1:
            raise ValueError(f"batch and steps must be >= 1, got {self.batch}, {self.steps}")

    def on(self, name: str) -> bool:
        """Whether the released choice ``name`` is switched on."""
        return name in self.switches

    @property
    def config(self) -> dict[str, float]:
        """The released config of this dataset."""
        return RELEASED_CONFIG[self.dataset]

    def batching(self) -> tuple[int | None, int, bool, bool]:
        """``(rows per device and step or None, devices, paired rows, per-batch K)``: the
        ``minibatch`` switch sets all four as the released code had them, the fields one each."""
        if self.on("minibatch"):
            return int(self.config["batch"]), int(self.config["devices"]), True, True
        return self.batch, 1, self.paired_rows, self.batch_precond

    def preconditioned(self, method: str) -> bool:
        """Whether ``method``'s regularizer gradient is preconditioned by K⁻¹."""
        return method in ("condreg", "r_ill_only") or (
            method == "opt_kappa" and self.precondition_opt_kappa
        )


@dataclass
class Trained:
    """An emulated run: θ, the bias (None without ``linear_init``), why it stopped, λ's, epochs
    and steps run, the final D_P loss and each term's path length Σ_t (relative step size)
    (NaN where no step is clipped: fixed λ or Adam)."""

    theta: np.ndarray
    bias: np.ndarray | None
    stopped: str = "completed"
    lam: dict[str, float] = field(default_factory=dict)
    epochs_run: int = 0
    steps_run: int = 0
    loss_final: float = math.nan
    path_length: dict[str, float] = field(default_factory=dict)


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


class Sampler:
    """The row indices of every step: per device ``(rows of D_P, rows of D_H)``, None = all.

    Paired rows (the released loader): one permutation of ``min(N_P, N_H)`` row pairs per
    epoch, split over the devices, the last incomplete batch dropped. Unpaired: a permutation of
    D_P per epoch and D_H's rows drawn from a stream of its own permutations (every row used)."""

    def __init__(self, n_p: int, n_h: int, protocol: Protocol, rng: np.random.Generator) -> None:
        self.batch, self.devices, self.paired, _ = protocol.batching()
        self.n_p, self.n_h, self.rng = n_p, n_h, rng
        self._stream = np.empty(0, dtype=np.int64)

    def epoch(self) -> list[list[tuple[Any, Any]]]:
        """One epoch's steps."""
        size, d = self.batch, self.devices
        if size is None:
            if not self.paired or self.n_p == self.n_h:
                return [[(None, None)]]
            rows = np.arange(min(self.n_p, self.n_h))  # the longer task cut to the shorter
            return [
                [(rows if self.n_p > self.n_h else None, rows if self.n_h > self.n_p else None)]
            ]
        n = min(self.n_p, self.n_h) if self.paired else self.n_p
        perm = self.rng.permutation(n)
        shards = [perm[r::d] for r in range(d)]
        n_steps = min(len(s) // size for s in shards)
        if n_steps < 1:
            raise ValueError(f"batches of {size} rows: only {n} rows per epoch")
        steps = []
        for j in range(n_steps):
            rows = [s[j * size : (j + 1) * size] for s in shards]
            steps.append([(b, b if self.paired else self._take(size)) for b in rows])
        return steps

    def _take(self, k: int) -> np.ndarray:
        while self._stream.size < k:
            self._stream = np.concatenate([self._stream, self.rng.permutation(self.n_h)])
        out, self._stream = self._stream[:k], self._stream[k:]
        return out


def minibatch_steps(n_p: int, n_h: int, protocol: Protocol) -> int:
    """The steps per epoch of the released ``minibatch`` switch on these tasks."""
    rows = min(n_p, n_h)
    size, devices = int(protocol.config["batch"]), int(protocol.config["devices"])
    return min(len(range(r, rows, devices)) for r in range(devices)) // size


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


def task_loss(z: np.ndarray, y: np.ndarray, task: str) -> float:
    """The D_P loss as condreg reports it: relative squared error, or mean logistic loss."""
    if task == "regression":
        return float(np.mean((z - y) ** 2) / (np.mean(y * y) or 1.0))
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def _loss_arrays(t: TaskArrays, protocol: Protocol) -> tuple[np.ndarray, np.ndarray]:
    """The supervised loss's inputs and labels: raw under Adam, condreg's scaled ones otherwise."""
    return (t.X, t.y) if protocol.on("adam") else (t.Xs, t.ys)


def _supervised(t: TaskArrays, rows, theta, bias, omega, protocol: Protocol):
    """The D_P loss's gradients in θ, bias and ω on ``rows``."""
    X, y = _loss_arrays(t, protocol)
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
    if protocol.batching()[3]:
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
    if protocol.preconditioned(method):
        g_theta = precondition(g_theta, t, B, protocol)
    return g_theta, (None if bias is None else dF.sum(axis=0))


def _gradients(method, P: TaskArrays, H: TaskArrays, rows, params, protocol, alpha):
    """One step's gradients on one device: ``{"sup": (θ, bias, ω), "p": …, "h": …}``."""
    from condreg.algorithm import imma_gradient

    (rows_p, rows_h), theta, bias = rows, params["theta"], params["bias"]
    out = {"sup": _supervised(P, rows_p, theta, bias, params["omega"], protocol)}
    out["p"] = _reg_direction(method, "p", P, rows_p, theta, bias, protocol)
    if method == "imma":
        X, y = (H.Xs, H.ys) if rows_h is None else (H.Xs[rows_h], H.ys[rows_h])
        grad = imma_gradient(theta, X, y, protocol.task, protocol.imma_steps, alpha, np)[1]
        out["h"] = (-grad, None)
    else:
        out["h"] = _reg_direction(method, "h", H, rows_h, theta, bias, protocol)
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
    pre = protocol.preconditioned(method)
    sizes = {k: _rel_size(lr * grads[k][0], theta, pre) for k in ("p", "h") if grads[k] is not None}
    step = protocol.max_step
    return {k: step / v if v > 0 and math.isfinite(v) else 1.0 for k, v in sizes.items()}


def _clip(method: str, U: np.ndarray, theta: np.ndarray, protocol: Protocol) -> tuple[float, float]:
    """``(factor, its step's relative size)``: condreg's clip ``min(1, max_step/size)``, or
    ``max_step/size`` with ``exact_steps``; ``(1, NaN)`` under Adam and the fixed λ's."""
    if protocol.on("adam") or (protocol.on("fixed_lambda") and method != "imma"):
        return 1.0, math.nan
    size = _rel_size(U, theta, protocol.preconditioned(method))
    if size <= 0:
        return 1.0, 0.0
    c = protocol.max_step / size if protocol.exact_steps else min(1.0, protocol.max_step / size)
    return c, c * size


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
    """``(new {"theta", "bias", "omega"}, each term's step length)`` after one step."""
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
        return (new if "bias" in grads else new | {"bias": None}), {}
    theta = params["theta"] - lr * g_theta
    bias = None if params["bias"] is None else params["bias"] - lr * g_bias
    lengths = {}
    for k, w in lam.items():
        U = lr * w * g[k][0]
        c, lengths[k] = _clip(method, U, params["theta"], protocol)
        theta = theta - c * U
        if bias is not None and g[k][1] is not None:
            bias = bias - c * lr * w * g[k][1]
    return {"theta": theta, "bias": bias, "omega": params["omega"] - lr * g_omega}, lengths


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
    sampler = Sampler(X_p.shape[0], X_h.shape[0], protocol, rng)
    run = Trained(params["theta"], params["bias"])
    lam: dict[str, float] | None = None
    while run.stopped == "completed" and _more(run, epochs, protocol.steps):
        run.epochs_run += 1
        for rows in sampler.epoch():
            if protocol.steps is not None and run.steps_run >= protocol.steps:
                break
            try:
                g = _mean([_gradients(method, P, H, r, params, protocol, alpha) for r in rows])
                lam = _weights(method, g, params["theta"], protocol, lr) if lam is None else lam
                new, lengths = _update(method, g, lam, params, protocol, lr, adam)
            except (FloatingPointError, OverflowError, np.linalg.LinAlgError) as exc:
                run.stopped = f"stopped at epoch {run.epochs_run}: {exc}"
                break
            if not all(v is None or np.all(np.isfinite(v)) for v in new.values()):
                run.stopped = f"diverged at epoch {run.epochs_run}"
                break
            params, run.steps_run = new, run.steps_run + 1
            for k, v in lengths.items():
                run.path_length[k] = run.path_length.get(k, 0.0) + v
    run.theta, run.bias, run.lam = params["theta"], params["bias"], lam or {}
    X, y = _loss_arrays(P, protocol)
    bias = 0.0 if params["bias"] is None else params["bias"]
    z = (X @ params["theta"] + bias) @ params["omega"]
    run.loss_final = task_loss(z, y, protocol.task)
    return run


def _more(run: Trained, epochs: int, steps: int | None) -> bool:
    """Whether another epoch runs: ``epochs`` of them, or until ``steps`` steps are done."""
    return run.epochs_run < epochs if steps is None else run.steps_run < steps


def head_only_loss(
    X: np.ndarray, y: np.ndarray, task: str, epochs: int, lr: float, *, adam: bool = False
) -> float:
    """The D_P loss of the head alone on θ = I, trained for ``epochs`` full-batch steps of
    ``lr`` as the emulator trains it (gradient descent on condreg's scaled loss, or Adam on the
    raw one): the reference of the D_P-only rule."""
    t = prepare_task(X, y, task, 0.0)
    Xw, yw = (t.X, t.y) if adam else (t.Xs, t.ys)
    w, optimizer = np.zeros(X.shape[1]), Adam(lr) if adam else None
    for _ in range(epochs):
        g = Xw.T @ _loss_derivative(Xw @ w, yw, task) / len(yw)
        w = optimizer.step({"w": w}, {"w": g})["w"] if optimizer else w - lr * g
    return task_loss(Xw @ w, yw, task)
