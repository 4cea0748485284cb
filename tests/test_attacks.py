"""condreg.attacks.probe: every attacker solves least squares; GD's slow-down follows Eq. 2.

Reference values come from NumPy's ``lstsq`` / ``eigvalsh`` in float64, not from condreg.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from condreg.attacks import ATTACKERS, ProbeResult, probe, steps_to_reduction
from condreg.testing import matrix_with_spectrum

# Steps per attacker on the well-conditioned problem (κ(AᵀA) = 4): generous for every one of
# them with its documented defaults (Adam's lr = 1e-3 moves each coordinate ~1e-3 per step).
STEPS = {"adam": 800}
DEFAULT_STEPS = 300


def _well_conditioned(seed: int = 0):
    """A 40×6 problem with σ(A) in [0.5, 1] (κ(AᵀA) = 4), |w*| ≲ 0.15, nonzero residual."""
    rng = np.random.default_rng(seed)
    A = matrix_with_spectrum(np.linspace(1.0, 0.5, 6), 40, 6, seed=seed + 1)
    w_true = 0.1 * rng.uniform(-1, 1, 6)
    y = A @ w_true + 0.05 * rng.standard_normal(40)
    return A, y


@pytest.mark.parametrize("attacker", ATTACKERS)
def test_every_attacker_reaches_the_least_squares_optimum(backend64, attacker):
    A, y = _well_conditioned()
    w_ref = np.linalg.lstsq(A, y, rcond=None)[0]
    loss_ref = float(np.sum((A @ w_ref - y) ** 2))
    steps = STEPS.get(attacker, DEFAULT_STEPS)
    res = probe(
        backend64.asarray(np.eye(6)),
        backend64.asarray(A),
        backend64.asarray(y),
        attacker=attacker,
        steps=steps,
    )
    assert isinstance(res, ProbeResult)
    loss = backend64.numpy(res.loss)
    ratio = backend64.numpy(res.norm_ratio)
    assert loss.shape == ratio.shape == (steps + 1,)
    assert loss[0] == pytest.approx(float(y @ y), rel=1e-12)  # w0 = 0
    assert ratio[0] == 1.0
    assert float(res.loss_min) == pytest.approx(loss_ref, rel=1e-12)
    np.testing.assert_allclose(backend64.numpy(res.w_star), w_ref, rtol=0, atol=1e-12)
    tol_w, tol_loss = (1e-6, 1e-10) if attacker == "adam" else (1e-9, 1e-14)
    np.testing.assert_allclose(backend64.numpy(res.w), w_ref, rtol=0, atol=tol_w)
    assert (loss[-1] - loss_ref) / (loss[0] - loss_ref) < tol_loss
    assert ratio[-1] < tol_w
    assert res.steps_to(0.99) is not None
    assert res.kappa == pytest.approx(4.0, rel=1e-10) and res.rank == 6


def test_lstsq_reaches_the_optimum_at_step_one():
    A, y = _well_conditioned()
    res = probe(None, A, y, attacker="lstsq", steps=3)
    loss = np.asarray(res.loss)
    assert loss[0] > loss[1]
    np.testing.assert_array_equal(loss[1:], [float(res.loss_min)] * 3)
    assert res.steps_to(0.99) == 1 and res.steps_to(1.0) == 1
    np.testing.assert_array_equal(np.asarray(res.norm_ratio)[1:], 0.0)


def test_gd_exact_is_eq16s_probe_convergence():
    from condreg.metrics import probe_convergence

    rng = np.random.default_rng(3)
    X = matrix_with_spectrum(np.geomspace(1, 0.05, 8), 30, 8, seed=2)
    theta = rng.standard_normal((8, 8))
    y = rng.standard_normal(30)
    res = probe(theta, X, y, attacker="gd_exact", steps=40)
    np.testing.assert_allclose(
        np.asarray(res.norm_ratio), np.asarray(probe_convergence(X @ theta, y, 40)), rtol=1e-8
    )


def test_constant_step_is_one_over_the_largest_hessian_eigenvalue():
    A, y = _well_conditioned(4)
    L = float(np.linalg.eigvalsh(2 * A.T @ A)[-1])
    mu = float(np.linalg.eigvalsh(2 * A.T @ A)[0])
    assert probe(None, A, y, attacker="gd", steps=1).params["lr"] == pytest.approx(1 / L)
    assert probe(None, A, y, attacker="nesterov", steps=1).params["lr"] == pytest.approx(1 / L)
    hb = probe(None, A, y, attacker="momentum", steps=1).params
    assert hb["lr"] == pytest.approx(4 / (math.sqrt(L) + math.sqrt(mu)) ** 2)
    rk = math.sqrt(L / mu)
    assert hb["beta"] == pytest.approx(((rk - 1) / (rk + 1)) ** 2)
    assert probe(None, A, y, attacker="gd", steps=1, lr=0.1).params["lr"] == 0.1
    assert probe(None, A, y, attacker="adam", steps=1).params == {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
    }


def _spectrum_problem(kappa: float, n: int = 6, m: int = 24):
    """A with κ(AᵀA) = kappa (eigenvalues geometric), y = A·w* with w* equal along every
    right singular vector (so the smallest eigenvalue's direction has to be fitted)."""
    sv = np.sqrt(np.geomspace(1.0, 1.0 / kappa, n))
    A, factors = matrix_with_spectrum(sv, m, n, seed=5, return_factors=True)
    w_star = factors.Vt.T @ np.ones(n)
    return np.asarray(A), np.asarray(A @ w_star)


@pytest.mark.parametrize("attacker", ["gd", "gd_exact"])
def test_gd_slowdown_grows_with_kappa_as_eq2_bounds(attacker):
    tol = 1e-3
    steps_needed = []
    for kappa in (10.0, 100.0, 1000.0):
        A, y = _spectrum_problem(kappa)
        res = probe(None, A, y, attacker=attacker, steps=int(6 * kappa))
        assert res.kappa == pytest.approx(kappa, rel=1e-8)
        t = np.arange(len(res.loss))
        bound = (1 - 1 / kappa) ** t
        excess = (np.asarray(res.loss) - float(res.loss_min)) / (
            float(res.loss[0]) - float(res.loss_min)
        )
        # Eq. 2's rate (1 - 1/κ)^t bounds the loss excess of both step rules at every step
        assert np.all(excess <= bound * (1 + 1e-9) + 1e-15)
        ratio = np.asarray(res.norm_ratio)
        if attacker == "gd":  # and the norm ratio of the constant step 1/L
            assert np.all(ratio <= bound * (1 + 1e-9) + 1e-15)
        hit = np.flatnonzero(ratio <= tol)
        assert hit.size, f"{attacker} did not reach norm ratio {tol} at κ = {kappa}"
        steps_needed.append(int(hit[0]))
    if attacker == "gd":
        # the slowest direction holds 1/6 of ‖w_0 − w*‖² and shrinks by exactly 1 − 1/κ per
        # step: at least ln(6·tol) / (2 ln(1 − 1/κ)) ≈ κ·2.6 steps, linear in κ
        for kappa, t in zip((10.0, 100.0, 1000.0), steps_needed, strict=True):
            assert t >= math.log(6 * tol) / (2 * math.log(1 - 1 / kappa)) - 1
    assert steps_needed[0] < steps_needed[1] < steps_needed[2]
    assert steps_needed[2] / steps_needed[0] > 30


def test_lstsq_and_lbfgs_are_kappa_independent():
    for kappa in (10.0, 1e3, 1e6):
        A, y = _spectrum_problem(kappa)
        assert probe(None, A, y, attacker="lstsq", steps=2).steps_to(0.9999) == 1
        # L-BFGS with exact line search on a 6-dimensional quadratic: CG-like, ≤ ~n steps
        assert probe(None, A, y, attacker="lbfgs", steps=30).steps_to(0.9999) <= 8


def test_achievable_loss_is_the_same_for_any_invertible_theta():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((50, 8))
    y = rng.standard_normal(50)
    base = float(probe(None, X, y, attacker="lstsq", steps=1).loss_min)
    # an ill-conditioned but invertible θ (κ(θ) = 1e4)
    theta = matrix_with_spectrum(np.geomspace(1, 1e-4, 8), 8, 8, seed=3)
    res = probe(theta, X, y, attacker="lstsq", steps=1)
    assert float(res.loss_min) == pytest.approx(base, rel=1e-8)
    assert float(res.loss[1]) == pytest.approx(base, rel=1e-8)
    # a rank-deficient θ can raise it
    singular = theta.copy()
    singular[:, -1] = 0.0
    assert float(probe(singular, X, y, attacker="lstsq", steps=1).loss_min) > base * 1.0001


def test_steps_to_reduction():
    loss = np.array([10.0, 5.0, 2.0, 1.05, 1.0])
    assert steps_to_reduction(loss, 1.0, 0.5) == 1
    assert steps_to_reduction(loss, 1.0, 0.99) == 3
    assert steps_to_reduction(loss, 1.0, 1.0) == 4
    assert steps_to_reduction(loss, 0.0, 0.99) is None
    assert steps_to_reduction(np.array([2.0, 2.0]), 2.0) == 0  # nothing to reduce
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match="fraction"):
            steps_to_reduction(loss, 1.0, bad)


