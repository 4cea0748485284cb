"""condreg reproduce tamper: a tiny end-to-end run holds every method × attacker × optimizer cell
with the identity's deficit exactly 0; the saved extractors load and an attack of our own on them
gives the recorded numbers; resume; option errors; the large-model path on a fake ResNet."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")

from condreg.attacks import finetune  # noqa: E402
from condreg_experiments import UsageError, tamper  # noqa: E402
from condreg_experiments.tamper import settings, study  # noqa: E402

# pre-training and immunization as small as the deep-net study's tiny run; 4-step attacks
TINY = dict(
    n_per_digit=40,
    pretrain_epochs=2,
    immunize_steps=4,
    batch_size=48,
    reg_steps=(0.05,),
    rir_groups=2,
    rir_group_size=30,
    feature_dim=48,
    attack_steps=4,
    eval_every=2,
    attack_batch=16,
    lr_grid_sgd=(0.01, 0.1),
    lr_grid_adamw=(1e-3, 1e-2),
)


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("mlxtend")
    out = tmp_path_factory.mktemp("tamper")
    payload = tamper.run(out, seeds=1, progress=False, jobs=1, domains="same,cross", **TINY)
    return out, payload


def test_every_cell_is_there_and_the_identity_deficit_is_zero(tiny_run):
    out, payload = tiny_run
    for name in ("results.json", "table.md", "deficit_heatmap.png", "kappa_vs_deficit.png"):
        assert (out / name).is_file()
    assert (out / "attack_curves_sgd.png").is_file() and (out / "attack_curves_adamw.png").is_file()
    summary = payload["results"]["summary"]
    cells = {f"{a}/{o}" for a in settings.ATTACKERS for o in settings.OPTIMIZERS}
    for arch in ("rescnn", "vit"):
        for domain in ("same", "cross"):
            methods = summary[arch][domain]["methods"]
            assert set(methods) == {"identity", "r_ill_only", "imma", "opt_kappa", "condreg"}
            for m, meas in methods.items():
                assert set(meas["cells"]) == cells
                for cell in meas["cells"].values():
                    assert len(cell["deficit"]["values"]) == 1 and len(cell["lr"]) == 1
                    if m == "identity":
                        assert cell["deficit"]["values"] == [0.0]
                        assert cell["steps_to_target"][0] is not None
            assert methods["identity"]["rir_theta0"] == 1.0
    table = (out / "table.md").read_text()
    lead = table.split("## ")[0]
    for family in ("Linear probe", "LoRA (r 8, 32)", "Block fine-tuning", "Full fine-tuning"):
        assert f"**{family}**" in lead


def test_the_chosen_rates_and_grids_are_recorded(tiny_run):
    _, payload = tiny_run
    unit = payload["results"]["units"]["vit-cross-seed0"]
    for rec in unit["methods"].values():
        for cell, res in rec["attacks"].items():
            opt = cell.split("/")[1]
            grid = list(TINY["lr_grid_sgd"] if opt == "sgd" else TINY["lr_grid_adamw"])
            assert res["settings"]["lr_grid"] == list(
                settings.resolve(False, TINY).grid(cell.split("/")[0], opt)
            )
            assert res["settings"]["lr_grid"] == grid and res["lr"] in grid
            assert [r["lr"] for r in res["sweep"]] == grid
            assert all(r["val_area"] is not None for r in res["sweep"])
        assert rec["attacks"]["lora_r32/sgd"]["settings"]["rank"] == 32
        assert rec["attacks"]["lora_r8/adamw"]["changed"] == []
        assert rec["attacks"]["linear_probe/sgd"]["changed"] == []
        changed = rec["attacks"]["finetune_block/adamw"]["changed"]
        assert changed and all(n.startswith("block.") for n in changed)
        assert any(n.startswith("stem.") for n in rec["attacks"]["finetune_all/adamw"]["changed"])


def test_saved_extractors_load_and_our_own_attack_agrees(tiny_run):
    out, payload = tiny_run
    rec = payload["results"]["units"]["rescnn-same-seed0"]["methods"]["condreg"]
    net, info = tamper.load_extractor(out / rec["extractor"])
    assert info["method"] == "condreg" and info["domain"] == "same" and info["seed"] == 0
    (X, y), (Xt, yt) = tamper.harmful_task(info)
    with torch.no_grad():
        F = net(torch.as_tensor(Xt))
    assert F.shape == (len(yt), info["feature_dim"]) and bool(torch.isfinite(F).all())
    # the same attack through the loaded extractor (no cached stem): the recorded curve
    recorded = rec["attacks"]["finetune_block/sgd"]
    again = finetune(
        net,
        (X, y),
        (Xt, yt),
        attacker="finetune_block",
        block="block",
        optimizer="sgd",
        steps=TINY["attack_steps"],
        lr_grid=TINY["lr_grid_sgd"],
        eval_every=TINY["eval_every"],
        batch_size=TINY["attack_batch"],
        n_classes=5,
        seed=0,
    )
    assert again.lr == recorded["lr"]
    np.testing.assert_allclose(again.test_acc, recorded["test_acc"], atol=1.5 / len(yt))
    with pytest.raises(ValueError, match="not an extractor"):
        (out / "bogus.pt").write_bytes(b"")
        torch.save({"format": "other"}, out / "bogus.pt")
        tamper.load_extractor(out / "bogus.pt")
    with pytest.raises(FileNotFoundError):
        tamper.load_extractor(out / "missing.pt")


def test_cross_digits_are_mnist_shaped_and_another_source():
    X, y = study.cross_digits()
    assert X.shape == (1797, 1, 28, 28) and X.dtype == np.float32 and set(y) == set(range(10))
    border = X[:, :, :4, :]
    assert np.allclose(border, (0 - study.MNIST_MEAN) / study.MNIST_STD)  # MNIST's empty border


def test_resume_reuses_every_unit(tiny_run, monkeypatch):
    out, payload = tiny_run

    def boom(*a, **k):
        raise AssertionError("a finished unit was recomputed")

    monkeypatch.setattr(study, "run_seed", boom)
    again = tamper.run(
        out, seeds=1, progress=False, jobs=1, resume=True, domains="same,cross", **TINY
    )
    assert again["results"]["summary"] == json.loads(json.dumps(payload["results"]["summary"]))
    with pytest.raises(UsageError, match="other settings"):
        tamper.run(
            out,
            seeds=1,
            progress=False,
            resume=True,
            domains="same,cross",
            **{**TINY, "attack_steps": 6},
        )


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"domains": "same,moon"}, "--domains"),
        ({"attackers": "lora_r8,prune"}, "--attackers"),
        ({"optimizers": "adam"}, "--optimizers"),
        ({"attack_steps": 0}, "attack_steps"),
        ({"lr_grid_sgd": "0.1,-1"}, "lr_grid_sgd"),
        ({"no_such_option": 1}, "unknown tamper option"),
        ({"arch": "resnet18", "domains": "cross"}, "needs --pretrain-dir|--domains same"),
        ({"target": "theta"}, "target=block"),
    ],
)
def test_bad_options_are_usage_errors_before_any_work(tmp_path, options, match):
    out = tmp_path / "never"
    with pytest.raises(UsageError, match=match):
        tamper.run(out, progress=False, **options)
    assert not out.exists()


def test_cli_bad_option_is_one_line(capsys):
    from condreg.cli import main

    assert main(["reproduce", "tamper", "--domains", "moon", "--out", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--domains" in err[0]


@pytest.mark.parametrize(
    ("module", "argv", "match"),
    [
        ("peft", [], "LoRA attackers need peft"),
        ("sklearn", ["--domains", "same,cross"], "needs scikit-learn"),
        ("torch", [], "needs PyTorch"),
    ],
)
def test_a_missing_library_is_one_line_before_any_work(tmp_path, module, argv, match):
    out = tmp_path / "never"
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from condreg.cli import main\n"
        f"raise SystemExit(main(['reproduce', 'tamper', *{argv!r}, '--out', {str(out)!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and match in lines[0], proc.stderr
    assert not out.exists()


def test_quick_settings_hold_every_cell_and_the_grids_depend_on_the_attacker():
    s = settings.resolve(True, {})
    assert (
        s.grid("lora_r32", "sgd")
        == s.grid("lora_r8", "sgd")
        == settings.ATTACK_LR_GRIDS["lora/sgd"][1:3]
    )
    full = settings.resolve(False, {})
    assert full.grid("finetune_all", "adamw") == (3e-4, 1e-3, 3e-3)
    assert full.grid("linear_probe", "adamw") == (3e-3, 1e-2, 3e-2)
    assert settings.resolve(False, {"lr_grid_adamw": "0.1"}).grid("finetune_all", "adamw") == (0.1,)
    assert s.attackers == settings.ATTACKERS and s.optimizers == settings.OPTIMIZERS
    import condreg.attacks

    assert settings.OPTIMIZERS is condreg.attacks.OPTIMIZERS  # defined once, in the library
    assert s.base.methods == ("identity", "r_ill_only", "imma", "opt_kappa", "condreg")
    assert s.domains == ("same",) and tamper.SEEDS[True] == 1


def test_large_model_path_on_a_fake_resnet(tmp_path, monkeypatch):
    """``--arch resnet18`` with image folders (a tiny torchvision-like ResNet, random weights)."""
    import importlib.util

    from test_deepnet import _FakeResNet, _write_folder

    from condreg_experiments.deepnet import models

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: object() if n == "torchvision" else real(n, *a)
    )
    monkeypatch.setattr(
        models, "build_large", lambda a, w, n: models.split_resnet(_FakeResNet(), n)
    )
    p = _write_folder(tmp_path / "p", classes=("a", "b", "c"), per_class=12, size=(12, 12))
    h = _write_folder(tmp_path / "h", classes=("x", "y"), per_class=12, size=(12, 12))
    small = {k: v for k, v in TINY.items() if k != "feature_dim"}
    small.update(batch_size=8, rir_group_size=6)
    payload = tamper.run(
        tmp_path / "out",
        seeds=1,
        progress=False,
        jobs=1,
        arch="resnet18",
        pretrain_dir=p,
        harmful_dir=h,
        image_size=16,
        methods="condreg",
        domains="same",
        **small,
    )
    methods = payload["results"]["summary"]["resnet18"]["same"]["methods"]
    assert set(methods) == {"identity", "condreg"}
    assert len(methods["condreg"]["cells"]) == len(settings.ATTACKERS) * 2
    rec = payload["results"]["units"]["resnet18-same-seed0"]["methods"]["condreg"]
    net, info = tamper.load_extractor(tmp_path / "out" / rec["extractor"])
    assert info["arch"] == "resnet18"
    with torch.no_grad():
        assert net(torch.zeros(2, 3, 16, 16)).shape == (2, 16)
