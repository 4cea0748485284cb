"""One test body over NumPy, PyTorch and JAX: values and gradients equal the core's closed form.

For every public value function (``condition_number``, ``r_well``, ``r_ill``) and every backend,
the value and the gradient obtained the backend's own way — NumPy: the ``*_grad`` function;
PyTorch: ``.backward()`` through :mod:`condreg.torch`; JAX: ``jax.jit(jax.grad(...))``
through :mod:`condreg.jax` (eager JAX is in ``test_jax_autodiff.py``) — equal the core's closed
form ``condreg.*_grad`` evaluated on the same matrix in NumPy float64, to 1e-10 relative
(elementwise ``rtol`` plus ``atol`` = 1e-10 × the largest entry, so that near-zero gradient
entries are compared relative to the gradient's scale).

Points: generic (tall, wide, square), tied extremes (where the closed form is the minimum-norm
subgradient, and autodiff through ``svdvals`` returns whatever basis element the decomposition
picked), rank-deficient, batched, and each with ``gram=True``.

The test body is the abstract class :class:`AdapterContract`; ``TestNumpy``, ``TestTorch`` and
``TestJax`` subclass it and only say how to build their backend (``make_backend``).
"""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest
from conftest import FUNCTIONS

from condreg.testing import assert_close, matrix_with_spectrum, to_numpy

RTOL = 1e-10

# name: (singular values — a 2-D array makes a batch —, m, n)
CASES = {
    "generic-tall": ([3.0, 2.0, 1.3, 0.7], 6, 4),
    "generic-wide": ([2.5, 1.5, 0.8], 3, 5),
    "generic-square": ([4.0, 2.5, 1.5, 1.0], 4, 4),
    "tied-top": ([2.0, 2.0, 1.2, 0.6], 5, 4),
    "tied-bottom": ([3.0, 1.7, 0.8, 0.8], 5, 4),
    "tied-both": ([2.0, 2.0, 1.0, 1.0], 4, 4),
    "tied-top-triple": ([1.5, 1.5, 1.5, 0.5], 4, 5),
    "rank-deficient": ([3.0, 1.5, 0.6, 0.0], 5, 4),
    "rank-deficient-two-zeros": ([2.4, 1.1, 0.0, 0.0], 4, 4),
    "batched": ([[3.0, 2.0, 1.0], [2.0, 2.0, 1.0], [4.0, 1.0, 1.0], [2.0, 0.5, 0.0]], 4, 3),
}


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------


class NumpyBackend:
    name = "numpy"

    def asarray(self, S: np.ndarray):
        return np.asarray(S, dtype=np.float64)

    def value_and_grad(self, name: str, S, **kwargs):
        value, grad = FUNCTIONS[name]
        return value(S, **kwargs), grad(S, **kwargs)

    def is_native(self, x) -> bool:
        return isinstance(x, np.ndarray) or isinstance(x, np.floating)


class TorchBackend:
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def asarray(self, S: np.ndarray):
        return self.torch.asarray(S, dtype=self.torch.float64)

    def value_and_grad(self, name: str, S, **kwargs):
        X = S.detach().clone().requires_grad_(True)
        out = FUNCTIONS[name][0](X, **kwargs)
        # condreg's one closed-form Function, not autodiff through a decomposition
        assert type(out.grad_fn).__name__ == "_SpectralValueWithJvpBackward", out.grad_fn
        out.sum().backward()
        return out.detach(), X.grad

    def is_native(self, x) -> bool:
        return isinstance(x, self.torch.Tensor)

    def closed_form_any(self, name: str, S):
        return FUNCTIONS[name][1](S, subgradient="any")

    def naive_grad(self, f, S):
        """Gradient by PyTorch's own autodiff through ``torch.linalg.svdvals``."""
        X = S.detach().clone().requires_grad_(True)
        f(X, self.torch.linalg.svdvals(X)).backward()
        return X.grad


class JaxBackend:
    name = "jax"

    def __init__(self) -> None:
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp

    def asarray(self, S: np.ndarray):
        return self.jnp.asarray(S, dtype=self.jnp.float64)

    def value_and_grad(self, name: str, S, **kwargs):
        # jit-compiled, once per function and options (eager JAX dispatches and compiles op by
        # op, which is slow); eager behaviour is covered in test_jax_autodiff.py.
        return _jax_value_and_grad(name, tuple(sorted(kwargs.items())))(S)

    def is_native(self, x) -> bool:
        return isinstance(x, self.jax.Array)

    def closed_form_any(self, name: str, S):
        return _jax_jit(FUNCTIONS[name][1], subgradient="any")(S)

    def naive_grad(self, f, S):
        """Gradient by JAX's own autodiff through ``jnp.linalg.svdvals``."""
        return _jax_jit(self.jax.grad(lambda X: f(X, self.jnp.linalg.svdvals(X))))(S)


