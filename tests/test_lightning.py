"""condreg.torch.lightning: Algorithm 1 run by a real lightning.Trainer on the CPU (tiny)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

from lightning.pytorch.utilities import CombinedLoader  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import condreg  # noqa: E402


def _data(seed=0, N=64, D=8):
    rng = np.random.default_rng(seed)
    X_p = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -1, D))
    Q, _ = np.linalg.qr(rng.standard_normal((D, D)))
    X_h = rng.standard_normal((N, D)) @ np.diag(np.logspace(0, -1, D)) @ Q.T
    y = (X_p @ rng.standard_normal(D) > 0).astype(np.int64)
    return torch.tensor(X_p), torch.tensor(y), torch.tensor(X_h)


def _trainer(tmp_path, steps):
    return L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        default_root_dir=tmp_path,
    )


def _fit(tmp_path, steps=40, backbone=None, **kw):
    from condreg.torch.lightning import ImmunizationModule

    X_p, y, X_h = _data()
    torch.manual_seed(0)
    immunized = torch.nn.Linear(8, 8, bias=False).double()
    with torch.no_grad():
        immunized.weight.copy_(torch.eye(8, dtype=torch.float64))
    module = ImmunizationModule(
        backbone if backbone is not None else torch.nn.Identity(),
        immunized,
        torch.nn.Linear(8, 2).double(),
        **kw,
    )
    loader = CombinedLoader(
        {
            "pretrain": DataLoader(TensorDataset(X_p, y), batch_size=64),
            "harmful": DataLoader(TensorDataset(X_h), batch_size=64),
        },
        "max_size_cycle",
    )
    trainer = _trainer(tmp_path, steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers / logging
        trainer.fit(module, loader)
    theta = immunized.weight.detach().T.numpy()
    return condreg.metrics.rir(theta, X_p.numpy(), X_h.numpy()), trainer, module


def test_trainer_runs_algorithm1_and_moves_kappa_the_intended_way(tmp_path):
    plain, _, _ = _fit(tmp_path / "plain", lam_p=0.0, lam_h=0.0)
    res, trainer, _ = _fit(tmp_path / "reg", lam_p=100.0, lam_h=1.0, log_kappa=True)
    assert trainer.global_step == 40
    # κ(H_P) down (below its start and below plain training), κ(H_H) up: Eq. 15's RIR > 1
    assert res.kappa_hp < res.kappa_kp and res.kappa_hp < plain.kappa_hp, (res, plain)
    assert res.kappa_hh > 3 * res.kappa_kh, res
    assert res.rir > 3 and res.ii < 1 and plain.rir < 1.1, (res, plain)
    logged = trainer.callback_metrics
    assert {"task", "reg", "kappa_hp", "kappa_hh"} <= set(logged)
    # the logged κ of the last batch is that of the features before the last step (full batch)
    np.testing.assert_allclose(float(logged["kappa_hh"]), res.kappa_hh, rtol=0.1)
    assert not list(tmp_path.glob("**/*.ckpt"))


def test_precondition_sits_on_the_regularizer_path(tmp_path):
    """One full-batch step with ridge=0, normalize=False, plain SGD and no task gradient on θ
    equals Algorithm 1's K⁺-left update of θ = weight.T."""
    from condreg.algorithm import preconditioned_gradient

    X_p, y, X_h = _data()
    _, _, module = _fit(
        tmp_path,
        steps=1,
        lam_p=0.5,
        lam_h=0.2,
        ridge=0.0,
        normalize=False,
        lr=1e-3,
        momentum=0.0,
        task_loss=lambda logits, labels: 0.0 * logits.sum(),
    )
    theta = module.immunized.weight.detach().T.numpy()
    eye = np.eye(8)
    expected = eye - 1e-3 * (
        0.5 * preconditioned_gradient(eye, X_p.numpy(), "r_well")
        + 0.2 * preconditioned_gradient(eye, X_h.numpy(), "r_ill")
    )
    np.testing.assert_allclose(theta, expected, rtol=1e-9, atol=1e-12)


def test_weight_conditioning_option_and_bad_batches(tmp_path):
    from condreg.torch.lightning import ImmunizationModule

    backbone = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).double()
    _, trainer, _ = _fit(tmp_path, steps=3, backbone=backbone, lam_weights=0.1)
    assert np.isfinite(float(trainer.callback_metrics["weights"]))
    module = ImmunizationModule(torch.nn.Identity(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    with pytest.raises(ValueError, match="pretrain"):
        module.training_step({"x": torch.zeros(4, 8)}, 0)
    batch = {"pretrain": (torch.zeros(4, 8), torch.zeros(4, dtype=torch.long))}
    with pytest.raises(
        ValueError, match=r"missing \['harmful'\], got keys \['harmfull', 'pretrain'\]"
    ):
        module.training_step({**batch, "harmfull": torch.zeros(4, 8)}, 0)
    with pytest.raises(ValueError, match=r"'pretrain' is not a pair"):
        module.training_step({"pretrain": torch.zeros(4, 8), "harmful": torch.zeros(4, 8)}, 0)
    with pytest.raises(ValueError, match="lr"):
        ImmunizationModule(torch.nn.Identity(), torch.nn.Linear(8, 8), torch.nn.Identity(), lr=0)
