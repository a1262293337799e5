"""`transformer_tkg` for CUDA: a whole decode step through every layer with the Triton pieces (norms, RoPE
straight into the KV cache, attention over the filled cache rows, SiLU * up) and cuBLAS products, residuals
folded into `addmm`. No host sync anywhere, so the step can be captured as one CUDA graph."""

from __future__ import annotations

import torch

from .attention_tkg import attend_cache
from .mlp import mlp_into
from .qkv import qkv_to_cache
from .rmsnorm import rmsnorm_into


def transformer_tkg(x, pos, cos, sin, input_norms, wqs, wks, wvs, wos, post_norms, gates, ups, downs, k_caches,
                    v_caches, final_norm, lm_head, n_heads, n_kv_heads, eps, out):
    """The cuda target of kernels.ops.transformer_tkg."""
    b, t, dim = x.shape
    d = wqs[0].shape[0] // n_heads
    h = x.reshape(b * t, dim)
    for i in range(len(wqs)):
        q = qkv_to_cache(h.view(b, t, dim), input_norms[i], wqs[i], wks[i], wvs[i], cos, sin, n_heads,
                         n_kv_heads, eps, k_caches[i], v_caches[i], pos)
        att = torch.empty(b, t, n_heads, d, dtype=x.dtype, device=x.device)  # written through its (B, H, T, D) view
        attend_cache(q, k_caches[i], v_caches[i], pos, att.transpose(1, 2))
        h = torch.addmm(h, att.view(b * t, n_heads * d), wos[i].t())
        h = mlp_into(h, gates[i], ups[i], downs[i], post_norms[i], eps, True, torch.empty_like(h))
    normed = rmsnorm_into(h, final_norm, eps, torch.empty_like(h))
    torch.mm(normed, lm_head.t(), out=out.view(b * t, -1))
