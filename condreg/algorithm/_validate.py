"""Input checks of :func:`condreg.immunize`: every one runs before any decomposition."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import numpy as np
from array_api_compat import is_array_api_obj

from condreg import _validation
from condreg.algorithm._result import ImmunizationWarning

Array = Any

#: The supervised tasks.
TASKS = ("regression", "classification")


def _kind(a: Any) -> str:
    return type(a).__module__.split(".")[0] + "." + type(a).__name__


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
            raise TypeError(
                f"immunize: {name} must be an array of numbers, got {_kind(a)}"
            ) from None
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
                stacklevel=5,
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


def options(
    *, method, task, methods, lr, max_step, lam_p, lam_h, ridge, imma_steps, imma_lr, rtol
) -> dict[str, Any]:
    """Checked scalar options (``ValueError``/``TypeError`` naming the argument)."""
    if not isinstance(method, str) or method not in methods:
        raise ValueError(f"immunize: method must be one of {tuple(methods)}, got {method!r}")
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
    """The checked options of the data's setup: ``rtol`` in (0, 1) and ``ridge > 0`` (or None)."""
    if rtol is not None:
        rtol = positive(rtol, "rtol")
        if not rtol < 1:
            raise ValueError(f"immunize: rtol must be in (0, 1), got {rtol!r}")
    return {"rtol": rtol, "ridge": None if ridge is None else positive(ridge, "ridge")}
