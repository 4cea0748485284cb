"""Theorem A.1 (R_well, after Nenov et al.; docs/math.md §3) as properties on random spectra.

R_well(S) = ½sigma_1² − ‖S‖_F²/(2p) = Σ_i (sigma_1² − sigma_i²)/(2p), p = min(m, n):
R_well >= 0, = 0 iff full rank and kappa = 1; log kappa <= p R_well / sigma_k² (full rank);
the step S − eta ∇R_well scales sigma_1 by 1 − eta(1 − 1/p) and sigma_i (i >= 2) by 1 + eta/p,
so kappa strictly decreases for small eta > 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import condreg
from condreg.testing import assert_close, matrix_with_spectrum, random_orthonormal

RTOL = 1e-9


@st.composite
def spectra(draw, full_rank=False, unique_top=False):
    p = draw(st.integers(1, 5))
    m, n = p + draw(st.integers(0, 2)), p
    if draw(st.booleans()):
        m, n = n, m
    top = draw(st.floats(0.1, 10.0))
    ratios = draw(st.lists(st.floats(1.0 / 50.0, 1.0), min_size=p - 1, max_size=p - 1))
    values = [top] + sorted((top * r for r in ratios), reverse=True)
    if not full_rank:
        zeros = draw(st.integers(0, p - 1))
        values = values[: p - zeros] + [0.0] * zeros
    if unique_top:
        assume(p >= 2 and values[1] < values[0] * (1 - 1e-3))
    return values, m, n, draw(st.integers(0, 2**32 - 1))


@given(spectra())
def test_non_negative(case):
    values, m, n, seed = case
    S = matrix_with_spectrum(values, m, n, seed=seed)
    assert float(condreg.r_well(S)) >= 0.0


@given(spectra(full_rank=True))
def test_log_kappa_bound(case):
    """log kappa <= p·R_well / sigma_k² for full-rank S."""
    values, m, n, seed = case
    S = matrix_with_spectrum(values, m, n, seed=seed)
    p = min(m, n)
    s = np.linalg.svd(S, compute_uv=False)
    kappa = float(condreg.condition_number(S))
    assert math.log(kappa) <= p * float(condreg.r_well(S)) / s[-1] ** 2 * (1 + RTOL) + 1e-12


@pytest.mark.parametrize(("m", "n"), [(3, 3), (5, 3), (2, 4)])
def test_zero_at_scaled_orthonormal(backend, m, n):
    """Full rank and kappa = 1 (c·Q with orthonormal columns/rows): R_well = 0 up to rounding."""
    p = min(m, n)
    Q = random_orthonormal(max(m, n), p, seed=m * n)
    S = 2.5 * (Q if m >= n else Q.T)
    value = condreg.r_well(backend.asarray(S))
    tol = 100 * backend.eps * 2.5**2
    assert abs(float(backend.numpy(value))) <= tol


@pytest.mark.parametrize(
    "spectrum",
    [[2.0, 2.0, 0.0], [2.0, 0.0, 0.0], [2.0, 2.0, 1.999]],
    ids=["kappa-1-rank-2-of-3", "rank-1", "nearly-kappa-1"],
)
def test_positive_unless_full_rank_and_kappa_1(spectrum):
    """Rank-deficient with equal nonzero values: R_well = (p − k)sigma²/(2p) > 0."""
    S = matrix_with_spectrum(spectrum, 4, 3, seed=1)
    s = np.asarray(spectrum)
    want = (3 * s[0] ** 2 - np.sum(s**2)) / 6
    assert want > 0
    assert_close(condreg.r_well(S), np.asarray(want), rtol=1e-6)


@given(spectra(unique_top=True), st.floats(0.01, 0.99))
def test_small_step_decreases_condition_number(case, fraction):
    """With eta < (sigma_1 − sigma_2)/(sigma_1(1 − 1/p) + sigma_2/p), sigma_1 stays the largest,
    the others grow by 1 + eta/p and kappa strictly decreases (rank-deficient S included)."""
    values, m, n, seed = case
    S = matrix_with_spectrum(values, m, n, seed=seed)
    p = min(m, n)
    s = np.linalg.svd(S, compute_uv=False)
    eta = fraction * (s[0] - s[1]) / (s[0] * (1 - 1 / p) + s[1] / p)
    S_new = S - eta * condreg.r_well_grad(S)
    assert float(condreg.condition_number(S_new)) < float(condreg.condition_number(S)) or (
        float(condreg.condition_number(S)) == 1.0
    )
    predicted = np.concatenate([[s[0] * (1 - eta * (1 - 1 / p))], s[1:] * (1 + eta / p)])
    assert_close(np.linalg.svd(S_new, compute_uv=False), predicted, rtol=1e-8, atol=1e-12 * s[0])


def test_step_decreases_r_well_on_every_backend(backend):
    """R_well itself decreases along −∇R_well (a descent direction)."""
    S = backend.matrix([3.0, 2.0, 1.0], 4, 3, seed=2)
    G = condreg.r_well_grad(S)
    before = float(backend.numpy(condreg.r_well(S)))
    after = float(backend.numpy(condreg.r_well(S - 0.05 * G)))
    assert after < before
    kappa_before = float(backend.numpy(condreg.condition_number(S)))
    kappa_after = float(backend.numpy(condreg.condition_number(S - 0.05 * G)))
    assert kappa_after < kappa_before


def test_r_well_normaliser_is_min_dimension_not_rank():
    """p = min(m, n) for R_well (k for R_ill): diag(2, 2, 0) has R_well = 4/2 − 8/6."""
    S = np.diag([2.0, 2.0, 0.0])
    assert_close(condreg.r_well(S), np.asarray(2.0 - 8.0 / 6.0))
    assert float(condreg.r_ill(S)) == math.inf  # k = 2, both nonzero values equal: the pole
