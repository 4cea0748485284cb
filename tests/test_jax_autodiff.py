"""condreg inside JAX: the closed form through ``jax.custom_vjp``.

Covers eager ``jax.grad``, ``jit(grad)``, ``vmap(grad)``, reverse-over-reverse (Hessian-vector
products against finite differences of the closed-form gradient), float32 and float64,
unsupported forward mode (a clear ``TypeError``), eager errors and their skipping under ``jit``.
x64 is switched on only inside fixtures and restored afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from conftest import FUNCTIONS, NAMES  # noqa: E402

import condreg  # noqa: E402
import condreg.jax as condreg_jax  # noqa: E402
from condreg.testing import assert_close, matrix_with_spectrum  # noqa: E402

GRAM = pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])


def generic_np(m=4, n=3, *, seed=0, batch=None):
    p = min(m, n)
    values = np.linspace(2.5, 0.8, p)
    if batch is not None:
        values = np.stack([values * (1.0 + 0.25 * i) for i in range(batch)])
    return matrix_with_spectrum(values, m, n, seed=seed)


def close(actual, desired, rtol=1e-10):
    """``actual`` (any dtype) against a float64 reference, relative to the reference's scale."""
    actual = np.asarray(actual)
    desired = np.asarray(desired, dtype=actual.dtype)
    assert_close(actual, desired, rtol=rtol, atol=rtol * float(np.abs(desired).max()))


# --------------------------------------------------------------------------------------------
# First order: eager, jit, vmap
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_eager_grad_is_closed_form(x64, name):
    f, grad = FUNCTIONS[name]
    S = generic_np()
    g = jax.grad(f)(jnp.asarray(S))
    assert isinstance(g, jax.Array) and g.dtype == jnp.float64
    close(g, grad(S))
    value, g2 = jax.value_and_grad(f)(jnp.asarray(S))
    close(value, f(S))
    close(g2, grad(S))


@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_jit_grad_batched(x64, name, gram):
    f, grad = FUNCTIONS[name]
    S = generic_np(5, 3, batch=3)
    g = jax.jit(jax.grad(lambda X: f(X, gram=gram).sum()))(jnp.asarray(S))
    close(g, grad(S, gram=gram))


@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_vmap_grad(x64, name, gram):
    f, grad = FUNCTIONS[name]
    S = generic_np(3, 4, batch=4)
    g = jax.jit(jax.vmap(jax.grad(lambda X: f(X, gram=gram))))(jnp.asarray(S))
    close(g, grad(S, gram=gram))


def test_eager_vmap_grad(x64):
    S = generic_np(4, 3, batch=2)
    close(jax.vmap(jax.grad(condreg.r_ill))(jnp.asarray(S)), condreg.r_ill_grad(S))


def test_tied_extremes_min_norm(x64):
    S = matrix_with_spectrum([2.0, 2.0, 1.0, 1.0], 5, 4, seed=2)
    for f, grad in FUNCTIONS.values():
        close(jax.jit(jax.grad(f))(jnp.asarray(S)), grad(S, subgradient="min_norm"))


@pytest.mark.parametrize("name", NAMES)
def test_float32(x32, name):
    f, grad = FUNCTIONS[name]
    S = generic_np(4, 3)
    S32 = jnp.asarray(S, dtype=jnp.float32)
    for g in (jax.grad(f)(S32), jax.jit(jax.grad(f))(S32)):
        assert g.dtype == jnp.float32
        close(g, grad(S), rtol=1e-4)
    assert f(S32).dtype == jnp.float32


# --------------------------------------------------------------------------------------------
# Second order (reverse over reverse)
# --------------------------------------------------------------------------------------------


@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_grad_of_grad_hvp_matches_finite_differences(x64, name, gram):
    f, grad = FUNCTIONS[name]
    S, V = generic_np(4, 3, seed=3), generic_np(4, 3, seed=4)

    @jax.jit
    def hvp(X, W):
        return jax.grad(lambda Y: jnp.vdot(jax.grad(lambda Z: f(Z, gram=gram))(Y), W))(X)

    h = 1e-3
    fd = (
        -grad(S + 2 * h * V, gram=gram)
        + 8 * grad(S + h * V, gram=gram)
        - 8 * grad(S - h * V, gram=gram)
        + grad(S - 2 * h * V, gram=gram)
    ) / (12 * h)
    close(hvp(jnp.asarray(S), jnp.asarray(V)), fd, rtol=1e-7)


