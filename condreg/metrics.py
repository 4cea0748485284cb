"""The paper's immunization metrics (docs/math.md §6) on any Array API array: RIR (Eq. 15, 17) and
the probing convergence curve (Eq. 16); κ as :func:`condreg.condition_number` (``gram=True``)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from condreg import _backend, _core, _spectrum, _validation
from condreg._api import condition_number

Array = Any

__all__ = ["RIR", "RIRSpectra", "RIRTheta0", "rir", "rir_spectra", "run_rtol", "rir_theta0"]
__all__ += ["probe_convergence"]


class RIR(NamedTuple):
    """Eq. 15 as Python floats: ``i = κ(H_H(θ))/κ(K_H)``, ``ii = κ(H_P(θ))/κ(K_P)``,
    ``rir = i / ii``, and the four condition numbers. Success: ``i`` large, ``ii ≤ 1``,
    ``rir ≫ 1``."""

    i: float
    ii: float
    rir: float
    kappa_hp: float
    kappa_hh: float
    kappa_kp: float
    kappa_kh: float


class RIRTheta0(NamedTuple):
    """Eq. 17: ``rir``, the mean of the per-group ``ratios``; ``i`` and ``ii``, the means of their
    numerators and denominators."""

    rir: float
    i: float
    ii: float
    ratios: list[float]


def check_matrix(X: Array, name: str, where: str) -> None:
    """Raise ``ValueError`` unless ``X`` is a non-empty 2-D array."""
    if getattr(X, "ndim", None) != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(
            f"{where}: {name} must be a non-empty 2-D array, got shape "
            f"{tuple(getattr(X, 'shape', ()))}"
        )


def run_rtol(X_p: Array, X_h: Array, dtype: Any = None) -> float:
    """The one rank tolerance of a pair of tasks, ``max(N_P, N_H, D)·eps(dtype)`` relative to
    ``σ₁``: the default of :func:`rir` and :func:`condreg.immunize`.

    Parameters
    ----------
    X_p, X_h : array
        The pre-training and harmful data, ``N_P×D`` and ``N_H×D``.
    dtype : optional
        The dtype whose ``eps`` counts (default ``X_p``'s; float64 for a non-floating dtype).

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.metrics import run_rtol
    >>> run_rtol(np.zeros((10, 3)), np.zeros((20, 3))) == 20 * float(np.finfo(float).eps)
    True
    """
    xp = array_namespace(X_p, X_h)
    dtype = X_p.dtype if dtype is None else dtype
    if not xp.isdtype(dtype, "real floating"):
        dtype = xp.float64
    return max(X_p.shape[0], X_h.shape[0], X_p.shape[1]) * float(xp.finfo(dtype).eps)


class RIRSpectra:
    """The singular values behind Eq. 15 (from :func:`rir_spectra`), resolved above
    ``rtol·σ₁`` and so re-thresholded for any tolerance ``>= rtol``.

    Parameters
    ----------
    parts, fingerprint, xp
        Internal (use :func:`rir_spectra`).
    rtol : float
        The tolerance the spectra were decomposed at.
    """

    __slots__ = ("_parts", "_fingerprint", "_xp", "rtol")

    def __init__(self, parts: tuple[_Part, ...], fingerprint: tuple, xp: Any, rtol: float) -> None:
        self._parts = parts  # K_P, K_H, H_P, H_H: the engine's spectrum and the output dtype
        self._fingerprint = fingerprint
        self._xp = xp
        self.rtol = float(rtol)

    def _task_parts(self, fingerprint: tuple, rtol: float) -> tuple:
        """``K_P``'s and ``K_H``'s parts for reuse on the same data at ``rtol``."""
        if self._fingerprint != fingerprint:
            raise ValueError(
                "rir_spectra: tasks was computed on other X_p, X_h (shape, dtype or entries "
                "differ); pass the result of a call on these arrays"
            )
        if self.rtol > rtol:
            raise ValueError(
                f"rir_spectra: tasks resolves the singular values above {self.rtol:.3g}·σ₁ "
                f"only, not rtol={rtol:.3g}"
            )
        parts = self._parts[:2]
        if self.rtol == rtol:
            return parts
        return tuple(_Part(_recut(part.sp, rtol, self._xp), part.dtype) for part in parts)

    def __getstate__(self) -> tuple:  # picklable: the namespace by its module name
        return self._parts, self._fingerprint, self._xp.__name__, self.rtol

    def __setstate__(self, state: tuple) -> None:
        self._parts, self._fingerprint, name, self.rtol = state
        self._xp = importlib.import_module(name)

    @property
    def s_kp(self) -> Array:
        """Singular values of ``X_p`` (descending)."""
        return self._parts[0].sp.s

    @property
    def s_kh(self) -> Array:
        """Singular values of ``X_h`` (descending)."""
        return self._parts[1].sp.s

    def _checked(self, rtol: float | None, where: str) -> float:
        if rtol is None:
            return self.rtol
        rtol = _core.check_rtol(rtol, where=f"{where}: ")
        if rtol < self.rtol:
            raise ValueError(
                f"{where}: these spectra resolve the singular values above {self.rtol:.3g}·σ₁ "
                f"only, not rtol={rtol:.3g}; call rir_spectra again with rtol <= {rtol:.3g}"
            )
        return rtol

    def rir(self, rtol: float | None = None) -> RIR:
        """:func:`rir` (Eq. 15) with the singular values ``σ_i > rtol·σ₁`` counted.

        Parameters
        ----------
        rtol : float, optional
            In ``[self.rtol, 1)``; default :attr:`rtol`.

        Raises
        ------
        ValueError, TypeError
            For ``rtol`` outside ``[self.rtol, 1)``, or not a real number.
        """
        rtol = self._checked(rtol, "RIRSpectra.rir")
        k_kp, k_kh, k_hp, k_hh = (self._kappa(part, rtol) for part in self._parts)
        i_ratio, ii_ratio = k_hh / k_kh, k_hp / k_kp
        return RIR(i_ratio, ii_ratio, i_ratio / ii_ratio, k_hp, k_hh, k_kp, k_kh)

    def ranks(self, rtol: float | None = None) -> tuple[int, int, int, int]:
        """Numerical ranks ``#{σ_i > rtol·σ₁}`` of ``X_p``, ``X_h``, ``X_pθ``, ``X_hθ``.

        Parameters
        ----------
        rtol : float, optional
            In ``[self.rtol, 1)``; default :attr:`rtol`.

        Raises
        ------
        ValueError, TypeError
            For ``rtol`` outside ``[self.rtol, 1)``, or not a real number.
        """
        rtol = self._checked(rtol, "RIRSpectra.ranks")
        return tuple(int(float(_recut(part.sp, rtol, self._xp).k)) for part in self._parts)

    def _kappa(self, part: _Part, rtol: float) -> float:
        """κ(FᵀF) at ``rtol`` from the stored spectrum."""
        xp = self._xp
        sp = part.sp if rtol == self.rtol else _recut(part.sp, rtol, xp)
        value = _core.value_from_spectrum("condition_number", sp, xp, tie_rtol=None)
        return float(xp.astype(xp.asarray(value), part.dtype))

    def __repr__(self) -> str:
        r = self.rir()
        return f"RIRSpectra(rtol={self.rtol:.3g}, rir={r.rir:.4g}, i={r.i:.4g}, ii={r.ii:.4g})"


def rir_spectra(
    theta: Array | None,
    X_p: Array,
    X_h: Array,
    *,
    rtol: float | None = None,
    tasks: RIRSpectra | None = None,
) -> RIRSpectra:
    """Decompose the four matrices of Eq. 15 once; evaluate RIR at several tolerances from it.

    Parameters
    ----------
    theta : array or None
        ``(D, D_out)``; ``None`` means θ = I (two decompositions, RIR exactly 1).
    X_p, X_h, rtol
        As in :func:`rir`.
    tasks : RIRSpectra, optional
        An earlier result on the same ``X_p``, ``X_h`` at a tolerance ``<= rtol``, to reuse.

    Raises
    ------
    ValueError, TypeError
        What :func:`rir` raises, and for a ``tasks`` of other data, a coarser tolerance or type.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.metrics import rir_spectra
    >>> rng = np.random.default_rng(0)
    >>> sp = rir_spectra(np.eye(3), rng.normal(size=(20, 3)), rng.normal(size=(10, 3)))
    >>> sp.rir(10 * sp.rtol).rir, sp.ranks()
    (1.0, (3, 3, 3, 3))
    """
    arrays = {"X_p": X_p, "X_h": X_h} if theta is None else {"theta": theta, "X_p": X_p, "X_h": X_h}
    xp = _validation.named_namespace("rir", arrays)
    check_matrix(X_p, "X_p", "rir")
    check_matrix(X_h, "X_h", "rir")
    if theta is not None:
        if getattr(theta, "ndim", None) != 2:
            shape = tuple(getattr(theta, "shape", ()))
            raise ValueError(f"rir: theta must be a 2-D array, got shape {shape}")
        if not bool(xp.all(xp.isfinite(theta))):
            raise ValueError("rir: theta contains NaN or Inf")
    if tasks is not None and not isinstance(tasks, RIRSpectra):
        raise TypeError(f"rir_spectra: tasks must be an RIRSpectra, got {type(tasks).__name__}")
    cols = X_p.shape[1] if theta is None else theta.shape[0]
    if not (X_p.shape[1] == X_h.shape[1] == cols):
        raise ValueError(
            "rir: feature dimensions disagree: X_p has "
            f"{X_p.shape[1]}, X_h has {X_h.shape[1]}, theta has {cols} rows"
        )
    for X, name in ((X_p, "X_p"), (X_h, "X_h")):
        if not bool(xp.all(xp.isfinite(X))):
            raise ValueError(f"rir: {name} contains NaN or Inf")
    # κ is scale-invariant: bring θ and the data near 1 by powers of two (exact)
    X_p, X_h = _unit(X_p, xp), _unit(X_h, xp)
    fingerprint = _fingerprint(X_p, X_h, xp)
    theta = None if theta is None else _unit(theta, xp)
    F_p, F_h = (X_p, X_h) if theta is None else (X_p @ theta, X_h @ theta)
    if rtol is None:
        rtol = run_rtol(X_p, X_h, F_p.dtype)
    rtol = _spectrum.resolve_rtol(rtol, F_p.shape, F_p.dtype, xp)
    if tasks is None:
        k_p, k_h = _decompose(X_p, rtol), _decompose(X_h, rtol)
    else:
        k_p, k_h = tasks._task_parts(fingerprint, rtol)
    h_p, h_h = (k_p, k_h) if theta is None else (_decompose(F_p, rtol), _decompose(F_h, rtol))
    return RIRSpectra((k_p, k_h, h_p, h_h), fingerprint, xp, rtol)


class _Part(NamedTuple):
    """One matrix of Eq. 15: its spectrum and the dtype κ is returned in."""

    sp: Any
    dtype: Any


def _decompose(F: Array, rtol: float) -> _Part:
    """The spectrum :func:`condreg.condition_number` (``gram=True``) computes κ from."""
    F, xp, concrete = _validation.matrix(F, where="rir")
    F, dtype = _validation.compute_dtype(F, xp, None, where="rir")
    sp = _spectrum.decompose(F, xp, gram=True, vectors=False, rtol=rtol, concrete=concrete)
    return _Part(sp, dtype)


def _recut(sp: Any, rtol: float, xp: Any) -> Any:
    """``sp`` with its numerical rank re-decided at ``rtol`` (``σ_i > rtol·σ₁``)."""
    mask = sp.s > rtol * sp.s[..., :1]
    return sp._replace(mask=mask, k=xp.sum(xp.astype(mask, sp.s.dtype), axis=-1))


def _fingerprint(X_p: Array, X_h: Array, xp: Any) -> tuple:
    """Shapes, dtypes, sums and sums of squares of both (rescaled) tasks."""
    out: list[Any] = []
    for X in (X_p, X_h):
        Z = X if xp.isdtype(X.dtype, "real floating") else xp.astype(X, xp.float64)
        out += [tuple(X.shape), str(X.dtype), float(xp.sum(Z)), float(xp.sum(Z * Z))]
    return tuple(out)


def rir(theta: Array, X_p: Array, X_h: Array, *, rtol: float | None = None) -> RIR:
    """Relative immunization ratio of a linear extractor (Eq. 15), as ``immunize``'s metrics:

    ``RIR = [κ(H_H(θ))/κ(K_H)] / [κ(H_P(θ))/κ(K_P)]``, ``H(θ) = θᵀXᵀXθ``, ``K = XᵀX``.

    Parameters
    ----------
    theta : array
        The linear extractor, ``(D, D_out)``.
    X_p, X_h : array
        The pre-training and harmful data, ``N_P×D`` and ``N_H×D``, of ``theta``'s namespace.
    rtol : float, optional
        One tolerance for all four κ: ``σ_i > rtol·σ₁`` counts; default :func:`run_rtol`.

    Raises
    ------
    ValueError
        For mismatched shapes, empty or non-finite input, zero matrices, ``rtol`` not in [0, 1).
    TypeError
        For ``theta=None`` or mixed libraries.

    Examples
    --------
    >>> import numpy as np, condreg.metrics
    >>> rng = np.random.default_rng(0)
    >>> condreg.metrics.rir(np.eye(3), rng.normal(size=(20, 3)), rng.normal(size=(10, 3))).rir
    1.0
    """
    if theta is None:
        raise TypeError("rir: theta must be an array, got NoneType")
    return rir_spectra(theta, X_p, X_h, rtol=rtol).rir()


def rir_theta0(
    f_I: Callable[[Array], Array],
    f_0: Callable[[Array], Array],
    X_p: Array,
    X_h: Array,
    groups: int = 20,
    group_size: int = 100,
    seed: int = 0,
    *,
    rtol: float | None = None,
) -> RIRTheta0:
    """RIR relative to the initial model θ_0, for non-linear feature maps (Eq. 17): the mean over
    random groups of ``[κ(H̃_H(θ_I)) / κ(H̃_H(θ_0))] / [κ(H̃_P(θ_I)) / κ(H̃_P(θ_0))]``,
    ``H̃ = FᵀF`` of the features flattened to ``(n, -1)``.

    Parameters
    ----------
    f_I, f_0 : callable
        The immunized and the initial feature map (two objects), batch → features.
    X_p, X_h : array
        The pre-training and harmful samples (axis 0), of one namespace.
    groups : int
        Number of groups (``>= 1``).
    group_size : int
        Samples per task and group (``>= 2``; all if fewer).
    seed : int
        Seed of the ``numpy.random.default_rng`` that draws the groups.
    rtol : float, optional
        Rank tolerance of each κ (default ``max(n, d)·eps`` per feature matrix).

    Raises
    ------
    ValueError
        When ``f_I is f_0`` (docs/math.md §9.6), ``groups < 1``, ``group_size < 2`` or empty data.
    TypeError
        When a map is not callable or the data are of different libraries.

    Warns
    -----
    UserWarning
        When both maps return identical features on the first group.

    Examples
    --------
    >>> import numpy as np, condreg.metrics
    >>> X = np.random.default_rng(0).normal(size=(50, 4))
    >>> condreg.metrics.rir_theta0(lambda x: x, lambda x: 2 * x, X, X, groups=2, group_size=10).rir
    1.0
    """
    if f_I is f_0:
        raise ValueError(
            "rir_theta0: f_I and f_0 are the same object; pass the immunized feature map as f_I "
            "and a copy of the initial one as f_0 (otherwise every ratio is 1, docs/math.md §9.6)"
        )
    if not (callable(f_I) and callable(f_0)):
        raise TypeError("rir_theta0: f_I and f_0 must be callables returning feature arrays")
    if int(groups) < 1 or int(group_size) < 2:
        raise ValueError("rir_theta0: groups must be >= 1 and group_size >= 2")
    xp = _validation.named_namespace("rir_theta0", {"X_p": X_p, "X_h": X_h})
    for X, name in ((X_p, "X_p"), (X_h, "X_h")):
        if getattr(X, "ndim", 0) < 1 or X.shape[0] == 0:
            raise ValueError(f"rir_theta0: {name} is empty")
    rng = np.random.default_rng(seed)
    nums, dens = [], []
    for g in range(int(groups)):
        for X, out in ((X_p, dens), (X_h, nums)):
            n = X.shape[0]
            idx = rng.choice(n, size=min(int(group_size), n), replace=False)
            batch = xp.take(X, xp.asarray(idx, device=_device(X)), axis=0)
            F_I, F_0 = (xp.reshape(F, (F.shape[0], -1)) for F in (f_I(batch), f_0(batch)))
            if g == 0 and tuple(F_I.shape) == tuple(F_0.shape):
                if bool(array_namespace(F_I).all(F_I == F_0)):
                    warnings.warn(
                        "rir_theta0: f_I and f_0 return identical features; was the initial "
                        "model modified in place? (docs/math.md §9.6)",
                        stacklevel=2,
                    )
            k_I, k_0 = (float(condition_number(F, gram=True, rtol=rtol)) for F in (F_I, F_0))
            out.append(k_I / k_0)
    ratios = [h / p for h, p in zip(nums, dens, strict=True)]
    return RIRTheta0(float(np.mean(ratios)), float(np.mean(nums)), float(np.mean(dens)), ratios)


def _pow2(amax: Array, xp: Any) -> Array:
    """``2**-round(log2(amax))`` (1 for 0): brings the largest entry near 1, exactly."""
    safe = xp.where(amax > 0, amax, xp.ones_like(amax))
    return 2.0 ** (-xp.round(xp.log2(safe)))


def _unit(a: Array, xp: Any) -> Array:
    """``a`` times the power of two that brings its largest entry near 1 (floating ``a`` only)."""
    if not xp.isdtype(a.dtype, "real floating"):
        return a
    return a * xp.astype(_pow2(xp.max(xp.abs(a)), xp), a.dtype)


def probe_convergence(A: Array, y: Array, steps: int, *, norm: str = "euclidean") -> Array:
    """Norm-ratio curve ``‖w_t − w*‖² / ‖w_0 − w*‖²`` (``w* = pinv(A) y``) of gradient descent
    on ``‖Aw − y‖²`` from ``w_0 = 0`` with exact line search (Eq. 16). Jit-able.

    Parameters
    ----------
    A, y : array
        ``N×D``, and ``(N,)`` or ``(N, 1)`` of ``A``'s namespace.
    steps : int
        Number of descent steps, ``>= 0``.
    norm : {"euclidean", "hessian"}
        The error's norm: Euclidean, or ``‖A(w_t − w*)‖² / ‖A(w_0 − w*)‖²``.

    Returns
    -------
    array
        The ``steps + 1`` ratios (first entry 1); NaN when ``w* = 0``.

    Raises
    ------
    ValueError
        For other shapes, an unknown ``norm``, an invalid ``steps``, NaN/Inf entries.
    TypeError
        For arrays of different libraries.

    Examples
    --------
    >>> import numpy as np, condreg.metrics
    >>> condreg.metrics.probe_convergence(np.eye(2), np.ones(2), 1)
    array([1., 0.])
    """
    xp = _validation.named_namespace("probe_convergence", {"A": A, "y": y})
    check_matrix(A, "A", "probe_convergence")
    N, D = A.shape
    if tuple(y.shape) == (N, 1):
        y = xp.reshape(y, (N,))
    if tuple(y.shape) != (N,):
        raise ValueError(f"probe_convergence: y must have shape ({N},), got {tuple(y.shape)}")
    if norm not in ("euclidean", "hessian"):
        raise ValueError(f"probe_convergence: norm must be 'euclidean' or 'hessian', got {norm!r}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 0:
        raise ValueError(f"probe_convergence: steps must be an integer >= 0, got {steps!r}")
    if not xp.isdtype(A.dtype, "real floating"):
        A = xp.astype(A, xp.float64 if xp.isdtype(A.dtype, "integral") else A.dtype)
    y = xp.astype(y, A.dtype)
    if _backend.readable(xp.all(xp.isfinite(A)) & xp.all(xp.isfinite(y))) is False:
        raise ValueError("probe_convergence: A or y contains NaN or Inf")
    # the ratios are invariant under A → aA, y → by: scale both by powers of two (exact)
    A, y = A * _pow2(xp.max(xp.abs(A)), xp), y * _pow2(xp.max(xp.abs(y)), xp)
    w_star = xp.linalg.pinv(A) @ y
    w0 = xp.zeros((D,), dtype=A.dtype, device=_device(A))

    def size(e):
        if norm == "hessian":
            e = A @ e
        return xp.sum(e * e)

    e0 = size(w_star)
    ratios = [size(w - w_star) / e0 for w in exact_descent(xp, A, y, w0, int(steps))]
    return xp.stack([xp.ones_like(e0), *ratios])


def safe_div(xp: Any, num: Array, den: Array) -> Array:
    """``num/den``, 0 where ``den`` is 0 (a vanished gradient or direction: stay put)."""
    ok = den > 0
    return xp.where(ok, num / xp.where(ok, den, xp.ones_like(den)), xp.zeros_like(num))


def exact_descent(xp: Any, A: Array, y: Array, w: Array, steps: int) -> Iterator[Array]:
    """The iterates of steepest descent on ``‖Aw − y‖²`` from ``w`` with exact line search."""
    for _ in range(steps):
        g = 2.0 * (A.T @ (A @ w - y))
        Ag = A @ g
        w = w - safe_div(xp, xp.sum(g * g), 2.0 * xp.sum(Ag * Ag)) * g
        yield w
