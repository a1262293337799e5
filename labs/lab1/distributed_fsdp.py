"""Lab 1, Step 5: distributed training over the chip's 4 logical NeuronCores with FSDP2.

    NEURON_RT_VIRTUAL_CORE_SIZE=2 NEURON_RT_NUM_CORES=4 torchrun --nproc_per_node 4 \\
        --rdzv_backend c10d --rdzv_endpoint localhost:29500 labs/lab1/distributed_fsdp.py

Each rank binds to `neuron:{LOCAL_RANK}`; `init_process_group()` picks the `neuron` backend for the device.
The model is sharded with `fully_shard` and computes in bf16 (MixedPrecisionPolicy), gradients are reduced
in fp32. `--parallel ddp` trains the same model with DistributedDataParallel instead. `--checkpoint-dir DIR`
saves model + optimizer with torch.distributed.checkpoint after every iteration and resumes from the newest
complete checkpoint there.
"""

import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from nativelab.distributed import checkpoint

DIM, HIDDEN, BATCH = 64, 256, 32


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", help="save every iteration here, resume from the newest checkpoint")
    p.add_argument("--digits", type=int, default=4, help="decimals of the printed loss")
    p.add_argument("--fail-at", type=int, help="(fault injection) raise after this iteration ...")
    p.add_argument("--fail-rank", type=int, default=0, help="... on this rank ...")
    p.add_argument("--fail-how", choices=("raise", "kill"), default="raise", help="... by an exception or SIGKILL")
    return p.parse_args()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM)) for _ in range(2)
        )
        self.head = nn.Linear(DIM, DIM)
        with torch.no_grad():
            self.head.weight.mul_(0.1)  # start near zero output: the first loss is about the targets' variance

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def batch(seed: int, rank: int, device):
    """Each rank's own fixed batch (a resumed run sees exactly the same data): targets of variance ~1,
    half of it learnable (a rotation of the input), so the loss starts near 1.0 and falls."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    x = torch.randn(BATCH, DIM, generator=g)
    y = 0.5 * x.roll(1, dims=1) + 0.85 * torch.randn(BATCH, DIM, generator=g)
    return x.to(device), y.to(device)


@record  # torchrun shows a failing rank's traceback in its summary
def main():
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.neuron.set_device(local_rank)
    device = torch.device("neuron", local_rank)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    # One write per line: print() writes the text and the newline separately when unbuffered, and four
    # ranks share one stdout, so their lines could interleave.
    sys.stdout.write(f"[Rank {rank}/{world}] Initialized on {device}\n")
    sys.stdout.flush()

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = MLP().to(device)
    if args.parallel == "fsdp":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    start = 0
    if args.checkpoint_dir and checkpoint.latest(args.checkpoint_dir) is not None:
        # only then: get_state_dict initializes an empty optimizer's state (a zero-lr step counts as a step)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        start = checkpoint.load(state, args.checkpoint_dir)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if rank == 0:
            print(f"Resumed from iteration {start} ({args.checkpoint_dir})", flush=True)

    x, y = batch(args.seed, rank, device)
    for it in range(start + 1, args.iterations + 1):
        loss = (model(x).float() - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reported = loss.detach().clone()
        dist.all_reduce(reported, op=dist.ReduceOp.AVG)  # the mean over all ranks' batches
        if rank == 0:
            print(f"Iteration {it}/{args.iterations}, Loss: {reported.item():.{args.digits}f}", flush=True)
        if args.checkpoint_dir:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            checkpoint.save({"model": model_sd, "optim": optim_sd}, args.checkpoint_dir, it)
        if args.fail_at == it and rank == args.fail_rank:
            if args.fail_how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected failure on rank {rank} after iteration {it}")

    dist.barrier()
    if rank == 0:
        print("Training complete!", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
