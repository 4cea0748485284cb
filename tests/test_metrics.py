"""Eq. 15 (RIR), Eq. 17 (RIR_θ0) and Eq. 16 (norm ratio with exact line search)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_backend

from condreg import condition_number
from condreg.metrics import RIR, probe_convergence, rir, rir_theta0


def _pair(seed=0, N=50, D=6):
    rng = np.random.default_rng(seed)
    X_p = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -1, D))
    Q, _ = np.linalg.qr(rng.standard_normal((D, D)))
    X_h = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -1.5, D)) @ Q
    return X_p, X_h


#: The backends the metrics are checked on.
BACKENDS = [
    "numpy-float64",
    "numpy-float32",
    "torch-cpu-float64",
    "jax-float64",
    "array_api_strict-float64",
]


@pytest.mark.parametrize("name", BACKENDS)
def test_rir_of_identity_is_exactly_one(name):
    X_p, X_h = _pair()
    with make_backend(name) as b:
        res = rir(b.asarray(np.eye(6)), b.asarray(X_p), b.asarray(X_h))
    assert isinstance(res, RIR)
    assert res.rir == 1.0 and res.i == 1.0 and res.ii == 1.0


def test_rir_matches_its_definition_and_is_scale_invariant():
    X_p, X_h = _pair(1)
    theta = np.random.default_rng(2).standard_normal((6, 6))

    def kap(A):
        s = np.linalg.svd(A, compute_uv=False)
        return (s[0] / s[-1]) ** 2

    res = rir(theta, X_p, X_h)
    i_ = kap(X_h @ theta) / kap(X_h)
    ii = kap(X_p @ theta) / kap(X_p)
    np.testing.assert_allclose([res.i, res.ii, res.rir], [i_, ii, i_ / ii], rtol=1e-8)
    res2 = rir(7.5 * theta, 3.0 * X_p, 0.1 * X_h)
    np.testing.assert_allclose(res2.rir, res.rir, rtol=1e-8)


def test_rir_uses_one_tolerance_for_the_pair():
    """Default rtol = max(N_P, N_H, D)·eps for all four κ's (the rule of condreg.immunize)."""
    X_p, X_h = _pair(5)
    X_h = X_h[:20]  # N_P = 50, N_H = 20
    theta = np.random.default_rng(6).standard_normal((6, 6))
    from condreg.metrics import run_rtol

    assert run_rtol(X_p, X_h) == 50 * np.finfo(np.float64).eps
    assert rir(theta, X_p, X_h) == rir(theta, X_p, X_h, rtol=run_rtol(X_p, X_h))
    # a coarse tolerance drops the smallest singular values of K from every κ
    coarse = rir(np.eye(6), X_p, X_h, rtol=0.5)
    s = np.linalg.svd(X_h, compute_uv=False)
    assert coarse.kappa_kh == pytest.approx((s[0] / s[s > 0.5 * s[0]][-1]) ** 2, rel=1e-9)
    with pytest.raises(ValueError, match="rtol"):
        rir(theta, X_p, X_h, rtol=1.5)


def test_rir_rejects_bad_shapes():
    X_p, X_h = _pair()
    with pytest.raises(ValueError, match="feature dimensions"):
        rir(np.eye(5), X_p, X_h)
    with pytest.raises(ValueError, match="2-D"):
        rir(np.eye(6), X_p[0], X_h)
    with pytest.raises(ValueError, match="2-D"):
        rir(np.ones(6), X_p, X_h)


