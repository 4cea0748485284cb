"""The NumPy/SciPy path: the ``*_grad`` functions are the gradient for ``scipy.optimize``.

``scipy.optimize.minimize(fun, x0, jac=True)`` with ``fun`` returning ``(value, gradient)`` from
``condreg.r_ill``/``condreg.r_ill_grad`` drives the condition number of a small matrix up, and with
``condreg.r_well``/``condreg.r_well_grad`` drives it down to 1 (R_well is nonsmooth at a tied σ₁,
so that is done with a method made for it, an ε-subgradient descent).
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


def eps_subgradient_descent(S, *, eps=0.1, eps_min=1e-10, max_iter=1000):
    """Minimise R_well with a method made for nonsmooth functions (Goldstein's ε-subgradient).

    R_well is not differentiable where σ₁ is tied. ``r_well_grad(S, tie_rtol=eps)`` averages
    every singular value within ``eps`` of σ₁, which is the minimum-norm element of the convex
    hull of the gradients nearby (an ε-subgradient). Step along it with an Armijo line search;
    once it is shorter than ``eps·‖S‖_F`` (ε-stationary), shrink ``eps`` tenfold.
    Returns the final ``S`` and the number of iterations.
    """
    for it in range(max_iter):
        if eps < eps_min:
            return S, it
        g = condreg.r_well_grad(S, tie_rtol=eps)
        gg = float(np.sum(g * g))
        if np.sqrt(gg) <= eps * np.linalg.norm(S):
            eps /= 10
            continue
        f, t = float(condreg.r_well(S)), 1.0
        while float(condreg.r_well(S - t * g)) > f - 1e-4 * t * gg:
            t /= 2
            assert t > 1e-12, "no descent along -r_well_grad: not a descent direction"
        S = S - t * g
    raise AssertionError(f"not ε-stationary after {max_iter} iterations (eps = {eps:g})")


def test_minimizing_r_well_drives_kappa_to_one():
    """The ε-subgradient method reaches κ = 1 at a nonzero S, and S is stationary there in
    the nonsmooth sense: the minimum-norm ε-subgradient (ε = 1e-8) vanishes."""
    S, _ = eps_subgradient_descent(S0.copy())
    sigma = np.linalg.svd(S, compute_uv=False)
    assert sigma[-1] > 0.5  # not the trivial minimiser S = 0
    assert condreg.condition_number(S) < 1.0 + 1e-8
    assert condreg.r_well(S) < 1e-9 * condreg.r_well(S0)
    assert np.linalg.norm(condreg.r_well_grad(S, tie_rtol=1e-8)) < 1e-6


def test_bfgs_on_r_well_lowers_kappa_before_the_tie():
    """BFGS assumes smoothness, and R_well has a kink wherever σ₁ is tied: it may stop at a tie
    ("precision loss", scipy >= 1.17) short of κ = 1. Up to there the closed-form gradient
    still drives R_well and κ down substantially; the ε-subgradient method finishes the job."""
    fun = value_and_grad(condreg.r_well, condreg.r_well_grad, S0.shape)
    result = optimize.minimize(fun, S0.ravel(), jac=True, method="BFGS")
    S = result.x.reshape(S0.shape)
    assert condreg.r_well(S) < 0.05 * condreg.r_well(S0)
    assert condreg.condition_number(S) < 1.1  # kappa(S0) = 2
    S, _ = eps_subgradient_descent(S)
    assert condreg.condition_number(S) < 1.0 + 1e-8
    assert np.linalg.svd(S, compute_uv=False)[-1] > 0.5


def test_minimizing_r_well_of_the_gram_matrix():
    fun = value_and_grad(condreg.r_well, condreg.r_well_grad, S0.shape, gram=True)
    result = optimize.minimize(
        fun, S0.ravel(), jac=True, method="L-BFGS-B", options={"maxiter": 100}
    )
    S = result.x.reshape(S0.shape)
    kappa0 = condreg.condition_number(S0, gram=True)  # 4
    assert condreg.condition_number(S, gram=True) < 1.0 + 0.1 * (kappa0 - 1.0)
