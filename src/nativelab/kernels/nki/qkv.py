"""RMSNorm + the Q/K/V projections + RoPE in NKI, for grouped-query attention: x (B, T, dim) -> q (B, H, T, D),
k and v (B, Hkv, T, D), RoPE applied to q and k.

Tokens on partitions (128 per tile, within one sequence so a tile's positions are consecutive): the norm
along the free dimension, then h.T by Tensor Engine transposes (the hidden size onto partitions, where the
projections contract), each projection 512 output features per PSUM bank, then RoPE on each head's D columns
with the tile's rows of the tables, and each head's [tokens, D] block stored to its place in (B, H, T, D).

The projections arrive laid out for the Tensor Engine, wq [P, dim / P, H * D] and wk, wv [P, dim / P, KV * D]
@ HBM (layouts.tiled / prepared, once per weight); the op (`qkv`) takes nn.Linear.weight ([out, in])."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki
from ..ops.qkv import check_qkv_args
from .rmsnorm import load_broadcast, rmsnorm_rows
from .rope import rotate_into
from .layouts import expect_tiled, load_tiled, prepared
from .tiles import tiles, transpose_rows


def project(y, h_t, w_t, dim, p):
    """y [n, F] (SBUF, y's dtype) = h @ w.T from h.T [p, dim tiles, n] and w.T [p, dim tiles, F], 512 output
    features per PSUM bank, each rounded once from its fp32 sum."""
    n, features = y.shape
    for _, c0, nc in tiles(features, nl.tile_size.gemm_moving_fmax):
        ps = nl.ndarray((n, nc), dtype=nl.float32, buffer=nl.psum)
        for k, _, nk in tiles(dim, p):
            nisa.nc_matmul(dst=ps, stationary=h_t[0:nk, k, :], moving=w_t[0:nk, k, c0:c0 + nc])
        nisa.tensor_copy(dst=y[:, c0:c0 + nc], src=ps)
    return y


def store_heads(out, b, t0, y, heads, d, cos=None, sin=None):
    """y [n, heads * D] -> out[b, head, t0:t0 + n, :] per head, RoPE'd first when the tables are given."""
    n = y.shape[0]
    for hh in nl.affine_range(heads):
        block = y[:, hh * d:(hh + 1) * d]
        if cos is not None:
            r = nl.ndarray((n, d), dtype=y.dtype, buffer=nl.sbuf)
            block = rotate_into(r, block, cos, sin)
        nisa.dma_copy(dst=out[b, hh, t0:t0 + n, :], src=block)


@jit
def qkv_kernel(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps):
    b_size, t, dim = x.shape
    d = wq.shape[-1] // n_heads  # checked below
    p = nl.tile_size.pmax
    expect_tiled("qkv_kernel", "wq", wq, dim, n_heads * d, "[P, dim / P, heads * head_dim]")
    expect_tiled("qkv_kernel", "wk", wk, dim, n_kv_heads * d, "[P, dim / P, kv_heads * head_dim]")
    expect_tiled("qkv_kernel", "wv", wv, dim, n_kv_heads * d, "[P, dim / P, kv_heads * head_dim]")
    q = nl.ndarray((b_size, n_heads, t, d), dtype=x.dtype, buffer=nl.shared_hbm)
    k = nl.ndarray((b_size, n_kv_heads, t, d), dtype=x.dtype, buffer=nl.shared_hbm)
    v = nl.ndarray((b_size, n_kv_heads, t, d), dtype=x.dtype, buffer=nl.shared_hbm)
    w = load_broadcast(norm_w, p)
    wq_t, wk_t, wv_t = (load_tiled(m, n_block=nl.tile_size.gemm_moving_fmax, k_block=1) for m in (wq, wk, wv))
    for b in nl.affine_range(b_size):
        for _, t0, n in tiles(t, p):
            xt = nl.ndarray((n, dim), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xt, src=x[b, t0:t0 + n, :])
            h = nl.ndarray((n, dim), dtype=x.dtype, buffer=nl.sbuf)
            h_t = transpose_rows(rmsnorm_rows(h, xt, w, eps), p)
            c = nl.ndarray((n, d), dtype=cos.dtype, buffer=nl.sbuf)
            s = nl.ndarray((n, d), dtype=sin.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=c, src=cos[t0:t0 + n, :])
            nisa.dma_copy(dst=s, src=sin[t0:t0 + n, :])
            for out, w_t, heads, rope in ((q, wq_t, n_heads, True), (k, wk_t, n_kv_heads, True),
                                          (v, wv_t, n_kv_heads, False)):
                y = nl.ndarray((n, heads * d), dtype=x.dtype, buffer=nl.sbuf)
                project(y, h_t, w_t, dim, p)
                store_heads(out, b, t0, y, heads, d, c if rope else None, s if rope else None)
    return q, k, v


_qkv = wrap_nki(qkv_kernel)


@nki_op("nativelab::nki_qkv", mutates_args=())
def qkv(x: torch.Tensor, norm_w: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
        cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int,
        eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_qkv_args(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads)
    x, norm_w, cos, sin = (t.contiguous() for t in (x, norm_w, cos, sin))
    q, k, v = _qkv(x, norm_w, prepared(wq), prepared(wk), prepared(wv), cos, sin, n_heads, n_kv_heads, float(eps))
    return q, k, v
