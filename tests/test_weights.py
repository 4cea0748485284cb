"""Weight-conditioning helpers (condreg.torch.weights, condreg.jax.weights) on small networks."""

from __future__ import annotations

import numpy as np
import pytest

import condreg


def _torch_net(torch):
    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 16),
        nn.ReLU(),
        nn.LayerNorm(16),
        nn.Linear(16, 3),
    ).double()
    with torch.no_grad():  # ill-conditioned start: rows scaled over a decade
        for i in (0, 3, 6):
            W = net[i].weight
            rows = torch.logspace(0, -1, W.shape[0], dtype=W.dtype)
            W.mul_(rows.reshape(-1, *[1] * (W.ndim - 1)))
    return net


def test_torch_selection_and_value():
    torch = pytest.importorskip("torch")
    from condreg.torch.weights import (
        weight_condition_numbers,
        weight_conditioning_loss,
        weight_matrices,
    )

    net = _torch_net(torch)
    mats = dict(weight_matrices(net))
    assert list(mats) == ["0.weight", "3.weight", "6.weight"]  # LayerNorm, biases skipped
    assert mats["0.weight"].shape == (4, 9)  # (out, in·k·k)
    expected = sum(
        float(condreg.r_well((W / torch.linalg.vector_norm(W)).detach().numpy()))
        for W in mats.values()
    )
    loss = weight_conditioning_loss(net)
    assert loss.ndim == 0 and loss.requires_grad
    np.testing.assert_allclose(float(loss.detach()), expected, rtol=1e-12)
    mean = weight_conditioning_loss(net, reduction="mean")
    np.testing.assert_allclose(float(mean), expected / 3, rtol=1e-12)
    # name filter (regex or callable) and module filter
    assert list(dict(weight_matrices(net, name_filter=r"^[36]\."))) == ["3.weight", "6.weight"]
    assert list(dict(weight_matrices(net, name_filter=lambda n: n.startswith("0")))) == ["0.weight"]
    only_linear = weight_matrices(net, module_filter=lambda n, m: isinstance(m, torch.nn.Linear))
    assert [n for n, _ in only_linear] == ["3.weight", "6.weight"]
    kappas = weight_condition_numbers(net)
    np.testing.assert_allclose(
        kappas["6.weight"], float(condreg.condition_number(mats["6.weight"].detach().numpy()))
    )
    k = weight_conditioning_loss(net, "condition_number", name_filter="6")
    np.testing.assert_allclose(float(k), kappas["6.weight"], rtol=1e-12)
    logk = weight_conditioning_loss(net, "log_condition_number", name_filter="6")
    np.testing.assert_allclose(float(logk), np.log(kappas["6.weight"]), rtol=1e-12)
    with pytest.raises(ValueError, match="no parameter selected"):
        weight_conditioning_loss(net, name_filter="nothing-matches")
    with pytest.raises(ValueError, match="penalty"):
        weight_conditioning_loss(net, "spectral_norm")
    with pytest.raises(ValueError, match="reduction"):
        weight_conditioning_loss(net, reduction="max")
    with torch.no_grad():
        net[6].weight.zero_()
    with pytest.raises(condreg.RankError):
        weight_conditioning_loss(net)


@pytest.mark.parametrize("penalty", ["r_well", "log_condition_number"])
def test_torch_training_lowers_the_weights_kappa(penalty):
    """Task + penalty ends with every selected weight better conditioned than the task alone;
    a weight the name filter leaves out is not affected by the penalty."""
    torch = pytest.importorskip("torch")
    from condreg.torch.weights import weight_condition_numbers, weight_conditioning_loss

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 1, 8, 8, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (64,), generator=gen)

    def run(lam):
        net = _torch_net(torch)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        for _ in range(60):
            loss = torch.nn.functional.cross_entropy(net(x), y)
            if lam:
                loss = loss + lam * weight_conditioning_loss(net, penalty, name_filter=r"^[03]\.")
            opt.zero_grad()
            loss.backward()
            opt.step()
        return weight_condition_numbers(net)

    start = weight_condition_numbers(_torch_net(torch))
    plain, reg = run(0.0), run(1.0)
    for name in ("0.weight", "3.weight"):
        assert reg[name] < 0.7 * plain[name] and reg[name] < 0.7 * start[name], (name, reg, plain)
    assert reg["6.weight"] > 0.5 * plain["6.weight"]  # not selected: no strong effect


