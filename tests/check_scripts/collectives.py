"""Collectives over the `neuron` process group, one rank per process (RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT from the test, no torchrun), three steps marked by hand; `fsdp`: two FSDP2 training steps instead."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import nativelab.check

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.neuron.set_device(rank)
dev = torch.device("neuron", rank)
dist.init_process_group("neuron")

if sys.argv[1:] == ["fsdp"]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).to(dev)
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 64).to(dev), torch.randn(4, 8).to(dev)
    for _ in range(2):
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
else:
    grad = torch.ones(1024, device=dev)
    for _ in range(3):
        dist.all_reduce(grad)
        out = torch.empty(world * 256, device=dev)
        dist.all_gather_into_tensor(out, torch.ones(256, device=dev))
        shard = torch.empty(256, device=dev)
        dist.reduce_scatter_tensor(shard, torch.ones(world * 256, device=dev))
        dist.broadcast(grad, src=0)
        dist.barrier()
        nativelab.check.step()
dist.destroy_process_group()
