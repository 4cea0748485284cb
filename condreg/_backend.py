"""The one place that knows array libraries and devices, and the one device-to-host read.

Every other module asks here which library an array (or a namespace, or a dtype) comes from,
whether its values can be read, and moves values between the host and the array's device:
NumPy arrays as they are, PyTorch through ``Tensor.numpy(force=True)``, CuPy through ``.get()``,
any other Array API library through ``__array__`` or, where it refuses (an array on another
device), DLPack onto the CPU. Nothing here imports a framework.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

import numpy as np

Array = Any


def library(obj: Any) -> str:
    """The library of an array, a namespace or a dtype (``numpy``, ``torch``, ``jax``, ``cupy``,
    ``array_api_strict`` ...), from its module: no array-api-compat helper, whose caches
    ``torch.compile`` would trace and warn about. ``array_api_compat.numpy`` is ``numpy``."""
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    elif isinstance(obj, type):
        name = obj.__module__
    else:
        name = type(obj).__module__
    name = name.removeprefix("array_api_compat.").partition(".")[0]
    return "jax" if name == "jaxlib" else name


def kind(obj: Any) -> str:
    """``library.TypeName`` of ``obj``, for error messages."""
    return f"{type(obj).__module__.partition('.')[0]}.{type(obj).__name__}"


def device(x: Array) -> Any:
    """``x``'s device, ``None`` where it has none (a JAX tracer, a NumPy scalar)."""
    return getattr(x, "device", None)


def cpu(x: Array) -> bool:
    """Whether ``x`` is a NumPy array or a PyTorch CPU tensor: where the engine's host-driven
    extreme-cluster route pays (measured: benchmarks/RESULTS.md)."""
    lib = library(x)
    return lib == "numpy" or (lib == "torch" and x.device.type == "cpu")


def traced(x: Array) -> bool:
    """Whether ``x`` has no values to read: a PyTorch tensor while ``torch.compile`` traces, a
    fake or meta tensor, a JAX tracer."""
    lib = library(x)
    if lib == "jax":
        return isinstance(x, sys.modules["jax"].core.Tracer)
    if lib != "torch":
        return False
    torch = sys.modules["torch"]
    return torch.compiler.is_compiling() or x.device.type == "meta" or "Fake" in type(x).__name__


def quiet(x: Array) -> Any:
    """NumPy's floating-point warnings off for arithmetic on ``x`` (a no-op for libraries that do
    not warn): non-finite results there are documented values or reported by the caller."""
    if library(x) in ("numpy", "array_api_strict"):  # NumPy's ufuncs
        return np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore")
    return contextlib.nullcontext()


def to_host(x: Array) -> np.ndarray:
    """The one device-to-host read: ``x`` as a NumPy array, from any library and any device
    (NumPy arrays as they are, not copied; the others detached and copied)."""
    if isinstance(x, np.ndarray):
        return x
    lib = library(x)
    if lib == "torch":
        return x.numpy(force=True)  # detached, copied to the host where it is not there
    if lib == "cupy":
        return x.get()
    try:
        return np.asarray(x)
    except (RuntimeError, TypeError, ValueError):  # on another device: DLPack onto the CPU
        return np.from_dlpack(x, device="cpu")


def to_device(x: Any, like: Array, xp: Any, dtype: Any = None) -> Array:
    """A host array (or scalar) ``x`` as an array of ``xp`` on ``like``'s device, in ``dtype``
    (a NumPy dtype; default ``x``'s)."""
    return xp.asarray(np.asarray(x, dtype=dtype, order="C"), device=getattr(like, "device", None))


def eager(x: Array) -> bool:
    """``read`` callback for arrays whose values can be read: the value of a 0-d boolean."""
    return bool(x)


def readable(x: Array) -> bool | None:
    """The value of a 0-d boolean, or ``None`` where the library refuses to read it (a tracer,
    ``vmap``)."""
    try:
        return bool(x)
    except (TypeError, RuntimeError):
        return None
