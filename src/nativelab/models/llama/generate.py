"""Generation with the static KV cache (gpt-fast style): prefill the prompt, then one token per decode step.

The decode step (model + sampling) is the unit `torch.compile` captures: fixed shapes (one token, one position),
so it compiles once and never again during generation. On CUDA the experimental tier goes further: its whole
decode step (every layer, final norm, LM head, sampling, the cache position update) is captured once as a CUDA
graph over static buffers, so each generated token is one graph replay with no host sync in between.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ...device.config import DEVICE_NAME
from ...kernels import ops as K
from ...kernels.ops.sample import seed_state
from .model import Llama, LlamaConfig


@dataclass(frozen=True)
class Sampling:
    greedy: bool = True
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 0.9
    seed: int = 0


def check_fits(cfg: LlamaConfig, prompt_len: int, max_new_tokens: int, of: str | None = None) -> None:
    """A ValueError unless a prompt and the tokens generated after it fit in the static KV cache; `of` names
    whose limit it is in the message (a size, say; default: the model's)."""
    if prompt_len + max_new_tokens > cfg.max_seq_len:
        limit = (f"the maximum sequence length {cfg.max_seq_len} of {of}" if of
                 else f"the model's maximum sequence length {cfg.max_seq_len}")
        raise ValueError(f"prompt of {prompt_len} tokens + {max_new_tokens} new tokens exceeds {limit}")


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
    """Prefill + decode for one model; `decode_step` is what `compile()` replaces with a compiled graph.

    `cuda_graph` (default: the experimental tier on CUDA) replays the decode step as a captured CUDA graph."""

    def __init__(self, model: Llama, sampling: Sampling, cuda_graph: bool | None = None):
        self.model = model
        self.sampling = sampling
        device = model.embed_tokens.weight.device
        self.device = device
        self.seed_state = seed_state(sampling.seed, device)
        self.decode_step = self._decode_step
        self.prefill_step = self._prefill_step
        if cuda_graph is None:
            cuda_graph = model.tier == "experimental" and device.type == "cuda"
        if cuda_graph and device.type != "cuda":
            raise ValueError(f"cuda_graph: the model is on {device}, CUDA graphs need a CUDA device")
        self.cuda_graph = cuda_graph
        self._graph = None
        # The experimental tier off CUDA goes from the token ids to the draw in the model (model.next_token: a
        # decode step is one kernel, a prompt core's layers then the draw); on CUDA its step is captured as a
        # CUDA graph of the layer kernel and the sampler instead, and its prompt runs through core's kernels.
        self.one_kernel = model.tier == "experimental" and device.type != "cuda"

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        s = self.sampling
        if self.model.tier == "base":
            return sample_torch(logits, s)
        return K.sample(logits.float(), self.seed_state, 0.0 if s.greedy else s.temperature, s.top_k, s.top_p)

    def _prefill_step(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        if self.one_kernel:  # the prompt to the first token, drawn as the decode steps draw
            s = self.sampling
            return self.model.next_token(tokens, input_pos, self.seed_state, 0.0 if s.greedy else s.temperature,
                                         s.top_k, s.top_p)
        return self._sample(self.model(tokens, input_pos)[:, -1])

    def _decode_step(self, token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        if self.one_kernel:
            s = self.sampling
            return self.model.next_token(token.view(1, 1), input_pos, self.seed_state,
                                         0.0 if s.greedy else s.temperature, s.top_k, s.top_p)
        return self._sample(self.model(token.view(1, 1), input_pos)[:, -1])

    def compile(self, backend: str | None = None) -> "Generator":
        """torch.compile the steps: backend "neuron" on the emulated device; on CUDA, Inductor (its default
        mode, no CUDA graphs of its own) for the decode step only: the prefill runs once per generation and
        Inductor's compile time is better not spent on it. A decode step replayed as a CUDA graph is not
        compiled: it is already one launch per token."""
        cuda = self.device.type == "cuda"
        if backend is None:
            backend = "inductor" if cuda else DEVICE_NAME
        if not self.cuda_graph:
            self.decode_step = torch.compile(self._decode_step, backend=backend, fullgraph=False)
        if not cuda:
            self.prefill_step = torch.compile(self._prefill_step, backend=backend, fullgraph=False)
        return self

    def _static_step(self):
        """One decode step over static buffers: it reads the token and position, writes the next token into
        `_history[pos]`, then feeds it back and advances the position, all on the device (what is captured)."""
        dev, n = self.device, self.model.cfg.max_seq_len
        self._token = torch.zeros(1, dtype=torch.int64, device=dev)
        self._pos = torch.zeros(1, dtype=torch.int64, device=dev)
        self._history = torch.zeros(n, dtype=torch.int64, device=dev)

        def step():
            nxt = self._decode_step(self._token, self._pos)
            self._history.index_copy_(0, self._pos, nxt)
            self._token.copy_(nxt)
            self._pos.add_(1)

        return step

    def _capture(self) -> None:
        step, dev = self._static_step(), self.device
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm up outside the capture: Triton compiles, cuBLAS picks its kernels
            for _ in range(2):
                step()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        self._graph = graph

    def _decode_replayed(self, first: torch.Tensor, start: int, n: int) -> torch.Tensor:
        self._token.copy_(first.view(1))
        self._pos.fill_(start)
        for _ in range(n):
            self._graph.replay()
        return self._history[start:start + n]

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        cfg = self.model.cfg
        if not prompt:
            raise ValueError("prompt: at least one token is needed")
        check_fits(cfg, len(prompt), max_new_tokens)
        if any(t < 0 or t >= cfg.vocab_size for t in prompt):
            raise ValueError(f"prompt: token ids must be in [0, {cfg.vocab_size})")
        if self.cuda_graph and self._graph is None:
            self._capture()  # before the prefill: the capture's warm-up steps write cache rows and the counter
        self.seed_state.copy_(seed_state(self.sampling.seed, self.device))
        tokens = torch.tensor([prompt], dtype=torch.int32).to(self.device)
        positions = torch.arange(cfg.max_seq_len, dtype=torch.int64).to(self.device)
        nxt = self.prefill_step(tokens, positions[: len(prompt)])
        if self.cuda_graph:
            return torch.cat([nxt, self._decode_replayed(nxt, len(prompt), max_new_tokens - 1)]).cpu().tolist()
        out = [nxt]
        for i in range(max_new_tokens - 1):
            pos = positions[len(prompt) + i: len(prompt) + i + 1]
            nxt = self.decode_step(nxt, pos)
            out.append(nxt)
        return torch.cat(out).cpu().tolist()  # one host read at the end: no sync per token


@contextlib.contextmanager
def counting_tokens(callback):
    """While active, `callback(n)` gets the number of tokens each `Generator.generate` returns (for per-token
    figures in profiles and checks)."""
    original = Generator.generate

    def generate(self, *a, **k):
        out = original(self, *a, **k)
        callback(len(out))
        return out

    Generator.generate = generate
    try:
        yield
    finally:
        Generator.generate = original
