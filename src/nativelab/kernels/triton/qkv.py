"""RMSNorm + Q/K/V projections + RoPE for CUDA. A few rows (decode): one fused kernel (fused_gemv.py). More
rows (prefill): the norm and RoPE in Triton, the projections on cuBLAS, RoPE reading the projections through
their (B, H, T, D) view and writing q / k straight into the outputs, so no transpose copy is made."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .fused_gemv import MAX_ROWS, fusable, fused_qkv
from .rmsnorm import rmsnorm_into
from .rope import rope_into


def qkv(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, q_out, k_out, v_out):
    """The cuda target of kernels.ops.qkv."""
    b, t, _ = x.shape
    if b * t <= MAX_ROWS and fusable(wq, n_heads, wk, wv):
        fused_qkv(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, q_out, k_out, v_out)
        return
    d = wq.shape[0] // n_heads
    h = rmsnorm_into(x, norm_w, eps, torch.empty(x.shape, dtype=x.dtype, device=x.device))
    rope_into(F.linear(h, wq).view(b, t, n_heads, d).transpose(1, 2), cos, sin, q_out)
    rope_into(F.linear(h, wk).view(b, t, n_kv_heads, d).transpose(1, 2), cos, sin, k_out)
    v_out.copy_(F.linear(h, wv).view(b, t, n_kv_heads, d).transpose(1, 2))
