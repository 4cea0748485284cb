"""condreg inside PyTorch autograd: the closed form as the derivative of an autograd.Function.

Covers ``.backward()``, ``torch.func`` (grad, vmap, vmap(grad), grad(grad), jvp/jacfwd,
hessian), gradcheck/gradgradcheck, Hessian-vector products by double backward against finite
differences of the closed-form gradient, a ``torch.compile`` smoke test, host synchronisation,
eager errors, and CUDA variants (marked ``cuda``, skipped without a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import FUNCTIONS, NAMES  # noqa: E402

import condreg  # noqa: E402
import condreg.torch as condreg_torch  # noqa: E402
from condreg.testing import assert_close, matrix_with_spectrum  # noqa: E402

GRAM = pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def generic(m=4, n=3, *, seed=0, batch=None, dtype=torch.float64, device="cpu"):
    """A matrix (or batch) with distinct, well-separated singular values."""
    p = min(m, n)
    values = np.linspace(2.5, 0.8, p)
    if batch is not None:
        values = np.stack(
            [values * (1.0 + 0.25 * i) + 0.1 * i * np.arange(p)[::-1] for i in range(batch)]
        )
    S = matrix_with_spectrum(values, m, n, seed=seed)
    return torch.asarray(S, dtype=dtype, device=device)


def closed_form(name, S, **kwargs):
    """The core's closed-form gradient in NumPy float64, as a tensor like ``S``."""
    G = FUNCTIONS[name][1](S.detach().cpu().double().numpy(), **kwargs)
    return torch.asarray(G, dtype=S.dtype, device=S.device)


def close(actual, desired, rtol=1e-10):
    scale = float(desired.abs().max())
    assert_close(actual, desired, rtol=rtol, atol=rtol * scale)


# --------------------------------------------------------------------------------------------
# First order
# --------------------------------------------------------------------------------------------


@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_backward_is_closed_form(name, gram):
    S = generic(5, 3, batch=3).requires_grad_()
    out = FUNCTIONS[name][0](S, gram=gram)
    assert out.shape == (3,) and out.requires_grad
    assert type(out.grad_fn).__name__ == "_SpectralValueWithJvpBackward"
    weights = torch.tensor([1.0, -2.0, 0.5], dtype=S.dtype)
    (out * weights).sum().backward()
    expected = weights[:, None, None] * closed_form(name, S, gram=gram)
    close(S.grad, expected)


@pytest.mark.parametrize("name", NAMES)
def test_autograd_grad_and_non_leaf_input(name):
    A = generic(4, 4).requires_grad_()
    S = 2.0 * A + 0.0  # a non-leaf: the chain rule goes through condreg's backward
    (g,) = torch.autograd.grad(FUNCTIONS[name][0](S), A)
    close(g, 2.0 * closed_form(name, S))


@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_func_grad(name, gram):
    S = generic(3, 5)
    g = torch.func.grad(lambda X: FUNCTIONS[name][0](X, gram=gram))(S)
    close(g, closed_form(name, S, gram=gram))


@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_func_vmap_value_and_vmap_grad(name, gram):
    f = FUNCTIONS[name][0]
    B = generic(4, 3, batch=5)
    values = torch.func.vmap(lambda X: f(X, gram=gram))(B)
    close(values, f(B, gram=gram))
    grads = torch.func.vmap(torch.func.grad(lambda X: f(X, gram=gram)))(B)
    close(grads, closed_form(name, B, gram=gram))
    # the batch on another axis, and nested vmap
    close(torch.func.vmap(f, in_dims=1)(B.movedim(0, 1)), f(B))
    nested = torch.func.vmap(torch.func.vmap(f))(B.reshape(5, 1, 4, 3))
    close(nested, f(B).reshape(5, 1))


@pytest.mark.parametrize("name", NAMES)
def test_forward_mode_is_the_same_linear_map(name):
    f = FUNCTIONS[name][0]
    S, V = generic(4, 3), generic(4, 3, seed=5)
    value, tangent = torch.func.jvp(f, (S,), (V,))
    G = closed_form(name, S)
    close(value, f(S))
    close(tangent, (G * V).sum())
    close(torch.func.jacfwd(f)(S), G)
    # vmap over jvp, and the classic forward-AD API
    vt = torch.func.vmap(lambda X, T: torch.func.jvp(f, (X,), (T,))[1])(S[None], V[None])
    close(vt, (G * V).sum()[None])
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        out = f(fwAD.make_dual(S, V))
        close(fwAD.unpack_dual(out).tangent, (G * V).sum())


