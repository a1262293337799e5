"""Rank programs for tests/test_distributed.py, run under torchrun: `python -m torch.distributed.run ...
tests/distributed_worker.py collectives|train`. Every check compares against a reference computed in this
process from the same deterministic inputs every rank can rebuild; a failed check raises (non-zero exit)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import nativelab  # noqa: F401  (also registered by `import torch` unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32)
SHAPES = ((7,), (3, 5))


def data(rank: int, shape, dtype, salt: int = 0) -> torch.Tensor:
    """Small integers: exact in every dtype above, and their sums over 4 ranks too."""
    n = torch.Size(shape).numel()
    return ((torch.arange(n).reshape(shape) * (rank + 1) + rank + salt) % 61).to(dtype)


def check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.device == DEVICE, f"{what}: result on {got.device}, expected {DEVICE}"
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)}"
    assert torch.equal(got, want), f"{what}: got {got.flatten()[:8].tolist()} want {want.flatten()[:8].tolist()}"


def collectives(rank: int, world: int) -> None:
    for dtype in DTYPES:
        for shape in SHAPES:
            tag = f"{dtype} {shape}"
            every = [data(r, shape, dtype) for r in range(world)]
            stacked = torch.stack([t.float() for t in every])

            t = every[rank].to(DEVICE) * 1  # produced by a queued device op: the collective must wait for it
            dist.all_reduce(t)
            check(t, stacked.sum(0).to(dtype), f"all_reduce SUM {tag}")
            t = every[rank].to(DEVICE)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            check(t, stacked.amax(0).to(dtype), f"all_reduce MAX {tag}")
            if dtype.is_floating_point:
                t = every[rank].to(DEVICE)
                work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
                assert work.wait()
                check(t, (stacked.sum(0) / world).to(dtype), f"all_reduce AVG async {tag}")

            outs = [torch.empty(shape, dtype=dtype, device=DEVICE) for _ in range(world)]
            dist.all_gather(outs, every[rank].to(DEVICE))
            for r in range(world):
                check(outs[r], every[r], f"all_gather[{r}] {tag}")
            out = torch.empty((world * shape[0], *shape[1:]), dtype=dtype, device=DEVICE)
            dist.all_gather_into_tensor(out, every[rank].to(DEVICE))
            check(out, torch.cat(every), f"all_gather_into_tensor {tag}")

            big = [data(r, (world * shape[0], *shape[1:]), dtype, salt=1) for r in range(world)]
            total = torch.stack([b.float() for b in big]).sum(0).to(dtype)
            mine = total.chunk(world)[rank]
            out = torch.empty(shape, dtype=dtype, device=DEVICE)
            dist.reduce_scatter_tensor(out, big[rank].to(DEVICE))
            check(out, mine, f"reduce_scatter_tensor {tag}")
            out = torch.empty(shape, dtype=dtype, device=DEVICE)
            dist.reduce_scatter(out, [c.to(DEVICE) for c in big[rank].chunk(world)])
            check(out, mine, f"reduce_scatter {tag}")

            t = every[rank].to(DEVICE)
            dist.broadcast(t, src=world - 1)
            check(t, every[world - 1], f"broadcast {tag}")

            send = (every[rank] + 1).to(DEVICE)
            recv = torch.empty(shape, dtype=dtype, device=DEVICE)
            works = [dist.isend(send, (rank + 1) % world), dist.irecv(recv, (rank - 1) % world)]
            for w in works:
                w.wait()
            check(recv, every[(rank - 1) % world] + 1, f"isend/irecv ring {tag}")

    # async handles: the future yields the device tensors once the collective is done
    t = torch.full((4,), float(rank + 1), device=DEVICE)
    fut = dist.all_reduce(t, async_op=True).get_future()
    (res,) = fut.wait()
    assert res is t, "the future must yield the device tensor itself"
    check(t, torch.full((4,), float(world * (world + 1) // 2)), "all_reduce future")

    split = torch.arange(world * 2, dtype=torch.float32) + 100 * rank
    out = torch.empty(world * 2, device=DEVICE)
    dist.all_to_all_single(out, split.to(DEVICE))
    want = torch.cat([(torch.arange(world * 2, dtype=torch.float32) + 100 * r)[2 * rank: 2 * rank + 2] for r in range(world)])
    check(out, want, "all_to_all_single")

    every = [data(r, (5,), torch.float32) for r in range(world)]
    t = every[rank].to(DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    check(t, torch.stack(every).amin(0), "all_reduce MIN")
    t = every[rank].to(DEVICE)
    dist.reduce(t, dst=0)
    if rank == 0:
        check(t, torch.stack(every).sum(0), "reduce")
    gathered = [torch.empty(5, device=DEVICE) for _ in range(world)] if rank == 0 else None
    dist.gather(every[rank].to(DEVICE), gathered, dst=0)
    if rank == 0:
        for r in range(world):
            check(gathered[r], every[r], f"gather[{r}]")
    out = torch.empty(5, device=DEVICE)
    dist.scatter(out, [t.to(DEVICE) for t in every] if rank == 1 else None, src=1)
    check(out, every[rank], "scatter")
    outs = [torch.empty(2, device=DEVICE) for _ in range(world)]
    dist.all_to_all(outs, [torch.tensor([rank, r], dtype=torch.float32, device=DEVICE) for r in range(world)])
    for r in range(world):
        check(outs[r], torch.tensor([r, rank], dtype=torch.float32), f"all_to_all[{r}]")

    if rank == 0:
        dist.send(torch.tensor([7.0, 8.0], device=DEVICE), dst=world - 1)
    elif rank == world - 1:
        got = torch.zeros(2, device=DEVICE)
        dist.recv(got, src=0)
        check(got, torch.tensor([7.0, 8.0]), "send/recv")
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)], objs
    dist.barrier()
    print(f"collectives ok on rank {rank}/{world} ({DEVICE})", flush=True)


STEPS, BATCH, LR = 4, 8, 1e-2


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def global_batch(world: int):
    g = torch.Generator().manual_seed(123)
    return torch.randn(world * BATCH, 16, generator=g), torch.randn(world * BATCH, 4, generator=g)


def reference(world: int):
    """Single-process CPU training on the whole global batch: what data parallelism must reproduce."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = global_batch(world)
    losses = []
    for _ in range(STEPS):
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


