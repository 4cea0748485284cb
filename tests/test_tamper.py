"""condreg reproduce tamper: a tiny end-to-end run holds every method × attacker cell and family
worst case with the identity's deficit exactly 0; every attacker's configuration comes from the
search and the edge count is recounted from the units; the tangent κ agrees with an independent
computation; the saved extractors load and a search of our own on them gives the recorded numbers;
resume; option errors; the large-model path on a fake ResNet."""

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

from condreg.attacks import LR_GRIDS, SCHEDULES, finetune_search  # noqa: E402
from condreg_experiments import UsageError, tamper  # noqa: E402
from condreg_experiments.tamper import report, settings, study  # noqa: E402

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
    short_steps=2,
    keep=1,
    max_extend=1,
    tangent_batch=6,
    attackers=",".join(settings.ATTACKERS),  # LoRA r32 too, which a full run leaves out
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
    assert (out / "attack_curves.png").is_file() and (out / "best_so_far.png").is_file()
    summary = payload["results"]["summary"]
    for arch in ("rescnn", "vit"):
        for domain in ("same", "cross"):
            methods = summary[arch][domain]["methods"]
            assert set(methods) == {"identity", "r_ill_only", "imma", "opt_kappa", "condreg"}
            for m, meas in methods.items():
                assert set(meas["cells"]) == set(settings.ATTACKERS)
                assert set(meas["families"]) == set(report.FAMILIES)
                for cell in [*meas["cells"].values(), *meas["families"].values()]:
                    assert len(cell["deficit"]["values"]) == 1 and len(cell["config"]) == 1
                    assert cell["deficit"]["ci95"] is None  # one seed: no interval
                    if m == "identity":
                        assert cell["deficit"]["values"] == [0.0]
                for fam, fc in meas["families"].items():
                    assert fc["attacker"][0] in report.FAMILIES[fam]
            assert methods["identity"]["rir_theta0"] == 1.0
    table = (out / "table.md").read_text()
    lead = table.split("## ")[0]
    for family in report.FAMILIES:
        assert f"**{family}**" in lead
    assert "95 % interval" in table and "κ of the empirical tangent kernel" in table


def test_every_configuration_is_searched_and_the_edge_count_is_recounted(tiny_run):
    _, payload = tiny_run
    results = payload["results"]
    capped, at_edge, n = [], 0, 0
    for key, unit in results["units"].items():
        for m, rec in unit["methods"].items():
            assert set(rec["attacks"]) == set(settings.ATTACKERS)
            for attacker, res in rec["attacks"].items():
                st = res["settings"]
                assert st["lr_grids"] == {"sgd": [0.01, 0.1], "adamw": [1e-3, 1e-2]}
                assert st["schedules"] == list(SCHEDULES) and st["keep"] == 1
                assert {(r["optimizer"], r["schedule"]) for r in res["sweep"]} == {
                    (o, s) for o in ("sgd", "adamw") for s in SCHEDULES
                }
                full = [r for r in res["sweep"] if r["steps"] == TINY["attack_steps"]]
                chosen = (res["optimizer"], res["schedule"], res["lr"])
                assert chosen in {(r["optimizer"], r["schedule"], r["lr"]) for r in full}
                assert report.held_out_score(res) == max(r["val_area"] for r in full)
                n += 1
                at_edge += st["chosen_at_grid_edge"]
                if st["capped"]:
                    capped.append(f"{key}/{m}/{attacker}")
            assert rec["attacks"]["lora_r32"]["settings"]["rank"] == 32
            assert rec["attacks"]["linear_probe"]["changed"] == []
            assert rec["attacks"]["whitened_probe"]["settings"]["ridge"] > 0
            changed = rec["attacks"]["finetune_block"]["changed"]
            assert changed and all(c.startswith("block.") for c in changed)
            assert any(c.startswith("stem.") for c in rec["attacks"]["finetune_all"]["changed"])
    search = results["search"]
    assert search["searches"] == n and search["chosen_at_edge"] == at_edge
    assert search["chosen_capped"] == len(capped) == len(search["capped"])
    assert sorted(c.split(" (")[0] for c in search["capped"]) == sorted(capped)


def test_best_so_far_is_the_running_maximum_of_the_sweep():
    sweep = [{"val_final": v} for v in (0.2, 0.5, None, 0.4, 0.7)]
    assert report.best_so_far({"sweep": sweep}) == [0.2, 0.5, 0.5, 0.5, 0.7]


def test_the_interval_is_students_t():
    ms = report.mean_ci([1.0, 2.0, 3.0])
    assert ms["mean"] == 2.0 and ms["std"] == 1.0
    np.testing.assert_allclose(ms["ci95"], 4.3026527297 / np.sqrt(3), rtol=1e-9)
    assert report.mean_ci([0.5])["ci95"] is None
    assert report.fmt_ci(ms) == "2.00 ± 2.48"


