"""The spectral engine (condreg._spectrum) and Algorithm 1's view of it (condreg._linalg).

Path choice, accuracy guard, rank rule shared with condition_number, ties at the rounding scale.
"""

from __future__ import annotations

import numpy as np
import pytest

import condreg
from condreg import _backend, _linalg, _spectrum
from condreg.testing import matrix_with_spectrum


def _batch(N, D, kappa, seed=0, dtype=np.float64):
    r = min(N, D)
    s = np.logspace(0.0, -np.log10(kappa), r)
    return matrix_with_spectrum(s, N, D, seed=seed).astype(dtype)


# --------------------------------------------------------------------------------------------
# hessian_spectrum(rtol=) / decompose: the rank rule of condition_number(X @ theta, rtol=rtol)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("N", "D"), [(6, 10), (10, 6), (8, 8)])
@pytest.mark.parametrize("kappa", [10.0, 1e5, 1e9, 1e13])
@pytest.mark.parametrize("rtol", [None, 1e-6])
def test_hessian_spectrum_rank_rule_is_condition_numbers(N, D, kappa, rtol):
    X = _batch(N, D, kappa, seed=1)
    theta = np.random.default_rng(2).standard_normal((D, D)) / np.sqrt(D) + np.eye(D)
    F = X @ theta
    want = float(condreg.condition_number(F, rtol=rtol)) ** 2
    s_ref = np.linalg.svd(F, compute_uv=False)
    tol = max(F.shape) * np.finfo(np.float64).eps if rtol is None else rtol
    k_ref = int(np.sum(s_ref > tol * s_ref[0]))
    for vectors in (True, False):
        hs = _linalg.hessian_spectrum(X @ theta, np, vectors=vectors, rtol=rtol)
        assert int(hs.sp.k) == k_ref
        got = float(_linalg.kappa(hs, np))
        assert got == pytest.approx(want, rel=1e-9 + 1e-15 * want)
        if vectors:  # the small side's vectors: eigenvectors of the small Gram (on the rank)
            s, m = hs.sp.s, hs.sp.mask
            Q = hs.W if hs.W is not None else hs.V
            G = F @ F.T if hs.W is not None else F.T @ F
            assert np.allclose((G @ Q)[:, m], (Q * s**2)[:, m], atol=1e-11 * s[0] ** 2)


# --------------------------------------------------------------------------------------------
# The accuracy guard: the Gram path only where it resolves the spectrum
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("N", "D"), [(16, 40), (40, 16)])
@pytest.mark.parametrize(
    ("dtype", "kappas"),
    [(np.float64, [2.0, 10.0, 1e3, 1e5, 1e7]), (np.float32, [2.0, 10.0, 1e2, 1e3])],
)
def test_auto_path_matches_the_svd_path(N, D, dtype, kappas):
    from conftest import conditioned_rtol

    for kappa in kappas:
        F = _batch(N, D, kappa, seed=4, dtype=dtype)
        for q in ("condition_number", "r_well", "r_ill"):
            fn = getattr(condreg, q)
            grad = getattr(condreg, q + "_grad")
            ref = float(fn(F.astype(np.float64), gram=True))
            got = float(fn(F, gram=True))
            # the rounding of two routes to the same gradient grows like kappa(F)·eps
            rel = conditioned_rtol(kappa) if dtype == np.float64 else 2e-5 * max(1.0, kappa)
            assert got == pytest.approx(ref, rel=rel), (q, kappa)
            G = grad(F, gram=True).astype(np.float64)
            Gref = grad(F.astype(np.float64), gram=True)
            err = np.max(np.abs(G - Gref)) / np.max(np.abs(Gref))
            assert err < rel * 10, (q, kappa, err)


def test_guard_takes_the_gram_path_only_when_resolved():
    well = _batch(16, 40, 10.0, seed=5)
    ill = _batch(16, 40, 1e6, seed=5)
    rt = 40 * np.finfo(float).eps
    kw = {"gram": True, "vectors": False, "rtol": rt, "concrete": _backend.eager}
    err_w = _spectrum.decompose(well, np, **kw).mu_err
    err_i = _spectrum.decompose(ill, np, **kw).mu_err
    assert float(np.max(err_w)) > 0  # the Gram path (its error bound is carried)
    assert float(np.max(err_i)) == 0  # the exact path


def test_gram_path_error_bound_holds():
    rng = np.random.default_rng(6)
    for N, D in [(8, 30), (30, 8)]:
        F = rng.standard_normal((N, D))
        kw = {"gram": True, "vectors": False, "rtol": 0.0, "concrete": _backend.eager}
        sm = _spectrum.decompose(F, np, method="gram", **kw)
        s, err = sm.s, sm.mu_err
        s_ref = np.linalg.svd(F, compute_uv=False)
        assert np.all(np.abs(s**2 - s_ref**2) <= float(err[0]) * s_ref[0] ** 2)


