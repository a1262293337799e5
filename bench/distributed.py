"""Data-parallel training on the emulated device with 1, 2 and 4 ranks (torchrun), measured in one run.

    python bench/distributed.py [--parallel fsdp|ddp] [--steps 20] [--ranks 1,2,4]

Each rank trains a small causal language model (embedding, 2 transformer layers, LM head; FSDP2 with a
bf16 MixedPrecisionPolicy by default) on its own batch of `batch x seq` tokens (weak scaling: the global batch
grows with the ranks). Prints the step time (median over `--steps` timed steps after warm-up, each ended
by a device synchronize and a barrier), tokens/s over all ranks, and the ratios against one rank; then one
4 MiB all_reduce through the neuron backend on device tensors against plain gloo on CPU tensors. Every rank
is a process on the host CPU: with fewer cores than ranks they share the cores, so this measures the
backend's overhead and the host's parallelism, not a NeuronCore's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 1024, 128, 4, 2, 64, 4
ALLREDUCE_BYTES = 4 << 20


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True, norm_first=True)
                for _ in range(LAYERS)
            )
            self.head = nn.Linear(DIM, VOCAB)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x, src_mask=self.mask, is_causal=True)
            return self.head(x)

    local = int(os.environ["LOCAL_RANK"])
    torch.neuron.set_device(local)
    device = torch.device("neuron", local)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = TinyLM().to(device)
    if args.parallel == "fsdp":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g, dtype=torch.int32).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)

    def step():
        logits = model(inputs).float()
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        step()
    times = []
    for _ in range(args.steps):
        torch.neuron.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        loss = step()
        torch.neuron.synchronize()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    result = {"world": world, "step_s": statistics.median(times), "loss": loss.item()}
    if world > 1:  # one collective alone: the neuron backend on device tensors against plain gloo on CPU ones
        gloo = dist.new_group(backend="gloo")
        dev_t = torch.ones(ALLREDUCE_BYTES // 4, device=device)
        cpu_t = torch.ones(ALLREDUCE_BYTES // 4)
        result["allreduce_neuron_s"] = time_collective(lambda: dist.all_reduce(dev_t), args.steps)
        result["allreduce_gloo_s"] = time_collective(lambda: dist.all_reduce(cpu_t, group=gloo), args.steps)
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def time_collective(fn, reps: int) -> float:
    import torch.distributed as dist

    times = []
    for _ in range(reps + 2):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n: int, args) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--rdzv_backend", "c10d",
           "--rdzv_endpoint", f"localhost:{free_port()}", __file__, "--worker",
           "--parallel", args.parallel, "--steps", str(args.steps)]
    env = dict(os.environ, NATIVELAB_QUIET="1", OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"{n} ranks failed:\n{r.stderr[-4000:]}")
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parallel", choices=("fsdp", "ddp"), default="fsdp")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    ranks = [int(r) for r in args.ranks.split(",")]
    print(f"{args.parallel}, {LAYERS}-layer LM (dim {DIM}, vocab {VOCAB}), {BATCH}x{SEQ} tokens per rank per step, "
          f"{os.cpu_count()} host cores, median of {args.steps} steps")
    results = {n: launch(n, args) for n in ranks}
    base = results[ranks[0]]
    base_tps = BATCH * SEQ * ranks[0] / base["step_s"]
    print(f"{'ranks':>5} | {'step time':>10} | {'tokens/s':>9} | {'tokens/s vs 1':>13} | {'efficiency':>10}")
    for n, res in results.items():
        tps = BATCH * SEQ * n / res["step_s"]
        print(f"{n:>5} | {res['step_s'] * 1e3:>7.1f} ms | {tps:>9.0f} | {tps / base_tps:>12.2f}x | "
              f"{tps / base_tps / (n / ranks[0]):>9.0%}")
    for n, res in results.items():
        if "allreduce_neuron_s" in res:
            ratio = res["allreduce_neuron_s"] / res["allreduce_gloo_s"]
            print(f"all_reduce of {ALLREDUCE_BYTES >> 20} MiB fp32, {n} ranks: neuron backend on device tensors "
                  f"{res['allreduce_neuron_s'] * 1e3:.2f} ms, gloo on CPU tensors {res['allreduce_gloo_s'] * 1e3:.2f} ms "
                  f"({ratio:.2f}x)")


if __name__ == "__main__":
    main()
