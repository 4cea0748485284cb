"""condreg.torch.nn: the regularizer module and the K⁻¹-left "dummy layer" in a plain loop."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import condreg  # noqa: E402
from condreg.algorithm import preconditioned_gradient  # noqa: E402
from condreg.metrics import rir  # noqa: E402
from condreg.torch.nn import ConditionRegularizer, Precondition, precondition  # noqa: E402


def _pair(seed=0, N=60, D=6):
    rng = np.random.default_rng(seed)
    X_p = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -1, D))
    Q, _ = np.linalg.qr(rng.standard_normal((D, D)))
    X_h = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -1, D)) @ Q.T
    y = X_p @ rng.standard_normal(D)
    return X_p, y, X_h


def _t(a):
    return torch.as_tensor(a, dtype=torch.float64)


def test_precondition_is_identity_forward_and_left_k_inverse_backward():
    X_p, _, X_h = _pair()
    rng = np.random.default_rng(1)
    theta = _t(np.eye(6) + 0.1 * rng.standard_normal((6, 6))).requires_grad_()
    for X, q, fn in ((X_p, "r_well", condreg.r_well), (X_h, "r_ill", condreg.r_ill)):
        x = _t(X)
        F = x @ theta
        G = precondition(F, x, ridge=0.0)
        assert torch.equal(G, F)
        (g,) = torch.autograd.grad(fn(G, gram=True), theta)
        expected = preconditioned_gradient(theta.detach().numpy(), X, q)
        np.testing.assert_allclose(g.numpy(), expected, rtol=1e-9, atol=1e-12)
        # without the dummy layer: the plain gradient 2KθG
        (plain,) = torch.autograd.grad(fn(x @ theta, gram=True), theta)
        np.testing.assert_allclose(plain.numpy(), X.T @ X @ expected, rtol=1e-8, atol=1e-10)


def test_precondition_with_ridge_and_with_fewer_samples_than_features():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((4, 7))  # N < D: K singular, the pseudo-inverse / ridge are needed
    theta = _t(np.eye(7) + 0.1 * rng.standard_normal((7, 7))).requires_grad_()
    x = _t(X)
    for ridge in (0.0, 1e-3):
        (g,) = torch.autograd.grad(
            condreg.r_well(Precondition(ridge)(x @ theta, x), gram=True), theta
        )
        expected = preconditioned_gradient(theta.detach().numpy(), X, "r_well", ridge=ridge or None)
        np.testing.assert_allclose(g.numpy(), expected, rtol=1e-8, atol=1e-12)


def test_regularizer_module_values_and_normalisation():
    X_p, _, X_h = _pair(3)
    Fp, Fh = _t(X_p), _t(X_h)
    plain = ConditionRegularizer(2.0, 3.0, normalize=False)
    value = plain(Fp, Fh)
    expected = 2.0 * condreg.r_well(X_p, gram=True) + 3.0 * condreg.r_ill(X_h, gram=True)
    np.testing.assert_allclose(float(value), expected, rtol=1e-10)
    norm = ConditionRegularizer(2.0, 3.0)
    np.testing.assert_allclose(float(norm(10.0 * Fp, 0.1 * Fh)), float(norm(Fp, Fh)), rtol=1e-10)
    assert float(ConditionRegularizer(1.0, 0.0)(None, Fh)) == 0.0
    only_h = ConditionRegularizer(0.0, 1.0, normalize=False)(None, Fh.reshape(60, 2, 3))
    np.testing.assert_allclose(float(only_h), condreg.r_ill(X_h, gram=True), rtol=1e-10)
    with pytest.raises(ValueError):
        ConditionRegularizer()(None, None)
    with pytest.raises(ValueError):
        ConditionRegularizer(-1.0)
    with pytest.raises(ValueError):
        precondition(Fp, Fh[:10])
    with pytest.raises(ValueError):
        Precondition(-1.0)


def _loop(X_p, y, X_h, *, lam_p, lam_h, lr, epochs, theta0=None, omega0=None):
    """The plain training loop of docs/immunization.md (full batch, SGD)."""
    D = X_p.shape[1]
    layer = torch.nn.Linear(D, D, bias=False).double()  # F = x Wᵀ, θ = Wᵀ
    head = torch.nn.Linear(D, 1, bias=False).double()
    with torch.no_grad():
        layer.weight.copy_(_t(np.eye(D) if theta0 is None else theta0).T)
        head.weight.copy_(_t(np.zeros(D) if omega0 is None else omega0)[None, :])
    reg = ConditionRegularizer(lam_p, lam_h, normalize=False)
    pre = Precondition(ridge=0.0)
    opt = torch.optim.SGD([*layer.parameters(), *head.parameters()], lr=lr)
    x_p, x_h, t = _t(X_p), _t(X_h), _t(y)
    for _ in range(epochs):
        opt.zero_grad()
        f_p, f_h = layer(x_p), layer(x_h)
        task_loss = torch.mean((head(f_p)[:, 0] - t) ** 2)  # un-preconditioned
        loss = task_loss + reg(pre(f_p, x_p), pre(f_h, x_h))
        loss.backward()
        opt.step()
    return layer.weight.detach().T.numpy(), head.weight.detach()[0].numpy()


def test_one_step_of_the_plain_loop_is_algorithm_1():
    X_p, y, X_h = _pair(4)
    rng = np.random.default_rng(5)
    theta0 = np.eye(6) + 0.1 * rng.standard_normal((6, 6))
    omega0 = rng.standard_normal(6)
    lr, lam_p, lam_h = 1e-3, 0.3, 0.2
    theta1, omega1 = _loop(
        X_p, y, X_h, lam_p=lam_p, lam_h=lam_h, lr=lr, epochs=1, theta0=theta0, omega0=omega0
    )
    r = X_p @ theta0 @ omega0 - y
    g_theta = np.outer(X_p.T @ (2 * r / len(y)), omega0)
    g_omega = theta0.T @ X_p.T @ (2 * r / len(y))
    expected = (
        theta0
        - lr * g_theta
        - lr * lam_p * preconditioned_gradient(theta0, X_p, "r_well")
        - lr * lam_h * preconditioned_gradient(theta0, X_h, "r_ill")
    )
    np.testing.assert_allclose(theta1, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(omega1, omega0 - lr * g_omega, rtol=1e-9, atol=1e-12)


def test_plain_loop_immunizes():
    X_p, y, X_h = _pair(6, N=100, D=8)
    s_p = np.linalg.norm(X_p, 2) ** 2
    s_h = np.linalg.norm(X_h, 2) ** 2
    # unit-scale covariances so that modest weights give steps of relative size ~1e-2
    X_p, X_h = X_p / np.sqrt(s_p), X_h / np.sqrt(s_h)
    theta, _ = _loop(X_p, y, X_h, lam_p=1.0, lam_h=1e-3, lr=5e-3, epochs=150)
    res = rir(theta, X_p, X_h)
    assert res.rir > 2 and res.ii < 1


def test_dummy_layer_runs_on_a_small_network_and_keeps_shapes():
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU())
    immunized = torch.nn.Linear(16, 16, bias=False)
    reg = ConditionRegularizer(1.0, 1.0)
    pre = Precondition()
    x_p, x_h = torch.randn(32, 10), torch.randn(24, 10)
    h_p, h_h = backbone(x_p), backbone(x_h)
    f_p, f_h = immunized(h_p), immunized(h_h)
    loss = f_p.pow(2).mean() + reg(pre(f_p, h_p.detach()), pre(f_h, h_h.detach()))
    loss.backward()
    assert immunized.weight.grad is not None and torch.all(torch.isfinite(immunized.weight.grad))
    assert backbone[0].weight.grad is not None
