"""Global batch under data parallelism: 2 gloo processes × N rows train exactly as one process
on the 2N rows (float64, 1e-8) — plain DDP (``torch.multiprocessing``), Lightning
(``strategy="ddp"``) and the Hugging Face ``Trainer``, the last two under ``torchrun``; each in a
subprocess with a timeout (no process group leaks into the suite; on timeout the subprocess's
whole session is killed). The scripts are ``tests/_scale_*.py``. Running them with
``CONDREG_TEST_LOCAL=1`` (``local=True``) gives relative differences of 1e-1 (Lightning) and
1e-2 (HF): the per-shard regularizer is a different training."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

HERE = Path(__file__).resolve().parent
TIMEOUT = 240


def _run(args, tmp_path, **env):
    """Run ``args`` in its own session; on timeout the whole process group is killed."""
    full = dict(os.environ, OMP_NUM_THREADS="1", **env)
    full["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), full.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{args[-2:]} ran longer than {TIMEOUT} s")
    assert proc.returncode == 0, out[-4000:]
    return out


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def _script(name):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ddp_and_fsdp_regularizer_and_preconditioner_are_those_of_the_global_batch(tmp_path):
    script = _script("_scale_ddp")
    _run([sys.executable, str(HERE / "_scale_ddp.py"), str(tmp_path)], tmp_path)
    weights = torch.load(tmp_path / "ddp.pt")
    assert _rel(weights[-1], script.train(script.CASES[0])) < 1e-8  # FSDP2 (fully_shard)
    for case, w in zip(script.CASES, weights[:-1], strict=True):
        one = script.train(case)
        local = case[-1]
        if local:  # each rank its own rows: a different training (the test can fail)
            assert _rel(w, one) > 1e-3, case
        else:
            assert _rel(w, one) < 1e-8, case


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def test_lightning_ddp_equals_one_process(tmp_path):
    pytest.importorskip("lightning")
    _run([*TORCHRUN, str(HERE / "_scale_lightning.py"), str(tmp_path)], tmp_path)
    w2, k2 = torch.load(tmp_path / "lightning2.pt")
    w1, k1 = _script("_scale_lightning").fit(1, str(tmp_path))
    assert _rel(w2, w1) < 1e-8
    assert _rel(k2, k1) < 1e-8  # the logged κ's are those of the global batch


def test_hf_trainer_on_two_processes_equals_one(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    _run([*TORCHRUN, str(HERE / "_scale_hf.py"), str(tmp_path)], tmp_path)
    _script("_scale_hf").main(str(tmp_path))
    w1, w2 = torch.load(tmp_path / "weights1.pt"), torch.load(tmp_path / "weights2.pt")
    assert _rel(w2, w1) < 1e-8
