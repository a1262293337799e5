"""One decoder layer: RMSNorm -> attention -> residual, RMSNorm -> SwiGLU MLP -> residual; and its RoPE."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from nativelab.models.llama import LlamaConfig, RMSNorm

from .self_attention import Attention
from nki_ops import nki_mlp, nki_rope


class RoPE(nn.Module):
    """Rotate (B, H, T, D) by the (T, D) tables, pairing the first and second half of D (HF convention)."""

    def forward(self, x, cos, sin):
        return nki_rope(x, cos, sin)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.dim, bias=False)

    def forward(self, x):
        return nki_mlp(
            x,
            self.gate_proj.weight,
            self.up_proj.weight,
            self.down_proj.weight
        )


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg, RoPE())
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, input_pos, cos, sin, mask):
        h = x + self.self_attn(self.input_layernorm(x), input_pos, cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))
