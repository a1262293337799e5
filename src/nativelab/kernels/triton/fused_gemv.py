"""Fused matrix-vector kernels for decode (a few rows): RMSNorm + Q/K/V + RoPE (+ the K/V cache write) in one
kernel, one program per head; RMSNorm + gate / up + SiLU * up in another, one program per block of the
intermediate size. Decode reads every weight once per token, so these are bandwidth-bound: each program
recomputes the norm from the row it loads anyway, instead of a separate kernel writing it and reading it back.
Used by transformer_tkg, and by qkv / mlp when there are few rows (for many rows, cuBLAS wins)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._private import version
from ._launch import block

MAX_ROWS = 16  # beyond this many rows the per-row weight walk loses to a cuBLAS product
_BLOCK_K = 128
_BLOCK_N = 32


@triton.jit
def row_rms(X, DIM, eps, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of the row at X, in float32."""
    acc = tl.zeros([BLOCK_K], tl.float32)
    for k in range(0, DIM, BLOCK_K):
        cols = k + tl.arange(0, BLOCK_K)
        x = tl.load(X + cols, mask=cols < DIM, other=0.0).to(tl.float32)
        acc += x * x
    return tl.rsqrt(tl.sum(acc, 0) / DIM + eps)


@triton.jit
def normed_chunk(X, NW, k, r, DIM, BLOCK_K: tl.constexpr):
    """Columns k..k+BLOCK_K of rmsnorm(x) * weight, rounded as the reference rounds (to x's dtype twice)."""
    cols = k + tl.arange(0, BLOCK_K)
    m = cols < DIM
    x = tl.load(X + cols, mask=m, other=0.0)
    w = tl.load(NW + cols, mask=m, other=0.0)
    h = (x.to(tl.float32) * r).to(x.dtype)
    return (h.to(tl.float32) * w.to(tl.float32)).to(x.dtype).to(tl.float32), cols, m


@triton.jit
def norm_qkv_rope_cache(X, NW, W, C, S, Pos, Q, Kc, Vc, eps, DIM, H, HKV, T, sqb, sqh, sqt, skb, skh, sks,
                        svb, svh, svs, HALF: tl.constexpr, BLOCK_K: tl.constexpr, AT_POS: tl.constexpr):
    """Program (head, row): one head's two half-rows of [Wq; Wk; Wv] times the normed row, RoPE for q and k,
    stored into q (B, H, T, D) and k / v: the caches at row pos[t] (AT_POS), or (B, Hkv, T, D) outputs."""
    head = tl.program_id(0)
    row = tl.program_id(1)
    b = row // T
    t = row % T
    x_row = X + row * DIM
    r = row_rms(x_row, DIM, eps, BLOCK_K)
    d = tl.arange(0, HALF)
    w1 = W + (head * 2 * HALF + d)[:, None] * DIM
    w2 = w1 + HALF * DIM
    y1 = tl.zeros([HALF], tl.float32)
    y2 = tl.zeros([HALF], tl.float32)
    for k in range(0, DIM, BLOCK_K):
        h, cols, m = normed_chunk(x_row, NW, k, r, DIM, BLOCK_K)
        y1 += tl.sum(tl.load(w1 + cols[None, :], mask=m[None, :], other=0.0).to(tl.float32) * h[None, :], 1)
        y2 += tl.sum(tl.load(w2 + cols[None, :], mask=m[None, :], other=0.0).to(tl.float32) * h[None, :], 1)
    y1 = y1.to(Q.dtype.element_ty).to(tl.float32)  # the projection's output rounds to the model dtype
    y2 = y2.to(Q.dtype.element_ty).to(tl.float32)
    if head < H + HKV:  # q or k: rotate
        c1 = tl.load(C + t * 2 * HALF + d).to(tl.float32)
        c2 = tl.load(C + t * 2 * HALF + HALF + d).to(tl.float32)
        s1 = tl.load(S + t * 2 * HALF + d).to(tl.float32)
        s2 = tl.load(S + t * 2 * HALF + HALF + d).to(tl.float32)
        o1 = y1 * c1 - y2 * s1
        o2 = y2 * c2 + y1 * s2
    else:
        o1 = y1
        o2 = y2
    kv_row = t
    if AT_POS:
        kv_row = tl.load(Pos + t).to(tl.int32)
    if head < H:
        out = Q + b * sqb + head * sqh + t * sqt
    elif head < H + HKV:
        out = Kc + b * skb + (head - H) * skh + kv_row * sks
    else:
        out = Vc + b * svb + (head - H - HKV) * svh + kv_row * svs
    tl.store(out + d, o1)
    tl.store(out + HALF + d, o2)