# --------------------------------------------------------------------------------------------
# Ties at the rounding scale of the computed values (docs/math.md §10.1)
# --------------------------------------------------------------------------------------------


def test_float32_gram_ties_are_decided_on_sigma():
    """128×64 float32 features with σ spread over 10^2.5: no value is tied with σ_min, and the
    gradient of κ(FᵀF) matches float64 (it was 131 % wrong with ties decided on μ)."""
    s = np.logspace(0.0, -2.5, 64)
    F = matrix_with_spectrum(s, 128, 64, seed=7)
    F32 = F.astype(np.float32)
    G32 = condreg.condition_number_grad(F32, gram=True).astype(np.float64)
    G64 = condreg.condition_number_grad(F32.astype(np.float64), gram=True)
    assert np.linalg.norm(G32 - G64) / np.linalg.norm(G64) < 1e-2
    condreg.condition_number_grad(F32, gram=True, subgradient="raise")  # no tie: no error


# --------------------------------------------------------------------------------------------
# The k-vector arithmetic on a host copy (eager) and on the device (tracing): one function
# --------------------------------------------------------------------------------------------


def _differential_inputs():
    """``(F, resolved)``: generic, tied, rank-deficient and κ(F) = 1e6 spectra, both shapes, and
    a batch; ``resolved``: the Gram resolves the spectrum (where forcing it is meaningful)."""
    ties = np.array([3.0, 3.0, 2.0, 1.5, 1.0, 1.0])
    deficient = np.array([2.0, 1.5, 1.0, 0.7, 0.0, 0.0])
    spectra = [np.geomspace(5.0, 0.5, 6), ties, deficient, np.geomspace(1.0, 1e-6, 6)]
    for i, s in enumerate(spectra):
        for N, D in ((6, 10), (10, 6)):
            yield matrix_with_spectrum(s, N, D, seed=i), i < 2
    yield np.stack([matrix_with_spectrum(s, 6, 10, seed=9) for s in spectra]), False


def _libraries():
    yield "numpy", np, lambda a: a, lambda a: np.asarray(a)
    torch = pytest.importorskip("torch")
    from array_api_compat import torch as xpt

    yield "torch", xpt, torch.asarray, lambda a: a.numpy()


@pytest.mark.parametrize("quantity", ["condition_number", "r_well", "r_ill"])
@pytest.mark.parametrize("policy", ["min_norm", "any"])
def test_host_and_device_arithmetic_agree(quantity, policy):
    """The one choice of where :func:`condreg._core.parts` runs (``host``): the same route on
    the same matrix gives the same value, rank, ties and gradient from a NumPy host copy and
    from the device arrays (``host=False``, what tracing and ``check_finite=False`` use)."""
    for _, xp, make, back in _libraries():
        for F, resolved in _differential_inputs():
            S = make(F)
            for gram, method in ((False, "auto"), (True, "exact"), (True, "gram"), (True, "svd")):
                if method == "gram" and not resolved:
                    continue  # the accept rule refuses these: rounding decides the vectors
                kw = {"gram": gram, "vectors": True, "method": method, "policy": policy}
                on = [
                    _spectrum.evaluate(quantity, S, xp, host=h, check=False, **kw) for h in (1, 0)
                ]
                values = [back(ev.value) for ev in on]
                grads = [back(_spectrum.assemble(ev, xp)) for ev in on]
                np.testing.assert_allclose(values[0], values[1], rtol=1e-12)
                scale = np.max(np.abs(grads[1]))
                np.testing.assert_allclose(grads[0], grads[1], rtol=0, atol=1e-12 * scale)


def test_host_and_device_decisions_agree_under_jax_jit():
    """JAX: eager calls read (host), ``jax.jit`` cannot (device, the accept decision a
    ``lax.cond``): both take the Gram on a resolved spectrum and the exact route on κ(F) = 1e6,
    with the same values and gradients."""
    jax = pytest.importorskip("jax")
    from conftest import conditioned_rtol, enable_x64

    with enable_x64(jax):
        for kappa in (10.0, 1e6):
            F = jax.numpy.asarray(_batch(12, 30, kappa, seed=3))
            for q in ("condition_number", "r_well", "r_ill"):
                f = getattr(condreg, q)
                eager = jax.value_and_grad(lambda X, f=f: f(X, gram=True))(F)
                traced = jax.jit(jax.value_and_grad(lambda X, f=f: f(X, gram=True)))(F)
                # Rounding follows the conditioning: at kappa(F) = 1e6 the gradients of two
                # compiled programs differ by ~kappa * eps relative (5e-10 seen on one CPU).
                rtol = conditioned_rtol(kappa)
                np.testing.assert_allclose(eager[0], traced[0], rtol=rtol)
                scale = float(np.max(np.abs(np.asarray(eager[1]))))
                np.testing.assert_allclose(eager[1], traced[1], rtol=rtol, atol=rtol * scale)
