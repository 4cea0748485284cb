"""The NumPy/SciPy path: the ``*_grad`` functions are the gradient for ``scipy.optimize``.

``scipy.optimize.minimize(fun, x0, jac=True)`` with ``fun`` returning ``(value, gradient)`` from
``condreg.r_ill``/``condreg.r_ill_grad`` drives the condition number of a small matrix up, and with
``condreg.r_well``/``condreg.r_well_grad`` drives it down to 1.
"""

from __future__ import annotations

import numpy as np
import pytest

optimize = pytest.importorskip("scipy.optimize")

import condreg  # noqa: E402
from condreg.testing import matrix_with_spectrum  # noqa: E402

S0 = matrix_with_spectrum([2.0, 1.5, 1.0], 4, 3, seed=0)  # kappa(S0) = 2


def value_and_grad(value, grad, shape, **kwargs):
    """``fun`` for ``minimize(..., jac=True)`` over the flattened matrix."""

    def fun(x):
        S = x.reshape(shape)
        return float(value(S, **kwargs)), grad(S, **kwargs).ravel()

    return fun


@pytest.mark.parametrize(
    "value, grad",
    [
        (condreg.r_ill, condreg.r_ill_grad),
        (condreg.r_well, condreg.r_well_grad),
        (condreg.condition_number, condreg.condition_number_grad),
    ],
    ids=["r_ill", "r_well", "condition_number"],
)
@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
def test_scipy_check_grad(value, grad, gram):
    fun = value_and_grad(value, grad, S0.shape, gram=gram)
    x0 = S0.ravel()
    error = optimize.check_grad(lambda x: fun(x)[0], lambda x: fun(x)[1], x0)
    assert error < 1e-6 * max(1.0, np.linalg.norm(fun(x0)[1]))


@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
def test_minimizing_r_ill_raises_kappa(gram):
    fun = value_and_grad(condreg.r_ill, condreg.r_ill_grad, S0.shape, gram=gram)
    result = optimize.minimize(fun, S0.ravel(), jac=True, method="BFGS", options={"maxiter": 50})
    S = result.x.reshape(S0.shape)
    assert result.fun < 0.2 * fun(S0.ravel())[0]
    kappa0 = condreg.condition_number(S0, gram=gram)
    assert condreg.condition_number(S, gram=gram) > 3.0 * kappa0


def test_minimizing_r_ill_at_fixed_norm_makes_s_ill_conditioned():
    """R_ill is scale-dependent: part of its decrease above is growth of ‖S‖. On the sphere
    ‖S‖_F = ‖S0‖_F (S = c·x/‖x‖, chain rule by hand) only sigma_k can give way: kappa explodes."""
    c = np.linalg.norm(S0)

    def fun(x):
        n = np.linalg.norm(x)
        S = (c * x / n).reshape(S0.shape)
        G = condreg.r_ill_grad(S).ravel()
        return float(condreg.r_ill(S)), (c / n) * (G - x * (x @ G) / n**2)

    result = optimize.minimize(fun, S0.ravel(), jac=True, method="BFGS", options={"maxiter": 50})
    S = c * result.x.reshape(S0.shape) / np.linalg.norm(result.x)
    assert np.isclose(np.linalg.norm(S), c)
    assert condreg.condition_number(S) > 1e3


def test_minimizing_r_well_drives_kappa_to_one():
    fun = value_and_grad(condreg.r_well, condreg.r_well_grad, S0.shape)
    result = optimize.minimize(fun, S0.ravel(), jac=True, method="BFGS")
    assert result.success, result.message
    S = result.x.reshape(S0.shape)
    sigma = np.linalg.svd(S, compute_uv=False)
    assert sigma[-1] > 0.5  # not the trivial minimiser S = 0
    assert condreg.condition_number(S) < 1.0 + 1e-6
    assert condreg.r_well(S) < 1e-10


def test_minimizing_r_well_of_the_gram_matrix():
    fun = value_and_grad(condreg.r_well, condreg.r_well_grad, S0.shape, gram=True)
    result = optimize.minimize(
        fun, S0.ravel(), jac=True, method="L-BFGS-B", options={"maxiter": 100}
    )
    S = result.x.reshape(S0.shape)
    kappa0 = condreg.condition_number(S0, gram=True)  # 4
    assert condreg.condition_number(S, gram=True) < 1.0 + 0.1 * (kappa0 - 1.0)
