"""The input checks of :func:`condreg.immunize` (all before any decomposition) and what
Algorithm 1 derives from the data alone (:func:`setup_data`), held by the caller."""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from array_api_compat import device as _device
from array_api_compat import is_array_api_obj

from condreg import _backend, _core, _linalg, _precondition, _validation
from condreg.algorithm._factored import initial_features
from condreg.algorithm._methods import METHODS
from condreg.algorithm._problem import ImmunizationWarning, TaskData
from condreg.algorithm._step import probe_path
from condreg.metrics import rir_spectra, run_rtol

Array = Any

#: The supervised tasks.
TASKS = ("regression", "classification")


def namespace(named: dict[str, Any], xp: Any = None) -> Any:
    """The one array library of the inputs (``TypeError`` for a mix: no silent conversion)."""
    arrays = {k: a for k, a in named.items() if a is not None and is_array_api_obj(a)}
    for name in ("X_p", "X_h"):
        if name not in arrays:  # not an array: raises the TypeError naming it
            _validation.named_namespace("immunize", {name: named[name]})
    if xp is not None:
        return xp
    return _validation.named_namespace(
        "immunize", arrays, "; convert them first, e.g. torch.as_tensor(y) or numpy.asarray(y)"
    )


def float_dtype(xp: Any, *arrays: Array) -> Any:
    """The compute dtype: the inputs' real float (at least float32), or the default float."""
    dtypes = []
    for a in arrays:
        if not _is_real(a.dtype, xp):
            raise TypeError(f"immunize: data must be real numbers, got dtype {a.dtype}")
        if xp.isdtype(a.dtype, "real floating"):
            dtypes.append(a.dtype)
    if not dtypes:
        return _validation.default_float(xp, arrays[0])
    dtype = xp.result_type(*dtypes)
    return xp.float32 if xp.finfo(dtype).bits < 32 else dtype


def _is_real(dtype: Any, xp: Any) -> bool:
    """Real floating or integer (not bool, complex, object or strings)."""
    try:
        return bool(xp.isdtype(dtype, ("real floating", "signed integer", "unsigned integer")))
    except (TypeError, ValueError):
        return False


def data_matrices(X_p: Any, X_h: Any, xp: Any) -> tuple[Array, Array]:
    """``X_p``, ``X_h`` checked (2-D, same features, finite, nonzero) in the compute dtype."""
    for X, name in ((X_p, "X_p"), (X_h, "X_h")):
        if getattr(X, "ndim", None) != 2:
            raise ValueError(
                f"immunize: {name} must be a 2-D array (samples × features), got shape "
                f"{tuple(getattr(X, 'shape', ()))}"
            )
        if X.shape[0] == 0 or X.shape[1] == 0:
            raise ValueError(f"immunize: {name} is empty (shape {tuple(X.shape)})")
    if X_p.shape[1] != X_h.shape[1]:
        raise ValueError(
            f"immunize: X_p and X_h must have the same number of features, got {X_p.shape[1]} "
            f"and {X_h.shape[1]}"
        )
    dtype = float_dtype(xp, X_p, X_h)
    X_p, X_h = xp.astype(X_p, dtype), xp.astype(X_h, dtype)
    for X, name in ((X_p, "X_p"), (X_h, "X_h")):
        if not bool(xp.all(xp.isfinite(X))):
            raise ValueError(f"immunize: {name} contains NaN or Inf")
        if not bool(xp.any(X != 0)):
            raise ValueError(f"immunize: {name} is all zeros (rank 0); nothing to immunize")
    return X_p, X_h


def checked(
    a: Any, name: str, shape: tuple[int, ...], xp: Any, dtype: Any, dev: Any, expected: str = ""
) -> Array:
    """``a`` in ``xp`` with ``dtype`` (nested sequences converted), of ``shape`` (``(n, 1)``
    accepted for ``(n,)``) and finite."""
    if not is_array_api_obj(a):
        try:
            a = np.asarray(a, dtype=np.float64)
        except (TypeError, ValueError):
            kind = _backend.kind(a)
            raise TypeError(f"immunize: {name} must be an array of numbers, got {kind}") from None
        a = xp.asarray(a, device=dev)
    if not _is_real(a.dtype, xp):
        raise TypeError(f"immunize: {name} must be real numbers, got dtype {a.dtype}")
    a = xp.astype(a, dtype)
    if len(shape) == 1 and tuple(a.shape) == (*shape, 1):
        a = xp.reshape(a, shape)
    if tuple(a.shape) != shape:
        raise ValueError(
            f"immunize: {name} must have shape {expected or shape}, got {tuple(a.shape)}"
        )
    if not bool(xp.all(xp.isfinite(a))):
        raise ValueError(f"immunize: {name} contains NaN or Inf")
    return a


