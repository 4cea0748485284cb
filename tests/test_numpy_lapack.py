"""The exact path's NumPy decompositions through SciPy's LAPACK (``_spectrum._qr_r`` and
``_spectrum.svdvals``): NumPy's results to rounding, NumPy's errors, and NumPy's own routines
where SciPy is missing."""

from __future__ import annotations

import numpy as np
import pytest

from condreg import _spectrum
from condreg.testing import matrix_with_spectrum


@pytest.mark.parametrize("shape", [(60, 25), (25, 60), (30, 30)])
def test_qr_r_and_svdvals_match_numpy(monkeypatch, shape):
    pytest.importorskip("scipy")
    A = matrix_with_spectrum(np.logspace(0, -6, min(shape)), *shape, seed=3)
    lapack = _spectrum._numpy_lapack(A)
    assert lapack is not None
    used = []  # SciPy's routines are the ones called
    spied = lapack._replace(
        geqrf=lambda *a, **k: used.append("geqrf") or lapack.geqrf(*a, **k),
        gesdd=lambda *a, **k: used.append("gesdd") or lapack.gesdd(*a, **k),
    )
    monkeypatch.setitem(_spectrum._LAPACK, "d", spied)
    R = _spectrum._qr_r(np, A)
    want_R = np.linalg.qr(A, mode="r")
    assert R.shape == want_R.shape and R.dtype == want_R.dtype
    np.testing.assert_array_equal(R, np.triu(R))  # triangular, zeros below
    # R is unique up to the signs of its rows
    signs = np.sign(np.diag(R)) * np.sign(np.diag(want_R))
    eps = np.finfo(np.float64).eps
    np.testing.assert_allclose(signs[:, None] * R, want_R, atol=50 * eps * np.abs(A).max())
    s = _spectrum.svdvals(np, R)
    want = np.linalg.svd(A, compute_uv=False)
    assert s.dtype == want.dtype and s.shape == want.shape and np.all(np.diff(s) <= 0)
    np.testing.assert_allclose(s, want, atol=50 * eps * want[0], rtol=0)
    assert used == ["geqrf", "gesdd"]


def test_float32_stays_with_numpy_and_its_float64_accuracy():
    """NumPy computes float32 input in float64; SciPy's float32 routines would not (κ(F) =
    1e5: a relative error ~1e-3 on κ instead of ~1e-7). float32 therefore stays with NumPy,
    bit for bit, and keeps that accuracy."""
    import condreg

    F = matrix_with_spectrum(np.logspace(0, -5, 64), 256, 64, seed=4)
    F32 = F.astype(np.float32)
    assert _spectrum._numpy_lapack(F32) is None
    np.testing.assert_array_equal(_spectrum._qr_r(np, F32), np.linalg.qr(F32, mode="r"))
    np.testing.assert_array_equal(_spectrum.svdvals(np, F32), np.linalg.svd(F32, compute_uv=False))
    want = float(np.linalg.cond(F32.astype(np.float64)) ** 2)  # of the float32 entries
    got = float(condreg.condition_number(F32, gram=True, rtol=1e-9))
    assert got == pytest.approx(want, rel=1e-5)


def test_svdvals_raises_where_numpy_does():
    """NaN: NumPy's LinAlgError; Inf: NaN values, as NumPy's (and QR passes both through)."""
    pytest.importorskip("scipy")
    R = np.triu(np.random.default_rng(0).standard_normal((20, 20)))
    assert _spectrum._numpy_lapack(R) is not None
    R[3, 7] = np.nan
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.svd(R, compute_uv=False)
    with pytest.raises(np.linalg.LinAlgError, match="did not converge"):
        _spectrum.svdvals(np, R)
    assert np.isnan(_spectrum._qr_r(np, R)).any()
    R[3, 7] = np.inf
    want = np.linalg.svd(R, compute_uv=False)
    got = _spectrum.svdvals(np, R)
    assert np.isnan(want).all() and np.isnan(got).all()
    assert not np.isfinite(_spectrum._qr_r(np, R)).all()


def test_the_input_is_kept():
    pytest.importorskip("scipy")
    A = np.random.default_rng(1).standard_normal((40, 30))
    B = A.copy()
    _spectrum._qr_r(np, A.T)
    _spectrum.svdvals(np, A)
    np.testing.assert_array_equal(A, B)


def test_without_scipy_numpy_decides(monkeypatch):
    """No SciPy (or an array it does not cover: a batch, an integer or empty matrix): NumPy's
    own routines, bit for bit."""
    A = np.random.default_rng(2).standard_normal((30, 20))
    monkeypatch.setattr(_spectrum, "_LAPACK", {"d": None, "s": None})
    np.testing.assert_array_equal(_spectrum._qr_r(np, A), np.linalg.qr(A, mode="r"))
    np.testing.assert_array_equal(_spectrum.svdvals(np, A), np.linalg.svd(A, compute_uv=False))
    monkeypatch.undo()
    batch = np.stack([A, 2 * A])
    np.testing.assert_array_equal(
        _spectrum.svdvals(np, batch), np.linalg.svd(batch, compute_uv=False)
    )
    assert _spectrum._numpy_lapack(np.zeros((0, 3))) is None
    assert _spectrum._numpy_lapack(np.ones((3, 3), dtype=np.int64)) is None
