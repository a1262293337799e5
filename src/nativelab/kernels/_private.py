"""Every private PyTorch API the kernel library relies on, each behind one named function here; nothing else
in nativelab/kernels imports `torch._*`. `tests/test_private_apis.py` exercises each of them."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor  # imported once: is_fake runs on every kernel launch


def is_fake(t: torch.Tensor) -> bool:
    """A fake tensor (tracing: `torch.compile`, `make_fx`, a custom op's fake implementation), which holds
    metadata and no data."""
    return isinstance(t, FakeTensor)