def test_norm_ratio_is_nan_when_w0_is_the_optimum():
    A, y = _well_conditioned()
    w_star = np.linalg.lstsq(A, y, rcond=None)[0]
    res = probe(None, A, y, attacker="gd", steps=2, w0=w_star)
    assert np.all(np.isnan(np.asarray(res.norm_ratio)))


def test_bad_input_raises_typed_errors():
    A, y = _well_conditioned()
    with pytest.raises(ValueError, match="gd_exact, gd, momentum"):
        probe(None, A, y, attacker="sgd")
    for steps in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="steps"):
            probe(None, A, y, steps=steps)
    with pytest.raises(TypeError, match="takes no option"):
        probe(None, A, y, attacker="gd_exact", lr=0.1)
    with pytest.raises(TypeError, match="history"):
        probe(None, A, y, attacker="gd", history=3)
    for attacker, bad in (
        ("gd", {"lr": -1.0}),
        ("gd", {"lr": math.inf}),
        ("momentum", {"beta": 1.0}),
        ("adam", {"betas": (0.9,)}),
        ("adam", {"eps": 0.0}),
        ("lbfgs", {"history": 0}),
    ):
        with pytest.raises(ValueError, match=attacker):
            probe(None, A, y, attacker=attacker, steps=1, **bad)
    with pytest.raises(ValueError, match="theta must have D = 6 rows"):
        probe(np.eye(5), A, y)
    with pytest.raises(ValueError, match="y must have shape"):
        probe(None, A, y[:-1])
    with pytest.raises(ValueError, match="w0 must have shape"):
        probe(None, A, y, w0=np.zeros(5))
    with pytest.raises(ValueError, match="2-D"):
        probe(None, A[0], y)
    with pytest.raises(ValueError, match="2-D"):
        probe(None, np.zeros((0, 3)), np.zeros(0))
    bad_y = y.copy()
    bad_y[0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        probe(None, A, bad_y)
    with pytest.raises(TypeError, match="real floating"):
        probe(None, A.astype(complex), y)
    with pytest.raises(ValueError, match="rtol"):
        probe(None, A, y, rtol=2.0)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="one Array API library"):
        probe(None, torch.asarray(A), y)


