"""One decode step of a Llama layer in NKI, and the LM head: the experimental tier's kernels.

`decode_layer_kernel`: x (B, 1, dim), one token per sequence at position pos, through RMSNorm + Q/K/V + RoPE,
attention over the static cache's positions < pos plus the new token, the output projection + residual,
RMSNorm + SwiGLU MLP + residual. Everything between the layer's input and output stays in SBUF / PSUM: one
HBM round trip per layer (the weights and the cache are read once per launch). The kernel returns the new
token's k / v rows and does not write the cache (a write at a data-dependent position is an indirect DMA,
which the emulator does not model): the op writes them at pos after, as `attention_tkg` does.

Per sequence the token is a [1, dim] row; each head's q / k row, RoPE'd, is transposed onto partitions for
the Tensor Engine, the group's attention output comes back as o.T columns, and the output projection
contracts over each head's D rows of wo.T, summed over heads in PSUM.

`lm_head_kernel`: the final RMSNorm and the LM head, x (B, dim) -> logits (B, vocab), the head's weight
streamed through SBUF 512 rows at a time (a 32000 x 512 head does not fit)."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki
from .attention import decode_one_group, load_keys_values, positions_before
from .mlp import down_projection, swiglu_transposed
from .qkv import project
from .rmsnorm import load_broadcast, rmsnorm_rows
from .rope import rotate_into
from .tiles import load_transposed, tiles, transpose_into, transpose_rows


def _rope_heads(y, heads, d, c, s):
    """RoPE on each head's D columns of a [1, heads * D] row, into a new row."""
    r = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
    for hh in nl.affine_range(heads):
        rotate_into(r[:, hh * d:(hh + 1) * d], y[:, hh * d:(hh + 1) * d], c, s)
    return r


@jit
def decode_layer_kernel(x, pos, cos, sin, input_norm, wq, wk, wv, wo, post_norm, gate, up, down, k_cache, v_cache,
                        n_heads, n_kv_heads, eps):
    b_size, _, dim = x.shape
    d = wq.shape[0] // n_heads
    inter = gate.shape[0]
    group = n_heads // n_kv_heads
    s_len = k_cache.shape[2]
    p = nl.tile_size.pmax
    dt = x.dtype
    x_out = nl.ndarray(x.shape, dtype=dt, buffer=nl.shared_hbm)
    k_new = nl.ndarray((b_size, n_kv_heads, 1, d), dtype=dt, buffer=nl.shared_hbm)
    v_new = nl.ndarray((b_size, n_kv_heads, 1, d), dtype=dt, buffer=nl.shared_hbm)
    w_in, w_post = load_broadcast(input_norm, 1), load_broadcast(post_norm, 1)
    wq_t, wk_t, wv_t = load_transposed(wq, p), load_transposed(wk, p), load_transposed(wv, p)
    wo_t = load_transposed(wo, d)  # [D, heads, dim]: each head's D rows of wo.T
    g_t, u_t, d_t = load_transposed(gate, p), load_transposed(up, p), load_transposed(down, p)
    c = nl.ndarray((1, d), dtype=cos.dtype, buffer=nl.sbuf)
    s = nl.ndarray((1, d), dtype=sin.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=cos)
    nisa.dma_copy(dst=s, src=sin)
    before = positions_before(pos, group, s_len)
    for b in nl.affine_range(b_size):
        xb = nl.ndarray((1, dim), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=xb, src=x[b, :, :])
        h_t = transpose_rows(rmsnorm_rows(nl.ndarray((1, dim), dtype=dt, buffer=nl.sbuf), xb, w_in, eps), p)
        q = _rope_heads(project(nl.ndarray((1, n_heads * d), dtype=dt, buffer=nl.sbuf), h_t, wq_t, dim, p),
                        n_heads, d, c, s)
        k = _rope_heads(project(nl.ndarray((1, n_kv_heads * d), dtype=dt, buffer=nl.sbuf), h_t, wk_t, dim, p),
                        n_kv_heads, d, c, s)
        v = project(nl.ndarray((1, n_kv_heads * d), dtype=dt, buffer=nl.sbuf), h_t, wv_t, dim, p)
        att_t = nl.ndarray((d, n_heads), dtype=dt, buffer=nl.sbuf)  # o.T: one column per head
        for j in nl.affine_range(n_kv_heads):
            h0 = j * group
            nisa.dma_copy(dst=k_new[b, j, :, :], src=k[:, j * d:(j + 1) * d])
            nisa.dma_copy(dst=v_new[b, j, :, :], src=v[:, j * d:(j + 1) * d])
            k_t, v_tiles = load_keys_values(k_cache[b, j, :, :], v_cache[b, j, :, :], p)
            q_t = nl.ndarray((d, group), dtype=dt, buffer=nl.sbuf)
            for g in nl.affine_range(group):
                transpose_into(q_t[:, g:g + 1], q[:, (h0 + g) * d:(h0 + g + 1) * d])
            k_row_t = transpose_into(nl.ndarray((d, 1), dtype=dt, buffer=nl.sbuf), k[:, j * d:(j + 1) * d])
            o = nl.ndarray((group, d), dtype=dt, buffer=nl.sbuf)
            decode_one_group(o, q_t, k_row_t, v[:, j * d:(j + 1) * d], k_t, v_tiles, before, d ** -0.5, dt, p)
            transpose_into(att_t[:, h0:h0 + group], o)
        x1 = nl.ndarray((1, dim), dtype=dt, buffer=nl.sbuf)
        for _, c0, nc in tiles(dim, nl.tile_size.gemm_moving_fmax):  # output projection, summed over heads
            o_ps = nl.ndarray((1, nc), dtype=nl.float32, buffer=nl.psum)
            for hh in nl.affine_range(n_heads):
                nisa.nc_matmul(dst=o_ps, stationary=att_t[:, hh:hh + 1], moving=wo_t[0:d, hh, c0:c0 + nc])
            nisa.tensor_copy(dst=x1[:, c0:c0 + nc], src=o_ps)
        nisa.tensor_tensor(dst=x1, data1=x1, data2=xb, op=nl.add)
        h2_t = transpose_rows(rmsnorm_rows(nl.ndarray((1, dim), dtype=dt, buffer=nl.sbuf), x1, w_post, eps), p)
        act = swiglu_transposed(h2_t, g_t, u_t, dim, inter, 1, dt, p)
        down_projection(x_out[b, :, :], act, d_t, dim, inter, 1, dt, p, residual=x1)
    return x_out, k_new, v_new