def test_rir_theta0_averages_per_group_ratios():
    X_p, X_h = _pair(3, N=300, D=5)
    theta = np.random.default_rng(4).standard_normal((5, 5))

    def f_0(x):
        return np.tanh(x)

    def f_I(x):
        return np.tanh(x @ theta)

    res = rir_theta0(f_I, f_0, X_p, X_h, groups=6, group_size=40, seed=7)
    rng = np.random.default_rng(7)
    expected = []
    for _ in range(6):
        ip = rng.choice(300, size=40, replace=False)
        ih = rng.choice(300, size=40, replace=False)
        k = [
            float(condition_number(f(X[idx]), gram=True))
            for X, idx in ((X_h, ih), (X_p, ip))
            for f in (f_I, f_0)
        ]
        expected.append((k[0] / k[1]) / (k[2] / k[3]))
    assert len(res.ratios) == 6
    np.testing.assert_allclose(res.ratios, expected, rtol=1e-10)
    np.testing.assert_allclose(res.rir, np.mean(expected), rtol=1e-12)


def test_rir_theta0_refuses_the_same_extractor_twice():
    """docs/math.md §9.6: the public code passes the same network as θ_0 and θ_I (every ratio 1)."""
    X_p, X_h = _pair()

    def f(x):
        return x

    with pytest.raises(ValueError, match="same object"):
        rir_theta0(f, f, X_p, X_h)
    with pytest.warns(UserWarning, match="identical features"):
        res = rir_theta0(lambda x: x, lambda x: x * 1.0, X_p, X_h, groups=2, group_size=10)
    assert res.rir == 1.0


def test_rir_theta0_flattens_features_and_uses_all_samples_when_short():
    rng = np.random.default_rng(0)
    X_p = rng.standard_normal((30, 2, 3))
    X_h = rng.standard_normal((25, 2, 3))
    res = rir_theta0(lambda x: x * np.arange(1, 4), lambda x: x, X_p, X_h, groups=3, group_size=100)
    assert np.isfinite(res.rir) and len(res.ratios) == 3


def _problem(kappa_A, seed=0, N=30, D=8):
    """A with singular values from 1 to 1/√κ_A... so that κ(AᵀA) = kappa_A."""
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((N, D)))
    V, _ = np.linalg.qr(rng.standard_normal((D, D)))
    s = np.sqrt(np.logspace(0, -np.log10(kappa_A), D))
    A = U @ np.diag(s) @ V.T
    y = rng.standard_normal(N)
    return A, y


@pytest.mark.parametrize("kappa_A", [3.0, 30.0, 1000.0])
def test_exact_line_search_meets_kantorovich_bound(kappa_A):
    A, y = _problem(kappa_A)
    curve = probe_convergence(A, y, 40, norm="hessian")
    factor = ((kappa_A - 1) / (kappa_A + 1)) ** 2
    steps = curve[1:] / curve[:-1]
    live = curve[:-1] > 1e-20
    assert np.all(steps[live] <= factor * (1 + 1e-8))
    assert curve[0] == 1.0


def test_larger_kappa_gives_slower_norm_ratio_curve():
    curves = [probe_convergence(*_problem(k, seed=5), 30) for k in (4.0, 100.0, 10_000.0)]
    for c in curves:
        assert c[0] == 1.0 and np.all(np.diff(c) <= 1e-12)
    assert curves[0][30] < curves[1][30] < curves[2][30]


def test_probe_convergence_uses_minimum_norm_solution():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((5, 9))  # underdetermined: w* = pinv(A) y, reached from w_0 = 0
    y = rng.standard_normal(5)
    c = probe_convergence(A, y, 400)
    assert c[-1] < 1e-10


@pytest.mark.parametrize("name", ["torch-cpu-float64", "jax-float64", "array_api_strict-float64"])
def test_probe_convergence_agrees_across_backends(name):
    A, y = _problem(50.0)
    ref = probe_convergence(A, y, 10)
    with make_backend(name) as b:
        out = probe_convergence(b.asarray(A), b.asarray(y), 10)
        np.testing.assert_allclose(b.numpy(out), ref, rtol=1e-9, atol=1e-14)