@triton.jit
def norm_gate_up_silu(X, NW, G, U, A, eps, DIM, INTER, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (block, row): silu(gate . h) * (up . h) for BLOCK_N intermediate features of one row."""
    nb = tl.program_id(0)
    row = tl.program_id(1)
    x_row = X + row * DIM
    r = row_rms(x_row, DIM, eps, BLOCK_K)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < INTER
    g = tl.zeros([BLOCK_N], tl.float32)
    u = tl.zeros([BLOCK_N], tl.float32)
    for k in range(0, DIM, BLOCK_K):
        h, cols, m = normed_chunk(x_row, NW, k, r, DIM, BLOCK_K)
        wm = nm[:, None] & m[None, :]
        g += tl.sum(tl.load(G + n[:, None] * DIM + cols[None, :], mask=wm, other=0.0).to(tl.float32) * h[None, :], 1)
        u += tl.sum(tl.load(U + n[:, None] * DIM + cols[None, :], mask=wm, other=0.0).to(tl.float32) * h[None, :], 1)
    g = g.to(A.dtype.element_ty).to(tl.float32)
    u = u.to(A.dtype.element_ty).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(A.dtype.element_ty).to(tl.float32)
    tl.store(A + row * INTER + n, act * u, mask=nm)


def _qkv_weight(wq, wk, wv) -> torch.Tensor:
    """[Wq; Wk; Wv] for the fused kernel, which walks one matrix: made once and kept on wq itself (so it lives
    and dies with the weight: a key by address could outlive it and match a new weight at the same address),
    made again when wk / wv are other tensors or any of the three was written since."""
    versions = tuple(0 if w.is_inference() else version(w) for w in (wq, wk, wv))
    cached = getattr(wq, "_nativelab_qkv", None)
    if cached is None or cached[0] is not wk or cached[1] is not wv or cached[2] != versions:
        cached = (wk, wv, versions, torch.cat([wq, wk, wv]))
        wq._nativelab_qkv = cached
    return cached[3]


def fused_qkv(h, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, q_out, k_out, v_out, pos=None):
    """h (B, T, dim); q_out (B, H, T, D); k / v into k_out / v_out (B, Hkv, T, D), or, with `pos`, into the
    KV caches at rows pos[t]. Every output with unit stride along D; head_dim a power of two."""
    b, t, dim = h.shape
    d = wq.shape[0] // n_heads
    h, cos, sin = (c if c.is_contiguous() else c.contiguous() for c in (h, cos, sin))
    norm_qkv_rope_cache[(n_heads + 2 * n_kv_heads, b * t)](
        h, norm_w, _qkv_weight(wq, wk, wv), cos, sin, pos if pos is not None else h, q_out, k_out, v_out, eps, dim,
        n_heads, n_kv_heads, t, q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0),
        k_out.stride(1), k_out.stride(2), v_out.stride(0), v_out.stride(1), v_out.stride(2), HALF=d // 2,
        BLOCK_K=min(_BLOCK_K, block(dim)), AT_POS=pos is not None, num_warps=4)
    return q_out


def fusable(wq, n_heads: int, *weights) -> bool:
    """The fused matrix-vector kernels' conditions: head_dim a power of two, contiguous [out, in] weights."""
    d = wq.shape[0] // n_heads
    return d >= 2 and d & (d - 1) == 0 and all(w.is_contiguous() for w in (wq, *weights))


def fused_norm_swiglu(h, norm_w, gate_w, up_w, eps):
    """h (rows, dim) contiguous -> silu(gate(rmsnorm(h))) * up(rmsnorm(h)), (rows, intermediate)."""
    h = h if h.is_contiguous() else h.contiguous()
    rows, dim = h.shape
    inter = gate_w.shape[0]
    act = torch.empty(rows, inter, dtype=h.dtype, device=h.device)
    norm_gate_up_silu[(triton.cdiv(inter, _BLOCK_N), rows)](h, norm_w, gate_w, up_w, act, eps, dim, inter,
                                                           BLOCK_N=_BLOCK_N, BLOCK_K=min(_BLOCK_K, block(dim)),
                                                           num_warps=4)
    return act