def labels(y: Any, n: int, name: str, task: str, xp: Any, dtype: Any, dev: Any) -> Array:
    y = checked(y, name, (n,), xp, dtype, dev, f"({n},) or ({n}, 1) to match its inputs")
    if task == "classification":
        if not bool(xp.all((y == 0) | (y == 1))):
            raise ValueError(
                f"immunize: task='classification' needs binary labels in {{0, 1}}; {name} has "
                "other values (map them to 0/1 first)"
            )
        if bool(xp.all(y == y[0])):
            warnings.warn(
                f"{name} is constant: the supervised loss is degenerate (docs/math.md §9.5)",
                ImmunizationWarning,
                stacklevel=4,
            )
    return y


def positive(value: Any, name: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"immunize: {name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"immunize: {name} must be finite and {bound}, got {value!r}")
    return v


def integer(value: Any, name: str, low: int, error: type[Exception] = ValueError) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise error(f"immunize: {name} must be an integer >= {low}, got {value!r}")
    return int(value)


def options(method, task, lr, max_step, lam_p, lam_h, ridge, imma_steps, imma_lr, rtol) -> dict:
    """Checked scalar options (``ValueError``/``TypeError`` naming the argument)."""
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"immunize: method must be one of {METHODS}, got {method!r}")
    if task not in TASKS:
        raise ValueError(f"immunize: task must be one of {TASKS}, got {task!r}")
    out: dict[str, Any] = {
        "lr": positive(lr, "lr"),
        "max_step": positive(max_step, "max_step"),
        "imma_steps": integer(imma_steps, "imma_steps", 1),
    }
    if not out["max_step"] < 0.5:
        raise ValueError(f"immunize: max_step must be in (0, 0.5), got {max_step!r}")
    for name, v in (("lam_p", lam_p), ("lam_h", lam_h), ("imma_lr", imma_lr)):
        out[name] = None if v is None else positive(v, name, allow_zero=name != "imma_lr")
    return out | setup_options(rtol=rtol, ridge=ridge)


def setup_options(*, rtol: Any, ridge: Any) -> dict[str, Any]:
    """The checked options of the data's setup: ``rtol`` in [0, 1) and ``ridge >= 0`` (or None)."""
    where = "immunize: "
    return {
        "rtol": _core.check_rtol(rtol, where=where),
        "ridge": _core.check_ridge(ridge, where=where),
    }


@dataclass(frozen=True, eq=False)
class DataSetup:
    """Everything :func:`condreg.immunize` derives from the data alone (:func:`setup_data`):
    the singular values of ``X_p``, ``X_h`` (``tasks``, as :func:`condreg.metrics.rir`), the two
    tasks with their spectra at ``θ = I`` (``P``, ``H``) and paths. Pass it as
    ``immunize(..., setup=setup)`` with the very arrays it was built from (``built``)."""

    X_p: Array
    X_h: Array
    xp: Any
    rtol: float
    ridge: float | None
    tasks: Any
    P: TaskData
    H: TaskData
    paths: tuple[str, str]
    built: tuple[tuple[tuple[int, ...], str], tuple[tuple[int, ...], str]]

    def check(self, X_p: Array, X_h: Array, *, rtol: float, ridge: float | None, xp: Any) -> None:
        """``ValueError`` for a run on other arrays (or changed shapes, dtypes), another namespace,
        ``rtol`` or ``ridge`` than the setup's."""
        where = "immunize: setup was built from"
        if X_p is not self.X_p or X_h is not self.X_h:
            raise ValueError(
                f"{where} other arrays than the X_p, X_h given (pass the very arrays given to "
                "setup_data, or no setup)"
            )
        for X, name, (shape, dtype) in zip((X_p, X_h), ("X_p", "X_h"), self.built, strict=True):
            if tuple(X.shape) != shape or str(X.dtype) != dtype:
                raise ValueError(
                    f"{where} {name} of shape {shape} and dtype {dtype}; it now has shape "
                    f"{tuple(X.shape)} and dtype {X.dtype}"
                )
        if xp is not self.xp:
            raise ValueError(f"{where} arrays of namespace {self.xp.__name__}, not {xp.__name__}")
        if float(rtol) != self.rtol:
            raise ValueError(f"{where} rtol={self.rtol!r}; the run asks for rtol={rtol!r}")
        if ridge != self.ridge:
            raise ValueError(f"{where} ridge={self.ridge!r}; the run asks for ridge={ridge!r}")

    def __repr__(self) -> str:
        return (
            f"DataSetup(X_p={self.built[0][0]}, X_h={self.built[1][0]}, rtol={self.rtol:.3g}, "
            f"ridge={self.ridge!r}, paths={self.paths!r}, ranks=({self.P.rank}, {self.H.rank}))"
        )


