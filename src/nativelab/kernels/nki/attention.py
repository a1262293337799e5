"""Attention in NKI, grouped-query aware: q (B, H, T, D), k / v (B, Hkv, T, D), each kv head serving H / Hkv
query heads.

Prefill (`attention_cte`, causal over the prompt): per head and 128-query tile, scores = q @ k.T over the keys
up to the tile's last query (K.T kept in SBUF per kv head, 512 keys per PSUM bank), the causal mask by one
GpSimd affine_select, softmax along the free dimension, then probs @ V with the keys on partitions: each
128-key block of probs is transposed on the Tensor Engine and summed into one PSUM tile.

Decode (`attention_tkg`, one query token against the static KV cache): the cache holds positions < pos and
the kernel reads all of it (static shapes: the length is data, not a shape), masked by iota < pos, plus the
new token's key and value as one more column, then writes the new key and value into the cache at pos. The
attention itself (`decode_heads`) writes nothing, so the same code serves a layer that computes k_new in SBUF
(transformer.py). Every query head has a partition of one [H, S] score tile, so the softmax runs once for all
heads.

Both round where the PyTorch reference rounds: the scores to q's dtype, softmax in fp32, probs to q's dtype,
the output once from the PSUM accumulation."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki
from ..ops._checks import check_dim, check_rank, check_same
from ..ops.attention import _check_cte as check_cte  # the same argument checks as the PyTorch kernels'
from ..ops.attention import _check_qkv as check_qkv
from .tiles import low_words, row_at, store_spread, tiles, transpose_into


def softmax_rows(scores, neg_max, extra=None):
    """exp(scores + neg_max) / row sum (fp32, [n, m], rows on partitions), with `extra` ([n, 1] fp32, or
    None) one more column of the same rows: returns (e, its row reciprocal sums, exp of extra or None)."""
    n, m = scores.shape
    e = nl.ndarray((n, m), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=scores, bias=neg_max, reduce_op=nl.add, reduce_res=total)
    e_extra = None
    if extra is not None:
        e_extra = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e_extra, op=nl.exp, data=extra, bias=neg_max)
        nisa.tensor_tensor(dst=total, data1=total, data2=e_extra, op=nl.add)
    inv = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv, data=total)
    return e, inv, e_extra


def probs_times_v(o_ps, probs, v_tiles, dtype, p):
    """o_ps [n, D] (PSUM) += probs [n, m] @ V, V's m rows in 128-row tiles v_tiles [p, tiles, D]: each block of
    probs transposed on the Tensor Engine (keys onto partitions), then the stationary operand."""
    n, m = probs.shape
    for s, s0, ns in tiles(m, p):
        pt = transpose_into(nl.ndarray((ns, n), dtype=dtype, buffer=nl.sbuf), probs[:, s0:s0 + ns])
        nisa.nc_matmul(dst=o_ps, stationary=pt, moving=v_tiles[0:ns, s, :])


def scores_into(scores, q_t, k_t, m):
    """scores [n, m] (q's dtype, SBUF) = q @ k.T from q.T [D, n] and K.T [D, >= m], 512 keys per matmul."""
    n = scores.shape[0]
    for _, c0, nc in tiles(m, nl.tile_size.gemm_moving_fmax):
        s_ps = nl.ndarray((n, nc), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s_ps, stationary=q_t, moving=k_t[:, c0:c0 + nc])
        nisa.tensor_copy(dst=scores[:, c0:c0 + nc], src=s_ps)


def load_keys_values(k, v, p):
    """K.T [D, S] and V in 128-row tiles [p, tiles, D] of one kv head's k / v [S, D] (HBM)."""
    s, d = k.shape
    k_t = nl.ndarray((d, s), dtype=k.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=k_t, src=k)
    v_tiles = nl.ndarray((p, (s + p - 1) // p, d), dtype=v.dtype, buffer=nl.sbuf)
    for i, s0, ns in tiles(s, p):
        nisa.dma_copy(dst=v_tiles[0:ns, i, :], src=v[s0:s0 + ns, :])
    return k_t, v_tiles


@jit
def attention_cte_kernel(q, k, v):
    b_size, heads, t, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    p = nl.tile_size.pmax
    scale = d ** -0.5
    out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(b_size):
        for j in nl.affine_range(kv_heads):
            k_t, v_tiles = load_keys_values(k[b, j, :, :], v[b, j, :, :], p)
            for h in nl.affine_range(j * group, j * group + group):
                for _, t0, nq in tiles(t, p):
                    m = t0 + nq  # keys 0 .. the tile's last query (causal: later keys get no weight)
                    q_t = nl.ndarray((d, nq), dtype=q.dtype, buffer=nl.sbuf)
                    nisa.dma_transpose(dst=q_t, src=q[b, h, t0:t0 + nq, :])
                    scores = nl.ndarray((nq, m), dtype=q.dtype, buffer=nl.sbuf)
                    scores_into(scores, q_t, k_t, m)
                    scaled = nl.ndarray((nq, m), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.tensor_scalar(dst=scaled, data=scores, op0=nl.multiply, operand0=scale)
                    # query t0 + row attends to key col where t0 + row - col >= 0
                    nisa.affine_select(dst=scaled, pattern=[[-1, m]], offset=t0, channel_multiplier=1,
                                       on_true_tile=scaled, on_false_value=-float("inf"), cmp_op=nl.greater_equal)
                    neg_max = nl.ndarray((nq, 1), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.tensor_reduce(dst=neg_max, op=nl.max, data=scaled, axis=1, negate=True, keepdims=True)
                    e, inv, _ = softmax_rows(scaled, neg_max)
                    probs = nl.ndarray((nq, m), dtype=q.dtype, buffer=nl.sbuf)
                    nisa.tensor_scalar(dst=probs, data=e, op0=nl.multiply, operand0=inv)
                    o_ps = nl.ndarray((nq, d), dtype=nl.float32, buffer=nl.psum)
                    probs_times_v(o_ps, probs, v_tiles, q.dtype, p)
                    o = nl.ndarray((nq, d), dtype=q.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=o, src=o_ps)
                    nisa.dma_copy(dst=out[b, h, t0:t0 + nq, :], src=o)
    return out


def decode_heads(att, q_t, k_new_t, v_new, k_cache, v_cache, before_pos, scale, dtype, p):
    """att [R, C] (SBUF, dtype) = the heads' outputs o (a row [H * D]) in 128-row tiles, o[h * D + i] at
    [(h * D + i) % 128, (h * D + i) // 128] (R = min(H * D, 128)): the layout the output projection contracts.
    H query heads (q.T [D, H]) attend over their kv head's cache positions < pos (k_cache / v_cache [KV, S, D]
    @ HBM, before_pos [H, S] = 1.0 where position < pos) and the new token (k_new.T [D, KV], v_new [1, KV * D]
    SBUF); head h reads kv head h // (H / KV).

    All heads at once: head h's scores land on partition h of one [H, S] PSUM tile, by accumulating, per kv head,
    a matmul whose stationary is q.T with every column but that kv head's query heads zero (GpSimd selects make
    them; the other rows gain exact zeros). The softmax runs once over [H, S + 1] (the new token its last column), the
    probabilities are transposed once per 128 keys, and head h's output lands at its rows of the output tile as
    V's keys (stationary, zero but for head h's D columns) against head h's probabilities (moving)."""
    d, heads = q_t.shape
    kv_heads, s = k_cache.shape[0], k_cache.shape[1]
    group = heads // kv_heads
    rows, cols = att.shape
    k_t = []
    for j in range(kv_heads):  # Python lists: plain loops
        k_t.append(nl.ndarray((d, s), dtype=k_cache.dtype, buffer=nl.sbuf))
        nisa.dma_transpose(dst=k_t[j], src=k_cache[j, :, :])
    # only[:, j, :]: q.T with only kv head j's query heads kept (two GpSimd selects: j * group <= h < (j + 1) *
    # group), so one matmul per kv head puts each head's scores on its own partition (the others gain exact zeros)
    only = nl.ndarray((d, kv_heads, heads), dtype=dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=only, pattern=[[-group, kv_heads], [1, heads]], offset=0, channel_multiplier=0,
                       on_true_tile=q_t.reshape((d, 1, heads)).broadcast_to((d, kv_heads, heads)),
                       on_false_value=0.0, cmp_op=nl.greater_equal)
    nisa.affine_select(dst=only, pattern=[[group, kv_heads], [-1, heads]], offset=group - 1, channel_multiplier=0,
                       on_true_tile=only, on_false_value=0.0, cmp_op=nl.greater_equal)
    scores = nl.ndarray((heads, s), dtype=dtype, buffer=nl.sbuf)
    for _, c0, nc in tiles(s, nl.tile_size.gemm_moving_fmax):
        s_ps = nl.ndarray((heads, nc), dtype=nl.float32, buffer=nl.psum)
        for j in range(kv_heads):
            nisa.nc_matmul(dst=s_ps, stationary=only[:, j, :], moving=k_t[j][:, c0:c0 + nc])
        nisa.tensor_copy(dst=scores[:, c0:c0 + nc], src=s_ps)
    new_ps = nl.ndarray((heads, 1), dtype=nl.float32, buffer=nl.psum)
    for j in range(kv_heads):
        nisa.nc_matmul(dst=new_ps, stationary=only[:, j, :], moving=k_new_t[:, j:j + 1])
    probs = masked_softmax(nl.ndarray((heads, s + 1), dtype=dtype, buffer=nl.sbuf), scores, new_ps, before_pos,
                           scale)
    o_ps = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.psum)
    for i, s0, ns in tiles(s + 1, p):
        pt = transpose_into(nl.ndarray((ns, heads), dtype=dtype, buffer=nl.sbuf), probs[:, s0:s0 + ns])
        placed = {}  # (kv head, rows it lands at) -> its V tile, zero elsewhere: heads of a group share it
        for h in range(heads):
            j, r0, col = h // group, (h * d) % p, (h * d) // p
            if (j, r0) not in placed:
                placed[(j, r0)] = _v_at(v_cache[j, :, :], v_new[:, j * d:(j + 1) * d], s0, ns, r0, rows, dtype)
            nisa.nc_matmul(dst=o_ps[:, col:col + 1], stationary=placed[(j, r0)], moving=pt[:, h:h + 1])
    nisa.tensor_copy(dst=att, src=o_ps)
    return att


def _v_at(v, v_new, s0, ns, r0, rows, dtype):
    """Keys s0 .. s0 + ns of one kv head's V (v [S, D] @ HBM, then the new token's row v_new [1, D] SBUF as key S)
    at columns r0 .. r0 + D of an [ns, rows] SBUF tile, zero elsewhere (GpSimd clears it)."""
    s, d = v.shape
    v_h = nl.ndarray((ns, rows), dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=v_h, value=0.0, engine=nisa.engine.gpsimd)
    cached = min(ns, s - s0)
    if cached > 0:
        nisa.dma_copy(dst=v_h[0:cached, r0:r0 + d], src=v[s0:s0 + cached, :])
    if cached < ns:  # the new token's row, after the cache's
        nisa.dma_copy(dst=v_h[cached:ns, r0:r0 + d], src=v_new)
    return v_h


def masked_softmax(probs, scores, new_ps, before_pos, scale):
    """probs [g, S + 1] (SBUF, its dtype) = softmax of scores [g, S] (SBUF) masked to positions < pos and of one
    more column, the new token's scores new_ps [g, 1] (PSUM fp32): both scaled, the softmax in fp32, rounded to
    probs' dtype, as the reference rounds."""
    g, s = scores.shape
    new = nl.ndarray((g, 1), dtype=scores.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=new, src=new_ps)
    new_scaled = nl.ndarray((g, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=new_scaled, data=new, op0=nl.multiply, operand0=scale)
    scaled = nl.ndarray((g, s), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=scaled, data=scores, op0=nl.multiply, operand0=scale)
    row_max = nl.ndarray((g, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=scaled, predicate=before_pos, on_true=scaled, on_false=-float("inf"),
                       reduce_res=row_max, reduce_op=nl.maximum)
    neg_max = nl.ndarray((g, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=neg_max, data1=row_max, data2=new_scaled, op=nl.maximum)
    nisa.tensor_scalar(dst=neg_max, data=neg_max, op0=nl.multiply, operand0=-1.0)
    e, inv, e_new = softmax_rows(scaled, neg_max, new_scaled)
    nisa.tensor_scalar(dst=probs[:, 0:s], data=e, op0=nl.multiply, operand0=inv)
    nisa.tensor_scalar(dst=probs[:, s:s + 1], data=e_new, op0=nl.multiply, operand0=inv)
    return probs


def positions_before(pos, g, s):
    """[g, S] fp32: 1.0 where the cache position (the free index) < pos (a [1] int64 HBM tensor), else 0."""
    pos_h = nl.ndarray((g, 1), dtype=nl.int32, buffer=nl.sbuf)  # the position's low word on every partition
    nisa.dma_copy(dst=pos_h, src=pos.ap(pattern=[[0, g], [1, 1]], offset=0, dtype=nl.int32))
    pos_t = nl.ndarray((g, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=pos_t, src=pos_h)
    before = nl.ndarray((g, s), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=before, pattern=[[1, s]])
    nisa.tensor_scalar(dst=before, data=before, op0=nl.less, operand0=pos_t)
    return before


@jit
def attention_tkg_kernel(q, k_new, v_new, k_cache, v_cache, pos):
    """One decode token per sequence: q [B, H, 1, D], k_new / v_new [B, KV, 1, D], the caches [B, KV, S, D] and
    pos [1] int64 (HBM) -> out [B, H, 1, D]: attention over the cache's positions < pos and the new token, then
    k_new / v_new written into the caches at pos (after the read, which masks pos)."""
    b_size, heads, _, d = q.shape
    kv_heads, s = k_cache.shape[1], k_cache.shape[2]
    if pos.dtype != nl.int64:
        raise ValueError(f"attention_tkg_kernel: pos is the position as int64, got {pos.dtype}")
    p = nl.tile_size.pmax
    out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    before = positions_before(pos, heads, s)
    pos_i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=pos_i, src=low_words(pos, 1))
    for b in nl.affine_range(b_size):
        q_t = nl.ndarray((d, heads), dtype=q.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=q_t, src=q[b, :, 0, :])
        k_new_t = nl.ndarray((d, kv_heads), dtype=k_new.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=k_new_t, src=k_new[b, :, 0, :])
        v_row = nl.ndarray((1, kv_heads * d), dtype=v_new.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v_row, src=v_new[b, :, :, :].reshape((1, kv_heads * d)))
        att = nl.ndarray((min(heads * d, p), -(-heads * d // p)), dtype=q.dtype, buffer=nl.sbuf)
        decode_heads(att, q_t, k_new_t, v_row, k_cache[b, :, :, :], v_cache[b, :, :, :], before, d ** -0.5, q.dtype, p)
        store_spread(out[b, :, :, :].reshape((heads * d,)), att, heads * d, p)
        for j in nl.affine_range(kv_heads):  # the new rows into the caches at pos
            nisa.dma_copy(dst=row_at(k_cache[b, j, :, :], pos_i), src=k_new[b, j, :, :])
            nisa.dma_copy(dst=row_at(v_cache[b, j, :, :], pos_i), src=v_new[b, j, :, :])
    return out


_attention_cte = wrap_nki(attention_cte_kernel)
_attention_tkg = wrap_nki(attention_tkg_kernel)


@nki_op("nativelab::nki_attention_cte", mutates_args=())
def attention_cte(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    check_cte(q, k, v)
    return _attention_cte(q.contiguous(), k.contiguous(), v.contiguous())


@nki_op("nativelab::nki_attention_tkg", mutates_args=("k_cache", "v_cache"))
def attention_tkg(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One decode token: attend from q over the cache's positions < pos and the new token, then write k_new /
    v_new into the caches at pos (reference_attention_tkg's result and effect)."""
    check_qkv(q, k_new, v_new)
    if q.shape[2] != 1:
        raise ValueError(f"nki_attention_tkg: one query token per step (decode), got q of shape {tuple(q.shape)}; "
                         f"a prompt runs attention_cte")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_rank(name, c, 4)
        check_dim(name, c, 0, q.shape[0], "q's batch")
        check_dim(name, c, 1, k_new.shape[1], "k_new's kv heads")
        check_dim(name, c, 3, q.shape[3], "q's head_dim")
    if pos.shape != (1,):
        raise ValueError(f"pos: expected shape (1,) (the new token's position), got {tuple(pos.shape)}")
    check_same("q, k_new, v_new, k_cache, v_cache", q, k_new, v_new, k_cache, v_cache)
    return _attention_tkg(q.contiguous(), k_new.contiguous(), v_new.contiguous(), k_cache, v_cache,
                          pos.to(torch.int64))