def test_tied_extremes_give_min_norm_subgradient():
    """At tied extremes the backward is the minimum-norm subgradient (the average)."""
    S_np = matrix_with_spectrum([2.0, 2.0, 1.0, 1.0], 5, 4, seed=2)
    for name in NAMES:
        S = torch.asarray(S_np).requires_grad_()
        FUNCTIONS[name][0](S).backward()
        close(S.grad, torch.asarray(FUNCTIONS[name][1](S_np, subgradient="min_norm")))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", NAMES)
def test_dtype_is_preserved(name, dtype):
    S = generic(4, 3, dtype=dtype).requires_grad_()
    out = FUNCTIONS[name][0](S)
    out.backward()
    assert out.dtype == dtype and S.grad.dtype == dtype
    rtol = 1e-10 if dtype == torch.float64 else 1e-4
    close(S.grad, closed_form(name, S), rtol=rtol)


# --------------------------------------------------------------------------------------------
# gradcheck, second order
# --------------------------------------------------------------------------------------------


@GRAM
@pytest.mark.parametrize("shape", [(4, 3), (3, 4)], ids=["tall", "wide"])
@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_and_gradgradcheck(name, shape, gram):
    f = FUNCTIONS[name][0]
    S = generic(*shape, seed=1).requires_grad_()

    def fn(X):
        return f(X, gram=gram)

    assert torch.autograd.gradcheck(fn, (S,), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(fn, (S,), check_fwd_over_rev=True)


def _closed_form_gradient_np(name, gram):
    def grad(X):
        return FUNCTIONS[name][1](X, gram=gram)

    return grad


@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_double_backward_hvp_matches_finite_differences(name, gram):
    """``create_graph=True``: the Hessian-vector product equals central differences (4th order)
    of the closed-form gradient along V."""
    S = generic(4, 3, seed=3).requires_grad_()
    V = generic(4, 3, seed=4)
    (g,) = torch.autograd.grad(FUNCTIONS[name][0](S, gram=gram), S, create_graph=True)
    assert g.requires_grad
    (hvp,) = torch.autograd.grad((g * V).sum(), S)

    grad = _closed_form_gradient_np(name, gram)
    S0, V0, h = S.detach().numpy(), V.numpy(), 1e-3
    fd = (-grad(S0 + 2 * h * V0) + 8 * grad(S0 + h * V0) - 8 * grad(S0 - h * V0)
          + grad(S0 - 2 * h * V0)) / (12 * h)  # fmt: skip
    close(hvp, torch.asarray(fd), rtol=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_grad_of_grad_and_hessian(name):
    f = FUNCTIONS[name][0]
    S, V = generic(3, 3, seed=6), generic(3, 3, seed=7)
    hvp = torch.func.grad(lambda X: (torch.func.grad(f)(X) * V).sum())(S)
    H_rev = torch.func.jacrev(torch.func.jacrev(f))(S)
    H_fwd = torch.func.hessian(f)(S)  # forward-over-reverse
    close(H_fwd, H_rev)
    close(hvp, (H_rev * V).sum(dim=(-2, -1)))
    flat = H_rev.reshape(9, 9)
    close(flat, flat.T)


# --------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("name", ["r_ill"])
@pytest.mark.parametrize("batch", [2, None], ids=["batch", "single"])
def test_torch_compile_smoke(name, batch):
    """One full graph (no graph break) with the aot_eager backend: value and gradient (a
    single matrix and a batch)."""
    torch._dynamo.reset()
    f = FUNCTIONS[name][0]
    compiled = torch.compile(lambda X: f(X, gram=True), backend="aot_eager", fullgraph=True)
    S = generic(5, 3, batch=batch).requires_grad_()
    out = compiled(S)
    out.sum().backward()
    close(out.detach(), f(S.detach(), gram=True))
    close(S.grad, closed_form(name, S, gram=True))


# --------------------------------------------------------------------------------------------
# Host synchronisation and eager errors
# --------------------------------------------------------------------------------------------


@pytest.fixture
def no_host_reads(monkeypatch):
    """Make every Python-level read of a tensor value (and condreg's ``concrete``) fail."""

    def forbidden(*args, **kwargs):
        raise AssertionError("host synchronisation: a tensor value was read")

    for attr in ("__bool__", "__float__", "__int__", "__index__", "item", "tolist", "numpy"):
        monkeypatch.setattr(torch.Tensor, attr, forbidden)
    monkeypatch.setattr(condreg_torch, "concrete", forbidden)


@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_check_finite_false_reads_no_tensor_value(name, gram, no_host_reads):
    f = FUNCTIONS[name][0]
    S = generic(4, 3, batch=2).requires_grad_()
    out = f(S, gram=gram, check_finite=False)
    (g,) = torch.autograd.grad(out.sum(), S, create_graph=True)
    (g * S).sum().backward()  # double backward too
    torch.func.grad(lambda X: f(X, gram=gram, check_finite=False).sum())(S.detach())


def test_checks_do_read_values_when_enabled(monkeypatch):
    """The input checks, the accept decision and the pole are one host read (the engine's
    ``to_host``) in the forward; the backward reuses what it read."""
    from condreg import _backend

    calls = []
    original = _backend.to_host

    def counting(x):
        calls.append(x)
        return original(x)

    monkeypatch.setattr(_backend, "to_host", counting)
    S = generic(4, 3).requires_grad_()
    condreg.r_ill(S).backward()
    assert len(calls) == 1


class _CountDecompositions(torch.overrides.TorchFunctionMode):
    NAMES = ("svd", "svdvals", "eigh", "eigvalsh", "qr")

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name.startswith("linalg_") and name[len("linalg_") :] in self.NAMES:
            self.calls.append(name[len("linalg_") :])
        return func(*args, **(kwargs or {}))


@GRAM
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
def test_one_decomposition_per_step(name, gram, shape):
    """Forward + backward decompose once (the backward reuses the forward's spectrum); without
    a gradient the forward needs values only; create_graph recomputes."""
    S = generic(*shape).requires_grad_()
    f = FUNCTIONS[name][0]
    with _CountDecompositions() as mode:
        f(S, gram=gram).backward()
    assert len(mode.calls) == 1 + (mode.calls.count("qr") if gram else 0), mode.calls
    with _CountDecompositions() as mode, torch.no_grad():
        f(S, gram=gram)
    assert all(c in ("svdvals", "eigvalsh", "qr") for c in mode.calls), mode.calls
    close(S.grad, closed_form(name, S, gram=gram))


@pytest.mark.parametrize("name", NAMES)
def test_nan_and_inf_input_raise_eagerly(name):
    f = FUNCTIONS[name][0]
    for bad in (float("nan"), float("inf")):
        S = generic(4, 3)
        S[1, 1] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            f(S.requires_grad_())
        with pytest.raises(ValueError, match="NaN or Inf"):
            torch.func.grad(f)(S.detach())


@pytest.mark.parametrize("name", NAMES)
def test_zero_matrix_raises_rank_error(name):
    f = FUNCTIONS[name][0]
    with pytest.raises(condreg.RankError):
        f(torch.zeros(3, 3, dtype=torch.float64, requires_grad=True))
    with pytest.raises(condreg.RankError):
        f(torch.zeros(2, 3, 3, dtype=torch.float64))  # one bad matrix is enough
    with pytest.raises(condreg.RankError):
        torch.func.grad(f)(torch.zeros(3, 3, dtype=torch.float64))


@pytest.mark.parametrize("spectrum", [[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]], ids=["kappa-1", "rank-1"])
def test_r_ill_pole_value_inf_backward_raises(spectrum):
    S = torch.asarray(matrix_with_spectrum(spectrum, 4, 3, seed=1)).requires_grad_()
    value = condreg.r_ill(S)
    assert torch.isinf(value) and value > 0
    with pytest.raises(condreg.PoleError):
        value.backward()
    assert S.grad is None  # no NaN gradient was written
    with pytest.raises(condreg.PoleError):
        torch.func.grad(condreg.r_ill)(S.detach())
    with pytest.raises(condreg.PoleError):
        torch.func.jvp(condreg.r_ill, (S.detach(),), (S.detach(),))
    # a batch with one matrix at the pole
    B = torch.stack([S.detach(), generic(4, 3)]).requires_grad_()
    with pytest.raises(condreg.PoleError):
        condreg.r_ill(B).sum().backward()


def test_vmap_checks_like_eager():
    """``torch.func.vmap`` hands the Function's rule a plain batch whose values can be read: the
    pole is reported as in eager mode (it was skipped when values were read per matrix)."""
    P = torch.asarray(matrix_with_spectrum([1.0, 1.0, 1.0], 3, 3, seed=0))[None]
    with pytest.raises(condreg.PoleError):
        torch.func.vmap(torch.func.grad(condreg.r_ill))(P)


# --------------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_cuda_backward_stays_on_device(name, gram):
    S = generic(5, 3, batch=2, device="cuda").requires_grad_()
    out = FUNCTIONS[name][0](S, gram=gram)
    assert out.device.type == "cuda"
    out.sum().backward()
    assert S.grad.device.type == "cuda"
    close(S.grad, closed_form(name, S, gram=gram), rtol=1e-9)
    close(out.detach(), FUNCTIONS[name][0](S.detach().cpu(), gram=gram).cuda(), rtol=1e-9)


@pytest.mark.cuda
@needs_cuda
@GRAM
@pytest.mark.parametrize("name", NAMES)
def test_cuda_no_sync_with_check_finite_false(name, gram):
    S = generic(5, 3, batch=2, device="cuda").requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = FUNCTIONS[name][0](S, gram=gram, check_finite=False)
        (g,) = torch.autograd.grad(out.sum(), S, create_graph=True)
        (g * S).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert S.grad.device.type == "cuda"


@pytest.mark.cuda
@needs_cuda
def test_cuda_errors_and_func_transforms():
    S = generic(4, 3, device="cuda")
    close(torch.func.grad(condreg.r_ill)(S), closed_form("r_ill", S), rtol=1e-9)
    close(
        torch.func.vmap(torch.func.grad(condreg.r_well))(S[None]),
        closed_form("r_well", S[None]),
        rtol=1e-9,
    )
    P = torch.eye(3, dtype=torch.float64, device="cuda", requires_grad=True)
    with pytest.raises(condreg.PoleError):
        condreg.r_ill(P).backward()
    with pytest.raises(condreg.RankError):
        condreg.r_well(torch.zeros(3, 3, device="cuda"))


# ---------------------------------------------------------------------------------------------
# Known bugs of the many-route adapter, fixed by the one route (issue 22)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("name", ["r_well", "condition_number", "r_ill"])
def test_compiled_backward_of_every_function(name, backend):
    """``torch.compile(lambda F: condreg.<q>(F, gram=True), fullgraph=True)(F).backward()``: the
    closed-form gradient (r_well and condition_number raised "Placeholder node not found in env"
    while their forward returned one empty tensor as several outputs)."""
    torch._dynamo.reset()
    F = torch.randn(40, 9, dtype=torch.float64, requires_grad=True)
    f = torch.compile(
        lambda X: getattr(condreg, name)(X, gram=True), backend=backend, fullgraph=True
    )
    f(F).backward()
    want = getattr(condreg, name + "_grad")(F.detach().numpy(), gram=True)
    np.testing.assert_allclose(F.grad.numpy(), want, rtol=1e-10, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("shape", [(40, 9), (9, 40), (300, 200)])
def test_autocast_bfloat16_linear_features(shape):
    """A float32 ``nn.Linear`` under ``torch.autocast("cpu", dtype=torch.bfloat16)`` produces a
    bfloat16 feature batch: the value is computed in float32 (autocast off inside the Function),
    returned in bfloat16, and the backward reaches the float32 weights (it failed with "expected
    m1 and m2 to have the same dtype" below 128 features)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, shape[1])
    x = torch.randn(shape[0], 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F = lin(x)
        v = condreg.r_ill(F, gram=True)
    assert F.dtype == v.dtype == torch.bfloat16
    v.backward()
    assert lin.weight.grad.dtype == torch.float32 and torch.isfinite(lin.weight.grad).all()
    F32 = F.detach().float().numpy()  # the same (bfloat16) features, closed form in float32
    assert float(v) == pytest.approx(float(condreg.r_ill(F32, gram=True)), rel=1e-2)
