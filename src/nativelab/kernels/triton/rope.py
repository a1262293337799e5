"""RoPE in Triton, half-split pairing (Hugging Face): one program per (batch, head, position) row.

Strided input and output, so the projections' (B, T, H, D) layout is read through its (B, H, T D) view and
the result lands in whatever layout the caller gives (also in place, or into a KV cache row chosen by `pos`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import block


@triton.jit
def rope_rows(X, C, S, Y, Pos, H, T, sxb, sxh, sxt, syb, syh, syt, sct, sst, HALF: tl.constexpr,
              BLOCK: tl.constexpr, ROTATE: tl.constexpr, AT_POS: tl.constexpr):
    pid = tl.program_id(0)
    t = pid % T
    h = (pid // T) % H
    b = pid // (T * H)
    d = tl.arange(0, BLOCK)
    m = d < HALF
    xp = X + b * sxb + h * sxh + t * sxt
    x1 = tl.load(xp + d, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(xp + HALF + d, mask=m, other=0.0).to(tl.float32)
    if ROTATE:
        c1 = tl.load(C + t * sct + d, mask=m, other=0.0).to(tl.float32)
        c2 = tl.load(C + t * sct + HALF + d, mask=m, other=0.0).to(tl.float32)
        s1 = tl.load(S + t * sst + d, mask=m, other=0.0).to(tl.float32)
        s2 = tl.load(S + t * sst + HALF + d, mask=m, other=0.0).to(tl.float32)
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    else:  # a plain (strided) copy: V into its cache rows
        y1 = x1
        y2 = x2
    row = t
    if AT_POS:
        row = tl.load(Pos + t)
    yp = Y + b * syb + h * syh + row * syt
    tl.store(yp + d, y1, mask=m)
    tl.store(yp + HALF + d, y2, mask=m)


def rope_into(x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, out: torch.Tensor,
              pos: torch.Tensor | None = None) -> torch.Tensor:
    """out = rope(x) for x / out (B, H, T, D) with unit stride on D; with `pos`, row t of x goes to row pos[t]
    of out (a KV cache); without tables (cos = sin = None) the rows are copied as they are (V)."""
    b, h, t, d = x.shape
    rotate = cos is not None
    if not rotate:
        cos = sin = x
    x, cos, sin = (a if a.stride(-1) == 1 else a.contiguous() for a in (x, cos, sin))
    if out.stride(-1) != 1:
        raise ValueError("rope: the output needs unit stride along head_dim")
    n = b * h * t
    if n:
        rope_rows[(n,)](x, cos, sin, out, pos if pos is not None else x, h, t, x.stride(0), x.stride(1),
                        x.stride(2), out.stride(0), out.stride(1), out.stride(2), cos.stride(0), sin.stride(0),
                        HALF=d // 2, BLOCK=block(d // 2, 1), ROTATE=rotate, AT_POS=pos is not None, num_warps=1)
    return out


def rope(x, cos, sin, out):
    """The cuda target of kernels.ops.rope / rope_ (out may be x itself)."""
    rope_into(x, cos, sin, out)
