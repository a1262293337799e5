"""Generation with the static KV cache (gpt-fast style): prefill the prompt, then one token per decode step.

The decode step (model + sampling) is the unit `torch.compile` captures: fixed shapes (one token, one position),
so it compiles once and never again during generation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...kernels import ops as K
from ...kernels.ops.sample import seed_state
from .model import Llama


@dataclass(frozen=True)
class Sampling:
    greedy: bool = True
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 0.9
    seed: int = 0


def sample_torch(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """What a PyTorch user writes (the base tier): argmax, or sort + cumsum + multinomial for top-p.
    On the device, argmax, sort and multinomial are CPU fallbacks (the guide's Step 6)."""
    if s.greedy:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / s.temperature, dim=-1)
    if s.top_k > 0:
        kth = torch.topk(probs, s.top_k, dim=-1).values[..., -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    sorted_p = sorted_p.masked_fill(torch.cumsum(sorted_p, dim=-1) - sorted_p > s.top_p, 0.0)
    choice = torch.multinomial(sorted_p / sorted_p.sum(-1, keepdim=True), 1)
    return order.gather(-1, choice).squeeze(-1)


class Generator:
    """Prefill + decode for one model; `decode_step` is what `compile()` replaces with a compiled graph."""

    def __init__(self, model: Llama, sampling: Sampling):
        self.model = model
        self.sampling = sampling
        device = model.embed_tokens.weight.device
        self.device = device
        self.seed_state = seed_state(sampling.seed, device)
        self.decode_step = self._decode_step
        self.prefill_step = self._prefill_step

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        s = self.sampling
        if self.model.tier == "base":
            return sample_torch(logits, s)
        return K.sample(logits.float(), self.seed_state, 0.0 if s.greedy else s.temperature, s.top_k, s.top_p)

    def _prefill_step(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self._sample(self.model(tokens, input_pos)[:, -1])

    def _decode_step(self, token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self._sample(self.model(token.view(1, 1), input_pos)[:, -1])

    def compile(self, backend: str = "neuron") -> "Generator":
        self.decode_step = torch.compile(self._decode_step, backend=backend, fullgraph=False)
        self.prefill_step = torch.compile(self._prefill_step, backend=backend, fullgraph=False)
        return self

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        cfg = self.model.cfg
        if not prompt:
            raise ValueError("prompt: at least one token is needed")
        if len(prompt) + max_new_tokens > cfg.max_seq_len:
            raise ValueError(f"prompt of {len(prompt)} tokens + {max_new_tokens} new tokens exceeds the model's "
                             f"maximum sequence length {cfg.max_seq_len}")
        if any(t < 0 or t >= cfg.vocab_size for t in prompt):
            raise ValueError(f"prompt: token ids must be in [0, {cfg.vocab_size})")
        self.seed_state.copy_(seed_state(self.sampling.seed, self.device))
        tokens = torch.tensor([prompt], dtype=torch.int32).to(self.device)
        positions = torch.arange(cfg.max_seq_len, dtype=torch.int64).to(self.device)
        nxt = self.prefill_step(tokens, positions[: len(prompt)])
        out = [nxt]
        for i in range(max_new_tokens - 1):
            pos = positions[len(prompt) + i: len(prompt) + i + 1]
            nxt = self.decode_step(nxt, pos)
            out.append(nxt)
        return torch.cat(out).cpu().tolist()  # one host read at the end: no sync per token
