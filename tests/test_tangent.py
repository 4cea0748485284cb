"""condreg.attacks.tangent_condition: κ of the empirical tangent kernel J Jᵀ, checked against
its closed forms (a linear head on features, a linear block on inputs) and against an
independent Jacobian (torch.autograd.functional.jacobian) with NumPy's SVD."""

from __future__ import annotations

import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import conditioned_rtol  # noqa: E402
from torch import nn  # noqa: E402

from condreg.attacks import tangent_condition  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _kappa_nonzero(M: np.ndarray) -> float:
    """κ(MᵀM) = (σ₁/σ_k)² over the nonzero singular values (rank tolerance max(m, n)·eps)."""
    s = np.linalg.svd(M, compute_uv=False)
    s = s[s > max(M.shape) * np.finfo(np.float64).eps * s[0]]
    return float((s[0] / s[-1]) ** 2)


def _features(n, d, decades, seed=0):
    """An n×d float64 matrix with singular values spread over ``decades``."""
    g = np.random.default_rng(seed)
    U, _ = np.linalg.qr(g.standard_normal((n, min(n, d))))
    V, _ = np.linalg.qr(g.standard_normal((d, min(n, d))))
    return U @ np.diag(np.logspace(0, -decades, min(n, d))) @ V.T


@pytest.mark.parametrize(("n", "d", "decades"), [(20, 6, 2), (5, 8, 2), (20, 6, 5)])
def test_a_linear_head_on_features_is_the_probing_hessians_kappa(n, d, decades):
    """J = F ⊗ I_K: κ(JJᵀ) = κ(FFᵀ) = κ(FᵀF) over the nonzero spectrum, for every K (κ(FᵀF)
    up to 1e10, where the engine leaves the Gram for a QR of J)."""
    F = _features(n, d, decades)
    expect = _kappa_nonzero(F)
    for k in (1, 3):
        head = nn.Linear(d, k, bias=False).double()
        got = tangent_condition(nn.Identity(), torch.from_numpy(F), head=head)
        assert got == pytest.approx(expect, rel=conditioned_rtol(expect))
    # with a bias the features gain a column of ones: κ([F 1]ᵀ[F 1])
    head = nn.Linear(d, 2).double()
    got = tangent_condition(nn.Identity(), F, head=head)  # a NumPy batch
    expect = _kappa_nonzero(np.hstack([F, np.ones((n, 1))]))
    assert got == pytest.approx(expect, rel=conditioned_rtol(expect))


def test_a_linear_block_on_inputs_is_kappa_of_x_xt_times_the_maps():
    """A linear block W (no bias) on inputs X, then a fixed map A: JJᵀ = XXᵀ ⊗ AAᵀ."""
    X = _features(12, 4, 1.5, seed=1)  # XXᵀ 12×12 of rank 4: κ over the nonzero σ
    torch.manual_seed(0)
    net = nn.Sequential(
        collections.OrderedDict(block=nn.Linear(4, 5, bias=False), post=nn.Linear(5, 3, bias=False))
    ).double()
    got = tangent_condition(net, torch.from_numpy(X), block="block")
    A = net.post.weight.detach().numpy()
    expect = _kappa_nonzero(X) * _kappa_nonzero(A.T)
    assert got == pytest.approx(expect, rel=conditioned_rtol(expect))
    # the block alone: κ(XXᵀ)
    alone = nn.Sequential(collections.OrderedDict(block=nn.Linear(4, 5, bias=False))).double()
    got = tangent_condition(alone, X, block="block")
    assert got == pytest.approx(_kappa_nonzero(X), rel=conditioned_rtol(_kappa_nonzero(X)))


def _net():
    torch.manual_seed(0)
    stem = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.Tanh(), nn.Flatten())
    block = nn.Sequential(nn.Linear(48, 6), nn.Tanh(), nn.Dropout(0.5), nn.Linear(6, 4))
    return nn.Sequential(collections.OrderedDict(stem=stem, block=block)).double()


def _reference(net, X, names, head=None):
    """κ from torch.autograd.functional.jacobian of the whole batch and NumPy's SVD."""
    full = nn.Sequential(net) if head is None else nn.Sequential(net, head)
    full.eval()
    params = dict(full.named_parameters())
    keys = [k for k in params if any(k.startswith(p) for p in names)]

    def outputs(*values):
        swapped = dict(zip(keys, values, strict=True))
        return torch.func.functional_call(full, swapped, (X,)).reshape(-1)

    jac = torch.autograd.functional.jacobian(outputs, tuple(params[k].detach() for k in keys))
    J = torch.cat([j.reshape(j.shape[0], -1) for j in jac], 1).numpy()
    return _kappa_nonzero(J)


@pytest.mark.parametrize(
    ("block", "names", "with_head"),
    [("block", ["0.block."], False), (None, ["0."], False), ("stem", ["0.stem.", "1."], True)],
)
def test_against_an_independent_jacobian_and_svd(block, names, with_head):
    net = _net()
    head = nn.Linear(4, 3).double() if with_head else None
    X = torch.randn(7, 1, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    net.train()  # dropout on: tangent_condition measures the network in eval mode
    before = {k: v.clone() for k, v in net.state_dict().items()}
    got = tangent_condition(net, X, block=block, head=head)
    assert all(m.training for m in net.modules())  # the caller's flags are restored
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert tangent_condition(net, X, block=block, head=head) == got  # no dropout noise
    expect = _reference(net, X, names, head)
    assert got == pytest.approx(expect, rel=conditioned_rtol(expect))


def test_float32_parameters_cast_the_inputs():
    net = _net().float()
    X = np.random.default_rng(0).standard_normal((5, 1, 4, 4))  # float64 data
    kappa = tangent_condition(net, X, block="block")
    ref = tangent_condition(_net(), X, block="block")
    assert kappa == pytest.approx(ref, rel=1e-3)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((lambda x: x, torch.ones(2, 3)), {}, TypeError, "torch.nn.Module"),
        ((nn.Identity(), torch.ones(2, 3)), {"head": lambda x: x}, TypeError, "head must"),
        ((nn.Linear(3, 2), [[1.0, 2.0, 3.0]]), {}, TypeError, "X must be"),
        ((nn.Linear(3, 2), torch.ones(2, 3)), {"block": "nope"}, ValueError, "no submodule"),
        ((nn.Identity(), torch.ones(2, 3)), {}, ValueError, "no parameters"),
        ((nn.Linear(3, 2), torch.ones(0, 3)), {}, ValueError, "n >= 1"),
        ((nn.Linear(3, 2), torch.full((2, 3), float("nan"))), {}, ValueError, "NaN or Inf"),
        ((nn.Linear(3, 2), torch.ones(2, 3, dtype=torch.complex64)), {}, ValueError, "real"),
        ((nn.Conv1d(1, 2, 1), torch.ones(2, 1, 3)), {}, ValueError, r"\(n, K\) outputs"),
        ((nn.Linear(3, 2, bias=False), torch.zeros(2, 3)), {}, ValueError, "zero"),  # J = 0
    ],
)
def test_bad_input_is_a_typed_error(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        tangent_condition(*args, **kwargs)
