"""Causal prefill attention in Triton (flash attention: online softmax, the scores never leave the chip),
grouped-query aware. q (B, H, T, D), k / v (B, Hkv, T, D), any strides with unit stride along D."""

from __future__ import annotations

import triton
import triton.language as tl

from ._launch import block, dot_precision, interpreted


@triton.jit
def flash_causal(Q, K, V, O, scale, H, GROUP, T, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                 D, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kvh = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
                mask=(offs_m[:, None] < T) & dmask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = tl.minimum((start_m + 1) * BLOCK_M, T)  # causal: no key beyond the block's last query
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.load(K + b * skb + kvh * skh + cols[None, :] * skt + offs_d[:, None],
                     mask=(cols[None, :] < T) & dmask[:, None], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * scale
        s = tl.where((offs_m[:, None] >= cols[None, :]) & (cols[None, :] < T), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * svb + kvh * svh + cols[:, None] * svt + offs_d[None, :],
                    mask=(cols[:, None] < T) & dmask[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], acc,
             mask=(offs_m[:, None] < T) & dmask[None, :])


def attention_cte(q, k, v, out):
    """The cuda target of kernels.ops.attention_cte."""
    b, h, t, d = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    bm = 64 if t >= 64 else 16
    grid = (triton.cdiv(t, bm), b * h)
    if t:
        flash_causal[grid](q, k, v, out, d**-0.5, h, h // k.shape[1], t, q.stride(0), q.stride(1), q.stride(2),
                           k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
                           out.stride(0), out.stride(1), out.stride(2), d, BLOCK_M=bm, BLOCK_N=bm,
                           BLOCK_D=block(d), PRECISION=dot_precision(q.dtype), UPCAST=interpreted(), num_warps=4)