def test_probe_convergence_rejects_bad_input():
    A, y = _problem(5.0)
    with pytest.raises(ValueError, match="shape"):
        probe_convergence(A, y[:-1], 3)
    with pytest.raises(ValueError, match="steps"):
        probe_convergence(A, y, -1)
    with pytest.raises(ValueError, match="norm"):
        probe_convergence(A, y, 3, norm="l1")


def test_metrics_give_typed_errors_for_bad_input():
    X_p, X_h = _pair()
    with pytest.raises(ValueError, match="NaN"):
        rir(np.full((6, 6), np.nan), X_p, X_h)
    with pytest.raises(TypeError, match="must be an array"):
        rir(np.eye(6).tolist(), X_p, X_h)
    with pytest.raises(ValueError, match="NaN"):
        probe_convergence(X_p * np.nan, X_p[:, 0], 3)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="one Array API library"):
        rir(torch.eye(6, dtype=torch.float64), X_p, X_h)
    with pytest.raises(TypeError, match="one Array API library"):
        probe_convergence(torch.from_numpy(X_p), X_p[:, 0], 3)


@pytest.mark.parametrize("scale", [1e-200, 1e200])
def test_probe_convergence_is_scale_free(scale):
    """The norm ratios do not change under A → aA, y → by, even where AᵀA would overflow."""
    A, y = _problem(100.0)
    ref = probe_convergence(A, y, 8)
    np.testing.assert_allclose(probe_convergence(scale * A, y / scale, 8), ref, rtol=1e-9)


@pytest.mark.parametrize("a, b", [(1e200, 1.0), (1e-200, 1.0), (1.0, 1e-170), (1.0, 1e170)])
def test_rir_works_at_any_representable_scale(a, b):
    """κ is scale-invariant; θ and the data are rescaled by powers of two before any Gram."""
    X_p, X_h = _pair(7)
    theta = np.eye(6) + 0.2 * np.random.default_rng(8).standard_normal((6, 6))
    ref = rir(theta, X_p, X_h)
    np.testing.assert_allclose(tuple(rir(a * theta, b * X_p, X_h)), tuple(ref[:3]) + (
        ref.kappa_hp, ref.kappa_hh, ref.kappa_kp, ref.kappa_kh), rtol=1e-9)  # fmt: skip


# --------------------------------------------------------------------------------------------
# rir_spectra: one decomposition, several tolerances
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BACKENDS)
def test_rir_spectra_at_its_own_tolerance_is_rir_exactly(name):
    from condreg.metrics import rir_spectra

    X_p, X_h = _pair(11)
    theta = np.eye(6) + 0.3 * np.random.default_rng(12).standard_normal((6, 6))
    with make_backend(name) as b:
        args = (b.asarray(theta), b.asarray(X_p), b.asarray(X_h))
        for rtol in (None, 1e-3, 0.2):
            sp = rir_spectra(*args, rtol=rtol)
            assert sp.rir() == rir(*args, rtol=rtol)  # every field, bit for bit
        tasks = rir_spectra(None, *args[1:])
        assert tasks.rir() == (1.0, 1.0, 1.0) + tuple(tasks.rir()[3:])
        assert rir_spectra(*args, tasks=tasks).rir() == rir(*args)


