"""Decode attention in Triton against the static KV cache: the new K / V rows are written into the cache at
their positions, then each query attends over the cache positions up to its own (only those are read: the
unfilled rest of the cache costs nothing). One program per (batch, head, query); the cache position comes
from a device tensor, so a CUDA graph replays it at every step."""

from __future__ import annotations

import triton
import triton.language as tl

from ._launch import block
from .rope import rope_into

_BLOCK_N = 64


@triton.jit
def decode_attention(Q, Kc, Vc, Pos, O, scale, H, GROUP, T, sqb, sqh, sqt, skb, skh, sks, svb, svh, svs,
                     sob, soh, sot, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    t = pid % T
    h = (pid // T) % H
    b = pid // (T * H)
    kvh = h // GROUP
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    q = tl.load(Q + b * sqb + h * sqh + t * sqt + offs_d, mask=dmask, other=0.0).to(tl.float32)
    last = tl.load(Pos + t).to(tl.int32)  # attends to cache positions 0..last
    m_i = tl.full([], float("-inf"), tl.float32)
    l_i = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start in range(0, last + 1, BLOCK_N):
        cols = start + offs_n
        live = cols <= last
        k = tl.load(Kc + b * skb + kvh * skh + cols[:, None] * sks + offs_d[None, :],
                    mask=live[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        s = tl.where(live, tl.sum(k * q[None, :], 1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        v = tl.load(Vc + b * svb + kvh * svh + cols[:, None] * svs + offs_d[None, :],
                    mask=live[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m_i = m_new
    tl.store(O + b * sob + h * soh + t * sot + offs_d, acc / l_i, mask=dmask)


def attend_cache(q, k_cache, v_cache, pos, out):
    """out (B, H, T, D), any strides with unit stride on D: q's attention over the filled cache rows."""
    b, h, t, d = q.shape
    if t:
        decode_attention[(b * h * t,)](q, k_cache, v_cache, pos, out, d**-0.5, h, h // k_cache.shape[1], t,
                                       q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
                                       k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                                       out.stride(0), out.stride(1), out.stride(2), d, BLOCK_N=_BLOCK_N,
                                       BLOCK_D=block(d, 1), num_warps=2)
    return out


def write_cache(k_new, v_new, k_cache, v_cache, pos):
    """Rows t of k_new / v_new (B, Hkv, T, D) into the caches at rows pos[t]."""
    rope_into(k_new, None, None, k_cache, pos)
    rope_into(v_new, None, None, v_cache, pos)


def attention_tkg(q, k_new, v_new, k_cache, v_cache, pos, out):
    """The cuda target of kernels.ops.attention_tkg."""
    for c in (k_cache, v_cache):
        if c.stride(-1) != 1:
            raise ValueError("attention_tkg: the KV caches need unit stride along head_dim")
    write_cache(k_new, v_new, k_cache, v_cache, pos)
    attend_cache(q, k_cache, v_cache, pos, out)
