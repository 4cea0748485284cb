"""Run by tests/test_data_parallel.py: ConditionRegularizer + Precondition under plain DDP.

``python tests/_scale_ddp.py OUT`` spawns 2 gloo processes; each trains a small model for 3 SGD
steps on its rows of every case below (inside ``DistributedDataParallel``), rank 0 saves the
trained weights to ``OUT/ddp.pt``. The cases cover both routes of the regularizer and of the
preconditioner (N_total >= D: Gram all-reduce; N_total < D, or rank-deficient inputs: gather),
uneven row counts and ``local=True``; the last entry is ``CASES[0]`` under FSDP2
(``fully_shard``)."""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from condreg.torch.nn import ConditionRegularizer, Precondition

# (rows of rank 0, rows of rank 1, D_in, ridge, rank-deficient inputs, local)
CASES = [
    (32, 32, 8, 1e-4, False, False),
    (32, 32, 8, 0.0, False, False),
    (6, 6, 16, 1e-4, False, False),
    (6, 6, 16, 0.0, False, False),
    (40, 24, 8, 1e-4, False, False),
    (5, 9, 16, 0.0, False, False),
    (32, 32, 8, 1e-4, True, False),
    (32, 32, 8, 1e-4, False, True),
]


def data(case):
    n0, n1, d, _, deficient, _ = case
    g = torch.Generator().manual_seed(d)
    x_p = torch.randn(n0 + n1, d, generator=g, dtype=torch.float64)
    x_h = torch.randn(n0 + n1, d, generator=g, dtype=torch.float64)
    y = torch.randn(n0 + n1, generator=g, dtype=torch.float64)
    if deficient:  # constant feature sum: K has a null direction, the Gram route refuses
        x_p = x_p - x_p.mean(dim=1, keepdim=True)
        x_h = x_h - x_h.mean(dim=1, keepdim=True)
    return x_p, x_h, y


class Model(torch.nn.Module):
    def __init__(self, d, ridge, local):
        super().__init__()
        torch.manual_seed(0)
        self.immunized = torch.nn.Linear(d, 6, bias=False).double()
        self.head = torch.nn.Linear(6, 1).double()
        self.reg = ConditionRegularizer(1.0, 0.5, local=local)
        self.pre = Precondition(ridge, local=local)

    def forward(self, x_p, x_h, y, scale):
        f_p, f_h = self.immunized(x_p), self.immunized(x_h)
        task = scale * torch.sum((self.head(f_p)[:, 0] - y) ** 2)
        return task + self.reg(self.pre(f_p, x_p), self.pre(f_h, x_h))


def train(case, rows=slice(None), ddp=False, fsdp=False):
    x_p, x_h, y = data(case)
    model = Model(case[2], case[3], case[5])
    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    if fsdp:  # FSDP2: the parameters sharded over the ranks, gradients averaged as under DDP
        from torch.distributed.fsdp import fully_shard

        net = fully_shard(model)
        ddp = True
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # the mean over the global batch, also for uneven shards (DDP averages over ranks)
    scale = (2 if ddp else 1) / len(y)
    for _ in range(3):
        opt.zero_grad()
        net(x_p[rows], x_h[rows], y[rows], scale).backward()
        opt.step()
    weight = model.immunized.weight
    return (weight.full_tensor() if fsdp else weight).detach().clone()


def worker(rank, port, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        weights = []
        for case in CASES:
            start = 0 if rank == 0 else case[0]
            weights.append(train(case, slice(start, start + case[rank]), ddp=True))
        weights.append(train(CASES[0], slice(32 * rank, 32 * rank + 32), fsdp=True))
        if rank == 0:
            torch.save(weights, os.path.join(out, "ddp.pt"))
    finally:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, sys.argv[1]), nprocs=2)
