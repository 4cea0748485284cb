"""The PyTorch adapter's one route for a single CPU feature batch with ``gram=True`` whose gradient
is asked for (the most common call): bad input of every kind, out-of-range Gram matrices, the
pole, incoming gradients, forward mode, and the ``"extreme"`` route of large batches compared
with the dense route of the same matrix as a batch of one (``F[None]``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import enable_x64  # noqa: E402

import condreg  # noqa: E402
import condreg.torch  # noqa: E402
from condreg import PoleError, RankError, _backend  # noqa: E402
from condreg.testing import matrix_with_spectrum  # noqa: E402

QUANTITIES = ["condition_number", "r_well", "r_ill"]
SHAPES = [pytest.param((6, 20), id="N<D"), pytest.param((20, 6), id="N>D")]
DTYPES = [pytest.param(torch.float64, id="float64"), pytest.param(torch.float32, id="float32")]


def _value_and_grad(name, F, weight=None, **kwargs):
    X = F.detach().clone().requires_grad_()
    v = getattr(condreg, name)(X, gram=True, **kwargs)
    assert type(v.grad_fn).__name__ == "_SpectralValueWithJvpBackward"
    (v if weight is None else v * weight).sum().backward()
    return v.detach(), X.grad


def _general(monkeypatch, name, F, weight=None, **kwargs):
    """The same matrix as a batch of one: the dense route (never ``"extreme"``)."""
    v, G = _value_and_grad(name, F[None], weight, **kwargs)
    return v[0], G[0]


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def test_one_function_for_every_call():
    """Every call takes the one Function (a half-precision input through its float32 cast);
    ``torch.func.grad`` gives the same gradient as ``.backward()``."""
    F = torch.randn(8, 30, dtype=torch.float64)

    def grad_fn(X, **kwargs):
        return type(condreg.r_ill(X, **kwargs).grad_fn).__name__

    one = "_SpectralValueWithJvpBackward"
    X = F.clone().requires_grad_()
    assert grad_fn(X, gram=True) == grad_fn(torch.nn.Parameter(F.clone()), gram=True) == one
    assert grad_fn(X, gram=False) == grad_fn(X, gram=True, check_finite=False) == one
    batch = torch.randn(2, 8, 30, dtype=torch.float64, requires_grad=True)
    assert grad_fn(batch, gram=True) == one
    big = torch.randn(130, 140, dtype=torch.float64, requires_grad=True)  # the extreme route
    assert grad_fn(big, gram=True) == one
    with torch.no_grad():
        assert condreg.r_ill(X, gram=True).grad_fn is None
    assert condreg.r_ill(F, gram=True).grad_fn is None  # no gradient asked for
    half = F.to(torch.float16).requires_grad_()  # computed in float32
    assert grad_fn(half, gram=True) == "ToCopyBackward0"
    G = torch.func.grad(lambda A: condreg.r_ill(A, gram=True))(F)
    _, ref = _value_and_grad("r_ill", F)
    assert _rel(G, ref) < 1e-12


@pytest.mark.parametrize("name", QUANTITIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_equals_the_numpy_closed_form(name, dtype, shape):
    """Generic spectra, exact ties at both ends and a rank-deficient batch: the value and
    gradient (with an incoming gradient that is not 1) of the float64 NumPy closed form at the
    tolerances of the tensor's dtype."""
    N, D = shape
    spectra = [
        np.geomspace(5.0, 0.5, 6),
        np.array([3.0, 3.0, 2.0, 1.0, 1.0, 1.0]),
        np.array([2.0, 1.5, 1.0, 0.7, 0.0, 0.0]),
    ]
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    kw = {"tie_rtol": condreg._spectrum.default_tie_rtol((N, D), np.dtype(np_dtype), np)}
    if name != "r_well":
        kw["rtol"] = condreg._spectrum.resolve_rtol(None, (N, D), np.dtype(np_dtype), np)
    vkw = {k: v for k, v in kw.items() if name == "r_ill" or k == "rtol"}
    for seed, s in enumerate(spectra):
        F = torch.tensor(matrix_with_spectrum(s, N, D, seed=seed), dtype=dtype)
        v, G = _value_and_grad(name, F, weight=-2.5)
        A = F.double().numpy()
        w = float(getattr(condreg, name)(A, gram=True, **vkw))
        H = torch.from_numpy(-2.5 * getattr(condreg, name + "_grad")(A, gram=True, **kw))
        assert v.dtype == G.dtype == dtype
        assert abs(float(v) - w) <= tol * abs(w)
        assert _rel(G, H) < tol, (name, s)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", QUANTITIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_non_finite_input_raises_value_error(name, bad, dtype, shape):
    F = torch.randn(*shape, dtype=dtype)
    F[2, 3] = bad
    X = F.requires_grad_()
    with pytest.raises(ValueError, match=f"{name}: the input contains NaN or Inf"):
        getattr(condreg, name)(X, gram=True)


