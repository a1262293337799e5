"""Spawned subprocesses get their own device (the entry point registers it in each one)."""

import torch
import torch.multiprocessing as mp


def _worker(rank, q):
    import torch

    x = torch.full((4,), float(rank + 1)).to(f"neuron:{rank}")
    y = (x * 10).sum()
    q.put((rank, str(y.device), y.item(), torch.neuron.device_count()))


def test_spawned_workers_use_the_device():
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(q,), nprocs=2, start_method="spawn", join=True)
    results = sorted(q.get() for _ in range(2))
    assert results == [(0, "neuron:0", 40.0, 4), (1, "neuron:1", 80.0, 4)]


def test_device_tensors_are_passed_to_workers_as_host_copies_back():
    # Device tensors cross process boundaries by value through the host, like CUDA tensors without IPC.
    x = torch.arange(6.0).to("neuron")
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        out = pool.apply(torch.mul, (x.cpu(), 2))
    assert torch.equal(out, torch.arange(6.0) * 2)
