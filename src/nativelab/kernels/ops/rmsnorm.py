"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, computed in float32."""

from __future__ import annotations

import torch

from ..interface import kernel_op, wrap_kernel
from ._checks import check_dim, check_float, check_same


def reference_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.rmsnorm:rmsnorm"})
def rmsnorm_kernel(x, weight, eps, out):
    out.copy_(reference_rmsnorm(x, weight, eps))


@kernel_op("nativelab::rmsnorm", mutates_args=())
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    check_float("x", x)
    check_dim("weight", weight, 0, x.shape[-1], "x's last dimension")
    check_same("x, weight", x, weight)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rmsnorm_kernel(x, weight, eps, out)
    return out