@jit
def lm_head_kernel(x, final_norm, lm_head, eps):
    rows, dim = x.shape
    vocab = lm_head.shape[0]
    p = nl.tile_size.pmax
    fmax = nl.tile_size.gemm_moving_fmax
    logits = nl.ndarray((rows, vocab), dtype=x.dtype, buffer=nl.shared_hbm)
    w = load_broadcast(final_norm, min(rows, p))
    for _, r0, n in tiles(rows, p):
        xt = nl.ndarray((n, dim), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[r0:r0 + n, :])
        h_t = transpose_rows(rmsnorm_rows(nl.ndarray((n, dim), dtype=x.dtype, buffer=nl.sbuf), xt, w, eps), p)
        for _, v0, nv in tiles(vocab, fmax):
            w_t = load_transposed(lm_head[v0:v0 + nv, :], p)  # 512 rows of the head, transposed
            y = nl.ndarray((n, nv), dtype=x.dtype, buffer=nl.sbuf)
            project(y, h_t, w_t, dim, p)
            nisa.dma_copy(dst=logits[r0:r0 + n, v0:v0 + nv], src=y)
    return logits


_decode_layer = wrap_nki(decode_layer_kernel)
_lm_head = wrap_nki(lm_head_kernel)


@nki_op("nativelab::nki_decode_layer", mutates_args=("k_cache", "v_cache"))
def decode_layer(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, input_norm: torch.Tensor,
                 wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor, post_norm: torch.Tensor,
                 gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, n_heads: int, n_kv_heads: int, eps: float = 1e-5) -> torch.Tensor:
    """One layer of a decode step: x (B, 1, dim) at position pos (1,), cos / sin its (1, head_dim) rows; the
    new token's k / v are written into the caches at pos."""
    if x.dim() != 3 or x.shape[1] != 1:
        raise ValueError(f"nki_decode_layer: x must be (B, 1, dim), one token per sequence, got {tuple(x.shape)}")
    if pos.shape != (1,):
        raise ValueError(f"pos: expected shape (1,) (the token's position), got {tuple(pos.shape)}")
    x_out, k_new, v_new = _decode_layer(x.contiguous(), pos.to(torch.float32), cos.contiguous(), sin.contiguous(),
                                        input_norm, wq, wk, wv, wo, post_norm, gate, up, down, k_cache, v_cache,
                                        n_heads, n_kv_heads, float(eps))
    k_cache.index_copy_(2, pos, k_new)
    v_cache.index_copy_(2, pos, v_new)
    return x_out


@nki_op("nativelab::nki_lm_head", mutates_args=())
def lm_head(x: torch.Tensor, final_norm: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """logits (..., vocab) = rmsnorm(x) @ weight.T, weight [vocab, dim]."""
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"nki_lm_head: weight must be [vocab, {x.shape[-1]}], got {tuple(weight.shape)}")
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return _lm_head(flat, final_norm, weight, float(eps)).reshape(*x.shape[:-1], weight.shape[0])