@pytest.mark.parametrize("name", QUANTITIES)
@pytest.mark.parametrize("scale", [1e200, 1e-170], ids=["huge", "tiny"])
def test_a_gram_out_of_range_takes_the_exact_path(monkeypatch, name, scale):
    """F = 1e200·X: its Gram matrix overflows float64 (the general Function's exact path);
    F = 1e-170·X: it underflows. Finite values and gradients (zero or inf where the true ones
    are not representable, never NaN), equal to the general Function's."""
    F = torch.tensor(matrix_with_spectrum(np.geomspace(4.0, 1.0, 6), 6, 20, seed=3)) * scale
    v, G = _value_and_grad(name, F)
    w, H = _general(monkeypatch, name, F)
    assert not math.isnan(float(v)) and not torch.isnan(G).any()
    assert float(v) == pytest.approx(float(w), rel=1e-12)
    finite = torch.isfinite(H)
    assert torch.equal(finite, torch.isfinite(G))
    assert torch.allclose(G[finite], H[finite], rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("name", QUANTITIES)
def test_zero_matrix_raises_rank_error(name):
    X = torch.zeros(5, 9, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RankError, match="rank 0"):
        getattr(condreg, name)(X, gram=True)


def test_r_ill_at_its_pole_is_inf_and_its_backward_raises():
    F = torch.zeros(4, 10, dtype=torch.float64)
    F[:, :4] = 2.0 * torch.eye(4, dtype=torch.float64)  # every singular value equal
    X = F.requires_grad_()
    v = condreg.r_ill(X, gram=True)
    assert type(v.grad_fn).__name__ == "_SpectralValueWithJvpBackward"
    assert float(v.detach()) == math.inf
    with pytest.raises(PoleError, match="pole"):
        v.backward()
    assert float(condreg.condition_number(X, gram=True).detach()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kwargs, error",
    [({"rtol": 1.5}, ValueError), ({"tie_rtol": -1.0}, ValueError), ({"rtol": "0.1"}, TypeError)],
)
def test_invalid_tolerances_raise_typed_errors(kwargs, error):
    X = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    with pytest.raises(error, match="rtol"):
        condreg.r_ill(X, gram=True, **kwargs)


def test_incoming_gradient_and_create_graph(monkeypatch):
    """``autograd.grad`` with a non-unit incoming gradient, and double backward (the
    differentiable recomputation) — the same as the general Function."""
    F = torch.tensor(matrix_with_spectrum(np.geomspace(3.0, 1.0, 5), 5, 12, seed=4))

    def grads():
        X = F.clone().requires_grad_()
        v = condreg.r_ill(X, gram=True)
        weight = torch.tensor(-0.5, dtype=F.dtype)
        (G,) = torch.autograd.grad(v, X, grad_outputs=weight, create_graph=True)
        (H,) = torch.autograd.grad((G * G).sum(), X)
        return G.detach(), H

    G, H = grads()
    A = F.numpy()
    assert _rel(G, torch.from_numpy(-0.5 * condreg.r_ill_grad(A, gram=True))) < 1e-12
    eps = 1e-6  # H: the gradient of ‖G‖² by central differences along H itself

    def norm2(Y):
        return float(np.sum((0.5 * condreg.r_ill_grad(Y, gram=True)) ** 2))

    D = H.numpy() / np.linalg.norm(H.numpy())
    slope = (norm2(A + eps * D) - norm2(A - eps * D)) / (2 * eps)
    assert slope == pytest.approx(float((H * torch.from_numpy(D)).sum()), rel=1e-5)


def test_forward_mode_agrees_with_reverse_mode():
    import torch.autograd.forward_ad as fwAD

    F = torch.tensor(matrix_with_spectrum(np.geomspace(3.0, 1.0, 5), 5, 12, seed=5))
    T = torch.randn_like(F)
    X = F.clone().requires_grad_()
    condreg.r_ill(X, gram=True).backward()
    with fwAD.dual_level():
        dual = fwAD.make_dual(F.clone().requires_grad_(), T)
        out = condreg.r_ill(dual, gram=True)
        tangent = fwAD.unpack_dual(out).tangent
    assert float(tangent.detach()) == pytest.approx(float((X.grad * T).sum()), rel=1e-10)


@pytest.mark.parametrize("name", QUANTITIES)
@pytest.mark.parametrize(
    "backend",
    ["numpy", "torch-batch", "torch-no-grad", "torch-tall-large", "torch-wide-large", "jax"],
)
def test_an_overflowing_gram_takes_the_exact_path_everywhere(name, backend):
    """F = 1e200·X (dense, float64): every entry of FᵀF overflows. The Gram path must not hand
    ``inf`` to LAPACK (which does not converge and raises): the exact path gives the value of
    X itself (κ) or its scaling (R_well → inf, R_ill → 0), never an error or NaN."""
    X = matrix_with_spectrum(np.geomspace(4.0, 1.0, 6), 6, 20, seed=7)
    ref = float(getattr(condreg, name)(X, gram=True))
    shape_scale = {"condition_number": 1.0, "r_well": math.inf, "r_ill": 0.0}[name]
    if backend == "numpy":
        out = getattr(condreg, name)(X * 1e200, gram=True)
    elif backend == "jax":
        jax = pytest.importorskip("jax")
        with enable_x64(jax):
            out = jax.jit(lambda a: getattr(condreg, name)(a, gram=True))(
                jax.numpy.asarray(X * 1e200)
            )
            out = float(out)
    else:
        A = torch.tensor(X) * 1e200
        if backend == "torch-batch":
            A = torch.stack([A, A])
        elif backend.endswith("-large"):  # min side >= EXTREME_MIN (the exact path decides)
            shape = (300, 130) if backend == "torch-tall-large" else (130, 300)
            A = torch.tensor(matrix_with_spectrum(np.geomspace(4.0, 1.0, 130), *shape, seed=8))
            ref = float(getattr(condreg, name)(A, gram=True))
            A = A * 1e200
        grad = backend != "torch-no-grad"
        A.requires_grad_(grad)
        v = getattr(condreg, name)(A, gram=True)
        if grad:
            v.sum().backward()
            assert not torch.isnan(A.grad).any()
        out = float(v.detach().reshape(-1)[0])
    if shape_scale == 1.0:
        assert out == pytest.approx(ref, rel=1e-10)
    else:
        assert out == shape_scale


@pytest.mark.parametrize("name", QUANTITIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [pytest.param((130, 200), id="N<D"), pytest.param((200, 130), id="N>D")]
)
def test_large_batches_equal_the_dense_route(monkeypatch, name, dtype, shape):
    """From ``EXTREME_MIN`` on, a single batch's gradient is assembled from the extreme
    clusters' vectors only (counted); the same value and gradient as the dense route (the
    batch of one), also at exact ties at both ends."""
    N, D = shape
    n = min(N, D)
    s = np.linspace(3.0, 1.0, n)
    tied = s.copy()
    tied[:3], tied[-4:] = 3.0, 1.0
    calls = []
    original = condreg._extreme.gram_product

    def spy(*args, **kwargs):
        P = original(*args, **kwargs)
        calls.append(P is not None)
        return P

    monkeypatch.setattr(condreg._extreme, "gram_product", spy)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for seed, spectrum in enumerate([s, tied]):
        F = torch.tensor(matrix_with_spectrum(spectrum, N, D, seed=seed), dtype=dtype)
        v, G = _value_and_grad(name, F, weight=0.75)
        w, H = _general(monkeypatch, name, F, weight=0.75)
        assert abs(float(v) - float(w)) <= tol * abs(float(w))
        assert _rel(G, H) < tol, (name, seed)
    assert calls == [True] * 2  # the single batches; the batch of one is dense


def test_batched_incoming_gradients(monkeypatch):
    """``autograd.grad(..., is_grads_batched=True)`` and ``gradcheck(check_batched_grad=True)``."""
    F = torch.tensor(matrix_with_spectrum(np.geomspace(3.0, 1.0, 4), 4, 9, seed=6))
    weights = torch.tensor([1.0, -2.0, 0.5], dtype=F.dtype)

    def batched():
        X = F.clone().requires_grad_()
        v = condreg.r_ill(X, gram=True)
        (G,) = torch.autograd.grad(v, X, grad_outputs=weights, is_grads_batched=True)
        return G

    G = batched()
    _, one = _value_and_grad("r_ill", F)
    for i, w in enumerate(weights):
        assert _rel(G[i], w * one) < 1e-12
    X = F.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda A: condreg.r_ill(A, gram=True), (X,), check_batched_grad=True
    )


