"""The Gram matrix of a large CPU PyTorch batch from its upper block rows
(``condreg._spectrum._symmetric_gram``: 10/16 of the flops of ``X.T @ X``)."""

from __future__ import annotations

import numpy as np
import pytest

import condreg
from condreg import _spectrum

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("shape", [(1100, 256), (1100, 259), (257, 1103), (1030, 1030)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_blocked_gram_is_the_gram_to_rounding(shape, dtype):
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    F = torch.randn(*shape, dtype=torch.float64, generator=gen).to(dt)
    xp = condreg._validation.namespace(F, where="test")
    G = _spectrum._gram_matrix(F, xp, dt)
    X = F.double()
    ref = X @ X.T if shape[0] < shape[1] else X.T @ X
    n = min(shape)
    assert _spectrum._blocked_gram_eligible(F.to(dt))
    assert G.shape == (n, n) and G.dtype == dt
    # each entry is a dot product of max(shape) terms: |error| <= max(shape)·eps·‖col‖‖col‖
    eps = torch.finfo(dt).eps
    norms = torch.linalg.vector_norm(X, dim=1 if shape[0] < shape[1] else 0)
    bound = max(shape) * eps * torch.outer(norms, norms)
    assert bool(((G.double() - ref).abs() <= bound).all())
    if dtype == "float32":  # float32 features, float64 Gram (the accuracy guard's dtype)
        G64 = _spectrum._gram_matrix(F, xp, torch.float64)
        bound64 = max(shape) * torch.finfo(torch.float64).eps * torch.outer(norms, norms)
        assert G64.dtype == torch.float64 and bool(((G64 - ref).abs() <= bound64).all())
    # off the diagonal blocks the lower part is the transpose of the upper one, exactly
    edges = [n * i // _spectrum.GRAM_BLOCKS for i in range(_spectrum.GRAM_BLOCKS + 1)]
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        assert torch.equal(G[hi:, lo:hi], G[lo:hi, hi:].T)


def test_blocked_gram_only_where_it_pays_and_is_safe():
    big = torch.zeros(1100, 260)
    assert _spectrum._blocked_gram_eligible(big)
    assert not _spectrum._blocked_gram_eligible(torch.zeros(1100, 100))  # small side < 256
    assert not _spectrum._blocked_gram_eligible(torch.zeros(600, 300))  # too few flops to pay
    assert not _spectrum._blocked_gram_eligible(torch.zeros(2, 1100, 260))  # a batch
    assert not _spectrum._blocked_gram_eligible(np.zeros((1100, 260)))  # NumPy has syrk
    seen = []

    def f(F):
        seen.append(_spectrum._blocked_gram_eligible(F))
        return F.sum()

    torch.func.grad(f)(big)
    assert seen == [False]  # wrapped by a torch.func transform: the plain product


def test_r_ill_of_a_large_batch_equals_the_plain_gram_path(monkeypatch):
    """Value and gradient of R_ill(FᵀF) for a 900×300 batch (the extreme-cluster path, which
    forms FᵀF): the same with the blocked Gram as with ``X.T @ X``, and torch.func.grad (the
    plain product) agrees."""
    gen = torch.Generator().manual_seed(1)
    F = (torch.randn(900, 300, dtype=torch.float64, generator=gen)
         * torch.logspace(0, -2, 300, dtype=torch.float64))  # fmt: skip

    def value_and_grad():
        X = F.clone().requires_grad_(True)
        v = condreg.r_ill(X, gram=True)
        v.backward()
        return v.detach(), X.grad

    blocked = []
    real = _spectrum._symmetric_gram
    monkeypatch.setattr(_spectrum, "_symmetric_gram", lambda X: blocked.append(1) or real(X))
    v, g = value_and_grad()
    assert blocked  # the extreme-cluster path formed FᵀF from the block rows
    monkeypatch.setattr(_spectrum, "_blocked_gram_eligible", lambda A: False)
    v0, g0 = value_and_grad()
    torch.testing.assert_close(v, v0, rtol=1e-12, atol=0)
    torch.testing.assert_close(g, g0, rtol=1e-10, atol=1e-12 * float(g0.abs().max()))
    monkeypatch.undo()
    g_func = torch.func.grad(lambda X: condreg.r_ill(X, gram=True))(F)
    torch.testing.assert_close(g_func, g, rtol=1e-9, atol=1e-11 * float(g.abs().max()))
