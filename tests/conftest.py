"""Shared fixtures: one test body, every backend.

``backend`` is parametrised over the array libraries condreg supports (ids such as
``numpy-float64``, ``array_api_strict-float64-strict``, ``torch-cpu-float32``, ``jax-float64``).
Frameworks are imported lazily (``pytest.importorskip``), so the suite runs with whatever is
installed. Global state that a backend needs (array-api-strict flags, JAX's x64 mode) is set for the
duration of one test and restored afterwards — never at import.

Hypothesis profiles: ``fast`` (default) and ``deep``, chosen with ``HYPOTHESIS_PROFILE=deep``.
"""

from __future__ import annotations

import contextlib
import enum
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import condreg
from condreg.testing import matrix_with_spectrum, to_numpy

settings.register_profile(
    "fast",
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "deep",
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))


@dataclass
class Backend:
    """An array library, dtype and device to run a shared test body on.

    ``xp`` is the Array API namespace (array-api-compat's wrapper for torch), ``dtype`` the
    floating dtype of the test inputs, ``device`` the device (``None``: the default).
    ``rtol`` is the tolerance for comparing values against a float64 NumPy reference on
    moderately conditioned inputs (kappa <= ~10).
    """

    name: str
    xp: Any
    dtype: Any
    device: Any = None
    float64: bool = True
    rtol: float = field(default=1e-10)

    def matrix(self, singular_values, m, n, *, seed=0, return_factors=False):
        """:func:`condreg.testing.matrix_with_spectrum` in this backend."""
        return matrix_with_spectrum(
            singular_values,
            m,
            n,
            seed=seed,
            xp=self.xp,
            dtype=self.dtype,
            device=self.device,
            return_factors=return_factors,
        )

    def asarray(self, a):
        """``a`` (NumPy or nested lists) in this backend's namespace, dtype and device."""
        kwargs = {"dtype": self.dtype}
        if self.device is not None:
            kwargs["device"] = self.device
        return self.xp.asarray(np.asarray(a, dtype=np.float64), **kwargs)

    def numpy(self, x) -> np.ndarray:
        return to_numpy(x)

    @property
    def eps(self) -> float:
        return float(np.finfo(np.float64 if self.float64 else np.float32).eps)

    def default_rtol(self, m: int, n: int) -> float:
        """condreg's default rank tolerance ``max(m, n) * eps`` for this backend's dtype."""
        return max(m, n) * self.eps

    def __repr__(self) -> str:
        return self.name


def _numpy():
    return Backend("numpy-float64", np, np.float64)


def _numpy32():
    return Backend("numpy-float32", np, np.float32, float64=False, rtol=2e-4)


@contextlib.contextmanager
def _strict(profile: str):
    xp = pytest.importorskip("array_api_strict")
    saved = xp.get_array_api_strict_flags()
    try:
        if profile == "strict":
            xp.set_array_api_strict_flags(boolean_indexing=False, data_dependent_shapes=False)
        name = "array_api_strict-float64" + ("-strict" if profile == "strict" else "")
        yield Backend(name, xp, xp.float64)
    finally:
        xp.set_array_api_strict_flags(**saved)


def _torch(device: str, dtype_name: str):
    torch = pytest.importorskip("torch")
    from array_api_compat import array_namespace

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    xp = array_namespace(torch.empty(0))
    dtype = getattr(torch, dtype_name)
    single = dtype_name == "float32"
    return Backend(
        f"torch-{device}-{dtype_name}",
        xp,
        dtype,
        device=torch.device(device),
        float64=not single,
        rtol=2e-4 if single else 1e-10,
    )


@contextlib.contextmanager
def _jax(dtype_name: str):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    if dtype_name == "float64":
        with enable_x64(jax):
            yield Backend("jax-float64", jnp, jnp.float64)
    else:
        yield Backend("jax-float32", jnp, jnp.float32, float64=False, rtol=2e-4)


@contextlib.contextmanager
def enable_x64(jax=None):
    """Enable JAX's float64 for the duration of the block, and restore the previous setting."""
    if jax is None:
        jax = pytest.importorskip("jax")
    manager = getattr(jax, "enable_x64", None)
    if manager is not None and callable(manager):
        with manager(True):
            yield
        return
    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


class Library(enum.Enum):
    """The array libraries the suite enumerates (the one backend enumeration; ``BACKENDS``
    below pairs each with its dtypes and devices)."""

    NUMPY = "numpy"
    ARRAY_API_STRICT = "array_api_strict"
    TORCH = "torch"
    JAX = "jax"

    @classmethod
    def of(cls, backend_name: str) -> Library:
        return cls(backend_name.split("-")[0])


BACKENDS = [
    pytest.param("numpy-float64", id="numpy-float64"),
    pytest.param("numpy-float32", id="numpy-float32"),
    pytest.param("array_api_strict-float64", id="array_api_strict-float64"),
    pytest.param("array_api_strict-float64-strict", id="array_api_strict-float64-strict"),
    pytest.param("torch-cpu-float64", id="torch-cpu-float64"),
    pytest.param("torch-cpu-float32", id="torch-cpu-float32"),
    pytest.param("torch-cuda-float64", id="torch-cuda-float64", marks=pytest.mark.cuda),
    pytest.param("torch-cuda-float32", id="torch-cuda-float32", marks=pytest.mark.cuda),
    pytest.param("jax-float32", id="jax-float32"),
    pytest.param("jax-float64", id="jax-float64"),
]


