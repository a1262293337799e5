"""Llama, the whole model in one file: RMSNorm, RoPE, grouped-query attention over a static KV cache,
SwiGLU MLP, tied embeddings. Weight names follow Hugging Face's Llama, so real checkpoints load as they are.

Static shapes throughout: the KV cache is allocated once at `max_seq_len`; a step takes the tokens and their
positions and attends over the whole cache with a causal mask, so every decode step has the same shapes.

Three tiers run the same weights (Lab 2), chosen with `model.tier`:
- `base`: plain PyTorch, as written below;
- `core`: QKV + RoPE, attention and the MLP through the kernel library (`nativelab.kernels.ops`), in
  `Block.forward_kernels`;
- `experimental`: like core for the prompt, then one `transformer_tkg` call per generated token; generating,
  one `transformer_tkg_token` call for the prompt and one per token after it (`next_token`: the token ids in,
  the drawn token out; on CUDA the prompt still runs through core's kernels).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...kernels import ops as K

TIERS = ("base", "core", "experimental")


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    dim: int = 512
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 8
    intermediate_size: int = 2048
    max_seq_len: int = 512
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


SIZES = {
    "tiny": LlamaConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=160,
                        max_seq_len=64),
    "small": LlamaConfig(),  # the guide's: 41,556,480 parameters
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position and frequency, shaped (max_seq_len, head_dim)."""
    inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) by the (T, D) tables, pairing the first and second half of D (HF convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.register_buffer("k_cache", None, persistent=False)  # allocated by Llama.setup_cache
        self.register_buffer("v_cache", None, persistent=False)

    def forward(self, x, input_pos, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.k_cache.index_copy_(2, input_pos, k)  # the static cache, written in place
        self.v_cache.index_copy_(2, input_pos, v)
        keys, values = self.k_cache, self.v_cache
        if self.n_kv_heads != self.n_heads:
            rep = self.n_heads // self.n_kv_heads
            keys, values = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
        scores = (q @ keys.transpose(-1, -2)) * self.head_dim**-0.5
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).type_as(q) @ values
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, input_pos, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), input_pos, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_kernels(self, x, input_pos, cos, sin, prefill: bool):
        """The same layer through the kernel library: fused norm+QKV+RoPE, attention, fused norm+MLP+residual."""
        a, m = self.self_attn, self.mlp
        b, t, _ = x.shape
        q, k, v = K.qkv(x, self.input_layernorm.weight, a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, cos, sin,
                        a.n_heads, a.n_kv_heads, self.eps)
        if prefill:  # context encoding: causal attention over the prompt, then the cache write
            out = K.attention_cte(q, k, v)
            a.k_cache.index_copy_(2, input_pos, k)
            a.v_cache.index_copy_(2, input_pos, v)
        else:  # token generation: write the cache and attend over it in one kernel
            out = K.attention_tkg(q, k, v, a.k_cache, a.v_cache, input_pos)
        x = x + a.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        return K.mlp(x, m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight, self.post_attention_layernorm.weight,
                     self.eps, True)


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig, tier: str = "base"):
        super().__init__()
        self.cfg = cfg
        self.tier = tier
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        causal = torch.tril(torch.ones(cfg.max_seq_len, cfg.max_seq_len, dtype=torch.bool))
        self.register_buffer("causal_mask", causal, persistent=False)

    @property
    def tier(self) -> str:
        return self._tier

    @tier.setter
    def tier(self, tier: str) -> None:
        if tier not in TIERS:
            raise ValueError(f"unknown model tier {tier!r}; choose from {', '.join(TIERS)}")
        self._tier = tier

    @classmethod
    def from_size(cls, size: str, tier: str = "base", **overrides) -> "Llama":
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
        return cls(replace(SIZES[size], **overrides), tier)

    @classmethod
    def random(cls, size: str, tier: str = "base", seed: int = 0) -> "Llama":
        """Random weights from a fixed seed, scaled so that even a tiny model produces varied tokens."""
        model = cls.from_size(size, tier)
        gen = torch.Generator().manual_seed(seed)
        std = 2.4 * model.cfg.dim**-0.5
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 1.0 if name == "embed_tokens.weight" else std, generator=gen)
        return model

    def copy_as(self, tier: str, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "Llama":
        """A new model of `tier` on a copy of these weights (Lab 2's tiers share one set of weights), cast to
        `dtype` and moved to `device`, in eval mode with its KV cache allocated: ready to generate."""
        model = Llama(self.cfg, tier)
        model.load_state_dict(self.state_dict())
        if dtype is not None:
            model = model.to(dtype)
        model = model.eval()
        if device is not None:
            model = model.to(device)
        model.setup_cache()
        return model

    def setup_cache(self, batch_size: int = 1) -> None:
        """Allocate the static KV cache (on the model's device, in its dtype), zeroed."""
        p = self.embed_tokens.weight
        shape = (batch_size, self.cfg.n_kv_heads, self.cfg.max_seq_len, self.cfg.head_dim)
        for layer in self.layers:
            layer.self_attn.k_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
            layer.self_attn.v_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) at positions input_pos (T,) -> logits (B, T, vocab). A call with T > 1 is a prefill
        that starts the sequence at input_pos[0]; T == 1 is a decode step."""
        if self.layers[0].self_attn.k_cache is None:
            raise RuntimeError("call setup_cache() before running the model")
        prefill = tokens.shape[1] > 1
        dtype = self.embed_tokens.weight.dtype
        cos, sin = self.rope_cos[input_pos].to(dtype), self.rope_sin[input_pos].to(dtype)
        x = self.embed_tokens(tokens)
        if self.tier == "experimental" and not prefill:
            return K.transformer_tkg(x, input_pos, cos, sin, *self._layer_weights(), self.norm.weight,
                                     self.lm_head.weight, self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.norm_eps)
        if self.tier == "base":
            mask = self.causal_mask[input_pos].view(1, 1, tokens.shape[1], -1)
            for layer in self.layers:
                x = layer(x, input_pos, cos, sin, mask)
        else:
            for layer in self.layers:
                x = layer.forward_kernels(x, input_pos, cos, sin, prefill)
        return self.lm_head(self.norm(x))

    def next_token(self, tokens: torch.Tensor, input_pos: torch.Tensor, seed_state: torch.Tensor,
                   temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
        """The experimental tier's step: tokens (B, T) at consecutive positions input_pos (T,) -> the next token
        (B,), drawn as `kernels.ops.sample` draws (argmax for temperature 0), as one kernel from the token ids
        to the draw: a decode step (T == 1) or a whole prompt's prefill (T > 1)."""
        if self.layers[0].self_attn.k_cache is None:
            raise RuntimeError("call setup_cache() before running the model")
        c = self.cfg
        return K.transformer_tkg_token(tokens, input_pos, seed_state, self.embed_tokens.weight, self.rope_cos,
                                       self.rope_sin, *self._layer_weights(), self.norm.weight, self.lm_head.weight,
                                       c.n_heads, c.n_kv_heads, c.norm_eps, temperature, top_k, top_p)

    def _layer_weights(self) -> list[list[torch.Tensor]]:
        """Per-layer weight lists in transformer_tkg's order (and the caches it writes)."""
        L = self.layers
        return [
            [x.input_layernorm.weight for x in L], [x.self_attn.q_proj.weight for x in L],
            [x.self_attn.k_proj.weight for x in L], [x.self_attn.v_proj.weight for x in L],
            [x.self_attn.o_proj.weight for x in L], [x.post_attention_layernorm.weight for x in L],
            [x.mlp.gate_proj.weight for x in L], [x.mlp.up_proj.weight for x in L],
            [x.mlp.down_proj.weight for x in L], [x.self_attn.k_cache for x in L], [x.self_attn.v_cache for x in L],
        ]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