# --------------------------------------------------------------------------------------------
# Forward mode: unsupported, with a clear error
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, S: jax.jvp(f, (S,), (S,)),
        lambda f, S: jax.jacfwd(f)(S),
        lambda f, S: jax.linearize(f, S)[1](S),
        lambda f, S: jax.jit(jax.jacfwd(f))(S),
    ],
    ids=["jvp", "jacfwd", "linearize", "jit-jacfwd"],
)
def test_forward_mode_raises_type_error(x64, transform):
    S = jnp.asarray(generic_np())
    with pytest.raises(TypeError, match="forward-mode"):
        transform(condreg.r_ill, S)


def test_forward_over_reverse_hessian(x64):
    """Only the backward rule is differentiated in forward mode, so ``jax.hessian`` works: the
    Hessian is symmetric and its action equals central differences of the closed-form gradient."""
    S, V = generic_np(3, 3, seed=2), generic_np(3, 3, seed=5)
    h = 1e-3
    for f, grad in FUNCTIONS.values():
        H = np.asarray(jax.jit(jax.hessian(f))(jnp.asarray(S)))
        flat = H.reshape(9, 9)
        close(flat, flat.T)
        fd = (
            -grad(S + 2 * h * V) + 8 * grad(S + h * V) - 8 * grad(S - h * V) + grad(S - 2 * h * V)
        ) / (12 * h)
        close(np.tensordot(H, V, axes=2), fd, rtol=1e-7)


# --------------------------------------------------------------------------------------------
# Checks: eager errors; skipped under jit without breaking the trace
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_nan_input_raises_eagerly_and_is_skipped_under_jit(x64, name):
    f = FUNCTIONS[name][0]
    S = generic_np()
    S[1, 1] = np.nan
    S = jnp.asarray(S)
    with pytest.raises(ValueError, match="NaN or Inf"):
        f(S)
    with pytest.raises(ValueError, match="NaN or Inf"):
        jax.grad(f)(S)
    value, g = jax.jit(jax.value_and_grad(f))(S)  # traced: no check, no error
    assert not np.isfinite(np.asarray(g)).all()


@pytest.mark.parametrize("name", NAMES)
def test_zero_matrix_raises_rank_error_eagerly(x64, name):
    f = FUNCTIONS[name][0]
    Z = jnp.zeros((3, 3))
    with pytest.raises(condreg.RankError):
        f(Z)
    with pytest.raises(condreg.RankError):
        jax.grad(f)(Z)
    jax.jit(jax.grad(f))(Z)  # traced: no error


@pytest.mark.parametrize("spectrum", [[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]], ids=["kappa-1", "rank-1"])
def test_r_ill_pole_value_inf_grad_raises(x64, spectrum):
    P = jnp.asarray(matrix_with_spectrum(spectrum, 4, 3, seed=1))
    value = condreg.r_ill(P)
    assert np.isposinf(np.asarray(value))
    with pytest.raises(condreg.PoleError):
        jax.grad(condreg.r_ill)(P)
    with pytest.raises(condreg.PoleError):
        jax.grad(lambda X: condreg.r_ill(X).sum())(jnp.stack([P, jnp.asarray(generic_np())]))
    # under jit the check is skipped (documented): the gradient is not finite
    g = jax.jit(jax.grad(condreg.r_ill))(P)
    assert not np.isfinite(np.asarray(g)).all()


def test_check_finite_false_reads_no_value(x64, monkeypatch):
    def forbidden(x):
        raise AssertionError("a value check ran with check_finite=False")

    monkeypatch.setattr(condreg_jax, "concrete", forbidden)
    S = jnp.asarray(generic_np())
    for f, grad in FUNCTIONS.values():
        close(jax.grad(lambda X, f=f: f(X, check_finite=False))(S), grad(np.asarray(S)))
    # invalid input then gives inf/NaN instead of an error
    g = jax.grad(lambda X: condreg.r_ill(X, check_finite=False))(jnp.eye(3))
    assert not np.isfinite(np.asarray(g)).all()


def test_checks_run_eagerly(x64, monkeypatch):
    """Eagerly one host read in the forward (the engine's ``to_host``: values, checks, pole) and
    the pole, read back in the backward; under ``jit`` nothing is read."""
    from condreg import _backend

    reads, calls = [], []
    original, host = condreg_jax.concrete, _backend.to_host

    def counting(x):
        calls.append(original(x))
        return calls[-1]

    monkeypatch.setattr(condreg_jax, "concrete", counting)
    monkeypatch.setattr(_backend, "to_host", lambda x: (reads.append(x.shape), host(x))[1])
    jax.grad(condreg.r_ill)(jnp.asarray(generic_np()))
    assert len(reads) == 1 and calls == [False]
    reads.clear(), calls.clear()
    jax.jit(jax.grad(condreg.r_ill))(jnp.asarray(generic_np(seed=9)))
    assert reads == [] and all(c is None for c in calls)  # abstract under jit
