"""Sampling in Triton with the CPU kernel's semantics (kernels/ops/sample.py): temperature, top-k and top-p
without a sort, and the exponential race argmax(p / E) with the same counter-based noise, so a seeded draw
picks the same token on either device. One program per row holds the whole row in registers (vocabularies
up to 2**17); top-k is a bisection on the probabilities' bit patterns (exactly the k-th largest), top-p the
CPU kernel's bisection on the kept mass. The counter is read from and advanced on the device: no host sync."""

from __future__ import annotations

import triton
import triton.language as tl

from ..ops.sample import _BISECT_STEPS

MAX_VOCAB = 2**17


@triton.jit
def hash32(x):
    """kernels/ops/sample.py's _hash32 in uint32 arithmetic (wrapping products = its masked int64 ones)."""
    c = tl.full([], 0x45D9F3B, tl.uint32)
    x = x ^ (x >> 16)
    x = x * c
    x = x ^ (x >> 16)
    x = x * c
    return x ^ (x >> 16)


@triton.jit
def sample_rows(L, Seed, Out, V, stride, temperature, top_k, top_p, BLOCK: tl.constexpr, GREEDY: tl.constexpr,
                TOP_K: tl.constexpr, TOP_P: tl.constexpr, STEPS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    live = cols < V
    x = tl.load(L + row * stride + cols, mask=live, other=float("-inf")).to(tl.float32)
    if GREEDY:
        tl.store(Out + row, tl.argmax(x, 0).to(tl.int64))
    else:
        z = tl.div_rn(x, temperature)
        e = tl.exp(z - tl.max(z, 0))
        p = tl.div_rn(e, tl.sum(e, 0))
        threshold = tl.full([], 0.0, tl.float32)
        if TOP_K:  # the largest t with count(p >= t) >= k, over the bit patterns: the k-th largest p exactly
            bits = p.to(tl.int32, bitcast=True)
            lo = tl.full([], 0, tl.int32)
            hi = tl.max(bits, 0)
            for _ in range(31):
                mid = lo + ((hi - lo + 1) >> 1)
                enough = tl.sum(((bits >= mid) & live).to(tl.int32), 0) >= top_k
                lo = tl.where(enough, mid, lo)
                hi = tl.where(enough, hi, mid - 1)
            threshold = lo.to(tl.float32, bitcast=True)
        if TOP_P:  # the largest t with mass(p >= t) >= top_p, as the CPU kernel bisects
            lo_p = tl.full([], 0.0, tl.float32)
            hi_p = tl.max(p, 0)
            for _ in range(STEPS):
                mid_p = (lo_p + hi_p) / 2
                enough_p = tl.sum(tl.where(p >= mid_p, p, 0.0), 0) >= top_p
                lo_p = tl.where(enough_p, mid_p, lo_p)
                hi_p = tl.where(enough_p, hi_p, mid_p)
            threshold = tl.maximum(threshold, lo_p)
        seed = tl.load(Seed).to(tl.uint32)
        counter = tl.load(Seed + 1).to(tl.uint32)
        ids = (row * V + cols).to(tl.uint32)
        h = hash32(hash32(ids ^ seed) ^ (counter * tl.full([], 0x9E37, tl.uint32)))
        noise = (-tl.log((h.to(tl.float64) + 0.5) / 4294967296.0)).to(tl.float32)
        race = tl.where((p >= threshold) & live, tl.div_rn(p, noise), 0.0)
        tl.store(Out + row, tl.argmax(race, 0).to(tl.int64))


def sample(logits, seed_state, temperature, top_k, top_p, out):
    """The cuda target of kernels.ops.sample."""
    b, v = logits.shape
    if v > MAX_VOCAB:
        raise ValueError(f"sample: the Triton sampler holds a row in registers, vocabularies up to {MAX_VOCAB}; "
                         f"got {v}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    blk = triton.next_power_of_2(v)
    warps = max(1, min(32, blk // 1024))  # the row in registers, ~32 values per thread
    if b:
        sample_rows[(b,)](logits, seed_state, out, v, logits.stride(0), float(temperature), int(top_k),
                          float(top_p), BLOCK=blk, GREEDY=temperature <= 0.0, TOP_K=0 < top_k < v,
                          TOP_P=top_p < 1.0, STEPS=_BISECT_STEPS, num_warps=warps)
    seed_state[1:].add_(1)  # the next draw uses fresh noise (a device op: no host sync)
