"""The whole model: token embedding, the layers, final RMSNorm, LM head (tied to the embedding); the static KV
cache; the forward loop. A call with T > 1 tokens is a prefill starting at input_pos[0]; T == 1 a decode step.
Every step has the same shapes (the cache is allocated once at max_seq_len and masked), so it compiles once."""

import torch
import torch.nn as nn

import nativelab.models.llama as shared
from nativelab.models.llama import LlamaConfig, RMSNorm, rope_tables

from .transformer_block import TransformerBlock


class Llama(shared.Llama):
    Block = TransformerBlock  # the layer this folder defines

    def __init__(self, cfg: LlamaConfig):
        super().__init__(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(self.Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        causal = torch.tril(torch.ones(cfg.max_seq_len, cfg.max_seq_len, dtype=torch.bool))
        self.register_buffer("causal_mask", causal, persistent=False)

    def setup_cache(self, batch_size: int = 1) -> None:
        """Allocate the static KV cache (on the model's device, in its dtype), zeroed."""
        p = self.embed_tokens.weight
        shape = (batch_size, self.cfg.n_kv_heads, self.cfg.max_seq_len, self.cfg.head_dim)
        for layer in self.layers:
            layer.self_attn.k_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
            layer.self_attn.v_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) at positions input_pos (T,) -> logits (B, T, vocab)."""
        if self.layers[0].self_attn.k_cache is None:
            raise RuntimeError("call setup_cache() before running the model")
        dtype = self.embed_tokens.weight.dtype
        cos, sin = self.rope_cos[input_pos].to(dtype), self.rope_sin[input_pos].to(dtype)
        mask = self.causal_mask[input_pos].view(1, 1, tokens.shape[1], -1)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, input_pos, cos, sin, mask)
        return self.lm_head(self.norm(x))
