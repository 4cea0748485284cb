"""Bad input: each case raises a typed, explaining error (or returns a documented value), on
every backend where the case exists; no call returns a silent NaN."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import condreg
from condreg import PoleError, RankError
from condreg.testing import assert_close, to_numpy

VALUES = ["condition_number", "r_well", "r_ill"]
GRADS = ["condition_number_grad", "r_well_grad", "r_ill_grad"]
ALL = VALUES + GRADS


def _call(name, S, **kwargs):
    return getattr(condreg, name)(S, **kwargs)


@pytest.mark.parametrize("name", ALL)
def test_zero_matrix_raises_rank_error(backend, name):
    S = backend.asarray(np.zeros((3, 2)))
    with pytest.raises(RankError, match="rank 0"):
        _call(name, S)


def test_zero_matrix_in_a_batch_raises_rank_error():
    S = np.stack([np.diag([2.0, 1.0]), np.zeros((2, 2))])
    with pytest.raises(RankError):
        condreg.r_ill(S)


@pytest.mark.parametrize("spectrum", [[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]], ids=["kappa-1", "rank-1"])
def test_r_ill_pole(backend, spectrum):
    S = backend.asarray(np.diag(spectrum))
    assert_close(condreg.r_ill(S), backend.asarray(math.inf))
    with pytest.raises(PoleError, match="pole"):
        condreg.r_ill_grad(S)
    # Only R_ill has the pole: kappa and R_well are fine there.
    assert_close(condreg.condition_number(S), backend.asarray(1.0), rtol=backend.rtol)
    assert np.all(np.isfinite(to_numpy(condreg.r_well_grad(S))))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", ALL)
def test_non_finite_raises_value_error(backend, name, bad):
    A = np.diag([2.0, 1.0, 0.5])
    A[0, 1] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        _call(name, backend.asarray(A))


@pytest.mark.parametrize("name", ALL)
def test_complex_raises_type_error(name):
    with pytest.raises(TypeError, match="complex"):
        _call(name, np.eye(2, dtype=np.complex128))


def test_complex_raises_type_error_torch():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="complex"):
        condreg.r_well(torch.eye(2, dtype=torch.complex64))


@pytest.mark.parametrize("name", ALL)
def test_bool_raises_type_error(backend, name):
    S = backend.xp.asarray(np.eye(2, dtype=bool))
    with pytest.raises(TypeError, match="boolean"):
        _call(name, S)


@pytest.mark.parametrize("shape", [(), (3,)], ids=["0-d", "1-d"])
@pytest.mark.parametrize("name", ALL)
def test_ndim_below_two_raises_value_error(backend, name, shape):
    S = backend.asarray(np.ones(shape))
    with pytest.raises(ValueError, match="ndim"):
        _call(name, S)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 0, 0)])
@pytest.mark.parametrize("name", ALL)
def test_empty_matrix_raises_value_error(name, shape):
    with pytest.raises(ValueError, match="empty"):
        _call(name, np.ones(shape))


def test_empty_batch_gives_empty_result():
    """A batch of zero matrices (each matrix non-empty) is not an error: empty output."""
    out = condreg.r_ill(np.ones((0, 3, 2)))
    assert out.shape == (0,)
    assert condreg.r_ill_grad(np.ones((0, 3, 2))).shape == (0, 3, 2)


def _default_float(xp):
    return xp.__array_namespace_info__().default_dtypes()["real floating"]


@pytest.mark.parametrize("name", ALL)
def test_integer_input_is_promoted_to_default_float(backend, name):
    """Documented: integer input is promoted to the namespace's default real floating dtype
    (like numpy.linalg): float64 for NumPy, torch.get_default_dtype() for torch, float32 for
    JAX unless x64 is enabled."""
    S = backend.xp.asarray(np.diag([3, 1, 2]).astype(np.int32))
    out = _call(name, S)
    assert out.dtype == _default_float(backend.xp)
    if backend.xp is np:
        assert out.dtype == np.float64
    if name == "condition_number":
        assert_close(out, backend.xp.asarray(3.0, dtype=out.dtype), rtol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_array_likes_are_numpy_input(name):
    """Nested lists and tuples are NumPy input, as in numpy.linalg."""
    want = _call(name, np.array([[1.0, 2.0], [3.0, 4.0]]))
    for like in ([[1, 2], [3, 4]], ((1.0, 2.0), (3.0, 4.0))):
        got = _call(name, like)
        assert isinstance(got, np.ndarray) and got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-15)


@pytest.mark.parametrize("bad", [object(), {"a": 1}, "abc", [[1.0, 2.0], [3.0]]])
@pytest.mark.parametrize("name", ALL)
def test_what_numpy_cannot_read_raises_type_error(name, bad):
    with pytest.raises(TypeError):
        _call(name, bad)


@pytest.mark.parametrize("arg", ["gram", "check_finite"])
@pytest.mark.parametrize("name", ALL)
def test_flags_must_be_bool(name, arg):
    """``gram="yes"`` is not silently true; NumPy's bool is a bool."""
    S = np.diag([2.0, 1.0])
    for bad in ("yes", 1, None, 1.0):
        with pytest.raises(TypeError, match=arg):
            _call(name, S, **{arg: bad})
    for good in (np.True_, np.bool_(False)):
        _call(name, S, **{arg: good})


