"""The SwiGLU MLP in one kernel: optional RMSNorm, gate/up projections, SiLU, product, down projection,
optional residual. Weights are `nn.Linear.weight` ([out, in]), passed as they are."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..interface import kernel_op, wrap_kernel
from ._checks import check_dim, check_float, check_rank, check_same
from .rmsnorm import reference_rmsnorm


def reference_mlp(x, gate_w, up_w, down_w, norm_w=None, eps: float = 1e-5, residual: bool = False):
    h = reference_rmsnorm(x, norm_w, eps) if norm_w is not None else x
    y = F.linear(F.silu(F.linear(h, gate_w)) * F.linear(h, up_w), down_w)
    return x + y if residual else y


@wrap_kernel(weights=(1, 2, 3, 4), targets={"cuda": "nativelab.kernels.triton.mlp:mlp"})
def mlp_kernel(x, gate_w, up_w, down_w, norm_w, eps, residual, out):
    out.copy_(reference_mlp(x, gate_w, up_w, down_w, norm_w, eps, residual))


@wrap_kernel(weights=(1, 2, 3), targets={"cuda": "nativelab.kernels.triton.mlp:mlp_no_norm"})
def mlp_kernel_no_norm(x, gate_w, up_w, down_w, residual, out):
    out.copy_(reference_mlp(x, gate_w, up_w, down_w, None, 0.0, residual))


@kernel_op("nativelab::mlp", mutates_args=())
def mlp(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor,
        norm_w: torch.Tensor | None = None, eps: float = 1e-5, residual: bool = False) -> torch.Tensor:
    check_float("x", x)
    dim = x.shape[-1]
    for name, w in (("gate_w", gate_w), ("up_w", up_w)):
        check_rank(name, w, 2)
        check_dim(name, w, 1, dim, "x's hidden size: weights are [out, in]")
    check_dim("up_w", up_w, 0, gate_w.shape[0], "gate_w's intermediate size")
    check_rank("down_w", down_w, 2)
    check_dim("down_w", down_w, 1, gate_w.shape[0], "the intermediate size")
    check_dim("down_w", down_w, 0, dim, "x's hidden size")
    tensors = [x, gate_w, up_w, down_w] + ([norm_w] if norm_w is not None else [])
    check_same("x and the weights", *tensors)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if norm_w is not None:
        check_dim("norm_w", norm_w, 0, dim, "x's hidden size")
        mlp_kernel(x, gate_w, up_w, down_w, norm_w, eps, residual, out)
    else:
        mlp_kernel_no_norm(x, gate_w, up_w, down_w, residual, out)
    return out
