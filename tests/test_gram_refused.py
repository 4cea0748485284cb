"""The Cholesky pre-check of the engine's Gram path (``_spectrum.gram_refused``): it may only
say "refused" where the eigenvalues would refuse the Gram, and then every decomposition is the
one computing them gives, bit for bit. It runs only after a refusal of the same kind, so an
accepted Gram pays nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from condreg import _linalg, _spectrum, metrics
from condreg.algorithm import _step
from condreg.testing import matrix_with_spectrum


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch):
    monkeypatch.setattr(_spectrum, "_REFUSED_LAST", {})


def _features(log_kappa: float, n: int, d: int, seed: int, dtype=np.float64) -> np.ndarray:
    s = np.logspace(0.0, -log_kappa, min(n, d))
    return matrix_with_spectrum(s, n, d, seed=seed).astype(dtype)


def _gram(F: np.ndarray) -> np.ndarray:
    return _spectrum._gram_matrix(F, np, _spectrum.gram_dtype(F, np))


def _eigen_verdict(F: np.ndarray, rtol: float) -> bool:
    """Whether the eigenvalues accept the Gram path (what the pre-check must never contradict)."""
    _, _, mu_rel, err_rel, in_range = _spectrum.eigh_gram(_gram(F), F.shape, np, False, F.dtype)
    acc = _spectrum.gram_accuracy(np, F.dtype)
    return bool(in_range & _spectrum.gram_resolves(mu_rel, err_rel, rtol, acc, np))


def _refused(F: np.ndarray, rtol: float) -> bool:
    """The pre-check's verdict, with the last verdict of this kind a refusal (so it runs)."""
    M = _gram(F)
    _spectrum.note_gram_verdict(M, F.shape, False)
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
    """Across the threshold (κ(F) from 1 to 1e12; float64 features, and float32 ones with their
    float64 Gram at a small explicit rtol, where the pre-check applies): whenever it refuses,
    the eigenvalues refuse too; far beyond the threshold it decides."""
    shape = (n, n + extra) if wide else (n + extra, n)
    F = _features(log_kappa, *shape, seed, np.float32 if single else np.float64)
    rtol = 1e-9 if single else _spectrum.default_rtol(F.shape, F.dtype, np)
    if _refused(F, rtol):
        assert not _eigen_verdict(F, rtol)
    # decisive where the Gram cannot resolve the spectrum by orders of magnitude
    if log_kappa > (6.0 if not single else 8.0):
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
    M = _gram(ill)
    acc = _spectrum.gram_accuracy(np, ill.dtype)
    bad = M.copy()
    bad[3, 4] = np.nan
    assert not _spectrum.gram_refused(bad, ill.shape, rtol, acc)
    assert not _spectrum.gram_refused(np.stack([M, M]), ill.shape, rtol, acc)
    torch = pytest.importorskip("torch")
    assert not _spectrum.gram_refused(torch.from_numpy(M), ill.shape, rtol, acc)


def test_it_runs_only_after_a_refusal_of_the_same_kind(monkeypatch):
    """No work for a kind whose last Gram was accepted, or never seen: accepted Grams (deep-net
    features, pooled inputs) pay nothing for it."""
    ill = _features(9.0, 30, 50, 1)
    M, acc = _gram(ill), _spectrum.gram_accuracy(np, ill.dtype)
    rtol = _spectrum.default_rtol(ill.shape, ill.dtype, np)
    real = np.linalg.cholesky
    calls = []
    monkeypatch.setattr(np.linalg, "cholesky", lambda a: calls.append(a.shape) or real(a))
    assert not _spectrum.gram_refused(M, ill.shape, rtol, acc) and calls == []  # never seen
    _spectrum.note_gram_verdict(M, ill.shape, True)
    assert not _spectrum.gram_refused(M, ill.shape, rtol, acc) and calls == []  # accepted last
    _spectrum.note_gram_verdict(M, ill.shape, False)
    assert _spectrum.gram_refused(M, ill.shape, rtol, acc) and calls == [(30, 30)]
    other = _features(9.0, 31, 50, 1)  # another kind: its own record
    assert not _spectrum.gram_refused(_gram(other), other.shape, rtol, acc)
    # the engine records the eigenvalues' verdicts itself
    _spectrum._REFUSED_LAST.clear()
    _spectrum.decompose(ill, np, gram=True, vectors=False, rtol=rtol, concrete=_spectrum.eager)
    assert _spectrum._REFUSED_LAST == {_spectrum._verdict_key(M, ill.shape): True}
    well = _features(2.0, 30, 50, 0)
    _spectrum.decompose(well, np, gram=True, vectors=False, rtol=rtol, concrete=_spectrum.eager)
    assert _spectrum._REFUSED_LAST == {_spectrum._verdict_key(M, ill.shape): False}