@pytest.mark.parametrize("name", ALL)
def test_masked_arrays_raise_type_error_naming_the_fix(name):
    S = np.ma.masked_array(np.diag([2.0, 1.0]), mask=[[False, True], [False, False]])
    with pytest.raises(TypeError, match=r"filled\(.*\.data"):
        _call(name, S)


@pytest.mark.parametrize("dtype", ["longdouble", "complex64", "complex128"])
@pytest.mark.parametrize("name", ALL)
def test_unsupported_dtypes_name_the_supported_ones(name, dtype):
    if dtype == "longdouble" and np.dtype(np.longdouble) == np.float64:
        pytest.skip("longdouble is float64 on this platform")
    with pytest.raises(TypeError, match="float16, bfloat16, float32, float64"):
        _call(name, np.eye(2, dtype=dtype))


def test_mixed_namespaces_raise_type_error():
    xps = pytest.importorskip("array_api_strict")
    with pytest.raises(TypeError, match="mixed namespaces"):
        condreg.r_ill(np.diag([2.0, 1.0]), xp=xps)
    with pytest.raises(TypeError, match="mixed namespaces"):
        condreg.r_well_grad(xps.asarray(np.diag([2.0, 1.0])), xp=np)
    with pytest.raises(TypeError, match="mixed namespaces"):
        condreg.condition_number([[2.0, 0.0], [0.0, 1.0]], xp=xps)


def test_mixed_namespaces_torch_raise_type_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="mixed namespaces"):
        condreg.r_ill(torch.eye(2, dtype=torch.float64) * 2, xp=np)


def test_matching_xp_override_is_accepted(backend):
    S = backend.matrix([2.0, 1.0], 3, 2, seed=0)
    assert_close(condreg.condition_number(S, xp=backend.xp), condreg.condition_number(S))


def test_namespace_without_linalg_raises_type_error():
    fake = types.SimpleNamespace(__name__="fake_numpy", asarray=np.asarray)
    with pytest.raises(TypeError, match="linalg"):
        condreg.r_well(np.eye(2), xp=fake)


def test_array_api_strict_without_linalg_extension_raises_type_error():
    xps = pytest.importorskip("array_api_strict")
    S = xps.asarray(np.diag([2.0, 1.0]))
    saved = xps.get_array_api_strict_flags()
    try:
        xps.set_array_api_strict_flags(enabled_extensions=())
        with pytest.raises(TypeError, match="linalg"):
            condreg.r_ill(S)
    finally:
        xps.set_array_api_strict_flags(**saved)


def test_invalid_tolerances_raise_typed_errors():
    S = np.diag([2.0, 1.0])
    for bad, error in [(-1.0, ValueError), (1.0, ValueError), (math.nan, ValueError),
                       ("0.1", TypeError), (True, TypeError)]:  # fmt: skip
        with pytest.raises(error, match="rtol"):
            condreg.r_ill(S, rtol=bad)
        with pytest.raises(error, match="tie_rtol"):
            condreg.r_well_grad(S, tie_rtol=bad)


