"""condreg.torch.nn: the regularizer module and the K⁻¹-left "dummy layer" in a plain loop."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import condreg  # noqa: E402
from condreg.algorithm import preconditioned_gradient  # noqa: E402
from condreg.metrics import rir  # noqa: E402
from condreg.torch.nn import (  # noqa: E402
    ConditionRegularizer,
    Precondition,
    layer_gram,
    left_precondition,
    precondition,
)

pytestmark = pytest.mark.usefixtures("torch_one_thread")


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
    # token features (B, T, D): tokens as rows, (B·T, D) — the probing Hessian sums f fᵀ over
    # every token
    only_h = ConditionRegularizer(0.0, 1.0, normalize=False)(None, Fh.reshape(20, 3, 6))
    np.testing.assert_allclose(float(only_h), condreg.r_ill(X_h, gram=True), rtol=1e-10)
    tok = ConditionRegularizer(0.0, 1.0, normalize=False)(None, Fh.reshape(60, 2, 3))
    np.testing.assert_allclose(
        float(tok), condreg.r_ill(X_h.reshape(120, 3), gram=True), rtol=1e-10
    )
    with pytest.raises(ValueError):
        ConditionRegularizer()(None, None)
    with pytest.raises(ValueError):
        ConditionRegularizer(-1.0)
    with pytest.raises(ValueError):
        precondition(Fp, Fh[:10])
    with pytest.raises(ValueError):
        Precondition(-1.0)


def test_bad_inputs_raise_clear_errors():
    X_p, _, X_h = _pair(3)
    reg = ConditionRegularizer(1.0, 1.0)
    with pytest.raises(TypeError, match="torch.Tensor.*as_tensor"):
        reg(X_p, X_h)  # NumPy arrays
    with pytest.raises(ValueError, match=r"\(B, T, D\)"):
        reg(_t(X_p).reshape(60, 1, 2, 3))
    x = _t(X_p).reshape(20, 3, 6)
    with pytest.raises(ValueError, match="same rows"):
        precondition(x.reshape(30, 2, 6), x)
    with pytest.raises(TypeError, match="torch.Tensor"):
        precondition(X_p, _t(X_p))


def test_token_features_precondition_as_rows():
    """(B, T, D_in) inputs and (B, T, D) features: the dummy layer on the (B·T) token rows."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((12, 5, 4))
    theta = _t(np.eye(4) + 0.1 * rng.standard_normal((4, 4))).requires_grad_()
    x = _t(X)
    (g,) = torch.autograd.grad(
        ConditionRegularizer(1.0, 0.0, normalize=False)(precondition(x @ theta, x, ridge=0.0)),
        theta,
    )
    expected = preconditioned_gradient(theta.detach().numpy(), X.reshape(60, 4), "r_well")
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-9, atol=1e-12)


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


# --- layer_gram / left_precondition: the per-layer dummy layer of real networks -------------


def _patches_loop(layer, x):
    """Independent im2col by explicit loops over output positions (zero padding only)."""
    x = x.detach().numpy()
    N, C, H, W = x.shape
    kh, kw = layer.kernel_size
    sh, sw = layer.stride
    ph, pw = layer.padding
    dh, dw = layer.dilation
    g = layer.groups
    xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw))
    xp[:, :, ph : ph + H, pw : pw + W] = x
    Ho = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    Wo = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cg = C // g
    out = [[] for _ in range(g)]
    for n in range(N):
        for i in range(Ho):
            for j in range(Wo):
                win = xp[n, :, i * sh : i * sh + dh * (kh - 1) + 1 : dh, :][
                    :, :, j * sw : j * sw + dw * (kw - 1) + 1 : dw
                ]
                for k in range(g):
                    out[k].append(win[k * cg : (k + 1) * cg].reshape(-1))
    return [np.array(p) for p in out]  # per group: (N·Ho·Wo, C/g·kh·kw)


