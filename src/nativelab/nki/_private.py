"""The private PyTorch API the NKI layer needs (canary: tests/test_private_apis.py)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor


def is_fake(t: torch.Tensor) -> bool:
    """A fake tensor (torch.compile's tracing, a custom op's fake implementation): metadata, no data."""
    return isinstance(t, FakeTensor)