def _entry_points():
    """Every public function that takes ``rtol``, ``tie_rtol`` or ``ridge``: (name, call)."""
    import condreg.algorithm
    import condreg.attacks
    import condreg.metrics

    rng = np.random.default_rng(0)
    X_p, X_h, y = rng.normal(size=(12, 4)), rng.normal(size=(12, 4)), rng.normal(size=12)
    theta = np.eye(4)
    out = [
        ("rtol", lambda v: condreg.condition_number(X_p, rtol=v)),
        ("rtol", lambda v: condreg.r_ill(X_p, rtol=v, gram=True)),
        ("rtol", lambda v: condreg.r_ill_grad(X_p, rtol=v)),
        ("tie_rtol", lambda v: condreg.r_ill(X_p, tie_rtol=v)),
        ("tie_rtol", lambda v: condreg.condition_number_grad(X_p, tie_rtol=v)),
        ("tie_rtol", lambda v: condreg.r_well_grad(X_p, tie_rtol=v, gram=True)),
        ("rtol", lambda v: condreg.metrics.rir(theta, X_p, X_h, rtol=v)),
        ("rtol", lambda v: condreg.metrics.rir_spectra(theta, X_p, X_h, rtol=v)),
        ("rtol", lambda v: condreg.metrics.rir_spectra(theta, X_p, X_h).rir(rtol=v)),
        ("rtol", lambda v: condreg.immunize(X_p, y, X_h, epochs=1, rtol=v)),
        ("ridge", lambda v: condreg.immunize(X_p, y, X_h, epochs=1, ridge=v)),
        ("rtol", lambda v: condreg.algorithm.setup_data(X_p, X_h, rtol=v)),
        ("ridge", lambda v: condreg.algorithm.setup_data(X_p, X_h, ridge=v)),
        ("rtol", lambda v: condreg.attacks.probe(theta, X_p, y, rtol=v)),
    ]
    try:
        import jax.numpy as jnp

        import condreg.jax.optax
        import condreg.jax.train
    except ImportError:  # pragma: no cover - the jax/optax extras
        pass
    else:
        ones = jnp.ones((4, 3))
        out += [
            ("ridge", lambda v: condreg.jax.optax.condition_regularizer(ridge=v)),
            ("ridge", lambda v: condreg.jax.train.precondition(ones, ones, ridge=v)),
        ]
    try:
        import torch

        from condreg.torch import nn as cnn
    except ImportError:  # pragma: no cover - the torch extra
        return out
    F, x = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
    layer = torch.nn.Linear(4, 2).double()
    K = cnn.layer_gram(layer, x)
    out += [
        ("rtol", lambda v: condreg.r_ill(F, rtol=v)),
        ("tie_rtol", lambda v: condreg.r_ill(F, tie_rtol=v, gram=True)),
        ("rtol", lambda v: cnn.ConditionRegularizer(rtol=v)),
        ("rtol", lambda v: cnn.precondition(F, x, rtol=v)),
        ("ridge", lambda v: cnn.precondition(F, x, ridge=v)),
        ("ridge", lambda v: cnn.Precondition(ridge=v)),
        ("rtol", lambda v: cnn.Precondition(rtol=v)),
        ("rtol", lambda v: cnn.left_precondition(layer, torch.ones(2, 4), K, rtol=v)),
        ("absolute_ridge", lambda v: cnn.left_precondition(layer, torch.ones(2, 4), K, v)),
    ]
    return out


@pytest.mark.parametrize(
    "bad, error",
    [("0.1", TypeError), (True, TypeError), ([0.1], TypeError), (math.nan, ValueError),
     (-1.0, ValueError), (math.inf, ValueError)],
)  # fmt: skip
def test_tolerances_and_ridges_have_one_convention(bad, error):
    """One validator each for ``rtol``, ``tie_rtol`` and ``ridge``: a wrong type is a
    ``TypeError``, a bad value a ``ValueError``, naming the argument, at every entry point."""
    for name, call in _entry_points():
        with pytest.raises(error, match=name):
            call(bad)
    for name, call in _entry_points():  # the range: [0, 1) for tolerances, >= 0 for ridges
        if "ridge" in name:
            continue
        with pytest.raises(ValueError, match=name):
            call(1.0)


# --------------------------------------------------------------------------------------------
# check_finite=False
# --------------------------------------------------------------------------------------------


def test_check_finite_false_skips_the_rank_check(backend):
    """The zero matrix no longer raises RankError (the value is then undefined)."""
    S = backend.asarray(np.zeros((3, 2)))
    try:
        condreg.r_well(S, check_finite=False)
    except RankError:  # pragma: no cover - the assertion
        pytest.fail("check_finite=False must skip the rank check")


def test_check_finite_false_skips_the_pole_check(backend):
    S = backend.asarray(np.eye(3))
    G = condreg.r_ill_grad(S, check_finite=False)  # no PoleError: the result is not finite
    assert not np.all(np.isfinite(to_numpy(G)))


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
def test_check_finite_false_gives_nan_for_non_finite_input(backend, gram, bad):
    """Documented (docs/api.md): without the check, NaN/Inf input gives NaN values and
    gradients on every backend — never a LAPACK error, never a finite number. Only that matrix
    of a batch."""
    A = np.stack([np.diag([2.0, 1.0, 0.5]), np.diag([3.0, 1.0, 0.25])])
    A[0, 0, 1] = bad
    S = backend.asarray(A)
    for name in VALUES:
        out = to_numpy(_call(name, S, gram=gram, check_finite=False))
        assert np.isnan(out[0]) and np.isfinite(out[1]), name
    for name in GRADS:
        G = to_numpy(_call(name, S, gram=gram, check_finite=False))
        assert np.isnan(G[0]).all() and np.isfinite(G[1]).all(), name


