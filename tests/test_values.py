"""Values of kappa, R_well and R_ill (docs/math.md §1, §3) against an independent NumPy computation,
on every backend: namespace, dtype, device and shape of the output are the input's."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import QUANTITIES, reference

import condreg
from condreg.testing import assert_close, matrix_with_spectrum

SPECTRA = [
    pytest.param([3.0, 2.0, 1.0], 4, 3, id="tall-generic"),
    pytest.param([5.0, 1.5, 0.7], 3, 5, id="wide-generic"),
    pytest.param([2.0, 2.0, 1.0], 4, 3, id="tied-top"),
    pytest.param([4.0, 1.0, 1.0], 4, 3, id="tied-bottom"),
    pytest.param([3.0, 1.0, 0.0], 4, 3, id="rank-deficient"),
    pytest.param([2.5, 1.0, 0.0], 3, 5, id="rank-deficient-wide"),
]


@pytest.mark.parametrize("quantity", QUANTITIES)
@pytest.mark.parametrize(("spectrum", "m", "n"), SPECTRA)
def test_value_matches_numpy_reference(backend, quantity, spectrum, m, n):
    S = backend.matrix(spectrum, m, n, seed=len(spectrum) + m)
    got = getattr(condreg, quantity)(S)
    want = reference(quantity, S, rtol=backend.default_rtol(m, n))
    # Same namespace, dtype, device and shape (0-d) as the input; value of the float64 reference.
    assert_close(got, backend.asarray(want), rtol=backend.rtol, atol=0.0)
    assert got.shape == ()


def test_condition_number_over_nonzero_singular_values(backend):
    """kappa(diag(3, 1, 0)) = 3: the smallest *nonzero* singular value (pseudo-inverse)."""
    S = backend.asarray(np.diag([3.0, 1.0, 0.0]))
    assert_close(condreg.condition_number(S), backend.asarray(3.0), rtol=backend.rtol)
    # R_ill uses k = 2: ‖S‖_F²/(2k) − ½σ_k² = 10/4 − 1/2 = 2.
    assert_close(condreg.r_ill(S), backend.asarray(0.5), rtol=backend.rtol)
    # R_well uses p = 3: ½·9 − 10/6.
    assert_close(condreg.r_well(S), backend.asarray(4.5 - 10.0 / 6.0), rtol=backend.rtol)


def test_exact_values_on_diagonal_matrices(backend):
    S = backend.asarray(np.diag([4.0, 2.0, 1.0]))
    assert_close(condreg.condition_number(S), backend.asarray(4.0), rtol=backend.rtol)
    assert_close(condreg.r_well(S), backend.asarray(8.0 - 21.0 / 6.0), rtol=backend.rtol)
    assert_close(condreg.r_ill(S), backend.asarray(1.0 / (21.0 / 6.0 - 0.5)), rtol=backend.rtol)


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_batched_call_equals_loop(backend, quantity):
    rng = np.random.default_rng(7)
    spectra = np.sort(rng.uniform(0.5, 3.0, size=(4, 3)), axis=-1)[:, ::-1].copy()
    spectra[1, 2] = 0.0  # one rank-deficient matrix in the batch: per-matrix rank
    S = backend.matrix(spectra, 4, 3, seed=3)
    S = backend.xp.reshape(S, (2, 2, 4, 3))
    got = getattr(condreg, quantity)(S)
    assert got.shape == (2, 2)
    loop = [[getattr(condreg, quantity)(S[i, j, ...]) for j in range(2)] for i in range(2)]
    want = backend.xp.stack([backend.xp.stack(row) for row in loop])
    assert_close(got, want, rtol=backend.rtol)
    want = reference(quantity, S, rtol=backend.default_rtol(4, 3))
    assert_close(got, backend.asarray(want), rtol=backend.rtol)


@pytest.mark.parametrize("name", ["condition_number_grad", "r_well_grad", "r_ill_grad"])
def test_batched_gradient_equals_loop(backend, name):
    rng = np.random.default_rng(11)
    spectra = np.sort(rng.uniform(0.5, 3.0, size=(4, 3)), axis=-1)[:, ::-1].copy()
    S = backend.xp.reshape(backend.matrix(spectra, 4, 3, seed=5), (2, 2, 4, 3))
    got = getattr(condreg, name)(S)
    assert got.shape == S.shape
    for i in range(2):
        for j in range(2):
            one = getattr(condreg, name)(S[i, j, ...])
            assert_close(got[i, j, ...], one, rtol=backend.rtol, atol=backend.rtol * 10)


@pytest.mark.parametrize(
    "name",
    ["condition_number", "r_well", "r_ill", "condition_number_grad", "r_well_grad", "r_ill_grad"],
)
def test_output_namespace_dtype_device(backend, name):
    S = backend.matrix([3.0, 2.0, 1.0], 3, 4, seed=2)
    out = getattr(condreg, name)(S)
    from array_api_compat import array_namespace, device

    assert array_namespace(out) is array_namespace(S)
    assert out.dtype == S.dtype
    assert device(out) == device(S)
    assert out.shape == (() if not name.endswith("_grad") else S.shape)


def test_rtol_sets_the_numerical_rank():
    S = np.diag([1.0, 1e-6, 0.5])
    assert_close(condreg.condition_number(S), np.asarray(1e6))
    # With rtol above 1e-6 the smallest value is numerically zero: kappa over {1, 0.5}.
    assert_close(condreg.condition_number(S, rtol=1e-3), np.asarray(2.0))
    assert_close(condreg.r_ill(S, rtol=1e-3), np.asarray(reference("r_ill", S, rtol=1e-3)))


def test_default_rtol_is_matrix_rank_convention():
    """sigma just above max(m, n)·eps·sigma_1 counts, just below does not (numpy.linalg)."""
    eps = np.finfo(np.float64).eps
    above = np.diag([1.0, 10 * 3 * eps])
    below = np.diag([1.0, 0.1 * 3 * eps, 0.0])
    assert_close(condreg.condition_number(above), np.asarray(1.0 / (30 * eps)))
    assert_close(condreg.condition_number(below), np.asarray(1.0))
    assert np.linalg.matrix_rank(below) == 1


def test_scale_covariance():
    """kappa is scale-invariant; R_well scales as c², R_ill as 1/c² — over 200 orders of
    magnitude (no overflow to inf − inf = NaN, no underflow to 0/0)."""
    S = matrix_with_spectrum([3.0, 2.0, 1.0, 0.0], 5, 4, seed=1)
    base = {q: reference(q, S) for q in QUANTITIES}
    for c in [1e-100, 1e-30, 1e30, 1e100]:
        assert_close(
            condreg.condition_number(c * S), np.asarray(base["condition_number"]), rtol=1e-9
        )
        assert_close(condreg.r_well(c * S) / c / c, np.asarray(base["r_well"]), rtol=1e-9)
        assert_close(condreg.r_ill(c * S) * c * c, np.asarray(base["r_ill"]), rtol=1e-9)


# --------------------------------------------------------------------------------------------
# The shipped helpers (condreg.testing) the tests rely on
# --------------------------------------------------------------------------------------------


def test_matrix_with_spectrum_has_the_requested_spectrum(backend):
    values = [3.0, 3.0, 1.0, 0.0]
    S, fac = backend.matrix(values, 5, 4, seed=3, return_factors=True)
    assert S.shape == (5, 4) and S.dtype == backend.dtype
    s = np.linalg.svd(backend.numpy(S).astype(np.float64), compute_uv=False)
    assert_close(s, np.asarray(values), atol=10 * backend.eps * 3)
    assert fac.rank == 3
    assert_close(fac.U.T @ fac.U, np.eye(4), atol=1e-14)
    assert_close(fac.V.T @ fac.V, np.eye(4), atol=1e-14)
    assert_close(
        fac.U @ np.diag(fac.s) @ fac.Vt,
        backend.numpy(S).astype(np.float64),
        atol=10 * backend.eps * 3,
    )


def test_matrix_with_spectrum_batch_and_errors():
    S = matrix_with_spectrum([[2.0, 1.0], [5.0, 5.0]], 3, 2, seed=1)
    assert S.shape == (2, 3, 2)
    assert_close(
        np.linalg.svd(S, compute_uv=False), np.asarray([[2.0, 1.0], [5.0, 5.0]]), rtol=1e-12
    )
    with pytest.raises(ValueError):
        matrix_with_spectrum([1.0, 2.0, 3.0], 2, 4)
    with pytest.raises(ValueError):
        matrix_with_spectrum([1.0, -1.0], 2, 2)


def test_assert_close_checks_namespace_dtype_shape():
    a = np.ones(3)
    assert_close(a, np.ones(3))
    with pytest.raises(AssertionError, match="dtypes differ"):
        assert_close(a, np.ones(3, dtype=np.float32))
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_close(a, np.ones((1, 3)))
    with pytest.raises(AssertionError):
        assert_close(a, a * (1 + 1e-6))  # outside the float64 default rtol 4·sqrt(eps)
    assert_close(a.astype(np.float32), (a * (1 + 1e-4)).astype(np.float32))  # inside float32's
    xps = pytest.importorskip("array_api_strict")
    with pytest.raises(AssertionError, match="namespaces differ"):
        assert_close(xps.asarray(a), a)
    assert_close(xps.asarray(a), a, check_namespace=False, check_dtype=False, check_device=False)


def test_assert_close_accepts_torch_tensors_that_require_grad():
    torch = pytest.importorskip("torch")
    t = torch.ones(2, dtype=torch.float64, requires_grad=True) * 2
    assert_close(t, torch.full((2,), 2.0, dtype=torch.float64))
    with pytest.raises(AssertionError):
        assert_close(t, torch.full((2,), 2.1, dtype=torch.float64))
