"""Run by tests/test_data_parallel.py in a subprocess: ImmunizationModule fitted by Lightning on
2 gloo processes (``strategy="ddp_spawn"``, 32 rows each) and on one process (the same 64 rows
per step); prints the largest relative difference of the trained weights and the logged κ's."""

from __future__ import annotations

import sys
import warnings

import lightning as L
import torch
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader, TensorDataset

from condreg.torch.lightning import ImmunizationModule


def data():
    g = torch.Generator().manual_seed(0)
    scale = torch.logspace(0, -1, 8, dtype=torch.float64)
    X_p = torch.randn(64, 8, generator=g, dtype=torch.float64) * scale
    X_h = torch.randn(64, 8, generator=g, dtype=torch.float64) * scale.flip(0)
    y = (X_p @ torch.randn(8, generator=g, dtype=torch.float64) > 0).long()
    return X_p, y, X_h


def fit(devices: int, local: bool, root: str):
    X_p, y, X_h = data()
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).double()
    module = ImmunizationModule(
        backbone,
        torch.nn.Linear(8, 8, bias=False).double(),
        torch.nn.Linear(8, 2).double(),
        lam_p=1.0,
        lam_h=0.1,
        lr=0.05,
        log_kappa=True,
        local=local,
    )
    rows = 64 // devices
    loader = CombinedLoader(
        {
            "pretrain": DataLoader(TensorDataset(X_p, y), batch_size=rows),
            "harmful": DataLoader(TensorDataset(X_h), batch_size=rows),
        },
        "max_size_cycle",
    )
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        devices=devices,
        strategy="ddp_spawn" if devices > 1 else "auto",
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        default_root_dir=root,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)
    weights = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    kappas = torch.stack([trainer.callback_metrics[k] for k in ("kappa_hp", "kappa_hh")])
    return weights, kappas


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


if __name__ == "__main__":
    torch.set_num_threads(1)
    w1, k1 = fit(1, False, sys.argv[1])
    w2, k2 = fit(2, False, sys.argv[1])
    w2_local, _ = fit(2, True, sys.argv[1])
    print(f"global {rel(w2, w1):.3e} {rel(k2, k1):.3e} local {rel(w2_local, w1):.3e}")