def test_the_value_stays_on_the_cpu_under_another_default_device():
    F = torch.tensor(matrix_with_spectrum(np.geomspace(3.0, 1.0, 4), 4, 9, seed=9))
    _, want = _value_and_grad("r_ill", F)
    X = F.clone().requires_grad_()
    with torch.device("meta"):
        v = condreg.r_ill(X, gram=True)
        assert v.device.type == "cpu"
        v.backward()
    assert X.grad.device.type == "cpu" and _rel(X.grad, want) < 1e-12


def test_nan_input_is_reported_before_invalid_tolerances():
    X = torch.randn(5, 9, dtype=torch.float64)
    X[1, 1] = math.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        condreg.r_ill(X.requires_grad_(), gram=True, tie_rtol=-1.0)


def test_forced_gram_method_of_a_huge_matrix_is_scaled_first():
    """``how="gram"`` (internal: no exact fallback) on ``1e200·X``, whose Gram would overflow:
    the matrix is scaled by a power of two first, so the values are ``1e200`` times those of
    ``X`` (NumPy, PyTorch, a batch whose matrices differ by 1e200)."""
    from array_api_compat import array_namespace

    from condreg import _spectrum

    X = matrix_with_spectrum(np.geomspace(4.0, 1.0, 6), 6, 20, seed=7)
    for F in (X * 1e200, torch.tensor(X * 1e200), torch.tensor(np.stack([X * 1e200, X]))):
        xp = array_namespace(F)
        kw = {"gram": True, "vectors": False, "rtol": 0.0, "concrete": _backend.eager}
        sm = _spectrum.decompose(F, xp, method="gram", **kw)
        s = np.asarray(sm.s).reshape(-1, 6)
        np.testing.assert_allclose(s[0], np.geomspace(4.0, 1.0, 6) * 1e200, rtol=1e-12)
        if len(s) == 2:
            np.testing.assert_allclose(s[1], np.geomspace(4.0, 1.0, 6), rtol=1e-12)


def test_compute_dtype_of_another_library_is_named():
    """``compute_dtype=torch.float64`` on NumPy input: the error says the dtype belongs to
    another library (not that float64 is not a real floating dtype)."""
    with pytest.raises(TypeError, match="torch dtype but the input is a numpy array"):
        condreg.r_ill(np.ones((3, 2)) + np.eye(3, 2), compute_dtype=torch.float64)
