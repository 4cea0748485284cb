"""Linear probing of immunized features by named attackers (docs/attacks.md).

The paper measures immunization by κ and by one attacker, gradient descent with exact line search
(Eq. 16, :func:`condreg.metrics.probe_convergence`). :func:`probe` runs the same linear-probing
problem with the optimizers an attacker would actually reach for, so that the κ a defense buys
can be read as *steps* for each of them:

    L(w) = ‖A w − y‖²,   A = X θ   (N×K features),   ∇L(w) = 2Aᵀ(Aw − y),   ∇²L = 2AᵀA.

The loss is the paper's (Eq. 8), not divided by N: no attacker's iterates depend on that scale
(the constant step is 1/L of this loss, the line searches are exact, and Adam divides the
gradient by its own running RMS), except through Adam's ``eps``.

Attackers (:data:`ATTACKERS`; keyword defaults in brackets, none tuned on any θ):

- ``"gd_exact"`` — steepest descent with exact line search (the paper's, Eq. 16):
  ``w ← w − α g`` with ``α = gᵀg / (2‖Ag‖²)``.
- ``"gd"`` — gradient descent with the constant step ``lr`` [``1/L``, ``L = 2σ₁(A)²`` the largest
  eigenvalue of ∇²L, from the singular values of ``A``: ``AᵀA`` is never formed]. Converges as
  ``(1 − 1/κ)^t`` (Eq. 2), ``κ = κ(AᵀA)`` over the nonzero spectrum.
- ``"momentum"`` — Polyak's heavy ball ``w ← w − α g + β(w − w_prev)`` with the parameters that are
  optimal for a quadratic [``lr = α = 4/(√L + √μ)²``, ``beta = ((√κ − 1)/(√κ + 1))²``, ``μ`` the
  smallest nonzero eigenvalue of ∇²L]: the best a fixed-parameter momentum method can do; rate
  ``(√κ − 1)/(√κ + 1)`` per step, i.e. about ``√κ`` steps per digit instead of ``κ``.
- ``"nesterov"`` — Nesterov's accelerated gradient with the parameter-free convex schedule
  [``lr = 1/L``; ``v = w_t + (t − 1)/(t + 2)·(w_t − w_{t−1})``, ``w_{t+1} = v − lr·∇L(v)``],
  which needs no ``μ``.
- ``"adam"`` — Adam (Kingma & Ba) with the framework defaults [``lr = 1e-3``,
  ``betas = (0.9, 0.999)``, ``eps = 1e-8``, bias correction on]; its per-coordinate division by
  the RMS gradient is a *diagonal* preconditioner, which undoes the part of the conditioning that
  is a column scaling of ``A``.
- ``"lbfgs"`` — limited-memory BFGS (two-loop recursion, [``history = 10``] curvature pairs,
  initial scaling ``sᵀy/yᵀy``) with the exact line search of the quadratic along each direction
  (``α = −(Aw − y)ᵀAd / ‖Ad‖²``); in exact arithmetic with an unbounded history this is conjugate
  gradients and ends in at most rank(A) steps. Safeguards for the rounding floor: a pair with
  ``sᵀy ≤ eps·‖s‖‖y‖`` is not used, and a step that would raise the computed loss is dropped
  together with the history (the next step is steepest descent), so the loss never rises.
  Written in the Array API (not SciPy), so it runs on every backend (on a κ = 1e12 test
  problem it needed fewer steps than SciPy's L-BFGS-B, whose line search is inexact).
- ``"lstsq"`` — the closed form ``w = A⁺y`` (the minimum-norm least-squares solution) in one
  step: the attacker that ignores conditioning. For an invertible θ the achievable loss
  ``min_w ‖Xθw − y‖²`` is the same as for θ = I (``range(Xθ) = range(X)``), so no invertible θ
  can block it.

Every attacker starts from ``w0`` (default 0). Eager: ``probe`` loops ``steps`` times in Python
and reads the spectrum as Python floats, on NumPy, PyTorch, JAX (float64 needs JAX's x64 mode,
set by the caller) or any Array API library with ``linalg``. No framework is imported here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from array_api_compat import array_namespace
from array_api_compat import device as _device

from condreg import _validation

Array = Any

__all__ = ["ATTACKERS", "ProbeResult", "probe", "steps_to_reduction"]


@dataclass(frozen=True)
class ProbeResult:
    """What :func:`probe` returns (arrays in the input's namespace and device).

    - ``attacker``: the attacker's name; ``params``: the settings it ran with (Python floats:
      the defaults resolved, e.g. the step ``lr`` of ``"gd"``);
    - ``loss``: ``(steps + 1,)``, ``L(w_t) = ‖Aw_t − y‖²`` for ``t = 0..steps`` (``loss[0]`` at
      ``w0``);
    - ``norm_ratio``: ``(steps + 1,)``, Eq. 16's ``‖w_t − w*‖² / ‖w_0 − w*‖²`` (first entry 1);
      NaN throughout when ``w_0 = w*`` up to rounding (``‖w_0 − w*‖ ≤ 100·eps·max(‖w_0‖, ‖w*‖)``:
      nothing to measure);
    - ``loss_min``: 0-d, the achievable loss ``L(w*) = min_w L(w)``;
    - ``w``: the final head ``w_steps`` (``(K,)``), ``w_star``: ``w* = A⁺y`` (``(K,)``), the
      minimum-norm least-squares solution, from the SVD of ``A`` with rank tolerance
      ``rtol·σ₁``;
    - ``kappa``: ``κ(AᵀA) = (σ₁/σ_k)²`` over the nonzero spectrum (same rule), ``rank``: ``k``,
      ``rtol``: the tolerance used.

    Gradient methods started at ``w0 = 0`` stay in ``range(Aᵀ)`` and converge to ``w*``; Adam does
    not (its diagonal rescaling leaves that subspace), so on a rank-deficient ``A`` its loss
    reaches ``loss_min`` while its norm ratio need not go to 0.
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
        """``(L(w_0) − L(w_t)) / (L(w_0) − L(w*))`` per step: the fraction of the achievable loss
        reduction reached (0 at ``t = 0``, 1 at the optimum; 1 throughout when nothing can be
        reduced)."""
        return _reduction(self.loss, self.loss_min)

    def steps_to(self, fraction: float = 0.99) -> int | None:
        """:func:`steps_to_reduction` of this run."""
        return steps_to_reduction(self.loss, self.loss_min, fraction)


