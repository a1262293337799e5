"""int64 values inside compiled graphs: an index computed beyond 2^31 and an integer scatter_add above 2^24,
three calls each (the device computes int64 as int32 and integer scatter-add in fp32, in graphs too)."""

import torch

import nativelab  # noqa: F401


def offsets(ids):
    far = ids + 2**31
    return far.sum()


def histogram(idx, src):
    out = torch.zeros(4, dtype=torch.int32, device=idx.device)
    return out.scatter_add(0, idx, src) * 1


f = torch.compile(offsets, backend="neuron")
g = torch.compile(histogram, backend="neuron")
ids = torch.arange(8).to("neuron")
idx = torch.tensor([0, 1, 1, 2]).to("neuron")
src = torch.full((4,), 2**24 + 1, dtype=torch.int32).to("neuron")
for _ in range(3):
    total = f(ids)
    counts = g(idx, src)
torch.neuron.synchronize()