@pytest.fixture
def jw(x64):
    pytest.importorskip("jax")
    from condreg.jax import weights

    return weights


def _jax_params(jnp, seed=0):
    rng = np.random.default_rng(seed)

    def kernel(*shape):  # fan-in scaled, columns spread over a decade (ill-conditioned start)
        fan_in = int(np.prod(shape[:-1]))
        W = rng.standard_normal(shape) / np.sqrt(fan_in) * np.logspace(0, -1, shape[-1])
        return jnp.asarray(W)

    return {
        "conv": {"kernel": kernel(3, 3, 1, 4), "bias": jnp.zeros(4)},
        "dense": {"kernel": kernel(36, 16), "bias": jnp.zeros(16)},
        "head": {"kernel": kernel(16, 3), "scale": jnp.ones(3)},
    }


def test_jax_selection_value_and_jit(jw):
    import jax
    import jax.numpy as jnp

    params = _jax_params(jnp)
    mats = dict(jw.weight_matrices(params))
    assert list(mats) == ["['conv']['kernel']", "['dense']['kernel']", "['head']['kernel']"]
    assert mats["['conv']['kernel']"].shape == (9, 4)  # (kh·kw·in, out)
    expected = sum(float(condreg.r_well(np.asarray(W) / np.linalg.norm(W))) for W in mats.values())
    np.testing.assert_allclose(float(jw.weight_conditioning_loss(params)), expected, rtol=1e-12)
    jitted = jax.jit(jw.weight_conditioning_loss, static_argnames=("penalty",))
    np.testing.assert_allclose(float(jitted(params)), expected, rtol=1e-12)
    g = jax.grad(jw.weight_conditioning_loss)(params)
    assert not bool(jnp.any(g["dense"]["bias"])) and bool(jnp.any(g["dense"]["kernel"]))
    head_only = jw.weight_conditioning_loss(
        params, "condition_number", filter=lambda path, leaf: "head" in path and leaf.ndim == 2
    )
    np.testing.assert_allclose(
        float(head_only), float(condreg.condition_number(np.asarray(params["head"]["kernel"])))
    )
    torch_layout = jw.weight_matrices(params, matrix=lambda W: W.reshape(W.shape[0], -1))
    assert dict(torch_layout)["['conv']['kernel']"].shape == (3, 12)
    with pytest.raises(ValueError, match="no leaf selected"):
        jw.weight_conditioning_loss(params, filter=lambda p, leaf: False)
    with pytest.raises(ValueError, match="penalty"):
        jw.weight_conditioning_loss(params, "nope")
    with pytest.raises(condreg.RankError):
        jw.weight_conditioning_loss({"w": jnp.zeros((3, 3))})


def test_jax_training_lowers_the_weights_kappa(jw):
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((64, 36)))
    y = jnp.asarray(rng.standard_normal((64, 3)))
    start = {k: v for k, v in _jax_params(jnp).items() if k != "conv"}

    def task(p):
        h = jnp.tanh(x @ p["dense"]["kernel"] + p["dense"]["bias"])
        return jnp.mean((h @ p["head"]["kernel"] * p["head"]["scale"] - y) ** 2)

    def run(lam):
        @jax.jit
        def step(p):
            loss = lambda q: task(q) + lam * jw.weight_conditioning_loss(q)  # noqa: E731
            return jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, p, jax.grad(loss)(p))

        p = start
        for _ in range(100):
            p = step(p)
        return jw.weight_condition_numbers(p)

    k0, plain, reg = jw.weight_condition_numbers(start), run(0.0), run(1.0)
    for name in k0:
        assert reg[name] < 0.7 * plain[name] and reg[name] < 0.7 * k0[name], (name, reg, plain)