def test_integer_input_and_column_y():
    A = np.array([[1, 0], [0, 2], [1, 1]])
    y = np.array([[1], [2], [3]])
    res = probe(None, A, y, attacker="lstsq", steps=1)
    np.testing.assert_allclose(
        np.asarray(res.w), np.linalg.lstsq(A.astype(float), y[:, 0].astype(float))[0]
    )


# --------------------------------------------------------------------------------------------
# the experiment (condreg reproduce attacks)
# --------------------------------------------------------------------------------------------


def test_experiment_smoke(tmp_path):
    from threadpoolctl import threadpool_limits

    from condreg_experiments import attacks

    out = tmp_path / "attacks"
    # one BLAS thread, as the CLI runs it (two threads on a busy 2-core machine are much slower)
    with threadpool_limits(1):
        payload = attacks.run(
            out,
            quick=True,
            progress=False,
            steps=25,
            epochs=2,
            methods=["condreg"],
            pairs=[(3, 8)],
        )
    for name in ("results.json", "table.md", "attack_curves.png", "attack_curves_pretrain.png"):
        assert (out / name).is_file(), name
    assert (out / "attack_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert data["experiment"] == payload["experiment"] == "attacks"
    res = data["results"]
    datasets = data["settings"]["datasets"]
    assert "mnist-3-8" in datasets
    for name in datasets:
        for task in ("D_H", "D_P"):
            by_method = res["probes"][name][task]
            assert set(by_method) == {"identity", "condreg"}
            assert set(by_method["condreg"]) == set(ATTACKERS)
            # the closed form needs one step whatever θ is
            assert by_method["condreg"]["lstsq"][0]["steps_to"]["0.99"] == 1
            sl = res["slowdown"]["0.99"][name][task]["condreg"]["lstsq"][0]
            assert sl["factor"] == 1.0 and sl["bound"] == "="
    table = (out / "table.md").read_text(encoding="utf-8")
    assert "lstsq" in table and "Ours (condreg)" in table and "mnist-3-8" in table


@pytest.mark.parametrize(
    "bad",
    [
        {"steps": 0},
        {"attackers": ["sgd"]},
        {"methods": ["nope"]},
        {"fraction": 1.0},
        {"pairs": [(3, 3)]},
        {"pairs": [(3, 8), (3, 8)]},
        {"data": "/nonexistent/house_price"},
        {"lam_x": 1.0},
    ],
)
def test_experiment_rejects_bad_options_before_work(tmp_path, bad):
    from condreg_experiments import UsageError, attacks
    from condreg_experiments.data import DataError

    out = tmp_path / "never"
    with pytest.raises((UsageError, DataError, FileNotFoundError)):
        attacks.run(out, quick=True, progress=False, **bad)
    assert not out.exists()


def test_cli_reports_bad_attacks_options_with_status_2(tmp_path, capsys):
    from condreg.cli import main

    out = tmp_path / "never"
    assert main(["reproduce", "attacks", "--attackers", "sgd", "--out", str(out)]) == 2
    assert "unknown attacker" in capsys.readouterr().err
    assert not out.exists()


def test_import_attacks_imports_no_framework():
    import subprocess
    import sys

    code = (
        "import sys, condreg.attacks, condreg_experiments.attacks; "
        "print(sorted(m for m in ('torch', 'jax', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lbfgs_loss_never_rises_at_the_rounding_floor():
    # κ(AᵀA) = 1e12 and a rank-deficient A: curvature pairs turn to noise once converged
    rng = np.random.default_rng(0)
    X = matrix_with_spectrum(np.concatenate([np.geomspace(1, 1e-6, 12), np.zeros(3)]), 40, 15)
    y = rng.standard_normal(40)
    res = probe(None, X, y, attacker="lbfgs", steps=400, history=30)
    loss = np.asarray(res.loss)
    assert np.all(np.diff(loss) <= 0)
    assert (loss[-1] - float(res.loss_min)) / (loss[0] - float(res.loss_min)) < 1e-9
