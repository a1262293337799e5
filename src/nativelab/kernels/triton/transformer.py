"""`transformer_tkg` for CUDA: a whole decode step through every layer in five launches per layer, with no
host sync anywhere, so the step can be captured as one CUDA graph (models/llama/generate.py does).

Per layer: (1) RMSNorm + Q/K/V projection + RoPE + the K/V cache write, (2) attention over the filled cache
rows, (3) output projection + residual (cuBLAS `addmm`), (4) RMSNorm + gate and up projections + SiLU * up,
(5) down projection + residual (`addmm`); (1) and (4) are the fused matrix-vector kernels of fused_gemv.py.
Then the final norm and the LM head."""

from __future__ import annotations

import torch

from ..ops.decode_weights import DecodeWeights
from .attention_tkg import attend_cache
from .fused_gemv import fusable, fused_norm_swiglu, fused_qkv
from .rmsnorm import rmsnorm_into


def transformer_tkg(x, pos, cos, sin, weights, caches, n_heads, n_kv_heads, eps, out):
    """The cuda target of kernels.ops.transformer_tkg (`weights, caches`: DecodeWeights.flat()'s lists)."""
    w = DecodeWeights.unflatten(weights, caches)
    b, t, dim = x.shape
    d = w.wqs[0].shape[0] // n_heads
    if not fusable(w.wqs[0], n_heads, *w.wqs, *w.wks, *w.wvs, *w.gates, *w.ups):
        raise ValueError(f"transformer_tkg (Triton): needs a power-of-two head_dim (got {d}) and contiguous "
                         "[out, in] projection weights")
    h = x.reshape(b * t, dim).contiguous()
    for i in range(w.n_layers):
        q = torch.empty(b, n_heads, t, d, dtype=x.dtype, device=x.device)
        fused_qkv(h.view(b, t, dim), w.input_norms[i], w.wqs[i], w.wks[i], w.wvs[i], cos, sin, n_heads, n_kv_heads,
                  eps, q, w.k_caches[i], w.v_caches[i], pos)
        att = torch.empty(b, t, n_heads, d, dtype=x.dtype, device=x.device)  # written through its (B, H, T, D) view
        attend_cache(q, w.k_caches[i], w.v_caches[i], pos, att.transpose(1, 2))
        h = torch.addmm(h, att.view(b * t, n_heads * d), w.wos[i].t())
        h = torch.addmm(h, fused_norm_swiglu(h, w.post_norms[i], w.gates[i], w.ups[i], eps), w.downs[i].t())
    normed = rmsnorm_into(h, w.final_norm, eps, torch.empty_like(h))
    torch.mm(normed, w.lm_head.t(), out=out.view(b * t, -1))