def test_check_finite_false_gives_nan_for_a_zero_matrix(backend):
    S = backend.asarray(np.zeros((3, 2)))
    for name in ALL:
        assert np.isnan(to_numpy(_call(name, S, check_finite=False))).all(), name


def test_torch_backward_without_checks_gives_nan_gradients():
    torch = pytest.importorskip("torch")
    X = torch.tensor([[2.0, math.nan], [0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    for name in VALUES:
        X.grad = None
        v = _call(name, X, gram=True, check_finite=False)
        v.backward()
        assert torch.isnan(v) and torch.isnan(X.grad).all(), name


def test_largest_singular_value_overflowing_is_not_a_zero_matrix():
    """``np.full((3, 3), 1e308)``: finite, rank 1, σ₁ = 3e308 overflows. It is scaled by a power
    of two first: κ = 1, R_well overflows to inf, R_ill is at its pole, and the gradients are the
    representable ones (κ's is 0 at rank 1; R_well's ``σ₁u₁v₁ᵀ − S/p`` = 2e308/3 each)."""
    S = np.full((3, 3), 1e308)
    assert float(condreg.condition_number(S)) == 1.0
    assert float(condreg.r_well(S)) == math.inf and float(condreg.r_ill(S)) == math.inf
    assert np.all(condreg.condition_number_grad(S) == 0.0)
    np.testing.assert_allclose(condreg.r_well_grad(S), np.full((3, 3), 1e308 / 3 * 2), rtol=1e-14)
    with pytest.raises(PoleError):
        condreg.r_ill_grad(S)
    assert float(condreg.condition_number(S, gram=True)) == 1.0


# --------------------------------------------------------------------------------------------
# No silent NaN
# --------------------------------------------------------------------------------------------


@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=4),
        elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
        | st.sampled_from([0.0, 1.0, -1.0]),
    ),
    st.sampled_from(ALL),
    st.sampled_from([1.0, 1e-150, 1e150]),
)
def test_no_silent_nan(A, name, scale):
    """On any finite input a call either raises a ValueError subclass (rank 0, pole) or returns
    a result without NaN (inf only where the true value overflows or at R_ill's pole)."""
    try:
        out = to_numpy(_call(name, A * scale))
    except (RankError, PoleError):
        return
    assert not np.any(np.isnan(out)), (name, A, out)
    if name in ("condition_number", "r_well"):
        assert np.all(np.isfinite(out)) or scale > 1


def test_overflowing_r_well_is_inf_not_nan():
    """½sigma_1² − ‖S‖_F²/(2p) overflows as inf − inf = NaN; the value itself is just too big."""
    S = np.diag([1e200, 1e199, 1e198])
    assert float(condreg.r_well(S)) == math.inf
    assert_close(condreg.r_well(S * 1e-200), np.asarray(0.5 - (1 + 1e-2 + 1e-4) / 6))


# --------------------------------------------------------------------------------------------
# Representable extremes, half precision, vmap over bad batches (issue 8's core cases)
# --------------------------------------------------------------------------------------------

VALUES_F = [condreg.condition_number, condreg.r_well, condreg.r_ill]
EXTREMES = [
    # (features, dtype, kappa(FᵀF), R_well(FᵀF), R_ill(FᵀF)): mu = σ² under/overflows, the
    # values are the representable results (0 for an underflowing R_well, +inf at R_ill's pole
    # or for an overflowing one), never NaN.
    (1e-170 * np.diag([1.0, 0.5, 0.25]), "float64", 16.0, 0.0, math.inf),
    (1e20 * np.eye(3), "float32", 1.0, 0.0, math.inf),
]


@pytest.mark.parametrize(("F", "dtype", "kappa", "rwell", "rill"), EXTREMES, ids=["1e-170", "1e20"])
@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_gram_values_at_representable_extremes(F, dtype, kappa, rwell, rill, lib, request):
    if lib == "numpy":
        X = F.astype(dtype)
    elif lib == "torch":
        torch = pytest.importorskip("torch")
        X = torch.asarray(F, dtype=getattr(torch, dtype))
    else:
        jnp = pytest.importorskip("jax.numpy")
        request.getfixturevalue("x64")
        X = jnp.asarray(F, dtype=dtype)
    got = [float(to_numpy(f(X, gram=True))) for f in VALUES_F]
    assert got[0] == pytest.approx(kappa, rel=1e-5)
    assert got[1] == rwell and got[2] == rill
    for name in ("condition_number_grad", "r_well_grad"):
        G = to_numpy(getattr(condreg, name)(X, gram=True))
        assert not np.any(np.isnan(G)), name


