"""The Cholesky pre-check of the engine's Gram path (``_spectrum.gram_refused``): it may only
say "refused" where the eigenvalues would refuse the Gram, and then every decomposition is the
one computing them gives, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from condreg import _linalg, _spectrum, metrics
from condreg.algorithm import _step
from condreg.testing import matrix_with_spectrum


def _features(log_kappa: float, n: int, d: int, seed: int, dtype=np.float64) -> np.ndarray:
    s = np.logspace(0.0, -log_kappa, min(n, d))
    return matrix_with_spectrum(s, n, d, seed=seed).astype(dtype)


def _eigen_verdict(F: np.ndarray, rtol: float) -> bool:
    """Whether the eigenvalues accept the Gram path (what the pre-check must never contradict)."""
    M = _spectrum._gram_matrix(F, np, _spectrum.gram_dtype(F, np))
    _, _, mu_rel, err_rel, in_range = _spectrum.eigh_gram(M, F.shape, np, False, F.dtype)
    acc = _spectrum.gram_accuracy(np, F.dtype)
    return bool(in_range & _spectrum.gram_resolves(mu_rel, err_rel, rtol, acc, np))


def _refused(F: np.ndarray, rtol: float) -> bool:
    M = _spectrum._gram_matrix(F, np, _spectrum.gram_dtype(F, np))
    return _spectrum.gram_refused(M, F.shape, rtol, _spectrum.gram_accuracy(np, F.dtype))


@given(
    log_kappa=st.floats(0.0, 12.0),
    n=st.integers(2, 40),
    extra=st.integers(0, 30),
    wide=st.booleans(),
    seed=st.integers(0, 2**16),
    single=st.booleans(),
)
def test_a_refusal_is_what_the_eigenvalues_would_say(log_kappa, n, extra, wide, seed, single):
    """Across the threshold (κ(F) from 1 to 1e12, float64 and float32 features): whenever the
    pre-check refuses, the eigenvalues refuse too; far from the threshold it decides."""
    shape = (n, n + extra) if wide else (n + extra, n)
    F = _features(log_kappa, *shape, seed, np.float32 if single else np.float64)
    rtol = _spectrum.default_rtol(F.shape, F.dtype, np)
    if _refused(F, rtol):
        assert not _eigen_verdict(F, rtol)
    # decisive where the Gram cannot resolve the spectrum by orders of magnitude
    if not single and log_kappa > 6.0:
        assert _refused(F, rtol)


def test_the_pre_check_is_live_and_conservative():
    well, ill = _features(2.0, 30, 50, 0), _features(9.0, 30, 50, 1)
    rtol = _spectrum.default_rtol(well.shape, well.dtype, np)
    assert _eigen_verdict(well, rtol) and not _refused(well, rtol)
    assert not _eigen_verdict(ill, rtol) and _refused(ill, rtol)
    rank_deficient = np.concatenate([ill, ill[:5]], axis=0)  # FFᵀ singular
    assert _refused(rank_deficient, rtol)
    # not applicable: a tolerance that can put eigenvalues "certainly outside" the rank, a
    # non-finite Gram, a batch, another library
    assert not _refused(ill, 0.5)
    bad = _spectrum._gram_matrix(ill, np, np.float64)
    bad[3, 4] = np.nan
    assert not _spectrum.gram_refused(bad, ill.shape, rtol, _spectrum.gram_accuracy(np, ill.dtype))
    M = _spectrum._gram_matrix(ill, np, np.float64)
    acc = _spectrum.gram_accuracy(np, ill.dtype)
    assert not _spectrum.gram_refused(np.stack([M, M]), ill.shape, rtol, acc)
    torch = pytest.importorskip("torch")
    assert not _spectrum.gram_refused(torch.from_numpy(M), ill.shape, rtol, acc)


def _aligned(mu: np.ndarray, d: int) -> np.ndarray:
    """``[diag(√mu) | 0]``: its Gram is ``diag(mu)``, so ``max_i M_ii = mu_1`` (the pre-check's
    shift is then exactly ``(tau/2)·mu_1``)."""
    F = np.zeros((mu.size, d))
    F[np.arange(mu.size), np.arange(mu.size)] = np.sqrt(mu)
    return F


@pytest.mark.parametrize("factor", [1.5, 0.25])
def test_the_threshold_sits_between_a_quarter_and_one_and_a_half_tau(factor):
    """Smallest eigenvalue at 1.5·tau (tau = err/mu_1/accuracy, what the eigenvalues demand):
    accepted by both; at tau/4: refused by both, the pre-check included (its shift is tau/2)."""
    n, d = 20, 30
    mu = np.geomspace(1.0, 1e-3, n)
    acc = _spectrum.gram_accuracy(np, np.float64)
    eps = np.finfo(np.float64).eps
    tau = (eps * n + eps * np.sqrt(d) * mu[:-1].sum()) / acc  # err_rel / accuracy, mu_n ≈ 0
    mu[-1] = factor * tau
    F = _aligned(mu, d)
    rtol = _spectrum.default_rtol(F.shape, F.dtype, np)
    assert _eigen_verdict(F, rtol) is (factor > 1)
    assert _refused(F, rtol) is (factor < 1)


def _no_pre_check(monkeypatch):
    monkeypatch.setattr(_spectrum, "gram_refused", lambda *a, **k: False)


def _same(a, b):
    """Bit-identical arrays (or equal non-arrays) in the same structure."""
    if isinstance(a, tuple | list):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    else:
        assert type(a) is type(b) and (a == b or (a is None and b is None)), (a, b)


@pytest.mark.parametrize("log_kappa", [2.0, 9.0])
@pytest.mark.parametrize("shape", [(30, 50), (50, 30)])
def test_every_engine_entry_gives_the_same_bits_with_and_without_it(monkeypatch, log_kappa, shape):
    """condition_number's engine (values, vectors, extreme), the sample spectrum of
    hessian_spectrum, Algorithm 1's eager spectrum and condreg.metrics.rir: the same results
    whether the pre-check refused the Gram or the eigenvalues did."""
    F = _features(log_kappa, *shape, seed=7)
    rtol = _spectrum.default_rtol(F.shape, F.dtype, np)
    X_h = _features(3.0, *shape, seed=8)
    theta = np.eye(shape[1]) + 0.01 * np.random.default_rng(0).standard_normal((shape[1],) * 2)

    def results():
        out = []
        for vectors in (False, True):
            sp = _spectrum.decompose(
                F, np, gram=True, vectors=vectors, rtol=rtol, concrete=_spectrum.eager
            )
            out.append(tuple(sp))
        sp, unit = _spectrum.decompose_extreme(F, np, rtol=rtol, concrete=_spectrum.eager)
        out += [tuple(sp), unit]
        out.append(_linalg._sample_spectrum(F, np, True, rtol))
        out.append(_linalg._sample_spectrum(F, np, False, rtol))
        if shape[0] <= shape[1]:  # the loop's factor is r×D with r <= D
            hs = _step._eager_spectrum(F, rtol, np, vectors=False, path="auto")
            out.append((hs.sp.s, hs.sp.k, hs.sp.mu_err))
        out.append(tuple(metrics.rir(theta, F, X_h, rtol=rtol)))
        return out

    with_check = results()
    _no_pre_check(monkeypatch)
    _same(with_check, results())