_CONVS = [
    dict(in_channels=3, out_channels=4, kernel_size=3),
    dict(in_channels=3, out_channels=5, kernel_size=(3, 2), stride=2, padding=1),
    dict(in_channels=2, out_channels=3, kernel_size=3, stride=(1, 2), padding=2, dilation=2),
    dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, groups=2),
    dict(in_channels=6, out_channels=6, kernel_size=2, padding=1, dilation=(2, 1), groups=3),
]


@pytest.mark.parametrize("spec", _CONVS)
def test_layer_gram_conv_matches_an_independent_im2col(spec):
    torch.manual_seed(0)
    layer = torch.nn.Conv2d(**spec).double()
    x = torch.randn(3, spec["in_channels"], 7, 8, dtype=torch.float64)
    K = layer_gram(layer, x)
    patches = _patches_loop(layer, x)
    d = spec["in_channels"] // layer.groups * int(np.prod(layer.kernel_size))
    assert K.shape == (layer.groups, d, d)
    for k, P in enumerate(patches):
        np.testing.assert_allclose(K[k].numpy(), P.T @ P, rtol=1e-12, atol=1e-10)
    # the layer's own weight gradient is Σ ḡ pᵀ over the same patches (im2col convention)
    out = layer(x)
    gbar = torch.randn_like(out)
    (G,) = torch.autograd.grad((out * gbar).sum(), layer.weight)
    og = layer.out_channels // layer.groups
    gb = gbar.permute(0, 2, 3, 1).reshape(-1, layer.out_channels).numpy()
    for k, P in enumerate(patches):
        expected = gb[:, k * og : (k + 1) * og].T @ P
        np.testing.assert_allclose(
            G[k * og : (k + 1) * og].reshape(og, -1).numpy(), expected, rtol=1e-10, atol=1e-10
        )


def test_layer_gram_conv_padding_modes_and_same():
    torch.manual_seed(1)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    F_ = torch.nn.functional
    for mode in ("reflect", "circular", "replicate"):
        layer = torch.nn.Conv2d(3, 2, 3, padding=1, padding_mode=mode).double()
        P = F_.unfold(F_.pad(x, (1, 1, 1, 1), mode=mode), 3)
        P = P.permute(0, 2, 1).reshape(-1, 27)
        torch.testing.assert_close(layer_gram(layer, x)[0], P.T @ P)
    same = torch.nn.Conv2d(3, 2, 4, padding="same").double()  # even kernel: 1 left, 2 right
    P = F_.unfold(F_.pad(x, (1, 2, 1, 2)), 4).permute(0, 2, 1).reshape(-1, 48)
    torch.testing.assert_close(layer_gram(same, x)[0], P.T @ P)
    valid = torch.nn.Conv2d(3, 2, 3, padding="valid").double()
    P = F_.unfold(x, 3).permute(0, 2, 1).reshape(-1, 27)
    torch.testing.assert_close(layer_gram(valid, x)[0], P.T @ P)


def test_layer_gram_linear_sums_over_leading_axes():
    layer = torch.nn.Linear(5, 3).double()
    x = torch.randn(4, 6, 5, dtype=torch.float64)
    X = x.reshape(-1, 5)
    torch.testing.assert_close(layer_gram(layer, x), X.T @ X)
    with pytest.raises(ValueError, match="Linear"):
        layer_gram(layer, torch.randn(4, 4))
    with pytest.raises(ValueError, match="Conv2d"):
        layer_gram(torch.nn.Conv2d(3, 2, 3), torch.randn(2, 4, 5, 5))
    with pytest.raises(TypeError):
        layer_gram(torch.nn.Conv1d(3, 2, 3), torch.randn(2, 3, 5))