def test_rir_spectra_rethresholds_like_a_fresh_rir():
    """A singular value between rtol and 10·rtol counts at the first, not at the second: the
    re-cut spectrum gives the RIR and ranks that a new decomposition at 10·rtol gives."""
    from condreg.metrics import rir_spectra
    from condreg.testing import matrix_with_spectrum

    X_p = matrix_with_spectrum([3.0, 2.0, 1.5, 1.0], 40, 4, seed=0)
    X_h = matrix_with_spectrum([1.0, 0.9, 0.8, 5e-7], 40, 4, seed=1)
    theta = np.eye(4) + 0.1 * np.random.default_rng(2).standard_normal((4, 4))
    rtol = 1e-7
    sp = rir_spectra(theta, X_p, X_h, rtol=rtol)
    assert sp.ranks() == (4, 4, 4, 4) and sp.ranks(10 * rtol) == (4, 3, 4, 3)
    for f in (1, 10, 100, 1e5):
        np.testing.assert_allclose(
            tuple(sp.rir(f * rtol)), tuple(rir(theta, X_p, X_h, rtol=f * rtol)), rtol=1e-12
        )
    # the cut moved κ(K_H) from ~4e12 to ~1.6: the re-thresholding did change the numbers
    assert sp.rir(rtol).kappa_kh > 1e12 and sp.rir(10 * rtol).kappa_kh < 2
    s = np.linalg.svd(X_h, compute_uv=False)
    np.testing.assert_allclose(np.asarray(sp.s_kh) / float(sp.s_kh[0]), s / s[0], rtol=1e-9)


def test_rir_spectra_refuses_what_it_did_not_resolve():
    from condreg.metrics import RIRSpectra, rir_spectra

    X_p, X_h = _pair(13)
    theta = np.random.default_rng(14).standard_normal((6, 6))
    sp = rir_spectra(theta, X_p, X_h, rtol=1e-6)
    assert isinstance(sp, RIRSpectra) and sp.rtol == 1e-6
    with pytest.raises(ValueError, match="resolve"):
        sp.rir(1e-7)  # below the tolerance the spectra were decomposed at
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        sp.rir(1.0)
    with pytest.raises(TypeError, match="real number"):
        sp.rir("1e-3")
    with pytest.raises(ValueError, match="resolve"):
        sp.ranks(1e-9)
    # tasks: only from the same data, at a tolerance <= this one, and of the right type
    for other in (X_h + 1e-3, X_h[:-1], X_h.astype(np.float32)):
        with pytest.raises(ValueError, match="other X_p"):
            rir_spectra(theta, X_p, other, tasks=rir_spectra(None, X_p, X_h))
    with pytest.raises(ValueError, match="resolves"):
        rir_spectra(theta, X_p, X_h, rtol=1e-9, tasks=sp)
    with pytest.raises(TypeError, match="RIRSpectra"):
        rir_spectra(theta, X_p, X_h, tasks=rir(theta, X_p, X_h))
    with pytest.raises(TypeError, match="must be an array"):
        rir(None, X_p, X_h)
    with pytest.raises(ValueError, match="X_h contains NaN"):
        rir_spectra(None, X_p, X_h * np.nan)
    # reuse at a smaller tolerance re-cuts the tasks' spectra: as a fresh call
    coarse = rir_spectra(theta, X_p, X_h, rtol=0.3, tasks=rir_spectra(None, X_p, X_h))
    np.testing.assert_allclose(
        tuple(coarse.rir()), tuple(rir(theta, X_p, X_h, rtol=0.3)), rtol=1e-12
    )
    # data that differ by a power of two have the same spectra up to it: the same fingerprint
    same = rir_spectra(theta, 4.0 * X_p, X_h, rtol=1e-6, tasks=sp)
    assert same.rir() == rir(theta, X_p, X_h, rtol=1e-6)


def test_rir_spectra_reproduces_the_metrics_of_immunize():
    """res.metrics is condreg.metrics.rir at res.rtol, hence the spectra's own verdict."""
    import condreg
    from condreg.metrics import rir_spectra

    X_p, X_h = _pair(15, N=40, D=5)
    y_p = (X_p[:, 0] > 0).astype(float)
    res = condreg.immunize(X_p, y_p, X_h, task="classification", epochs=3, lr=0.01, seed=0)
    sp = rir_spectra(res.theta, X_p, X_h, rtol=res.rtol)
    assert sp.rir() == res.metrics
    tasks = rir_spectra(None, X_p, X_h, rtol=res.rtol)
    assert rir_spectra(res.theta, X_p, X_h, rtol=res.rtol, tasks=tasks).rir() == res.metrics