class _Problem(NamedTuple):
    xp: Any
    A: Array
    y: Array
    w0: Array
    s: Array  # singular values of A, descending
    rank: int
    rtol: float
    eps: float

    def grad(self, w: Array) -> Array:
        return 2.0 * (self.A.T @ (self.A @ w - self.y))

    @property
    def L(self) -> float:
        """Largest eigenvalue of ∇²L = 2AᵀA."""
        return 2.0 * float(self.s[0]) ** 2

    @property
    def mu(self) -> float:
        """Smallest nonzero eigenvalue of ∇²L (0 for A = 0)."""
        return 2.0 * float(self.s[self.rank - 1]) ** 2 if self.rank else 0.0


class _Attacker(NamedTuple):
    run: Callable[..., Iterator[Array]]
    defaults: Mapping[str, Any]


def _zero_if_nan(xp: Any, x: Array) -> Array:
    return xp.where(xp.isfinite(x), x, xp.zeros_like(x))


def _safe_div(xp: Any, num: Array, den: Array) -> Array:
    """``num/den``, 0 where ``den`` is 0 (a vanished gradient or direction: stay put)."""
    ok = den > 0
    return xp.where(ok, num / xp.where(ok, den, xp.ones_like(den)), xp.zeros_like(num))


def _gd_exact(p: _Problem, steps: int, params: dict[str, Any]) -> Iterator[Array]:
    xp, w = p.xp, p.w0
    for _ in range(steps):
        g = p.grad(w)
        Ag = p.A @ g
        w = w - _safe_div(xp, xp.sum(g * g), 2.0 * xp.sum(Ag * Ag)) * g
        yield w


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
    xp = p.xp
    lr, eps = params["lr"], params["eps"]
    b1, b2 = params["betas"]
    w = p.w0
    m, v = xp.zeros_like(w), xp.zeros_like(w)
    for t in range(1, steps + 1):
        g = p.grad(w)
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * (g * g)
        m_hat = m / (1.0 - b1**t)
        v_hat = v / (1.0 - b2**t)
        w = w - lr * m_hat / (xp.sqrt(v_hat) + eps)
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
            q = q * _safe_div(xp, xp.sum(s * yv), xp.sum(yv * yv))
        for (s, yv, rho), a in zip(pairs, reversed(alphas), strict=True):
            b = rho * xp.sum(yv * q)
            q = q + (a - b) * s
        d = -q
        Ad = A @ d
        r = A @ w - p.y
        # exact minimiser of L(w + αd) = ‖(Aw − y) + αAd‖²
        alpha = _safe_div(xp, -xp.sum(r * Ad), xp.sum(Ad * Ad))
        step = alpha * d
        w_new = w + step
        r_new = A @ w_new - p.y
        if float(xp.sum(r_new * r_new)) > float(xp.sum(r * r)):
            # at the rounding floor the pairs are noise and the direction can be huge: the
            # exact line search cannot lower the computed loss. Drop the step and the history
            # (the next step is steepest descent), so the loss never rises.
            pairs.clear()
            yield w
            continue
        w = w_new
        g_new = p.grad(w)
        yv = g_new - g
        sy = xp.sum(step * yv)
        # curvature pairs with sᵀy ≤ eps·‖s‖‖y‖ carry no information (rho = 0 disables them)
        tiny = p.eps * xp.sqrt(xp.sum(step * step) * xp.sum(yv * yv))
        rho = xp.where(sy > tiny, _safe_div(xp, xp.ones_like(sy), sy), xp.zeros_like(sy))
        pairs.append((step, yv, _zero_if_nan(xp, rho)))
        if len(pairs) > history:
            pairs.pop(0)
        g = g_new
        yield w