@contextlib.contextmanager
def make_backend(name: str):
    """Context manager yielding the :class:`Backend` called ``name`` (see ``BACKENDS``)."""
    library = Library.of(name)
    if library is Library.NUMPY:
        yield _numpy() if name == "numpy-float64" else _numpy32()
    elif library is Library.ARRAY_API_STRICT:
        with _strict("strict" if name.endswith("-strict") else "default") as b:
            yield b
    elif library is Library.TORCH:
        _, device, dtype_name = name.split("-")
        yield _torch(device, dtype_name)
    else:
        with _jax(name.split("-")[1]) as b:
            yield b


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Every backend (namespace, dtype, device), float32 and float64."""
    with make_backend(request.param) as b:
        yield b


@pytest.fixture(params=[p for p in BACKENDS if "float32" not in p.values[0]])
def backend64(request):
    """Every float64 backend (for tight comparisons and finite differences)."""
    with make_backend(request.param) as b:
        yield b


@pytest.fixture
def x64():
    """JAX float64 for the duration of the test (restored afterwards). The one x64 fixture of
    the suite."""
    with enable_x64():
        yield


@pytest.fixture
def x32():
    """JAX's default 32-bit mode for one test, whatever the session's setting (restored)."""
    jax = pytest.importorskip("jax")
    previous = bool(jax.config.read("jax_enable_x64"))
    jax.config.update("jax_enable_x64", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


@pytest.fixture
def torch_one_thread():
    """One torch thread for the test (restored afterwards): the small models and matrices of
    the torch tests run fastest on one thread and are immune to a busy machine. A module
    opts in with ``pytestmark = pytest.mark.usefixtures("torch_one_thread")``."""
    torch = pytest.importorskip("torch")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# --------------------------------------------------------------------------------------------
# The public functions, once for every test module: name -> (value function, closed form)
# --------------------------------------------------------------------------------------------

FUNCTIONS = {
    "condition_number": (condreg.condition_number, condreg.condition_number_grad),
    "r_well": (condreg.r_well, condreg.r_well_grad),
    "r_ill": (condreg.r_ill, condreg.r_ill_grad),
}
NAMES = list(FUNCTIONS)


# --------------------------------------------------------------------------------------------
# An independent float64 NumPy reference (written from docs/math.md, not from condreg's core)
# --------------------------------------------------------------------------------------------

QUANTITIES = ("condition_number", "r_well", "r_ill")


def reference(quantity: str, S, *, rtol: float | None = None, gram: bool = False) -> np.ndarray:
    """kappa, R_well or R_ill of ``S`` (or of ``SᵀS`` when ``gram``), per matrix of a batch.

    numpy.linalg.svd in float64 for the singular values, ‖·‖_F from the entries, rank
    k = #{sigma_i > rtol * sigma_1} with rtol = max(m, n) * eps(float64) by default.
    """
    S = to_numpy(S).astype(np.float64)
    batch = S.shape[:-2]
    flat = S.reshape((-1,) + S.shape[-2:])
    out = np.empty(len(flat))
    for i, A in enumerate(flat):
        m, n = A.shape
        s = np.linalg.svd(A, compute_uv=False)
        tol = (max(m, n) * np.finfo(np.float64).eps) if rtol is None else rtol
        k = int(np.sum(s > tol * s[0]))
        if gram:
            H = A.T @ A
            mu, fro2, p = s**2, float(np.sum(H * H)), n
        else:
            mu, fro2, p = s, float(np.sum(A * A)), min(m, n)
        if quantity == "condition_number":
            out[i] = mu[0] / mu[k - 1]
        elif quantity == "r_well":
            out[i] = 0.5 * mu[0] ** 2 - fro2 / (2 * p)
        elif quantity == "r_ill":
            den = fro2 / (2 * k) - 0.5 * mu[k - 1] ** 2
            out[i] = np.inf if den <= 0 else 1.0 / den
        else:  # pragma: no cover
            raise ValueError(quantity)
    return out.reshape(batch)


def spectral_parts(S) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 NumPy thin SVD ``(U, s, Vt)`` of one matrix."""
    return np.linalg.svd(to_numpy(S).astype(np.float64), full_matrices=False)


def conditioned_rtol(kappa: float, dtype=np.float64, *, factor: float = 100.0) -> float:
    """Relative tolerance for two routes to the same gradient of a matrix with condition number
    ``kappa``: the rounding of a decomposition-based gradient grows like ``kappa * eps`` (two
    kernels, or two CPUs, round differently), so a fixed ``rtol`` that holds at kappa = 10 fails
    at kappa = 1e6 on another machine. ``factor`` covers the dimension and the few operations
    after the decomposition; the floor keeps well-conditioned cases tight."""
    eps = float(np.finfo(dtype).eps)
    return max(factor * float(kappa) * eps, 1e3 * eps)
