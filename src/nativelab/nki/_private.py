"""The private PyTorch API the NKI layer needs (canary: tests/test_private_apis.py)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor


def is_fake(t: torch.Tensor) -> bool:
    """A fake tensor (torch.compile's tracing, a custom op's fake implementation): metadata, no data."""
    return isinstance(t, FakeTensor)


def is_view(t: torch.Tensor) -> bool:
    """`t` is a view of another tensor's memory (writing a copy of it is then not free to skip)."""
    return t._is_view()
