"""Run by tests/test_data_parallel.py: ImmunizationModule fitted by Lightning for 3 SGD steps.

``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/_scale_lightning.py OUT``
fits on 2 gloo processes (``strategy="ddp"``, 32 rows each; rank 0 saves the trained parameters
and the logged κ's to ``OUT/lightning2.pt``); :func:`fit` with ``devices=1`` is the one-process
run on the same 64 rows per step."""

from __future__ import annotations

import os
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


def fit(devices: int, root: str):
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
        local=bool(os.environ.get("CONDREG_TEST_LOCAL")),
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
        strategy="ddp" if devices > 1 else "auto",
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


if __name__ == "__main__":
    torch.set_num_threads(1)
    result = fit(2, sys.argv[1])
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(result, os.path.join(sys.argv[1], "lightning2.pt"))
    # Leave the process group before the interpreter exits: a gloo thread still running at
    # shutdown can abort the process ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