@pytest.mark.parametrize("fn_name", ["r_well", "r_ill"])
def test_left_precondition_linear_is_exact_k_plus_gradient(fn_name):
    """Theorem 4.2 for nn.Linear: G·K⁺ = (2PθG_H)ᵀ, θ = weightᵀ, also with N < D."""
    fn, grad_fn = getattr(condreg, fn_name), getattr(condreg, f"{fn_name}_grad")
    for N, D in ((60, 6), (5, 8)):
        g = torch.Generator().manual_seed(N)
        x = torch.randn(N, D, generator=g, dtype=torch.float64)
        layer = torch.nn.Linear(D, D, bias=False).double()
        with torch.no_grad():
            layer.weight.copy_(torch.eye(D) + 0.1 * torch.randn(D, D, generator=g))
        (G,) = torch.autograd.grad(fn(layer(x), gram=True), layer.weight)
        pre = left_precondition(layer, G, layer_gram(layer, x))
        theta = layer.weight.detach().T
        K = x.T @ x
        P = torch.linalg.pinv(K, hermitian=True) @ K  # projector on range(K)
        expected = (2 * P @ theta @ grad_fn(theta.T @ K @ theta)).T
        torch.testing.assert_close(pre, expected, rtol=1e-8, atol=1e-11)
        # equals the sample-axis dummy layer (push-through) with ridge 0
        (G2,) = torch.autograd.grad(
            fn(precondition(layer(x), x, ridge=0.0), gram=True), layer.weight
        )
        torch.testing.assert_close(pre, G2, rtol=1e-8, atol=1e-11)


@pytest.mark.parametrize("spec", _CONVS[1:4])
def test_left_precondition_conv_per_group(spec):
    torch.manual_seed(2)
    layer = torch.nn.Conv2d(**spec).double()
    x = torch.randn(4, spec["in_channels"], 9, 9, dtype=torch.float64)
    out = layer(x)
    (G,) = torch.autograd.grad(
        condreg.r_ill(out.permute(0, 2, 3, 1).reshape(-1, out.shape[1]), gram=True), layer.weight
    )
    K = layer_gram(layer, x)
    pre = left_precondition(layer, G, K)
    assert pre.shape == G.shape
    gsz, og = layer.groups, layer.out_channels // layer.groups
    for k in range(gsz):
        Gk = G[k * og : (k + 1) * og].reshape(og, -1)
        expected = Gk @ torch.linalg.pinv(K[k], hermitian=True)
        torch.testing.assert_close(pre[k * og : (k + 1) * og].reshape(og, -1), expected)
        # the gradient's rows lie in range(K): multiplying back by K recovers it
        torch.testing.assert_close(pre[k * og : (k + 1) * og].reshape(og, -1) @ K[k], Gk)
    ridge = left_precondition(layer, G, K, absolute_ridge=1e-2)
    eye = torch.eye(K.shape[-1], dtype=torch.float64)
    for k in range(gsz):
        Gk = G[k * og : (k + 1) * og].reshape(og, -1)
        torch.testing.assert_close(
            ridge[k * og : (k + 1) * og].reshape(og, -1), Gk @ torch.linalg.inv(K[k] + 1e-2 * eye)
        )


def test_left_precondition_drops_null_directions_and_checks_input():
    layer = torch.nn.Linear(3, 2, bias=False).double()
    x = torch.zeros(10, 3, dtype=torch.float64)
    x[:, :2] = torch.randn(10, 2, dtype=torch.float64)
    K = layer_gram(layer, x)
    G = torch.randn(2, 3, dtype=torch.float64)
    pre = left_precondition(layer, G, K)
    assert torch.all(pre[:, 2] == 0)
    torch.testing.assert_close(pre[:, :2], G[:, :2] @ torch.linalg.inv(K[:2, :2]))
    assert left_precondition(layer.float(), G.float(), K.float()).dtype == torch.float32
    with pytest.raises(ValueError, match="ridge"):
        left_precondition(layer, G, K, absolute_ridge=0.0)
    with pytest.raises(ValueError, match="shape"):
        left_precondition(layer, G[:, :2], K)
    with pytest.raises(ValueError, match="K must be"):
        left_precondition(layer, G, K[:2, :2])
    with pytest.raises(TypeError):
        left_precondition(torch.nn.Conv1d(3, 2, 1), torch.zeros(2, 3, 1), K)
