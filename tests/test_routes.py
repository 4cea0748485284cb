"""Differential check: every route to each value and gradient against the float64 closed form.

One parametrized test body (:func:`test_route`) runs ``condreg.condition_number``,
``condreg.r_well`` and ``condreg.r_ill`` (``gram=True``, and ``gram=False`` on a few shapes)
through every way a user reaches them — PyTorch eager, ``no_grad``, ``check_finite=False``,
float32, float16/bfloat16, autocast behind an ``nn.Linear``, ``torch.func.grad``, ``vmap``,
``(B, N, D)`` batches, ``torch.compile(fullgraph=True)`` with backward on three backends,
``gradcheck``, forward mode; NumPy's ``*_grad``; JAX ``grad``/``jit``/``vmap``; array-api-strict
— on shapes on both sides of the engine's size and accept thresholds (``min(N, D)`` below and
above 128, ``N < D`` and ``N >= D``, spectra the Gram matrix resolves and spectra it does not),
and compares each value and gradient with :func:`reference`: ``numpy.linalg.svd`` of the float64
matrix and the closed forms written out below, independent of condreg's engine. The reference is
itself checked against ``torch.autograd`` through ``torch.linalg.svdvals``
(:func:`test_reference_matches_autograd_through_svdvals`).

Inputs have well-separated spectra (unique extremes, full rank, ``kappa(F)`` 4 or 1e7), so the
rank and the extreme singular pairs are unambiguous and every route must agree to the rounding
of its dtype.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import conditioned_rtol

import condreg

FUNCTIONS = ("condition_number", "r_well", "r_ill")

# --------------------------------------------------------------------------------------------
# The reference: float64 NumPy SVD and the closed forms
# --------------------------------------------------------------------------------------------


def _reference_one(quantity: str, F: np.ndarray, gram: bool, eps: float):
    m, n = F.shape
    U, s, Vt = np.linalg.svd(F, full_matrices=False)
    k = int(np.sum(s > max(m, n) * eps * s[0]))
    if gram:
        # H = FᵀF = V diag(mu) Vᵀ; G = d value / d H; d value / d F = 2 F G.
        H = F.T @ F
        mu, fro2, p = s**2, float(np.sum(H * H)), n
        v1, vk = Vt[0], Vt[k - 1]
        if quantity == "condition_number":
            value = mu[0] / mu[k - 1]
            G = value * (np.outer(v1, v1) / mu[0] - np.outer(vk, vk) / mu[k - 1])
        elif quantity == "r_well":
            value = 0.5 * mu[0] ** 2 - fro2 / (2 * p)
            G = mu[0] * np.outer(v1, v1) - H / p
        else:
            den = fro2 / (2 * k) - 0.5 * mu[k - 1] ** 2
            value = 1.0 / den
            G = (mu[k - 1] * np.outer(vk, vk) - H / k) / den**2
        return value, 2.0 * F @ G
    fro2, p = float(np.sum(F * F)), min(m, n)
    top, bottom = np.outer(U[:, 0], Vt[0]), np.outer(U[:, k - 1], Vt[k - 1])
    if quantity == "condition_number":
        value = s[0] / s[k - 1]
        return value, value * (top / s[0] - bottom / s[k - 1])
    if quantity == "r_well":
        return 0.5 * s[0] ** 2 - fro2 / (2 * p), s[0] * top - F / p
    den = fro2 / (2 * k) - 0.5 * s[k - 1] ** 2
    return 1.0 / den, (s[k - 1] * bottom - F / k) / den**2


def reference(quantity: str, F, *, gram: bool, eps: float = float(np.finfo(np.float64).eps)):
    """Value (shape ``F.shape[:-2]``) and gradient (shape ``F.shape``) of ``quantity`` at ``F``
    in float64: kappa = mu_1 / mu_k, R_well = ½ mu_1² − ‖·‖_F² / (2p),
    R_ill = 1 / (‖·‖_F² / (2k) − ½ mu_k²) on the singular values ``mu`` of ``FᵀF``
    (``gram=True``, ``p = D``) or of ``F`` (``p = min(N, D)``); rank ``k`` = #{sigma_i >
    max(N, D)·eps·sigma_1}."""
    F = np.asarray(F, dtype=np.float64)
    flat = F.reshape((-1,) + F.shape[-2:])
    pairs = [_reference_one(quantity, A, gram, eps) for A in flat]
    values = np.array([v for v, _ in pairs]).reshape(F.shape[:-2])
    grads = np.stack([g for _, g in pairs]).reshape(F.shape)
    return values, grads


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def _matrix(N: int, D: int, ill: bool, seed: int) -> np.ndarray:
    """``U diag(s) Vᵀ`` with random orthonormal ``U``, ``V`` and unique extremes: kappa 4
    (``2, 1.5 … 0.7, 0.5``) or, ``ill``, kappa 1e7 (``1, 0.5 … 1e-6, 1e-7``: the Gram matrix
    does not resolve the bottom in float64)."""
    rng = np.random.default_rng(seed)
    p = min(N, D)
    if ill:
        s = np.concatenate([[1.0], np.geomspace(0.5, 1e-6, p - 2), [1e-7]])
    else:
        s = np.concatenate([[2.0], np.geomspace(1.5, 0.7, p - 2), [0.5]])
    U = np.linalg.qr(rng.standard_normal((N, p)))[0]
    V = np.linalg.qr(rng.standard_normal((D, p)))[0]
    return (U * s) @ V.T


def make_input(shape: str) -> np.ndarray:
    """``"40x9"``, ``"3x20x30"`` (a batch), ``"300x200ill"`` (kappa 1e7)."""
    ill = shape.endswith("ill")
    dims = [int(d) for d in shape.removesuffix("ill").split("x")]
    *batch, N, D = dims
    mats = [_matrix(N, D, ill, seed) for seed in range(int(np.prod(batch, dtype=int)))]
    return np.stack(mats).reshape(*batch, N, D)


# --------------------------------------------------------------------------------------------
# The routes: each returns what it computed, as float64 NumPy (value, gradient, ...)
# --------------------------------------------------------------------------------------------


@dataclass
class Out:
    """What a route computed: ``value`` (None: not computed), ``grad`` w.r.t. the input (None:
    not computed), ``F`` the float64 matrix the reference must be evaluated at (default: the
    input), ``grad_map`` turning the reference gradient into the route's (autocast: the weight's
    gradient), ``jvp`` ``(tangent, direction)``, and dtypes to check."""

    value: np.ndarray | None
    grad: np.ndarray | None = None
    F: np.ndarray | None = None
    grad_map: object = None
    jvp: tuple | None = None
    dtypes: tuple = ()


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().double().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _torch_eager(fn, F, gram, *, dtype="float64", check_finite=True):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    T = torch.tensor(F, dtype=dt, requires_grad=True)
    kwargs = {} if check_finite else {"check_finite": False}
    v = fn(T, gram=gram, **kwargs)
    v.sum().backward()
    dtypes = ((v.dtype, dt), (T.grad.dtype, dt))
    return Out(_np(v), _np(T.grad), F=_np(T), dtypes=dtypes)


def _torch_no_grad(fn, F, gram):
    torch = pytest.importorskip("torch")
    T = torch.tensor(F, requires_grad=True)
    with torch.no_grad():
        v = fn(T, gram=gram)
    assert not v.requires_grad
    return Out(_np(v))


def _torch_autocast(fn, F, gram):
    """A float32 ``nn.Linear`` (no bias) produces ``F`` from an orthogonal ``X`` under CPU
    bfloat16 autocast; the gradient flows to the layer's float32 weight."""
    torch = pytest.importorskip("torch")
    N, D = F.shape
    X = np.linalg.qr(np.random.default_rng(7).standard_normal((N, N)))[0]
    layer = torch.nn.Linear(N, D, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(F.T @ X, dtype=torch.float32))
    Xt = torch.tensor(X, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        feats = layer(Xt)
        v = fn(feats, gram=gram)
    v.sum().backward()
    W = layer.weight
    dtypes = ((W.grad.dtype, W.dtype),)
    # F = X Wᵀ: d/dW = (d/dF)ᵀ X
    return Out(_np(v), _np(W.grad), F=_np(feats), grad_map=lambda g: g.T @ X, dtypes=dtypes)


def _torch_func_grad(fn, F, gram):
    torch = pytest.importorskip("torch")
    T = torch.tensor(F)
    g = torch.func.grad(lambda x: fn(x, gram=gram).sum())(T)
    return Out(_np(fn(T, gram=gram)), _np(g))


def _torch_vmap(fn, F, gram):
    torch = pytest.importorskip("torch")
    T = torch.tensor(F)
    v = torch.func.vmap(lambda x: fn(x, gram=gram))(T)
    g = torch.func.vmap(torch.func.grad(lambda x: fn(x, gram=gram)))(T)
    return Out(_np(v), _np(g))


def _torch_compile(backend):
    def run(fn, F, gram):
        torch = pytest.importorskip("torch")
        torch.compiler.reset()
        compiled = torch.compile(lambda x: fn(x, gram=gram), backend=backend, fullgraph=True)
        T = torch.tensor(F, requires_grad=True)
        v = compiled(T)
        v.sum().backward()
        return Out(_np(v), _np(T.grad))

    return run


def _torch_gradcheck(fn, F, gram):
    torch = pytest.importorskip("torch")
    T = torch.tensor(F, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: fn(x, gram=gram), (T,))
    v = fn(T, gram=gram)
    v.sum().backward()
    return Out(_np(v), _np(T.grad))


def _torch_jvp(fn, F, gram):
    torch = pytest.importorskip("torch")
    direction = np.random.default_rng(3).standard_normal(F.shape)
    v, tangent = torch.func.jvp(
        lambda x: fn(x, gram=gram), (torch.tensor(F),), (torch.tensor(direction),)
    )
    return Out(_np(v), jvp=(_np(tangent), direction))


def _numpy(dtype):
    def run(fn, F, gram):
        name = fn.__name__
        X = F.astype(dtype)
        v, g = fn(X, gram=gram), getattr(condreg, name + "_grad")(X, gram=gram)
        dtypes = ((np.asarray(v).dtype, np.dtype(dtype)), (g.dtype, np.dtype(dtype)))
        return Out(_np(v), _np(g), F=X.astype(np.float64), dtypes=dtypes)

    return run


def _jax_grad(fn, F, gram):
    import jax
    import jax.numpy as jnp

    X = jnp.asarray(F)
    g = jax.grad(lambda x: fn(x, gram=gram).sum())(X)
    return Out(_np(fn(X, gram=gram)), _np(g), F=_np(X))


def _jax_jit(fn, F, gram):
    import jax
    import jax.numpy as jnp

    v, g = jax.jit(jax.value_and_grad(lambda x: fn(x, gram=gram).sum()))(jnp.asarray(F))
    vals = jax.jit(lambda x: fn(x, gram=gram))(jnp.asarray(F))
    assert np.allclose(_np(v), _np(vals).sum(), rtol=1e-12)
    return Out(_np(vals), _np(g))


def _jax_vmap(fn, F, gram):
    import jax
    import jax.numpy as jnp

    X = jnp.asarray(F)
    v = jax.vmap(lambda x: fn(x, gram=gram))(X)
    g = jax.vmap(jax.grad(lambda x: fn(x, gram=gram)))(X)
    return Out(_np(v), _np(g))


def _strict(fn, F, gram):
    xp = pytest.importorskip("array_api_strict")
    X = xp.asarray(F)
    v = fn(X, gram=gram)
    g = getattr(condreg, fn.__name__ + "_grad")(X, gram=gram)
    return Out(np.asarray(float(v)) if v.ndim == 0 else _np(np.asarray(v)), np.asarray(g))


# --------------------------------------------------------------------------------------------
# The cases: route -> (runner, tolerance, x64 JAX, shapes)
# --------------------------------------------------------------------------------------------

# "ill" (kappa(F) = 1e7) follows the conditioning: conditioned_rtol(1e7) = 2.2e-7, with the
# margin of the 300x200 shape's longer reductions
TOL = {"float64": 1e-9, "ill": 5 * conditioned_rtol(1e7), "float32": 2e-4, "half": 2e-2}

SIZES = ["40x9", "9x40", "64x784", "130x140", "140x130", "300x200", "3x20x30"]
ILL = ["40x9ill", "9x40ill", "300x200ill"]
BATCHES = ["3x20x30", "2x9x40", "2x140x130"]

NOGRAM = ["40x9", "9x40", "130x140"]

ROUTES = {
    # name: (runner, dtype tolerance key, shapes with gram=True, shapes with gram=False)
    "eager": (_torch_eager, "float64", SIZES + ILL, NOGRAM),
    "no_grad": (_torch_no_grad, "float64", SIZES + ILL, NOGRAM),
    "unchecked": (
        lambda fn, F, gram: _torch_eager(fn, F, gram, check_finite=False),
        "float64",
        SIZES + ILL,
        NOGRAM,
    ),
    "float32": (
        lambda fn, F, gram: _torch_eager(fn, F, gram, dtype="float32"),
        "float32",
        SIZES,
        NOGRAM,
    ),
    "float16": (
        lambda fn, F, gram: _torch_eager(fn, F, gram, dtype="float16"),
        "half",
        ["40x9", "9x40", "130x140", "300x200"],
        [],
    ),
    "bfloat16": (
        lambda fn, F, gram: _torch_eager(fn, F, gram, dtype="bfloat16"),
        "half",
        ["40x9", "9x40", "130x140", "300x200", "3x20x30"],
        [],
    ),
    "autocast": (_torch_autocast, "half", ["40x9", "9x40", "64x784", "140x130", "300x200"], []),
    "func_grad": (_torch_func_grad, "float64", SIZES + ILL, NOGRAM),
    "vmap": (_torch_vmap, "float64", BATCHES, ["2x9x40"]),
    "batched": (_torch_eager, "float64", BATCHES + ["2x300x200ill"], ["2x40x9"]),
    "compile_eager": (_torch_compile("eager"), "float64", ["9x40", "140x130"], ["40x9"]),
    "compile_aot_eager": (
        _torch_compile("aot_eager"),
        "float64",
        ["40x9", "130x140", "3x20x30"],
        ["9x40"],
    ),
    "compile_inductor": (_torch_compile("inductor"), "float64", ["40x9"], []),
    "gradcheck": (_torch_gradcheck, "float64", ["12x5", "5x12"], ["12x5"]),
    "jvp": (_torch_jvp, "float64", ["40x9", "9x40"], ["40x9"]),
    "numpy": (_numpy(np.float64), "float64", SIZES + ILL, NOGRAM),
    "numpy_float32": (_numpy(np.float32), "float32", ["40x9", "9x40", "300x200"], ["40x9"]),
    "jax_grad": (_jax_grad, "float64", ["40x9", "9x40", "140x130", "300x200ill"], ["40x9"]),
    "jax_jit": (_jax_jit, "float64", ["9x40", "300x200ill"], []),
    "jax_vmap": (_jax_vmap, "float64", ["3x20x30"], []),
    "jax_float32": (
        lambda fn, F, gram: _jax_grad(fn, F.astype(np.float32), gram),
        "float32",
        ["40x9"],
        [],
    ),
    "strict": (_strict, "float64", ["40x9", "9x40", "140x130", "3x20x30"], ["40x9"]),
}


def _cases():
    for route, (_, _, gram_shapes, plain_shapes) in ROUTES.items():
        for fn, (gram, shapes) in itertools.product(
            FUNCTIONS, ((True, gram_shapes), (False, plain_shapes))
        ):
            for shape in shapes:
                suffix = "" if gram else "-nogram"
                yield pytest.param(fn, route, shape, gram, id=f"{fn}-{route}-{shape}{suffix}")


@pytest.mark.parametrize(("quantity", "route", "shape", "gram"), list(_cases()))
def test_route(request, quantity, route, shape, gram):
    """Every route's value and gradient equal the float64 closed form (to the route's dtype)."""
    runner, tol_key, _, _ = ROUTES[route]
    if route.startswith("jax"):
        pytest.importorskip("jax")
        request.getfixturevalue("x32" if route == "jax_float32" else "x64")
    tol = TOL["ill"] if shape.endswith("ill") and tol_key == "float64" else TOL[tol_key]
    F = make_input(shape)
    out = runner(getattr(condreg, quantity), F, gram)
    for got, want in out.dtypes:
        assert got == want, f"dtype {got}, expected {want}"
    ref_value, ref_grad = reference(quantity, F if out.F is None else out.F, gram=gram)
    if out.value is not None:
        assert out.value.shape == ref_value.shape
        np.testing.assert_allclose(out.value, ref_value, rtol=tol, atol=0)
    if out.grad_map is not None:
        ref_grad = out.grad_map(ref_grad)
    if out.grad is not None:
        assert out.grad.shape == ref_grad.shape
        err = np.max(np.abs(out.grad - ref_grad)) / np.max(np.abs(ref_grad))
        assert err <= tol, f"gradient relative error {err:.2e} > {tol:.0e}"
    if out.jvp is not None:
        tangent, direction = out.jvp
        want = np.sum(ref_grad * direction, axis=(-2, -1))
        np.testing.assert_allclose(tangent, want, rtol=tol, atol=tol * np.max(np.abs(want)))


# --------------------------------------------------------------------------------------------
# The reference itself, against autodiff through svdvals
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gram", [True, False], ids=["gram", "nogram"])
@pytest.mark.parametrize("quantity", FUNCTIONS)
@pytest.mark.parametrize("shape", ["40x9", "9x40", "300x200ill"])
def test_reference_matches_autograd_through_svdvals(quantity, shape, gram):
    """:func:`reference`'s closed forms equal ``torch.autograd`` through ``svdvals`` (float64)."""
    torch = pytest.importorskip("torch")
    F = make_input(shape)
    N, D = F.shape
    T = torch.tensor(F, requires_grad=True)
    s = torch.linalg.svdvals(T)
    k = int(torch.sum(s > max(N, D) * np.finfo(np.float64).eps * s[0]))
    mu, p = (s * s, D) if gram else (s, min(N, D))
    fro2 = torch.sum(mu * mu)
    if quantity == "condition_number":
        value = mu[0] / mu[k - 1]
    elif quantity == "r_well":
        value = 0.5 * mu[0] ** 2 - fro2 / (2 * p)
    else:
        value = 1.0 / (torch.sum(mu[:k] ** 2) / (2 * k) - 0.5 * mu[k - 1] ** 2)
    value.backward()
    ref_value, ref_grad = reference(quantity, F, gram=gram)
    tol = 1e-6 if shape.endswith("ill") else 1e-10
    np.testing.assert_allclose(ref_value, value.item(), rtol=tol)
    err = np.max(np.abs(ref_grad - T.grad.numpy())) / np.max(np.abs(ref_grad))
    assert err <= tol