@functools.cache
def _jax_value_and_grad(name: str, options: tuple):
    import jax

    f, kwargs = FUNCTIONS[name][0], dict(options)

    def value_and_grad(X):
        return f(X, **kwargs), jax.grad(lambda Y: f(Y, **kwargs).sum())(X)

    return jax.jit(value_and_grad)


def _jax_jit(f, **kwargs):
    import jax

    return jax.jit(functools.partial(f, **kwargs))


def _reference(name: str, S: np.ndarray, **kwargs):
    value, grad = FUNCTIONS[name]
    return value(S, **kwargs), grad(S, **kwargs)


def _assert_matches(actual, desired, what: str) -> None:
    actual, desired = to_numpy(actual), np.asarray(desired)
    scale = float(np.max(np.abs(desired))) if desired.size else 0.0
    assert actual.dtype == np.float64, (what, actual.dtype)
    assert_close(actual, desired, rtol=RTOL, atol=RTOL * scale, err_msg=what)


# --------------------------------------------------------------------------------------------
# The shared body
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Tied extremes: the minimum-norm subgradient versus autodiff through svdvals
# --------------------------------------------------------------------------------------------


def _rotate_tied_block(factors, block: slice, theta: float) -> np.ndarray:
    """The same matrix (up to rounding) written with a rotated basis of a tied block."""
    c, s = np.cos(theta), np.sin(theta)
    R = np.array([[c, -s], [s, c]])
    U, V = factors.U.copy(), factors.V.copy()
    U[:, block] = U[:, block] @ R
    V[:, block] = V[:, block] @ R
    return U @ (factors.s[:, None] * V.T)


# quantity-extreme: (spectrum, the tied block)
TIE_CASES = {
    "r_well-top": ([2.0, 2.0, 1.2, 0.6], slice(0, 2)),
    "r_ill-bottom": ([3.0, 1.7, 0.8, 0.8], slice(2, 4)),
    "condition_number-top": ([2.0, 2.0, 1.2, 0.6], slice(0, 2)),
    "condition_number-bottom": ([3.0, 1.7, 0.8, 0.8], slice(2, 4)),
}


def _naive(name: str, p: int):
    """The quantity written directly on the singular values (full rank ``p``)."""

    def r_well(S, s):
        return 0.5 * s[0] ** 2 - (s**2).sum() / (2 * p)

    def r_ill(S, s):
        return 1.0 / ((s**2).sum() / (2 * p) - 0.5 * s[p - 1] ** 2)

    def condition_number(S, s):
        return s[0] / s[p - 1]

    return {"r_well": r_well, "r_ill": r_ill, "condition_number": condition_number}[name]


# --------------------------------------------------------------------------------------------
# The shared test body, subclassed per framework
# --------------------------------------------------------------------------------------------


