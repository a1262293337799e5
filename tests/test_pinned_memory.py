"""Pinned host memory (CUDA's API): pin_memory(), is_pinned(), non_blocking copies, DataLoader(pin_memory=True)."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def test_pin_memory_and_is_pinned():
    x = torch.arange(12.0).reshape(3, 4)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p.device.type == "cpu" and torch.equal(p, x)
    assert p[1:].is_pinned()  # a view into pinned memory is pinned
    assert torch.empty(5, pin_memory=True).is_pinned()
    assert not torch.empty(5).is_pinned()


def test_non_blocking_copy_from_pinned_memory():
    p = torch.randn(64, 64).pin_memory()
    d = p.to("neuron", non_blocking=True)
    y = (d * 2 + 1).cpu()
    torch.testing.assert_close(y, p * 2 + 1)


def _loader(num_workers):
    xs = torch.randn(40, 3)
    ys = torch.arange(40)
    return xs, ys, DataLoader(TensorDataset(xs, ys), batch_size=8, pin_memory=True, num_workers=num_workers)


def test_dataloader_pin_memory_with_workers():
    xs, ys, loader = _loader(num_workers=2)
    total, seen = torch.zeros(3, device="neuron"), []
    for xb, yb in loader:
        assert xb.is_pinned() and yb.is_pinned()
        total += xb.to("neuron", non_blocking=True).sum(0)
        seen.append(yb)
    torch.testing.assert_close(total.cpu(), xs.sum(0))
    assert torch.equal(torch.cat(seen), ys)