def _aligned(mu: np.ndarray, d: int) -> np.ndarray:
    """``[diag(√mu) | 0]``: its Gram is ``diag(mu)``, so ``max_i M_ii = mu_1`` (the pre-check's
    shift is then exactly ``(tau_0/2)·mu_1``)."""
    F = np.zeros((mu.size, d))
    F[np.arange(mu.size), np.arange(mu.size)] = np.sqrt(mu)
    return F


@pytest.mark.parametrize("factor", [1.05, 0.4])
def test_the_threshold_sits_between_two_fifths_and_one_tau(factor):
    """Smallest eigenvalue at 1.05·tau (tau = err/mu_1/accuracy, what the eigenvalues demand,
    its √m·Σmu term included): accepted by both; at 0.4·tau: refused by both, the pre-check
    included (its shift is tau_0/2 with tau_0 within 10 % of tau)."""
    n, d = 20, 400
    mu = np.geomspace(1.0, 1e-1, n)
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
    """Bit-identical arrays (or equal non-arrays of the same type) in the same structure."""
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
    whether the pre-check refused the Gram or the eigenvalues did; on the ill-conditioned batch
    the pre-check did refuse at every entry."""
    F = _features(log_kappa, *shape, seed=7)
    rtol = _spectrum.default_rtol(F.shape, F.dtype, np)
    X_h = _features(log_kappa, *shape, seed=8)
    theta = np.eye(shape[1]) + 0.01 * np.random.default_rng(0).standard_normal((shape[1],) * 2)
    entries = [
        lambda: tuple(
            _spectrum.decompose(
                F, np, gram=True, vectors=False, rtol=rtol, concrete=_spectrum.eager
            )
        ),
        lambda: tuple(
            _spectrum.decompose(F, np, gram=True, vectors=True, rtol=rtol, concrete=_spectrum.eager)
        ),
        lambda: _spectrum.decompose_extreme(F, np, rtol=rtol, concrete=_spectrum.eager),
        lambda: _linalg._sample_spectrum(F, np, True, rtol),
        lambda: _linalg._sample_spectrum(F, np, False, rtol),
        lambda: tuple(metrics.rir(theta, F, X_h, rtol=rtol)),
    ]
    if shape[0] <= shape[1]:  # the loop's factor is r×D with r <= D

        def loop():
            hs = _step._eager_spectrum(F, rtol, np, vectors=False, path="auto")
            return hs.sp.s, hs.sp.k, hs.sp.mu_err

        entries.append(loop)
    real = _spectrum.gram_refused

    def counted(refusals):
        return lambda *a: refusals.append(real(*a)) or refusals[-1]

    for entry in entries:
        entry()  # the eigenvalues' verdicts are recorded: the pre-check runs from now on
        refusals: list[bool] = []
        monkeypatch.setattr(_spectrum, "gram_refused", counted(refusals))
        with_check = entry()
        assert any(refusals) is (log_kappa > 6), refusals
        _no_pre_check(monkeypatch)
        _same(with_check, entry())
        monkeypatch.setattr(_spectrum, "gram_refused", real)