def train(rank: int, world: int, mode: str):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = make_model().to(DEVICE)
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    else:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mode == "fsdp-bf16" \
            else MixedPrecisionPolicy()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = (t.chunk(world)[rank].to(DEVICE) for t in global_batch(world))
    losses = []
    for _ in range(STEPS):
        loss = (model(x).float() - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return losses, [p.detach().cpu() for p in params]


def train_all(rank: int, world: int) -> None:
    ref_losses, ref_params = reference(world)
    # fp32 FSDP2 and DDP differ from one process only in summation order; bf16 compute rounds
    for mode, rtol, atol in (("fsdp", 1e-5, 1e-6), ("ddp", 1e-5, 1e-6), ("fsdp-bf16", 3e-2, 1e-2)):
        losses, params = train(rank, world, mode)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=rtol, atol=atol,
                                   msg=lambda m, mode=mode: f"{mode} losses: {m}")
        for p, q in zip(params, ref_params):
            torch.testing.assert_close(p.float(), q, rtol=rtol, atol=atol * 10, msg=lambda m, mode=mode: f"{mode} params: {m}")
        if rank == 0:
            print(f"{mode} matches single-process training: {[round(v, 6) for v in losses]}", flush=True)


if __name__ == "__main__":
    local = int(os.environ["LOCAL_RANK"])
    torch.neuron.set_device(local)
    DEVICE = torch.device("neuron", local)
    dist.init_process_group(backend=os.environ.get("TEST_BACKEND") or None)
    assert type(dist.group.WORLD).__name__ == "NeuronProcessGroup", type(dist.group.WORLD)
    {"collectives": collectives, "train": train_all}[sys.argv[1]](dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