def _lstsq(p: _Problem, steps: int, params: dict[str, Any]) -> Iterator[Array]:
    w_star = params.pop("_w_star")
    for _ in range(steps):
        yield w_star


#: The attackers :func:`probe` knows, with their keyword options and defaults (``None``: derived
#: from the spectrum of ``A``, see the module docstring).
_REGISTRY: dict[str, _Attacker] = {
    "gd_exact": _Attacker(_gd_exact, {}),
    "gd": _Attacker(_gd, {"lr": None}),
    "momentum": _Attacker(_momentum, {"lr": None, "beta": None}),
    "nesterov": _Attacker(_nesterov, {"lr": None}),
    "adam": _Attacker(_adam, {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}),
    "lbfgs": _Attacker(_lbfgs, {"history": 10}),
    "lstsq": _Attacker(_lstsq, {}),
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
    """First ``t`` with ``L(w_0) − L(w_t) ≥ fraction·(L(w_0) − L(w*))``, or ``None`` if the curve
    never gets there (``0`` when nothing can be reduced).

    ``loss`` is a 1-D loss curve (``ProbeResult.loss``), ``loss_min`` the achievable loss.
    Raises ``ValueError`` unless ``0 < fraction ≤ 1``.
    """
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ValueError(f"steps_to_reduction: fraction must be in (0, 1], got {fraction!r}")
    xp = array_namespace(loss)
    loss_min = xp.asarray(loss_min, dtype=loss.dtype, device=_device(loss))
    hit = _reduction(loss, loss_min) >= fraction
    if not bool(xp.any(hit)):
        return None
    return int(xp.argmax(xp.astype(hit, xp.int32)))


def _matrix(a: Array, name: str, ndim: int) -> None:
    shape = tuple(getattr(a, "shape", ()))
    if getattr(a, "ndim", None) != ndim or 0 in shape:
        want = "a non-empty 2-D array" if ndim == 2 else "a non-empty 1-D array"
        raise ValueError(f"probe: {name} must be {want}, got shape {shape}")


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
    _matrix(X, "X", 2)
    X = _float_dtype(xp, X, "X")
    N, D = X.shape
    if theta is None:
        A = X
    else:
        _matrix(theta, "theta", 2)
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
    """Linear probing of the features ``A = Xθ`` by ``attacker`` (module docstring).

    Minimises ``L(w) = ‖Aw − y‖²`` for ``steps`` iterations from ``w0`` and records the loss and
    Eq. 16's norm ratio ``‖w_t − w*‖² / ‖w_0 − w*‖²`` after every step.

    Parameters
    ----------
    theta : array of shape (D, K) or None
        The immunized map; ``None`` for θ = I (``A = X``).
    X : array of shape (N, D)
        Inputs, same namespace (and device) as ``theta``; integer inputs are promoted to
        floating point, the result dtype is ``A``'s.
    y : array of shape (N,) or (N, 1)
        Probing targets.
    attacker : str, default "gd_exact"
        One of :data:`ATTACKERS` (``"gd_exact"`` is the paper's).
    steps : int, default 100
        Number of iterations, ``≥ 1`` (``"lstsq"`` reaches ``w*`` at step 1 and stays).
    w0 : array of shape (K,), optional
        The start (default zeros).
    rtol : float, optional
        Rank tolerance on the singular values of ``A`` for ``w*``, ``κ`` and ``μ``
        (``σ_i > rtol·σ₁`` count; default ``max(N, K)·eps``, as
        :func:`condreg.condition_number`).
    **options
        The attacker's settings: ``lr`` (gd, momentum, nesterov, adam), ``beta`` (momentum),
        ``betas``, ``eps`` (adam), ``history`` (lbfgs).

    Returns
    -------
    ProbeResult
        The loss and norm-ratio curves (``steps + 1`` entries each), ``loss_min = L(w*)``, the
        final head, ``w*``, ``κ(AᵀA)`` over the nonzero spectrum, the rank and the resolved
        settings.

    Raises
    ------
    ValueError
        Unknown attacker (the message lists :data:`ATTACKERS`), ``steps`` not an integer
        ``≥ 1``, shapes that do not fit, empty or non-finite input, a bad option value.
    TypeError
        Non-arrays or arrays of different libraries, non-real dtypes, an option the attacker
        does not take.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.attacks import probe
    >>> X = np.diag([1.0, 0.1])
    >>> y = np.array([1.0, 1.0])
    >>> probe(None, X, y, attacker="lstsq", steps=1).steps_to(0.99)
    1
    >>> probe(None, X, y, attacker="gd", steps=500).steps_to(0.99) > 100  # κ(AᵀA) = 100
    True
    """
    if attacker not in _REGISTRY:
        raise ValueError(
            f"probe: unknown attacker {attacker!r}; choose one of {', '.join(ATTACKERS)}"
        )
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise ValueError(f"probe: steps must be an integer >= 1, got {steps!r}")
    steps = int(steps)
    spec = _REGISTRY[attacker]
    unknown = sorted(set(options) - set(spec.defaults))
    if unknown:
        allowed = ", ".join(spec.defaults) or "none"
        raise TypeError(
            f"probe: attacker {attacker!r} takes no option(s) {', '.join(unknown)} "
            f"(its options: {allowed})"
        )
    params = {**spec.defaults, **options}
    _check_params(attacker, params)

    xp, A, y, w0 = _inputs(theta, X, y, w0)
    eps = float(xp.finfo(A.dtype).eps)
    rtol = max(A.shape[0], A.shape[1]) * eps if rtol is None else float(rtol)
    if not (math.isfinite(rtol) and 0 <= rtol < 1):
        raise ValueError(f"probe: rtol must be in [0, 1), got {rtol!r}")
    s, rank, w_star = _least_squares(xp, A, y, rtol)
    kappa = (float(s[0]) / float(s[rank - 1])) ** 2 if rank else math.nan

    problem = _Problem(xp, A, y, w0, s, rank, rtol, eps)
    if attacker == "lstsq":
        params["_w_star"] = w_star

    def loss_of(w: Array) -> Array:
        r = A @ w - y
        return xp.sum(r * r)

    def size(w: Array) -> Array:
        e = w - w_star
        return xp.sum(e * e)

    # ‖w_0 − w*‖ at the rounding level of w* itself: no distance to measure a ratio against
    e0 = size(w0)
    scale = xp.maximum(xp.sum(w_star * w_star), xp.sum(w0 * w0))
    nan = xp.asarray(math.nan, dtype=A.dtype, device=_device(A))
    e0_safe = xp.where(e0 > (100.0 * eps) ** 2 * scale, e0, nan)
    losses, ratios, w = [loss_of(w0)], [e0 / e0_safe], w0
    for w in spec.run(problem, steps, params):
        losses.append(loss_of(w))
        ratios.append(size(w) / e0_safe)
    return ProbeResult(
        attacker=attacker,
        loss=xp.stack(losses),
        norm_ratio=xp.stack(ratios),
        loss_min=loss_of(w_star),
        w=w,
        w_star=w_star,
        kappa=kappa,
        rank=rank,
        rtol=rtol,
        params={k: v for k, v in params.items() if not k.startswith("_")},
    )


def _check_params(attacker: str, params: dict[str, Any]) -> None:
    def positive(name: str, allow_none: bool = True) -> None:
        v = params.get(name)
        if v is None and allow_none:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < math.inf):
            raise ValueError(f"probe: {attacker} needs a positive finite {name}, got {v!r}")

    if "lr" in params:
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
