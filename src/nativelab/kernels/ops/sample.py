"""Sampling on the device: temperature, top-k and top-p without `sort`, `multinomial` or a host sync.

Top-k keeps the probabilities at or above the k-th largest (`topk`, which the device implements); top-p keeps
those at or above a threshold found by bisection on the kept mass (as FlashInfer does, no sort); the token is
drawn with an exponential race, argmax(p / E) with E ~ Exp(1), which picks each kept token with probability
proportional to p. The noise comes from a counter-based hash of (seed, counter, token id), and the counter
lives in a device tensor that the kernel advances, so a seeded run is reproducible and never waits on the host.
"""

from __future__ import annotations

import torch

from ..interface import kernel_op, wrap_kernel
from ._checks import check_float, check_rank

_BISECT_STEPS = 32
_MASK32 = 0xFFFFFFFF


def reference_sample_mask(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The tokens a sort-based top-k / top-p sampler may return (boolean, like logits)."""
    probs = torch.softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    allowed = torch.ones_like(probs, dtype=torch.bool)
    if top_k > 0:
        kth = torch.topk(probs, min(top_k, probs.shape[-1]), dim=-1).values[..., -1:]
        allowed &= probs >= kth
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly before each token
        keep_sorted = before < top_p
        keep = torch.zeros_like(allowed).scatter(-1, order, keep_sorted)
        allowed &= keep | (probs >= sorted_p.gather(-1, keep_sorted.sum(-1, keepdim=True) - 1))
    return allowed


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash in int64 arithmetic that never overflows (products stay below 2**59)."""
    x = (x ^ (x >> 16)) & _MASK32
    x = (x * 0x45D9F3B) & _MASK32
    x = (x ^ (x >> 16)) & _MASK32
    x = (x * 0x45D9F3B) & _MASK32
    return (x ^ (x >> 16)) & _MASK32


def _uniform(seed_state: torch.Tensor, shape) -> torch.Tensor:
    """Uniform (0, 1) noise from (seed, counter, position): the same inputs give the same noise."""
    ids = torch.arange(shape[0] * shape[1], dtype=torch.int64, device=seed_state.device).view(shape)
    seed, counter = seed_state[0] & _MASK32, seed_state[1] & _MASK32
    h = _hash32(_hash32(ids ^ seed) ^ ((counter * 0x9E37) & _MASK32))
    return (h.double() + 0.5) / 4294967296.0


def _sample(logits, seed_state, temperature, top_k, top_p):
    if temperature <= 0.0:
        return logits.argmax(-1)
    return _race(logits, -torch.log(_uniform(seed_state, logits.shape)).float(), temperature, top_k, top_p)


def _race(logits, exp_noise, temperature, top_k, top_p):
    """The token of each row drawn by the race argmax(p / E) over the kept tokens, given the noise E."""
    # Logits far below the maximum would give denormal probabilities, and every bisection pass over denormals
    # runs many times slower on x86; exp(-70) is still a normal float after dividing by the sum, and a token
    # that far below the maximum (p < 1e-30) can never enter the nucleus.
    z = logits.float() / temperature
    probs = torch.softmax(torch.maximum(z, z.amax(-1, keepdim=True) - 70.0), dim=-1)
    threshold = torch.zeros(probs.shape[0], 1, dtype=probs.dtype, device=probs.device)
    if top_k > 0 and top_k < probs.shape[-1]:
        threshold = torch.topk(probs, top_k, dim=-1).values[..., -1:]
    if top_p < 1.0:
        lo = torch.zeros_like(threshold)
        hi = probs.max(-1, keepdim=True).values
        for _ in range(_BISECT_STEPS):  # largest t with mass(p >= t) >= top_p
            mid = (lo + hi) / 2
            enough = (probs * (probs >= mid)).sum(-1, keepdim=True) >= top_p
            lo = torch.where(enough, mid, lo)
            hi = torch.where(enough, hi, mid)
        threshold = torch.maximum(threshold, lo)
    race = torch.where(probs >= threshold, probs / exp_noise, torch.zeros_like(probs))
    return race.argmax(-1)


@wrap_kernel(targets={"host": "nativelab.kernels.cpu.decode:race"})
def race_kernel(logits, exp_noise, temperature, top_k, top_p, out):
    """out (rows, 1) int32: the token `sample` draws from logits given its noise exp_noise = -log(u) (what the NKI
    top-p kernel computes; nki/host.py lowers it here); on the host, the C++ sampler's race (cpu/csrc/sample.h)."""
    out.copy_(_race(logits, exp_noise, temperature, top_k, top_p).view(out.shape))


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.sample:sample"})
def sample_kernel(logits, seed_state, temperature, top_k, top_p, out):
    out.copy_(_sample(logits, seed_state, temperature, top_k, top_p))
    seed_state[1:].add_(1)  # the next draw uses fresh noise


@kernel_op("nativelab::sample", mutates_args=("seed_state",))
def sample(logits: torch.Tensor, seed_state: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0) -> torch.Tensor:
    """Draw one token per row of `logits` (B, V). `seed_state` is an int64 tensor [seed, counter] on the
    same device, advanced in place by every call (make it with `seed_state(seed, device)`)."""
    check_rank("logits", logits, 2)
    check_float("logits", logits)
    check_sampling(seed_state, logits.device, top_k, top_p)
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    sample_kernel(logits, seed_state, float(temperature), int(top_k), float(top_p), out)
    return out


def check_sampling(seed_state: torch.Tensor, device: torch.device, top_k: int, top_p: float) -> None:
    """A ValueError naming the problem unless the sampler's state and settings are usable on `device`."""
    if seed_state.dtype != torch.int64 or seed_state.shape != (2,):
        raise ValueError(f"seed_state: expected an int64 tensor of shape (2,), got {seed_state.dtype} "
                         f"{tuple(seed_state.shape)}")
    if seed_state.device != device:
        raise ValueError(f"seed_state: on {seed_state.device}, expected {device}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p: expected 0 < top_p <= 1, got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k: expected >= 0 (0 = off), got {top_k}")


def seed_state(seed: int, device) -> torch.Tensor:
    """The sampler's [seed, counter] state."""
    return torch.tensor([seed, 0], dtype=torch.int64).to(device)
