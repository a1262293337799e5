"""The experimental tier's model: core's layers for a prompt (the guide's "CTE prefill": attention over all the
prompt's positions in one kernel a layer), the mega-kernel (self_attention.py) for every generated token, and
`next_token`, the generator's step off CUDA: token ids in, the drawn token out, one kernel a decode step."""

import torch

import nki_ops
from nativelab.kernels.nki import DecodeStack

from llama_nki_core.llama_nki import Llama as CoreLlama

from . import self_attention
from .transformer_block import TransformerBlock


class Llama(CoreLlama):
    Block = TransformerBlock

    def setup_cache(self, batch_size: int = 1) -> None:
        """The static KV cache, and the weights in the mega-kernel's layouts (prepared once, here, after the
        weights are loaded and cast: call it again after changing them)."""
        super().setup_cache(batch_size)
        self.decode_stack = DecodeStack.prepare(self.decode_weights(), self.rope_cos, self.rope_sin, self.cfg.n_heads)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > 1:  # a prompt's logits: layer by layer, as core
            return super().forward(tokens, input_pos)
        if self.layers[0].self_attn.k_cache is None:
            raise RuntimeError("call setup_cache() before running the model")
        return self_attention.decode_logits(self, tokens, input_pos)

    def next_token(self, tokens: torch.Tensor, input_pos: torch.Tensor, seed_state: torch.Tensor,
                   temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
        if self.layers[0].self_attn.k_cache is None:
            raise RuntimeError("call setup_cache() before running the model")
        if tokens.shape[1] > 1 and nki_ops.KERNELS == "nki":  # a prompt: CTE prefill, then the step's draw
            return nki_ops.draw(super().forward(tokens, input_pos)[:, -1], seed_state, temperature, top_k, top_p)
        # a decode step; with --kernels cpu a prompt too (the C++ step takes its tokens in one call)
        return self_attention.next_token(self, tokens, input_pos, seed_state, temperature, top_k, top_p)