def setup_data(
    X_p: Array, X_h: Array, *, rtol: float | None = None, ridge: float | None = None, xp: Any = None
) -> DataSetup:
    """Decompose the two tasks' data once (one thin SVD each, the spectra at ``θ = I`` and the
    paths), for every :func:`condreg.immunize` run on them.

    Parameters
    ----------
    X_p, X_h : array, shape (N_p, D) and (N_h, D)
        The pre-training and the harmful task's inputs (one Array API library).
    rtol, ridge, xp
        As in :func:`condreg.immunize` (``rtol`` default ``max(N_P, N_H, D)·eps``).

    Returns
    -------
    DataSetup
        For ``setup=`` with these arrays, ``rtol`` and ``ridge``: the runs are the same bit for bit.

    Raises
    ------
    TypeError, ValueError
        As :func:`condreg.immunize` for the data, ``rtol`` and ``ridge``.

    Examples
    --------
    >>> import numpy as np, condreg
    >>> X_p, X_h = np.random.default_rng(0).standard_normal((2, 40, 6))
    >>> setup = condreg.algorithm.setup_data(X_p, X_h)
    >>> res = condreg.immunize(X_p, X_p[:, 0], X_h, epochs=3, setup=setup, warn=False)
    >>> setup.paths
    ('auto', 'auto')
    """
    opts = setup_options(rtol=rtol, ridge=ridge)
    xp = namespace({"X_p": X_p, "X_h": X_h}, xp)
    Xp, Xh = data_matrices(X_p, X_h, xp)
    return build_setup(X_p, X_h, Xp, Xh, xp, opts["rtol"], opts["ridge"])


def build_setup(
    X_p: Array, X_h: Array, Xp: Array, Xh: Array, xp: Any, rtol: float | None, ridge: float | None
) -> DataSetup:
    """:func:`setup_data` of validated data: ``X_p``, ``X_h`` as given, ``Xp``, ``Xh`` cast."""
    rtol = float(run_rtol(Xp, Xh) if rtol is None else rtol)  # max(N_P, N_H, D)·eps, as rir
    tasks = rir_spectra(None, Xp, Xh, rtol=rtol)  # κ(K_P), κ(K_H) as metrics.rir
    kappas = tasks.rir()
    P, path_p = _at_identity(build_task(Xp, xp, rtol, ridge, kappas.kappa_kp), rtol, xp)
    H, path_h = _at_identity(build_task(Xh, xp, rtol, ridge, kappas.kappa_kh), rtol, xp)
    built = ((tuple(X_p.shape), str(X_p.dtype)), (tuple(X_h.shape), str(X_h.dtype)))
    return DataSetup(X_p, X_h, xp, rtol, ridge, tasks, P, H, (path_p, path_h), built)


def build_task(X: Array, xp: Any, rtol: float, ridge: float | None, kappa_K: float) -> TaskData:
    """The :class:`TaskData` of ``X`` from one SVD (``ValueError`` at rank 0)."""
    N, D = X.shape
    _, s, Vh = xp.linalg.svd(X, full_matrices=False)
    s1 = float(s[0])
    if not (s1 > 0 and math.isfinite(s1)):
        raise ValueError("immunize: a data matrix is zero (rank 0); nothing to immunize")
    rank = int(xp.sum(xp.astype(_precondition.rank_mask(s, rtol), s.dtype)))
    c = _linalg.power_of_two_scale(s1)
    sc = s[:rank] * c
    Vr = Vh[:rank, :]
    A = sc[:, None] * Vr
    f = _precondition.left_filter(sc, sc > 0, ridge, xp)
    scale = math.sqrt(N) / s1
    return TaskData(A, Vr.T, sc, f / sc, X * scale, scale, c, rank, kappa_K)


def _at_identity(task: TaskData, rtol: float, xp: Any) -> tuple[TaskData, str]:
    """The task with its spectrum at ``θ = I`` kept (eager NumPy, ``F = A``), and its path."""
    F = initial_features(task, xp.eye(task.A.shape[1], dtype=task.A.dtype, device=_device(task.A)))
    keep = F is task.A
    hs, path = probe_path(task, F, rtol, xp, vectors=keep)
    if not keep or hs is None:
        return task, path
    paths = ("auto",) if path == "auto" else ("auto", "exact")
    return replace(task, at_identity=tuple((p, hs) for p in paths)), path
