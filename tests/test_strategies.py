"""condreg.testing.strategies: the drawn matrices have the spectrum the strategy reports."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from condreg.testing import to_numpy
from condreg.testing.strategies import SpectralCase, matrices, spectra, spectral_cases


def _check_case(case: SpectralCase, rtol=1e-10):
    S = to_numpy(case.matrix).astype(np.float64)
    s = case.singular_values
    assert S.shape[-2:] == (case.m, case.n)
    assert s.shape == S.shape[:-2] + (min(case.m, case.n),)
    got = np.linalg.svd(S, compute_uv=False)
    np.testing.assert_allclose(got, s, rtol=rtol, atol=rtol * float(s.max()))
    k = case.rank
    assert np.all(s[..., :k] > 0) and np.all(s[..., k:] == 0)
    assert np.all(np.diff(s, axis=-1) <= 0)
    flat_s = s.reshape(-1, s.shape[-1])
    flat_t = np.broadcast_to(np.asarray(case.top_ties), s.shape[:-1]).reshape(-1)
    flat_b = np.broadcast_to(np.asarray(case.bottom_ties), s.shape[:-1]).reshape(-1)
    for row, t, b in zip(flat_s, flat_t, flat_b, strict=True):
        nz = row[:k]
        assert np.count_nonzero(nz == nz[0]) == t  # bit-identical ties, exact counts
        assert np.count_nonzero(nz == nz[-1]) == b


@settings(max_examples=40)
@given(
    spectral_cases(
        rank=(1, 6), kappa=(1.0, 1e4), top_ties=(1, 4), bottom_ties=(1, 4), batch_shape=()
    )
)
def test_case_has_the_reported_spectrum(case):
    _check_case(case)
    assert 1.0 <= case.kappa <= 1e4 * (1 + 1e-12)
    assert 0.1 <= case.sigma_min <= 10.0
    np.testing.assert_allclose(case.sigma_max, case.kappa * case.sigma_min, rtol=1e-15)
    assert isinstance(case.matrix, np.ndarray) and case.matrix.dtype == np.float64
    # the rank the strategy reports is the rank condreg's default tolerance sees
    import condreg

    s = np.linalg.svd(case.matrix, compute_uv=False)
    tol = max(case.m, case.n) * np.finfo(np.float64).eps * s[0]
    assert int(np.sum(s > tol)) == case.rank
    np.testing.assert_allclose(float(condreg.condition_number(case.matrix)), case.kappa, rtol=1e-9)


@settings(max_examples=20)
@given(
    spectral_cases(
        rank=3,
        kappa=(2.0, 10.0),
        rows=(3, 6),
        cols=4,
        top_ties=2,
        bottom_ties=(1, 3),
        batch_shape=st.sampled_from([(2,), (2, 3)]),
    )
)
def test_batched_cases(case):
    _check_case(case)
    assert case.matrix.shape[:-2] in ((2,), (2, 3)) and case.n == 4 and case.rank == 3
    assert np.all(case.top_ties == 2) and np.all(case.bottom_ties == 1)  # clipped: t + b <= k
    assert case.kappa.shape == case.matrix.shape[:-2]


@settings(max_examples=30)
@given(spectra(rank=(2, 5), kappa=(1.0, 5.0), bottom_ties=1, gap=0.01))
def test_spectra_gap_separates_a_unique_bottom(values):
    assert values.ndim == 1 and 2 <= values.size <= 5
    assert values[-2] >= values[-1] * 1.01 * (1 - 1e-15)
    assert np.count_nonzero(values == values[-1]) == 1


@settings(max_examples=10)
@given(spectra(rank=(1, 4), kappa=1.0))
def test_kappa_one_ties_everything(values):
    assert np.all(values == values[0])


def test_array_api_namespaces_and_dtypes():
    strict = pytest.importorskip("array_api_strict")

    @settings(max_examples=5)
    @given(
        spectral_cases(
            rank=(2, 4), xp=strict, dtype=st.sampled_from([strict.float32, strict.float64])
        )
    )
    def inner(case):
        assert type(case.matrix).__module__.startswith("array_api_strict")
        assert case.matrix.dtype in (strict.float32, strict.float64)
        _check_case(case, rtol=1e-10 if case.matrix.dtype == strict.float64 else 1e-5)

    inner()


def test_torch_namespace():
    torch = pytest.importorskip("torch")

    @settings(max_examples=5)
    @given(matrices(rank=(2, 4), xp=torch, dtype=torch.float32, batch_shape=(3,)))
    def inner(S):
        assert isinstance(S, torch.Tensor) and S.dtype == torch.float32 and S.shape[0] == 3

    inner()


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"rank": 0}, ValueError),
        ({"kappa": 0.5}, ValueError),
        ({"kappa": (2.0, 1.0)}, ValueError),
        ({"sigma_min": float("nan")}, ValueError),
        ({"gap": -1.0}, ValueError),
        ({"rank": "3"}, TypeError),
        ({"batch_shape": (2, 0)}, TypeError),
    ],
)
def test_bad_arguments_raise_at_construction(kwargs, error):
    with pytest.raises(error):
        spectral_cases(**kwargs)


def test_import_condreg_testing_does_not_import_hypothesis():
    code = (
        "import sys, condreg.testing; assert 'hypothesis' not in sys.modules, 'hypothesis'; "
        "import condreg.testing.strategies; assert 'hypothesis' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_jax_namespace():
    jnp = pytest.importorskip("jax.numpy")

    @settings(max_examples=5)
    @given(spectral_cases(rank=(2, 4), kappa=(2.0, 20.0), xp=jnp, dtype=jnp.float32))
    def inner(case):
        assert case.matrix.dtype == jnp.float32 and case.matrix.shape == (case.m, case.n)
        _check_case(case, rtol=1e-5)

    inner()