def test_r_ill_of_a_huge_tied_matrix_is_inf():
    assert condreg.r_ill(np.diag([1e308, 1e308])) == math.inf
    assert condreg.r_ill(np.diag([1e308, 1e308]), gram=True) == math.inf


def test_values_are_0d_arrays_on_numpy():
    S = np.diag([3.0, 2.0, 1.0])
    for f in VALUES_F:
        out = f(S)
        assert isinstance(out, np.ndarray) and out.shape == (), f.__name__


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("name", VALUES)
def test_torch_vmap_over_a_bad_batch_raises_value_error(name, bad):
    torch = pytest.importorskip("torch")
    X = torch.randn(3, 4, 3, dtype=torch.float64)
    X[1, 0, 0] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        torch.func.vmap(getattr(condreg, name))(X)


def test_condition_regularizer_on_a_zero_batch_raises_rank_error():
    torch = pytest.importorskip("torch")
    from condreg.torch.nn import ConditionRegularizer

    with pytest.raises(RankError):
        ConditionRegularizer()(torch.zeros(8, 5), torch.zeros(8, 5))


@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_half_precision_is_computed_in_float32(lib, half, gram):
    """float16/bfloat16 input: the values of the same (rounded) matrix computed in float32,
    results and gradients in the input dtype."""
    F = np.random.default_rng(0).standard_normal((8, 5))
    if lib == "numpy":
        if half == "bfloat16":
            pytest.skip("NumPy has no bfloat16")
        X = F.astype(half)
        X32 = X.astype(np.float32)
    elif lib == "torch":
        torch = pytest.importorskip("torch")
        X = torch.asarray(F).to(getattr(torch, half))
        X32 = X.float()
    else:
        jnp = pytest.importorskip("jax.numpy")
        X = jnp.asarray(F, dtype=getattr(jnp, half))
        X32 = X.astype(jnp.float32)

    def f64(a):  # bfloat16 has no NumPy dtype: widen in the array's own library first
        return to_numpy(a.float() if lib == "torch" else a.astype("float32")).astype(np.float64)

    for f in VALUES_F:
        out = f(X, gram=gram)
        assert out.dtype == X.dtype
        want = float(f64(f(X32, gram=gram)))
        assert float(f64(out)) == pytest.approx(want, rel=1e-2)
    for name in GRADS:
        G = getattr(condreg, name)(X, gram=gram)
        assert G.dtype == X.dtype
        want = f64(getattr(condreg, name)(X32, gram=gram))
        got = f64(G)
        assert np.max(np.abs(got - want)) <= 2e-2 * np.max(np.abs(want))


def test_torch_half_backward_gives_half_gradients():
    torch = pytest.importorskip("torch")
    X = torch.randn(8, 5).to(torch.float16).requires_grad_()
    condreg.r_ill(X, gram=True).backward()
    assert X.grad.dtype == torch.float16 and torch.all(torch.isfinite(X.grad))
    want = condreg.r_ill_grad(X.detach().float(), gram=True)
    assert torch.allclose(X.grad.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


@pytest.mark.parametrize("gram", [False, True], ids=["S", "gram"])
@pytest.mark.parametrize("kappa", [1e2, 1e4, 1e6])
def test_float32_kappa_computed_in_float64_is_accurate(kappa, gram):
    """compute_dtype=float64: κ of the float32 matrix (as stored) to 1e-3 up to κ(F) = 1e6."""
    from condreg.testing import matrix_with_spectrum

    F = matrix_with_spectrum(np.logspace(0, -np.log10(kappa), 12), 40, 12, seed=3)
    F32 = F.astype(np.float32)
    exact = np.linalg.svd(F32.astype(np.float64), compute_uv=False)
    want = (exact[0] / exact[-1]) ** (2 if gram else 1)
    got = condreg.condition_number(F32, gram=gram, compute_dtype=np.float64)
    assert got.dtype == np.float32
    assert float(got) == pytest.approx(want, rel=1e-3)


def test_invalid_compute_dtype_raises_type_error():
    with pytest.raises(TypeError, match="compute_dtype"):
        condreg.r_ill(np.eye(3), compute_dtype="float64x")
