"""`transformer_tkg` for CUDA: a whole decode step through every layer in five launches per layer, with no
host sync anywhere, so the step can be captured as one CUDA graph (models/llama/generate.py does).

Per layer: (1) RMSNorm + Q/K/V projection + RoPE + the K/V cache write, one program per head; (2) attention
over the filled cache rows; (3) output projection + residual (cuBLAS `addmm`); (4) RMSNorm + gate and up
projections + SiLU * up, one program per block of the intermediate size; (5) down projection + residual
(`addmm`). Then the final norm and the LM head. The projections in (1) and (4) are matrix-vector products
(decode reads every weight once, so they are bandwidth-bound): the norm is recomputed by each program from
the row it already loads, instead of a separate kernel writing and reading it back."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import block
from .attention_tkg import attend_cache
from .rmsnorm import rmsnorm_into

_BLOCK_K = 128
_BLOCK_N = 32
_MAX_CONCAT = 64  # concatenated Q/K/V weights kept (one per layer and weight version)
_concat: dict = {}


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
                        svb, svh, svs, HALF: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (head, row): one head's two half-rows of [Wq; Wk; Wv] times the normed row, RoPE for q and k,
    stored into q (B, H, T, D) or the caches at row pos[t]."""
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
    if head < H:
        out = Q + b * sqb + head * sqh + t * sqt
    elif head < H + HKV:
        out = Kc + b * skb + (head - H) * skh + tl.load(Pos + t) * sks
    else:
        out = Vc + b * svb + (head - H - HKV) * svh + tl.load(Pos + t) * svs
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
    """[Wq; Wk; Wv], concatenated once per weight version (the fused kernel walks one matrix)."""
    key = tuple((w.data_ptr(), 0 if w.is_inference() else w._version, tuple(w.shape)) for w in (wq, wk, wv))
    w = _concat.get(key)
    if w is None:
        if len(_concat) >= _MAX_CONCAT:
            del _concat[next(iter(_concat))]
        w = _concat[key] = torch.cat([wq, wk, wv]).contiguous()
    return w


def fused_qkv_to_cache(h, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, k_cache, v_cache, pos, q_out):
    """h (B, T, dim) contiguous; q_out (B, H, T, D); k / v rows written into the caches at `pos`."""
    b, t, dim = h.shape
    d = wq.shape[0] // n_heads
    cos, sin = (c if c.is_contiguous() else c.contiguous() for c in (cos, sin))
    norm_qkv_rope_cache[(n_heads + 2 * n_kv_heads, b * t)](
        h, norm_w, _qkv_weight(wq, wk, wv), cos, sin, pos, q_out, k_cache, v_cache, eps, dim, n_heads, n_kv_heads,
        t, q_out.stride(0), q_out.stride(1), q_out.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), HALF=d // 2,
        BLOCK_K=min(_BLOCK_K, block(dim)), num_warps=4)
    return q_out


def fused_norm_swiglu(h, norm_w, gate_w, up_w, eps):
    """h (rows, dim) contiguous -> silu(gate(rmsnorm(h))) * up(rmsnorm(h)), (rows, intermediate)."""
    rows, dim = h.shape
    inter = gate_w.shape[0]
    act = torch.empty(rows, inter, dtype=h.dtype, device=h.device)
    norm_gate_up_silu[(triton.cdiv(inter, _BLOCK_N), rows)](h, norm_w, gate_w, up_w, act, eps, dim, inter,
                                                           BLOCK_N=_BLOCK_N, BLOCK_K=min(_BLOCK_K, block(dim)),
                                                           num_warps=4)
    return act


def transformer_tkg(x, pos, cos, sin, input_norms, wqs, wks, wvs, wos, post_norms, gates, ups, downs, k_caches,
                    v_caches, final_norm, lm_head, n_heads, n_kv_heads, eps, out):
    """The cuda target of kernels.ops.transformer_tkg."""
    b, t, dim = x.shape
    d = wqs[0].shape[0] // n_heads
    if d % 2 or d & (d - 1):
        raise ValueError(f"transformer_tkg (Triton): head_dim must be a power of two, got {d}")
    for w in [*wqs, *wks, *wvs, *gates, *ups]:
        if not w.is_contiguous():
            raise ValueError("transformer_tkg (Triton): projection weights must be contiguous [out, in]")
    h = x.reshape(b * t, dim).contiguous()
    for i in range(len(wqs)):
        q = torch.empty(b, n_heads, t, d, dtype=x.dtype, device=x.device)
        fused_qkv_to_cache(h.view(b, t, dim), input_norms[i], wqs[i], wks[i], wvs[i], cos, sin, n_heads,
                           n_kv_heads, eps, k_caches[i], v_caches[i], pos, q)
        att = torch.empty(b, t, n_heads, d, dtype=x.dtype, device=x.device)  # written through its (B, H, T, D) view
        attend_cache(q, k_caches[i], v_caches[i], pos, att.transpose(1, 2))
        h = torch.addmm(h, att.view(b * t, n_heads * d), wos[i].t())
        h = torch.addmm(h, fused_norm_swiglu(h, post_norms[i], gates[i], ups[i], eps), downs[i].t())
    normed = rmsnorm_into(h, final_norm, eps, torch.empty_like(h))
    torch.mm(normed, lm_head.t(), out=out.view(b * t, -1))
