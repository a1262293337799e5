"""Attention: Q/K/V projections, RoPE, the static KV cache, attention over it, output projection."""

import torch
import torch.nn as nn

from nativelab.models.llama import LlamaConfig
from nki_ops import nki_attn


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, rope: nn.Module):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.rope = rope  # transformer_block.py's RoPE
        self.register_buffer("k_cache", None, persistent=False)  # allocated by Llama.setup_cache
        self.register_buffer("v_cache", None, persistent=False)

    def forward(self, x, input_pos, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        out = self.attend(q, k, v, input_pos, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def attend(self, q, k, v, input_pos, mask):
        """Write k, v into the static cache at input_pos and attend: a prompt causally over itself, a decode
        step over the cache's filled positions (one kernel each; the mask is not needed)."""
        return nki_attn(q, k, v, self.k_cache, self.v_cache, input_pos)
