"""Any Array API library on any device, with default arguments: array-api-strict's second device
stands in for a GPU (its arrays refuse ``np.asarray``, as CuPy's do), so every public function
must read values through the engine's one host read and return results on the input's device,
equal to the CPU results. The CuPy test runs under the ``cuda`` marker (benchmarks/gpu.sh)."""

from __future__ import annotations

import numpy as np
import pytest

import condreg
import condreg.attacks
import condreg.metrics
import condreg.testing

xps = pytest.importorskip("array_api_strict")

FUNCTIONS = ["condition_number", "r_well", "r_ill"]
FUNCTIONS += [name + "_grad" for name in FUNCTIONS]
rng = np.random.default_rng(0)
S = rng.normal(size=(2, 4, 6))
X_P, X_H, Y_P = rng.normal(size=(20, 5)), rng.normal(size=(20, 5)), rng.normal(size=20)
THETA = np.eye(5) + 0.1 * rng.normal(size=(5, 5))


def host(x):
    return np.from_dlpack(x)  # a test-side read that array-api-strict's devices allow


@pytest.fixture(params=["CPU_DEVICE", "device1"])
def on(request):
    device = xps.Device(request.param)

    def put(a):
        out = xps.asarray(a, device=device)
        assert out.device == device
        return out

    put.device = device
    return put


def _same(actual, desired, device, rtol=1e-12):
    assert actual.device == device
    np.testing.assert_allclose(host(actual), desired, rtol=rtol, atol=0.0)


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("gram", [False, True])
def test_core_functions_on_a_second_device(on, name, gram):
    f = getattr(condreg, name)
    _same(f(on(S), gram=gram), f(S, gram=gram), on.device)


def test_checks_read_a_second_device(on):
    bad = S.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        condreg.r_ill(on(bad))
    with pytest.raises(condreg.RankError):
        condreg.condition_number_grad(on(np.zeros((3, 4))))


def test_metrics_on_a_second_device(on):
    expected = condreg.metrics.rir(THETA, X_P, X_H)
    got = condreg.metrics.rir(on(THETA), on(X_P), on(X_H))
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10)
    spectra = condreg.metrics.rir_spectra(on(THETA), on(X_P), on(X_H))
    np.testing.assert_allclose(np.asarray(spectra.rir()), np.asarray(expected), rtol=1e-10)
    _same(spectra.s_kp, condreg.metrics.rir_spectra(THETA, X_P, X_H).s_kp, on.device)
    th = on(THETA)
    theta0 = condreg.metrics.rir_theta0(lambda X: X @ th, lambda X: X, on(X_P), on(X_H), 2, 6)
    want = condreg.metrics.rir_theta0(lambda X: X @ THETA, lambda X: X, X_P, X_H, 2, 6)
    np.testing.assert_allclose(theta0.ratios, want.ratios, rtol=1e-10)
    steps = condreg.metrics.probe_convergence(on(X_P), on(Y_P), 4)
    _same(steps, condreg.metrics.probe_convergence(X_P, Y_P, 4), on.device, rtol=1e-10)


def test_immunize_on_a_second_device(on):
    expected = condreg.immunize(X_P, Y_P, X_H, epochs=3, seed=0, warn=False)
    got = condreg.immunize(on(X_P), on(Y_P), on(X_H), epochs=3, seed=0, warn=False)
    _same(got.theta, expected.theta, on.device, rtol=1e-9)
    _same(got.omega, expected.omega, on.device, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(got.metrics), np.asarray(expected.metrics), rtol=1e-9)


def test_probe_on_a_second_device(on):
    expected = condreg.attacks.probe(THETA, X_P, Y_P, steps=5)
    got = condreg.attacks.probe(on(THETA), on(X_P), on(Y_P), steps=5)
    for field in ("loss", "norm_ratio", "w", "w_star"):
        _same(getattr(got, field), getattr(expected, field), on.device, rtol=1e-10)
    assert got.rank == expected.rank and got.kappa == pytest.approx(expected.kappa, rel=1e-12)


def test_testing_helpers_on_a_second_device(on):
    A = on(S[0])
    np.testing.assert_array_equal(condreg.testing.to_numpy(A), S[0])
    condreg.testing.assert_close(condreg.r_well_grad(A), on(condreg.r_well_grad(S[0])))
    with pytest.raises(AssertionError):
        condreg.testing.assert_close(A, on(S[0] + 1.0))
    condreg.testing.check_gradient(condreg.r_well, condreg.r_well_grad(A), A)


@pytest.mark.cuda
@pytest.mark.parametrize("name", FUNCTIONS)
def test_cupy_arrays_on_the_gpu(name):
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - CuPy without a usable GPU
        pytest.skip("no CUDA device")
    f = getattr(condreg, name)
    out = f(cp.asarray(S), gram=True)
    assert isinstance(out, cp.ndarray)
    np.testing.assert_allclose(out.get(), f(S, gram=True), rtol=1e-10)
