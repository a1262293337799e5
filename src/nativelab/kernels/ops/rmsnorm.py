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


# Training: the backward kernel recomputes the normalized rows (nothing but x is saved) and returns the
# gradients of x and of the weight (a sum over rows; cheap next to a matmul, so always computed).
@wrap_kernel
def rmsnorm_backward_kernel(grad, x, weight, eps, grad_x, grad_w):
    xf, gf = x.float(), grad.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    n = xf * r
    gn = gf * weight.float()
    grad_x.copy_(r * (gn - n * (gn * n).mean(-1, keepdim=True)))
    grad_w.copy_((gf * n.type_as(x).float()).reshape(-1, x.shape[-1]).sum(0))


@kernel_op("nativelab::rmsnorm_bwd", mutates_args=())
def _rmsnorm_bwd(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    grad_x = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    grad_w = torch.empty(weight.shape, dtype=torch.float32, device=x.device)
    rmsnorm_backward_kernel(grad, x, weight, eps, grad_x, grad_w)
    return grad_x, grad_w


def _setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    grad_x, grad_w = _rmsnorm_bwd(grad.contiguous(), x, weight, ctx.eps)
    return grad_x.to(x.dtype), grad_w.to(weight.dtype), None


rmsnorm.register_autograd(_backward, setup_context=_setup)
