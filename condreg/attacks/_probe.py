"""Linear probing of immunized features by named attackers (:data:`ATTACKERS`), so the κ a
defense buys reads as *steps* for each (docs/attacks.md). Eager, on any Array API library."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from array_api_compat import array_namespace
from array_api_compat import device as _device

from condreg import _core, _spectrum, _validation
from condreg.metrics import check_matrix, exact_descent, safe_div

Array = Any

__all__ = ["ATTACKERS", "ProbeResult", "probe", "steps_to_reduction"]


@dataclass(frozen=True)
class ProbeResult:
    """What :func:`probe` returns (arrays in the input's namespace and device).

    ``loss`` and ``norm_ratio`` (Eq. 16's ``‖w_t − w*‖² / ‖w_0 − w*‖²``, NaN when ``w_0 = w*``)
    have ``steps + 1`` entries; ``loss_min`` is ``L(w*)``, ``w`` the final head, ``w_star`` is
    ``A⁺y``, ``kappa`` is ``κ(AᵀA)``; ``params``: the settings the attacker ran with.
    """

    attacker: str
    loss: Array
    norm_ratio: Array
    loss_min: Array
    w: Array
    w_star: Array
    kappa: float
    rank: int
    rtol: float
    params: Mapping[str, Any] = field(default_factory=dict)

    def reduction(self) -> Array:
        """``(L(w_0) − L(w_t)) / (L(w_0) − L(w*))`` per step (1 when nothing can be reduced)."""
        return _reduction(self.loss, self.loss_min)

    def steps_to(self, fraction: float = 0.99) -> int | None:
        """:func:`steps_to_reduction` of this run.

        Parameters
        ----------
        fraction : float
            The share of ``L(w_0) − L(w*)`` to reach, ``0 < fraction ≤ 1``.

        Raises
        ------
        ValueError
            Unless ``0 < fraction ≤ 1``.
        """
        return steps_to_reduction(self.loss, self.loss_min, fraction)


class _Problem(NamedTuple):
    xp: Any
    A: Array
    y: Array
    w0: Array
    L: float  # largest eigenvalue of ∇²L = 2AᵀA
    mu: float  # smallest nonzero eigenvalue of ∇²L (0 for A = 0)
    eps: float
    w_star: Array

    def grad(self, w: Array) -> Array:
        return 2.0 * (self.A.T @ (self.A @ w - self.y))


def _gd_exact(p: _Problem, steps: int, params: dict[str, Any]) -> Iterator[Array]:
    return exact_descent(p.xp, p.A, p.y, p.w0, steps)


def _gd(p: _Problem, steps: int, params: dict[str, Any]) -> Iterator[Array]:
    if params["lr"] is None:
        params["lr"] = 1.0 / p.L if p.L > 0 else 0.0
    lr, w = params["lr"], p.w0
    for _ in range(steps):
        w = w - lr * p.grad(w)
        yield w


def _momentum(p: _Problem, steps: int, params: dict[str, Any]) -> Iterator[Array]:
    L, mu = p.L, p.mu
    if params["lr"] is None:
        params["lr"] = 4.0 / (math.sqrt(L) + math.sqrt(mu)) ** 2 if L > 0 else 0.0
    if params["beta"] is None:
        rk = math.sqrt(L / mu) if mu > 0 else 1.0
        params["beta"] = ((rk - 1.0) / (rk + 1.0)) ** 2
    lr, beta = params["lr"], params["beta"]
    w, prev = p.w0, p.w0
    for _ in range(steps):
        w, prev = w - lr * p.grad(w) + beta * (w - prev), w
        yield w


def _nesterov(p: _Problem, steps: int, params: dict[str, Any]) -> Iterator[Array]:
    if params["lr"] is None:
        params["lr"] = 1.0 / p.L if p.L > 0 else 0.0
    lr = params["lr"]
    w, prev = p.w0, p.w0
    for t in range(1, steps + 1):
        v = w + ((t - 1.0) / (t + 2.0)) * (w - prev)
        w, prev = v - lr * p.grad(v), w
        yield w


def _adam(p: _Problem, steps: int, params: dict[str, Any]) -> Iterator[Array]:
    xp, w, lr, eps = p.xp, p.w0, params["lr"], params["eps"]
    b1, b2 = params["betas"]
    m, v = xp.zeros_like(w), xp.zeros_like(w)
    for t in range(1, steps + 1):
        g = p.grad(w)
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * (g * g)
        w = w - lr * (m / (1.0 - b1**t)) / (xp.sqrt(v / (1.0 - b2**t)) + eps)
        yield w


def _lbfgs(p: _Problem, steps: int, params: dict[str, Any]) -> Iterator[Array]:
    xp, A, history = p.xp, p.A, params["history"]
    w = p.w0
    g = p.grad(w)
    pairs: list[tuple[Array, Array, Array]] = []  # (s, y, rho); rho = 0 disables a pair
    for _ in range(steps):
        q = g
        alphas = []
        for s, yv, rho in reversed(pairs):
            a = rho * xp.sum(s * q)
            q = q - a * yv
            alphas.append(a)
        if pairs:
            s, yv, _ = pairs[-1]
            q = q * safe_div(xp, xp.sum(s * yv), xp.sum(yv * yv))
        for (s, yv, rho), a in zip(pairs, reversed(alphas), strict=True):
            b = rho * xp.sum(yv * q)
            q = q + (a - b) * s
        d = -q
        Ad = A @ d
        r = A @ w - p.y
        # exact minimiser of L(w + αd) = ‖(Aw − y) + αAd‖²
        alpha = safe_div(xp, -xp.sum(r * Ad), xp.sum(Ad * Ad))
        step = alpha * d
        w_new = w + step
        r_new = A @ w_new - p.y
        if float(xp.sum(r_new * r_new)) > float(xp.sum(r * r)):
            # at the rounding floor: drop the step and the history, so the loss never rises
            pairs.clear()
            yield w
            continue
        w = w_new
        g_new = p.grad(w)
        yv = g_new - g
        sy = xp.sum(step * yv)
        # curvature pairs with sᵀy ≤ eps·‖s‖‖y‖ carry no information (rho = 0 disables them)
        tiny = p.eps * xp.sqrt(xp.sum(step * step) * xp.sum(yv * yv))
        rho = xp.where(sy > tiny, safe_div(xp, xp.ones_like(sy), sy), xp.zeros_like(sy))
        pairs.append((step, yv, xp.where(xp.isfinite(rho), rho, xp.zeros_like(rho))))
        if len(pairs) > history:
            pairs.pop(0)
        g = g_new
        yield w


def _lstsq(p: _Problem, steps: int, params: dict[str, Any]) -> Iterator[Array]:
    for _ in range(steps):
        yield p.w_star


#: Each attacker's iterates and its options' defaults (``None``: derived from ``A``'s spectrum).
_REGISTRY: dict[str, tuple[Callable[..., Iterator[Array]], dict[str, Any]]] = {
    "gd_exact": (_gd_exact, {}),
    "gd": (_gd, {"lr": None}),
    "momentum": (_momentum, {"lr": None, "beta": None}),
    "nesterov": (_nesterov, {"lr": None}),
    "adam": (_adam, {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}),
    "lbfgs": (_lbfgs, {"history": 10}),
    "lstsq": (_lstsq, {}),
}

#: Names accepted by ``probe(..., attacker=)``, in the order docs and tables use.
ATTACKERS: tuple[str, ...] = tuple(_REGISTRY)


def _reduction(loss: Array, loss_min: Array) -> Array:
    xp = array_namespace(loss)
    total = loss[0] - loss_min
    done = loss[0] - loss
    ok = total > 0
    return xp.where(ok, done / xp.where(ok, total, xp.ones_like(total)), xp.ones_like(done))


def steps_to_reduction(loss: Array, loss_min: Array | float, fraction: float = 0.99) -> int | None:
    """The first step ``t`` with ``L(w_0) − L(w_t) ≥ fraction·(L(w_0) − L(w*))`` (``0`` when
    nothing can be reduced), ``None`` if never reached.

    Parameters
    ----------
    loss, loss_min : Array, and Array or float
        The loss curve ``L(w_t)``, ``t = 0..steps``, and ``L(w*)`` (as in :class:`ProbeResult`).
    fraction : float
        The share of the achievable reduction to reach, ``0 < fraction ≤ 1``.

    Raises
    ------
    ValueError
        Unless ``0 < fraction ≤ 1``.

    Examples
    --------
    >>> import numpy as np, condreg.attacks
    >>> condreg.attacks.steps_to_reduction(np.asarray([4.0, 2.0, 1.1, 1.0]), 1.0, 0.9)
    2
    """
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ValueError(f"steps_to_reduction: fraction must be in (0, 1], got {fraction!r}")
    xp = array_namespace(loss)
    loss_min = xp.asarray(loss_min, dtype=loss.dtype, device=_device(loss))
    hit = _reduction(loss, loss_min) >= fraction
    if not bool(xp.any(hit)):
        return None
    return int(xp.argmax(xp.astype(hit, xp.int32)))


def _float_dtype(xp: Any, a: Array, name: str) -> Array:
    if xp.isdtype(a.dtype, "real floating"):
        return a
    if xp.isdtype(a.dtype, "integral"):
        return xp.astype(a, xp.float64 if hasattr(xp, "float64") else xp.float32)
    raise TypeError(f"probe: {name} must have a real floating (or integer) dtype, got {a.dtype}")


def _inputs(theta: Array | None, X: Array, y: Array, w0: Array | None) -> tuple:
    """``(xp, A = Xθ, y, w0)`` checked: shapes, dtypes (integers promoted), finite values."""
    named = {"theta": theta, "X": X, "y": y, "w0": w0}
    xp = _validation.named_namespace("probe", {k: a for k, a in named.items() if a is not None})
    check_matrix(X, "X", "probe")
    X = _float_dtype(xp, X, "X")
    N, D = X.shape
    A = X
    if theta is not None:
        check_matrix(theta, "theta", "probe")
        if theta.shape[0] != D:
            raise ValueError(
                f"probe: theta must have D = {D} rows (X is {N}×{D}), got shape "
                f"{tuple(theta.shape)}"
            )
        A = X @ _float_dtype(xp, theta, "theta")
    K = A.shape[1]
    if tuple(y.shape) == (N, 1):
        y = xp.reshape(y, (N,))
    if tuple(y.shape) != (N,):
        raise ValueError(f"probe: y must have shape ({N},) or ({N}, 1), got {tuple(y.shape)}")
    y = xp.astype(_float_dtype(xp, y, "y"), A.dtype)
    if w0 is None:
        w0 = xp.zeros((K,), dtype=A.dtype, device=_device(A))
    else:
        if tuple(w0.shape) != (K,):
            raise ValueError(f"probe: w0 must have shape ({K},), got {tuple(w0.shape)}")
        w0 = xp.astype(_float_dtype(xp, w0, "w0"), A.dtype)
    for a, name in ((A, "X @ theta"), (y, "y"), (w0, "w0")):
        if not bool(xp.all(xp.isfinite(a))):
            raise ValueError(f"probe: {name} contains NaN or Inf")
    return xp, A, y, w0


def _least_squares(xp: Any, A: Array, y: Array, rtol: float) -> tuple[Array, int, Array]:
    """Singular values of ``A`` (descending), the rank (``σ_i > rtol·σ₁``) and ``w* = A⁺y``."""
    U, s, Vt = xp.linalg.svd(A, full_matrices=False)
    s1 = float(s[0])
    keep = s > rtol * s1 if s1 > 0 else s > 0
    rank = int(xp.sum(xp.astype(keep, xp.int32)))
    inv = xp.where(keep, 1.0 / xp.where(keep, s, xp.ones_like(s)), xp.zeros_like(s))
    return s, rank, Vt.T @ (inv * (U.T @ y))


def probe(
    theta: Array | None,
    X: Array,
    y: Array,
    *,
    attacker: str = "gd_exact",
    steps: int = 100,
    w0: Array | None = None,
    rtol: float | None = None,
    **options: Any,
) -> ProbeResult:
    """Minimise ``L(w) = ‖Aw − y‖²``, ``A = Xθ``, by ``attacker`` for ``steps`` iterations.

    Parameters
    ----------
    theta : array of shape (D, K) or None
        The immunized map; ``None`` for θ = I (``A = X``).
    X, y : array of shape (N, D) and (N,) or (N, 1)
        Inputs and probing targets, of ``theta``'s namespace (integers are promoted).
    attacker : str
        One of :data:`ATTACKERS`.
    steps : int
        Number of iterations, ``≥ 1``.
    w0 : array of shape (K,), optional
        The start (default zeros).
    rtol : float, optional
        Rank tolerance on the singular values of ``A`` (default ``max(N, K)·eps``).
    **options
        ``lr``, ``beta`` (momentum), ``betas``, ``eps`` (adam), ``history`` (lbfgs).

    Raises
    ------
    ValueError
        Unknown attacker, bad ``steps`` or option value, mismatched, empty or non-finite input.
    TypeError
        Non-arrays or mixed libraries, non-real dtypes, an option the attacker does not take.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.attacks import probe
    >>> probe(None, np.diag([1.0, 0.1]), np.ones(2), attacker="gd", steps=500).steps_to(0.99)
    195
    """
    if attacker not in _REGISTRY:
        raise ValueError(
            f"probe: unknown attacker {attacker!r}; choose one of {', '.join(ATTACKERS)}"
        )
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise ValueError(f"probe: steps must be an integer >= 1, got {steps!r}")
    steps = int(steps)
    run, defaults = _REGISTRY[attacker]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(defaults) or "none"
        raise TypeError(
            f"probe: attacker {attacker!r} takes no option(s) {', '.join(unknown)} "
            f"(its options: {allowed})"
        )
    params = {**defaults, **options}
    _check_params(attacker, params)

    xp, A, y, w0 = _inputs(theta, X, y, w0)
    eps = float(xp.finfo(A.dtype).eps)
    _core.check_rtol(rtol, where="probe: ")
    rtol = _spectrum.resolve_rtol(rtol, A.shape, A.dtype, xp)
    s, rank, w_star = _least_squares(xp, A, y, rtol)
    s1, s_min = float(s[0]), (float(s[rank - 1]) if rank else 0.0)
    kappa = (s1 / s_min) ** 2 if rank else math.nan

    def sq(v: Array) -> Array:
        return xp.sum(v * v)

    # ‖w_0 − w*‖ at the rounding level of w* itself: no distance to measure a ratio against
    e0 = sq(w0 - w_star)
    scale = xp.maximum(sq(w_star), sq(w0))
    nan = xp.asarray(math.nan, dtype=A.dtype, device=_device(A))
    e0_safe = xp.where(e0 > (100.0 * eps) ** 2 * scale, e0, nan)
    losses, ratios, w = [sq(A @ w0 - y)], [e0 / e0_safe], w0
    problem = _Problem(xp, A, y, w0, 2.0 * s1**2, 2.0 * s_min**2, eps, w_star)
    for w in run(problem, steps, params):
        losses.append(sq(A @ w - y))
        ratios.append(sq(w - w_star) / e0_safe)
    loss, norm_ratio, loss_min = xp.stack(losses), xp.stack(ratios), sq(A @ w_star - y)
    return ProbeResult(attacker, loss, norm_ratio, loss_min, w, w_star, kappa, rank, rtol, params)


def _check_params(attacker: str, params: dict[str, Any]) -> None:
    def positive(name: str, allow_none: bool = True) -> None:
        v = params.get(name)
        if v is None and allow_none:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < math.inf):
            raise ValueError(f"probe: {attacker} needs a positive finite {name}, got {v!r}")

    positive("lr")
    if "beta" in params and params["beta"] is not None:
        b = params["beta"]
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b < 1:
            raise ValueError(f"probe: momentum needs 0 <= beta < 1, got {b!r}")
    if attacker == "adam":
        positive("eps", allow_none=False)
        betas = params["betas"]
        if (
            not isinstance(betas, (tuple, list))
            or len(betas) != 2
            or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)
        ):
            raise ValueError(f"probe: adam needs betas = (b1, b2) with 0 <= b < 1, got {betas!r}")
        params["betas"] = (float(betas[0]), float(betas[1]))
    if attacker == "lbfgs":
        h = params["history"]
        if isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1:
            raise ValueError(f"probe: lbfgs needs an integer history >= 1, got {h!r}")
