"""The SwiGLU MLP for CUDA, the residual folded into the down projection (`addmm`). A few rows with a norm
(decode): RMSNorm + gate / up + SiLU * up in one fused kernel (fused_gemv.py); otherwise RMSNorm and
SiLU(gate) * up in Triton, the gate / up projections on cuBLAS."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._launch import rows
from .fused_gemv import MAX_ROWS, fused_norm_swiglu
from .rmsnorm import rmsnorm_into

_BLOCK = 1024


@triton.jit
def silu_mul(G, U, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(G + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=m, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32)  # F.silu rounds to the input dtype
    tl.store(Y + offs, act * u, mask=m)


def swiglu(h: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor) -> torch.Tensor:
    g, u = F.linear(h, gate_w), F.linear(h, up_w)
    out = torch.empty_like(g)
    n = g.numel()
    if n:
        silu_mul[(triton.cdiv(n, _BLOCK),)](g, u, out, n, BLOCK=_BLOCK, num_warps=4)
    return out


def mlp_into(x, gate_w, up_w, down_w, norm_w, eps, residual, out):
    x2 = rows(x)
    if norm_w is not None and x2.shape[0] <= MAX_ROWS and gate_w.is_contiguous() and up_w.is_contiguous():
        act = fused_norm_swiglu(x2, norm_w, gate_w, up_w, eps)
    else:
        h = rmsnorm_into(x2, norm_w, eps, torch.empty_like(x2)) if norm_w is not None else x2
        act = swiglu(h, gate_w, up_w)
    o2 = out.view(-1, out.shape[-1])
    if residual:
        torch.addmm(x2, act, down_w.t(), out=o2)
    else:
        torch.mm(act, down_w.t(), out=o2)
    return out


def mlp(x, gate_w, up_w, down_w, norm_w, eps, residual, out):
    """The cuda target of kernels.ops.mlp."""
    mlp_into(x, gate_w, up_w, down_w, norm_w, eps, residual, out)


def mlp_no_norm(x, gate_w, up_w, down_w, residual, out):
    """The cuda target of kernels.ops.mlp without a norm."""
    mlp_into(x, gate_w, up_w, down_w, None, 0.0, residual, out)