class AdapterContract:
    """Values and gradients obtained the backend's own way equal the core's closed form."""

    @staticmethod
    def make_backend(request):  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def backend(self, request):
        return self.make_backend(request)

    @pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
    @pytest.mark.parametrize("case", list(CASES))
    @pytest.mark.parametrize("name", list(FUNCTIONS))
    def test_value_and_gradient_equal_closed_form(self, backend, name, case, gram):
        values, m, n = CASES[case]
        S_np = matrix_with_spectrum(values, m, n, seed=7)
        S = backend.asarray(S_np)
        value, grad = backend.value_and_grad(name, S, gram=gram)
        ref_value, ref_grad = _reference(name, S_np, gram=gram)

        assert backend.is_native(value) and backend.is_native(grad)
        assert tuple(value.shape) == S_np.shape[:-2]
        assert tuple(grad.shape) == S_np.shape
        _assert_matches(value, ref_value, f"{backend.name} {name} value")
        _assert_matches(grad, ref_grad, f"{backend.name} {name} gradient")

    @pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
    @pytest.mark.parametrize("name", list(FUNCTIONS))
    def test_batched_gradient_is_per_matrix_gradient(self, backend, name, gram):
        """A batch ``(2, 3, m, n)``: the gradient of the summed values is each matrix's own."""
        spectra = np.array([[3.0, 2.0, 1.0], [2.0, 2.0, 1.0], [3.0, 1.0, 1.0]] * 2)
        S_np = matrix_with_spectrum(spectra, 5, 3, seed=11).reshape(2, 3, 5, 3)
        value, grad = backend.value_and_grad(name, backend.asarray(S_np), gram=gram)
        assert tuple(value.shape) == (2, 3)
        for i in np.ndindex(2, 3):
            ref_value, ref_grad = _reference(name, S_np[i], gram=gram)
            _assert_matches(to_numpy(value)[i], ref_value, f"value {i}")
            _assert_matches(to_numpy(grad)[i], ref_grad, f"gradient {i}")

    @pytest.mark.parametrize("tie", list(TIE_CASES))
    def test_tied_extreme_min_norm_versus_autodiff_through_svdvals(self, backend, tie):
        """At a tied extreme the adapters return the basis-independent minimum-norm subgradient.

        PyTorch's and JAX's own autodiff through ``svdvals`` returns the rank-one element
        ``u vᵀ`` of the singular pair the decomposition happened to put first — the same as
        condreg's ``subgradient="any"`` — which depends on the basis LAPACK picked for the tied
        block; condreg's gradient is the average ``(1/r) U_J V_Jᵀ`` and does not change when the
        tied block's basis is rotated (the matrix changes only by rounding).
        """
        name = tie.split("-")[0]
        values, block = TIE_CASES[tie]
        if not hasattr(backend, "naive_grad"):
            pytest.skip(f"{backend.name} has no autodiff to compare with")
        S_np, factors = matrix_with_spectrum(values, 5, 4, seed=3, return_factors=True)
        p = 4
        S = backend.asarray(S_np)
        _, grad = backend.value_and_grad(name, S)
        naive = to_numpy(backend.naive_grad(_naive(name, p), S))
        grad = to_numpy(grad)

        # condreg = the minimum-norm closed form, built here from the exact factors.
        min_norm = FUNCTIONS[name][1](S_np)
        _assert_matches(grad, min_norm, "min-norm subgradient")
        any_element = to_numpy(backend.closed_form_any(name, S))
        _assert_matches(
            naive, any_element, "autodiff through svdvals = the decomposition's element"
        )

        # The two differ by a multiple of (u_1 v_1ᵀ − u_2 v_2ᵀ)/2 within the tied block: large.
        difference = naive - grad
        assert np.linalg.norm(difference) > 0.1 * np.linalg.norm(grad)
        U_J, V_J = factors.U[:, block], factors.V[:, block]
        projected = U_J @ (U_J.T @ difference @ V_J) @ V_J.T
        np.testing.assert_allclose(projected, difference, atol=1e-10 * np.linalg.norm(grad))
        # On the tied block, condreg's gradient is U_J (c I) V_Jᵀ (the average of the tied rank-one
        # terms); autodiff's is U_J (c' I + w e eᵀ) V_Jᵀ: one basis direction e singled out.
        Z_condreg = U_J.T @ grad @ V_J
        Z_naive = U_J.T @ naive @ V_J
        np.testing.assert_allclose(
            Z_condreg, Z_condreg[0, 0] * np.eye(2), atol=1e-10 * np.abs(grad).max()
        )
        np.testing.assert_allclose(
            np.trace(Z_naive), np.trace(Z_condreg), atol=1e-10 * np.abs(grad).max()
        )
        spread = np.ptp(np.linalg.eigvalsh(0.5 * (Z_naive + Z_naive.T)))
        assert spread > 0.1 * np.abs(grad).max()

        # Rotating the tied block's basis changes S by rounding only, condreg's gradient not at all.
        for theta in (0.3, 0.7, 2.0):
            S_rot = _rotate_tied_block(factors, block, theta)
            np.testing.assert_allclose(S_rot, S_np, atol=1e-14)
            _, grad_rot = backend.value_and_grad(name, backend.asarray(S_rot))
            _assert_matches(grad_rot, grad, f"gradient after rotating the tied basis by {theta}")

    @pytest.mark.parametrize("name", list(FUNCTIONS))
    def test_value_keeps_backend_type_and_dtype(self, backend, name):
        S = backend.asarray(matrix_with_spectrum([3.0, 2.0, 1.0], 4, 3, seed=1))
        value = FUNCTIONS[name][0](S)
        assert backend.is_native(value)
        assert value.dtype == S.dtype


class TestNumpy(AdapterContract):
    @staticmethod
    def make_backend(request):
        return NumpyBackend()


class TestTorch(AdapterContract):
    @staticmethod
    def make_backend(request):
        pytest.importorskip("torch")
        return TorchBackend()


class TestJax(AdapterContract):
    @staticmethod
    def make_backend(request):
        pytest.importorskip("jax")
        request.getfixturevalue("x64")
        return JaxBackend()


# --------------------------------------------------------------------------------------------
# Dispatch and imports
# --------------------------------------------------------------------------------------------


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_import_condreg_imports_no_framework():
    code = (
        "import sys, numpy as np, condreg\n"
        "S = np.arange(12.0).reshape(4, 3) ** 1.5\n"
        "condreg.r_ill(S); condreg.r_well_grad(S); condreg.condition_number(S, gram=True)\n"
        "loaded = [m for m in ('torch', 'jax', 'jaxlib', 'condreg.torch', 'condreg.jax')"
        " if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_missing_framework_fails_at_adapter_import_with_install_hint(framework):
    code = (
        f"import sys; sys.modules[{framework!r}] = None\n"
        "import condreg\n"
        "try:\n"
        f"    import condreg.{framework}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr + result.stdout
    assert f"pip install {framework}" in result.stdout
