"""RoPE in NKI on x (B, H, T, D) with the (T, D) cos / sin tables, the two halves of D paired (Hugging Face's
convention): rows (b, h, t) on partitions, D along the free dimension. With a short sequence (T < 128) several
heads share a tile and one DMA repeats the tables down its partitions; a long one tiles T and loads each
table tile once for every head. The Vector Engine does the products and the sum."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki
from ..ops.rope import _check as check_rope  # the same argument checks as the PyTorch kernel's


def rotate_into(dst, x, cos, sin):
    """dst = x * cos + rotate_half(x) * sin along the last dimension (D) of [n, D] tiles (or [n, heads, D]
    views, every head at once), rotate_half(x) = [-x2, x1], rounded where the PyTorch reference rounds: each
    product to x's dtype, then their sum."""
    d = x.shape[-1]
    h = d // 2
    lo, hi = _last(0, h, x.ndim), _last(h, d, x.ndim)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=a, data1=x, data2=cos, op=nl.multiply)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=b[lo], data=x[hi], op0=nl.multiply, operand0=-1.0, op1=nl.multiply,
                              operand1=sin[lo])
    nisa.tensor_tensor(dst=b[hi], data1=x[lo], data2=sin[hi], op=nl.multiply)
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=nl.add)
    return dst


def _last(start: int, stop: int, ndim: int) -> tuple:
    """The index of columns start:stop of the last dimension, all of the others."""
    return (slice(None),) * (ndim - 1) + (slice(start, stop),)


@jit
def rope_kernel(x, cos, sin):
    b, h, t, d = x.shape
    p = nl.tile_size.pmax
    heads = b * h
    rows = x.reshape((heads * t, d))
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    out_rows = out.reshape((heads * t, d))
    if t <= p:  # g whole heads per tile: the tables repeated g times down the partitions (partition step 0)
        g = p // t
        c = nl.ndarray((g * t, d), dtype=cos.dtype, buffer=nl.sbuf)
        s = nl.ndarray((g * t, d), dtype=sin.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=c, src=cos.ap(pattern=[[0, g], [d, t], [1, d]]))
        nisa.dma_copy(dst=s, src=sin.ap(pattern=[[0, g], [d, t], [1, d]]))
        for i in nl.affine_range((heads + g - 1) // g):
            r0 = i * g * t
            n = min(heads * t, r0 + g * t) - r0
            xt = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=rows[r0:r0 + n, :])
            y = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
            rotate_into(y, xt, c[0:n, :], s[0:n, :])
            nisa.dma_copy(dst=out_rows[r0:r0 + n, :], src=y)
    else:  # 128 positions per tile, the tables' tile loaded once for every head
        for j in nl.affine_range((t + p - 1) // p):
            t0 = j * p
            n = min(t, t0 + p) - t0
            c = nl.ndarray((n, d), dtype=cos.dtype, buffer=nl.sbuf)
            s = nl.ndarray((n, d), dtype=sin.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=c, src=cos[t0:t0 + n, :])
            nisa.dma_copy(dst=s, src=sin[t0:t0 + n, :])
            for r in nl.affine_range(heads):
                r0 = r * t + t0
                xt = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=xt, src=rows[r0:r0 + n, :])
                y = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
                rotate_into(y, xt, c, s)
                nisa.dma_copy(dst=out_rows[r0:r0 + n, :], src=y)
    return out


_rope = wrap_nki(rope_kernel)


@nki_op("nativelab::nki_rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    check_rope(x, cos, sin)
    return _rope(x.contiguous(), cos.contiguous(), sin.contiguous())
