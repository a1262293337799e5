"""int32 class labels for `cross_entropy` on the device (the guide's Lab 1 Step 2).

The real device has no int64, so labels are int32. CPU PyTorch rejects them in `cross_entropy_loss`'s
composite kernel before any device op runs, so for device tensors we widen the labels first and then run
the same composite kernel (its sub-ops, `nll_loss` included, still reach the device).
"""

from __future__ import annotations

import torch

_op = torch.ops.aten.cross_entropy_loss.default


def _cross_entropy_loss(input, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    if target.dtype in (torch.int32, torch.int16, torch.int8):
        target = target.to(torch.int64)
    return _op.decompose(input, target, weight, reduction, ignore_index, label_smoothing)


def install(lib: torch.library.Library) -> None:
    lib.impl("aten::cross_entropy_loss", _cross_entropy_loss, "AutogradPrivateUse1")