def test_the_family_picks_its_member_on_held_out_data_on_both_sides():
    def res(val, acc):
        cfg = {"optimizer": "sgd", "schedule": "constant", "lr": 0.1}
        st = {"steps": 4, "stopped": "interior", "capped": False, "chosen_at_grid_edge": False}
        sweep = [cfg | {"steps": 4, "val_area": val}]
        return cfg | {"sweep": sweep, "steps": [0, 2, 4], "test_acc": acc, "settings": st}

    imm = {"lora_r8": res(0.3, [0.2, 0.4, 0.6]), "lora_r32": res(0.5, [0.2, 0.2, 0.3])}
    ref = {"lora_r8": res(0.6, [0.2, 0.8, 1.0]), "lora_r32": res(0.4, [0.2, 0.6, 0.9])}
    s = settings.resolve(False, {})
    fam = report._family([imm], [ref], ("lora_r8", "lora_r32"), 0.2, s)
    # the pick is by held-out score, not by the (test) deficit: r32 here, r8 for the reference
    assert fam["attacker"] == ["lora_r32"] and fam["reference_attacker"] == ["lora_r8"]
    expected = 1 - np.trapezoid([0, 0, 0.1], [0, 2, 4]) / np.trapezoid([0, 0.6, 0.8], [0, 2, 4])
    np.testing.assert_allclose(fam["deficit"]["values"], [expected])


def test_the_tangent_kappa_agrees_with_an_independent_computation(tiny_run):
    """A probe's tangent kernel is ``[F 1][F 1]ᵀ ⊗ I``: κ of ``[F 1]`` squared, by NumPy."""
    out, payload = tiny_run
    rec = payload["results"]["units"]["rescnn-same-seed0"]["methods"]["condreg"]
    net, info = tamper.load_extractor(out / rec["extractor"])
    (X, _), _ = tamper.harmful_task(info)
    with torch.no_grad():
        F = net(torch.as_tensor(X[: TINY["tangent_batch"]])).double().numpy()
    sv = np.linalg.svd(np.hstack([F, np.ones((F.shape[0], 1))]), compute_uv=False)
    sv = sv[sv > sv[0] * 1e-6]
    np.testing.assert_allclose(rec["tangent"]["h"]["probe"], (sv[0] / sv[-1]) ** 2, rtol=1e-3)
    for d in ("h", "p"):
        assert all(rec["tangent"][d][k] >= 1 for k in ("probe", "block", "all"))


def test_saved_extractors_load_and_our_own_search_agrees(tiny_run):
    out, payload = tiny_run
    rec = payload["results"]["units"]["rescnn-same-seed0"]["methods"]["condreg"]
    net, info = tamper.load_extractor(out / rec["extractor"])
    assert info["method"] == "condreg" and info["domain"] == "same" and info["seed"] == 0
    (X, y), (Xt, yt) = tamper.harmful_task(info)
    with torch.no_grad():
        F = net(torch.as_tensor(Xt))
    assert F.shape == (len(yt), info["feature_dim"]) and bool(torch.isfinite(F).all())
    # the same search through the loaded extractor (no cached stem): the recorded choice
    recorded = rec["attacks"]["finetune_block"]
    again = finetune_search(
        net,
        (X, y),
        (Xt, yt),
        attacker="finetune_block",
        block="block",
        lr_grids={"sgd": TINY["lr_grid_sgd"], "adamw": TINY["lr_grid_adamw"]},
        steps=TINY["attack_steps"],
        short_steps=TINY["short_steps"],
        keep=TINY["keep"],
        max_extend=TINY["max_extend"],
        eval_every=TINY["eval_every"],
        batch_size=TINY["attack_batch"],
        n_classes=5,
        seed=0,
    )
    assert (again.optimizer, again.schedule, again.lr) == (
        recorded["optimizer"],
        recorded["schedule"],
        recorded["lr"],
    )
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
        ({"schedules": "cosine"}, "--schedules"),
        ({"short_steps": 200}, "short_steps"),
        ({"keep": 0}, "keep"),
        ({"max_extend": -1}, "max_extend"),
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


def test_the_search_spans_three_decades_and_quick_is_small():
    full = settings.resolve(False, {})
    for o in ("sgd", "adamw"):
        grid = full.grids()[o]
        assert grid == LR_GRIDS[o] and max(grid) / min(grid) >= 10**3 * (1 - 1e-9)
    assert full.schedules == SCHEDULES and full.rung1_steps == full.attack_steps // 5
    assert full.keep >= 1 and full.max_extend == 6
    s = settings.resolve(True, {})
    assert s.attackers == settings.DEFAULT_ATTACKERS == full.attackers
    assert set(settings.ATTACKERS) - set(full.attackers) == {"lora_r32"}
    assert s.optimizers == settings.OPTIMIZERS
    assert len(s.grids()["sgd"]) == 3 and s.max_extend == 1 and s.keep == 1
    import condreg.attacks

    assert settings.OPTIMIZERS is condreg.attacks.OPTIMIZERS  # defined once, in the library
    assert s.base.methods == ("identity", "r_ill_only", "imma", "opt_kappa", "condreg")
    assert s.domains == ("same",) and tamper.SEEDS[True] == 1
    assert settings.resolve(False, {"lr_grid_adamw": "0.1"}).grids()["adamw"] == (0.1,)


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
    assert len(methods["condreg"]["cells"]) == len(settings.ATTACKERS)
    rec = payload["results"]["units"]["resnet18-same-seed0"]["methods"]["condreg"]
    net, info = tamper.load_extractor(tmp_path / "out" / rec["extractor"])
    assert info["arch"] == "resnet18"
    with torch.no_grad():
        assert net(torch.zeros(2, 3, 16, 16)).shape == (2, 16)
