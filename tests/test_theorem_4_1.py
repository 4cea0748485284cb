"""Theorem 4.1 (R_ill, docs/math.md §3) as properties on random spectra.

Spectra are drawn with bounded ratios (sigma_1 / sigma_k <= 50) so that float64 is trustworthy.
With D = ‖S‖_F²/(2k) − ½sigma_k² = Σ_{i<k} (sigma_i² − sigma_k²)/(2k):

(1) 2k / ((k−1)(kappa²−1)sigma_k²) <= R_ill <= 2k / ((kappa²−1)sigma_k²)
    (each of the k−1 terms of D is at most sigma_1² − sigma_k², and the i = 1 term alone is at
    least (sigma_1² − sigma_k²)/(2k)); both bounds are attained (all middle values at sigma_1,
    resp. at sigma_k), so they are tight;
(2) 1 / log kappa <= sigma_1² R_ill;
(4) kappa(S − eta ∇R_ill) > kappa(S) for 0 < eta < (k/(k−1)) D² when sigma_k is unique.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import condreg
from condreg import PoleError
from condreg.testing import assert_close, matrix_with_spectrum
from condreg.testing.strategies import spectral_cases

RTOL = 1e-9  # relative slack for float64 comparisons of O(1)-conditioned quantities


def spectra(unique_bottom=False):
    """SpectralCase draws (condreg.testing.strategies): rank k in 2..5, sigma_1/sigma_k <= 50,
    sigma_k in [0.1, 10], exact ties at the top and (unless ``unique_bottom``, then sigma_k is
    unique with a relative gap of 1e-3) at the bottom, 0..2 exact zeros."""
    return spectral_cases(
        rank=(2, 5),
        kappa=(1.0, 50.0),
        sigma_min=(0.1, 10.0),
        top_ties=(1, 4),
        bottom_ties=1 if unique_bottom else (1, 4),
        gap=1e-3 if unique_bottom else 0.0,
    )


def _unpack(case):
    """(singular values descending with trailing zeros, m, n, seed, k)."""
    return list(case.singular_values), case.m, case.n, case.seed, case.rank


def _kappa_sigma(S):
    s = np.linalg.svd(S, compute_uv=False)
    k = int(np.sum(s > max(S.shape) * np.finfo(np.float64).eps * s[0]))
    return s[0] / s[k - 1], s[0], s[k - 1], k


@given(spectra())
def test_two_sided_bound(case):
    values, m, n, seed, k = _unpack(case)
    S = matrix_with_spectrum(values, m, n, seed=seed)
    kappa, s1, sk, rank = _kappa_sigma(S)
    assert rank == k
    r = float(condreg.r_ill(S))
    assert r >= 0
    assume(kappa > 1 + 1e-6)  # away from the pole, where both bounds are +inf
    lower = 2 * k / ((k - 1) * (kappa**2 - 1) * sk**2)
    upper = 2 * k / ((kappa**2 - 1) * sk**2)
    assert lower * (1 - RTOL) <= r <= upper * (1 + RTOL), (lower, r, upper)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_two_sided_bound_is_tight(k):
    """Lower bound attained when sigma_2..sigma_{k−1} = sigma_1, upper when they equal sigma_k."""
    s1, sk = 3.0, 0.5
    kappa = s1 / sk
    at_top = matrix_with_spectrum([s1] * (k - 1) + [sk], k + 1, k, seed=k)
    at_bottom = matrix_with_spectrum([s1] + [sk] * (k - 1), k + 1, k, seed=k)
    lower = 2 * k / ((k - 1) * (kappa**2 - 1) * sk**2)
    upper = 2 * k / ((kappa**2 - 1) * sk**2)
    assert_close(condreg.r_ill(at_top), np.asarray(lower), rtol=1e-10)
    if k > 2:  # k = 2: both bounds coincide with R_ill at the same matrix
        assert_close(condreg.r_ill(at_bottom), np.asarray(upper), rtol=1e-10)


@given(spectra())
def test_upper_bound_statement_2(case):
    """(2) 1 / log kappa <= sigma_1² R_ill."""
    values, m, n, seed, k = _unpack(case)
    S = matrix_with_spectrum(values, m, n, seed=seed)
    kappa, s1, _, _ = _kappa_sigma(S)
    assume(kappa > 1 + 1e-6)
    assert 1.0 / math.log(kappa) <= s1**2 * float(condreg.r_ill(S)) * (1 + RTOL)


@given(spectra(unique_bottom=True), st.floats(0.01, 0.99))
def test_step_increases_condition_number(case, fraction):
    """(4) kappa strictly increases after S − eta ∇R_ill, 0 < eta < (k/(k−1)) D²; the step scales
    sigma_i (i < k) by 1 + c/k and sigma_k by 1 − c(k−1)/k, c = eta / D²."""
    values, m, n, seed, k = _unpack(case)
    assert values[k - 2] >= values[k - 1] * (1 + 1e-3)  # the strategy's unique sigma_k
    S = matrix_with_spectrum(values, m, n, seed=seed)
    s = np.linalg.svd(S, compute_uv=False)
    den = np.sum(S * S) / (2 * k) - 0.5 * s[k - 1] ** 2
    eta = fraction * (k / (k - 1)) * den**2
    S_new = S - eta * condreg.r_ill_grad(S)
    kappa_old = float(condreg.condition_number(S))
    kappa_new = float(condreg.condition_number(S_new))
    assert kappa_new > kappa_old
    c = eta / den**2
    predicted = np.concatenate([s[: k - 1] * (1 + c / k), [s[k - 1] * (1 - c * (k - 1) / k)]])
    predicted = np.sort(predicted)[::-1]
    got = np.linalg.svd(S_new, compute_uv=False)[:k]
    assert_close(got, predicted, rtol=1e-8, atol=1e-12 * s[0])


def test_step_at_the_bound_drops_the_rank():
    """Control for (4): at eta = (k/(k−1)) D² exactly, sigma_k' = 0, the rank drops to k−1 and
    kappa (over the nonzero values) falls to sigma_1/sigma_{k−1}: the open bound is needed."""
    S = matrix_with_spectrum([4.0, 2.0, 1.0], 4, 3, seed=0)
    k = 3
    s = np.linalg.svd(S, compute_uv=False)
    den = np.sum(S * S) / (2 * k) - 0.5 * s[-1] ** 2
    eta = (k / (k - 1)) * den**2
    S_new = S - eta * condreg.r_ill_grad(S)
    assert np.linalg.matrix_rank(S_new, tol=1e-10) == 2
    kappa_new = float(condreg.condition_number(S_new, rtol=1e-10))
    assert_close(np.asarray(kappa_new), np.asarray(2.0), rtol=1e-9)
    assert kappa_new < float(condreg.condition_number(S))


@given(spectra())
def test_r_ill_non_negative_and_decreasing_in_sigma_1(case):
    """R_ill >= 0, and with sigma_k fixed it decreases to 0 as kappa grows (R_ill -> 0 iff
    kappa -> infinity, at fixed sigma_k)."""
    values, m, n, seed, k = _unpack(case)
    sk = values[k - 1]
    out = []
    for scale in [1.0, 10.0, 1e3, 1e6]:
        v = list(values)
        v[0] = max(v[0], sk * 1.5) * scale
        out.append(float(condreg.r_ill(matrix_with_spectrum(v, m, n, seed=seed))))
    assert all(x >= 0 for x in out)
    assert all(a > b for a, b in zip(out[:-1], out[1:], strict=True))
    assert out[-1] <= 2 * k / ((1.5e6) ** 2 - 1) / sk**2 * (1 + RTOL)


def test_r_ill_does_not_vanish_when_sigma_k_vanishes():
    """The iff of (1) needs sigma_k fixed: kappa -> inf by sigma_k -> 0 (sigma_1 fixed) leaves
    R_ill -> 2k / Σ_{i<k} sigma_i² > 0 (here 2k / 1 = 4)."""
    values = [float(condreg.r_ill(np.diag([1.0, t]))) for t in [1e-1, 1e-3, 1e-6]]
    assert_close(np.asarray(values[-1]), np.asarray(4.0), rtol=1e-6)


@pytest.mark.parametrize(
    "spectrum",
    [[2.0, 2.0, 2.0], [1.5, 1.5, 0.0], [3.0, 0.0, 0.0]],
    ids=["kappa-1", "kappa-1-rank-deficient", "rank-1"],
)
def test_pole_value_is_inf_and_gradient_raises(backend, spectrum):
    S = backend.matrix(spectrum, 4, 3, seed=1)
    value = condreg.r_ill(S)
    assert_close(value, backend.asarray(math.inf))
    with pytest.raises(PoleError, match="pole"):
        condreg.r_ill_grad(S)


def test_near_pole_is_finite_and_large():
    S = np.diag([1.0 + 1e-6, 1.0, 1.0])
    r = float(condreg.r_ill(S))
    assert math.isfinite(r) and r > 1e5
    assert np.all(np.isfinite(condreg.r_ill_grad(S)))
