"""RMSNorm + Q/K/V projections + RoPE for CUDA: the norm and RoPE in Triton, the projections on cuBLAS.

RoPE reads the projections through their (B, H, T, D) view and writes q / k straight into the outputs (or,
for decode, k and v straight into their KV cache rows: `qkv_to_cache`), so no transpose copy is made."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .rmsnorm import rmsnorm_into
from .rope import rope_into


def _project(x, norm_w, wq, wk, wv, n_heads, n_kv_heads, eps):
    b, t, _ = x.shape
    d = wq.shape[0] // n_heads
    h = rmsnorm_into(x, norm_w, eps, torch.empty(x.shape, dtype=x.dtype, device=x.device))
    q = F.linear(h, wq).view(b, t, n_heads, d).transpose(1, 2)
    k = F.linear(h, wk).view(b, t, n_kv_heads, d).transpose(1, 2)
    v = F.linear(h, wv).view(b, t, n_kv_heads, d).transpose(1, 2)
    return q, k, v


def qkv(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, q_out, k_out, v_out):
    """The cuda target of kernels.ops.qkv."""
    q, k, v = _project(x, norm_w, wq, wk, wv, n_heads, n_kv_heads, eps)
    rope_into(q, cos, sin, q_out)
    rope_into(k, cos, sin, k_out)
    v_out.copy_(v)


def qkv_to_cache(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, k_cache, v_cache, pos):
    """Decode: q (B, H, T, D) returned; rotated k and v written into the caches at rows `pos`."""
    q, k, v = _project(x, norm_w, wq, wk, wv, n_heads, n_kv_heads, eps)
    q_out = rope_into(q, cos, sin, torch.empty(q.shape, dtype=q.dtype, device=q.device))
    rope_into(k, cos, sin, k_cache, pos)
    rope_into(v, None, None, v_cache, pos)
    return q_out
