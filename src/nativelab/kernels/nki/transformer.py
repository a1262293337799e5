"""The experimental tier's decode step in NKI, as one kernel: token ids in, the next token (and the logits) out.

`transformer_step_kernel`, per sequence: the token's embedding row (a DMA at the token id, read at run time),
then every layer (RMSNorm + fused Q/K/V + RoPE, the new k / v rows written into the caches at the position, read
at run time, attention over the cache's positions before it plus the new token, the output projection + residual,
RMSNorm + SwiGLU MLP + residual), the final norm, the LM head, and the greedy token (the first largest logit).
The hidden state stays in SBUF from the embedding to the logits: one launch a token, as AWS's megakernel
(nki-library's transformer_tkg) runs every layer in one launch and writes the KV cache inside.

The weights come prepared once, at load (`DecodeStack.prepare`), in the layout the Tensor Engine contracts them
in: every matrix `[P, K / P, N] @ HBM`, its contraction dimension K on P = min(K, 128) partitions (K padded with
zero rows to whole tiles), so one contiguous DMA puts it in SBUF and no weight is transposed at launch.

Shapes (B sequences, H heads, KV kv-heads of D, dim, F = (H + 2 KV) * D, I the MLP's size, S cache positions):

    tokens      [B, 1] int64 @ HBM      the step's token ids (read as their low 32-bit words)
    pos         [1] int64 @ HBM         the step's position
    seed_state  [2] int64 @ HBM         the sampler's [seed, counter]; the counter advances by one
    embed       [vocab, dim]            rows gathered by token id
    rope_cos/sin [max_seq, D]           the model's tables, the row at pos read at run time
    input_norms, post_norms  L x [dim]
    wqkvs       L x [P, dim / P, F]     q | k | v projections, fused
    wos         L x [P, H * D / P, dim]
    gates, ups  L x [P, dim / P, I]
    downs       L x [P, I / P, dim]
    final_norm  [dim];  lm_head [P, dim / P, vocab]
    k_caches, v_caches  L x [B, KV, S, D] (written at pos)
    -> (token [B, 1] int64, logits [B, vocab])
"""

from __future__ import annotations

import functools
import typing
from typing import NamedTuple

import torch
from torch import Tensor

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from .attention import decode_heads, positions_before
from .mlp import swiglu_transposed
from .qkv import project
from .rmsnorm import load_broadcast, rmsnorm_rows
from .rope import rotate_into
from .sample import MAX8_FMAX, argmax_step, running_argmax
from .layouts import expect_tiled, load_tiled, prepared
from .tiles import low_words, row_at, tiles, transpose_rows

class DecodeStack(NamedTuple):
    """A Llama's tensors for `transformer_step_kernel`, prepared once (`prepare`): the matrices tiled for the
    Tensor Engine, the rest as the model holds them. `flat()` / `unflatten` carry it through a custom op's
    schema as two lists (read-only tensors, and the caches the kernel writes)."""
    embed: Tensor
    rope_cos: Tensor
    rope_sin: Tensor
    input_norms: list[Tensor]
    wqkvs: list[Tensor]
    wos: list[Tensor]
    post_norms: list[Tensor]
    gates: list[Tensor]
    ups: list[Tensor]
    downs: list[Tensor]
    final_norm: Tensor
    lm_head: Tensor
    k_caches: list[Tensor]
    v_caches: list[Tensor]

    @classmethod
    def prepare(cls, w, rope_cos: Tensor, rope_sin: Tensor, n_heads: int) -> DecodeStack:
        """From a model's DecodeWeights (PyTorch's layouts) and RoPE tables: the matrices in the kernel's layouts,
        each made once per weight tensor (`prepared`: preparing again is a lookup, and only a weight written in
        place or replaced since is laid out again). The caches are the model's own (the kernel writes them)."""
        with torch.no_grad():
            return cls(embed=w.embed, rope_cos=rope_cos.to(w.embed.dtype), rope_sin=rope_sin.to(w.embed.dtype),
                       input_norms=list(w.input_norms),
                       wqkvs=[prepared(q, k, v) for q, k, v in zip(w.wqs, w.wks, w.wvs)],
                       wos=[prepared(wo) for wo in w.wos], post_norms=list(w.post_norms),
                       gates=[prepared(g) for g in w.gates], ups=[prepared(u) for u in w.ups],
                       downs=[prepared(d_) for d_ in w.downs], final_norm=w.final_norm, lm_head=prepared(w.lm_head),
                       k_caches=list(w.k_caches), v_caches=list(w.v_caches))

    def flat(self) -> tuple[list[Tensor], list[Tensor]]:
        """(read-only tensors, caches): fields in order, a per-layer field's tensors in layer order."""
        weights = []
        for name in self._fields[:-2]:
            v = getattr(self, name)
            weights.extend(v if isinstance(v, list) else (v,))
        return weights, [*self.k_caches, *self.v_caches]

    @classmethod
    def unflatten(cls, weights: list[Tensor], caches: list[Tensor]) -> DecodeStack:
        n, rest = divmod(len(caches), 2)
        per_model = sum(not _PER_LAYER[f] for f in cls._fields[:-2])
        per_layer = sum(_PER_LAYER[f] for f in cls._fields[:-2])
        if n < 1 or rest or len(weights) != per_model + per_layer * n:
            raise ValueError(f"DecodeStack: expected {per_model} + {per_layer} x layers tensors and 2 x layers "
                             f"caches (DecodeStack.flat()), got {len(weights)} and {len(caches)}")
        fields, at = [], 0
        for f in cls._fields[:-2]:
            k = n if _PER_LAYER[f] else 1
            fields.append(list(weights[at:at + k]) if _PER_LAYER[f] else weights[at])
            at += k
        return cls(*fields, k_caches=list(caches[:n]), v_caches=list(caches[n:]))


_PER_LAYER = {f: typing.get_origin(t) is list for f, t in typing.get_type_hints(DecodeStack).items()}  # a tensor per layer


def _rope_heads(y, heads, d, c, s):
    """RoPE on every head's D columns of a [1, heads * D] row at once (c / s: the position's rows repeated per
    head, [1, >= heads, D]), into a new row."""
    r = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
    rotate_into(r.reshape((1, heads, d)), y.reshape((1, heads, d)), c[:, 0:heads, :], s[:, 0:heads, :])
    return r


def _columns(row, heads, d):
    """A [1, heads * D] row as [D, heads] (SBUF): each head's D values a column, by Tensor Engine transposes into
    one PSUM tile."""
    t_ps = nl.ndarray((d, heads), dtype=row.dtype, buffer=nl.psum)
    for h in range(heads):
        nisa.nc_transpose(dst=t_ps[:, h:h + 1], data=row[:, h * d:(h + 1) * d])
    t = nl.ndarray((d, heads), dtype=row.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=t_ps)
    return t


def qkv_rows(x, w_in, wqkv, c, s, n_heads, n_kv_heads, eps, p):
    """RMSNorm + the fused Q/K/V projection + RoPE of the hidden row x [1, dim] (SBUF): q [1, H * D] and k, v
    [1, KV * D] rows (SBUF), wqkv prepared [P, dim / P, (H + 2 KV) * D] (HBM)."""
    _, dim = x.shape
    d = c.shape[2]
    hq, hk = n_heads * d, n_kv_heads * d
    h_t = transpose_rows(rmsnorm_rows(nl.ndarray((1, dim), dtype=x.dtype, buffer=nl.sbuf), x, w_in, eps), p)
    y = project(nl.ndarray((1, hq + 2 * hk), dtype=x.dtype, buffer=nl.sbuf), h_t,
                load_tiled(wqkv, n_block=nl.tile_size.gemm_moving_fmax, k_block=1), dim, p)
    return _rope_heads(y[:, 0:hq], n_heads, d, c, s), _rope_heads(y[:, hq:hq + hk], n_kv_heads, d, c, s), \
        y[:, hq + hk:hq + 2 * hk]


def output_projection(att, wo, x, hd, p):
    """x + o @ wo.T (a [1, dim] row, SBUF), from the heads' outputs o [H * D = hd] in 128-row tiles att [R, C]
    (decode_heads' layout) and wo prepared [P, hd / P, dim] (HBM): 128 partitions of contraction a matmul."""
    rows, cols = att.shape
    y = project(nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf), att.reshape((rows, cols, 1)),
                load_tiled(wo, n_block=nl.tile_size.gemm_moving_fmax, k_block=1), hd,
                p)
    nisa.tensor_tensor(dst=y, data1=y, data2=x, op=nl.add)
    return y


def mlp_residual(x, w_post, gate, up, down, eps, p):
    """x + mlp(rmsnorm(x)) (a [1, dim] row, SBUF), the weights prepared (gate / up [P, dim / P, I], down
    [P, I / P, dim], HBM)."""
    _, dim = x.shape
    dt = x.dtype
    inter = gate.shape[2]
    h_t = transpose_rows(rmsnorm_rows(nl.ndarray((1, dim), dtype=dt, buffer=nl.sbuf), x, w_post, eps), p)
    g_t, u_t = load_tiled(gate, up, n_block=nl.tile_size.gemm_moving_fmax)
    act = swiglu_transposed(h_t, g_t, u_t, dim, inter, 1, dt, p)
    d_t = load_tiled(down, k_block=4)
    out = nl.ndarray((1, dim), dtype=dt, buffer=nl.sbuf)
    for _, c0, nc in tiles(dim, nl.tile_size.gemm_moving_fmax):  # down projection + residual
        o_ps = nl.ndarray((1, nc), dtype=nl.float32, buffer=nl.psum)
        for i, _, ni in tiles(inter, p):
            nisa.nc_matmul(dst=o_ps, stationary=act[0:ni, i, :], moving=d_t[0:ni, i, c0:c0 + nc])
        nisa.tensor_copy(dst=out[:, c0:c0 + nc], src=o_ps)
        nisa.tensor_tensor(dst=out[:, c0:c0 + nc], data1=out[:, c0:c0 + nc], data2=x[:, c0:c0 + nc], op=nl.add)
    return out


def _layer(x, b, pos_i, before, c, s, w_in, wqkv, wo, w_post, gate, up, down, k_cache, v_cache, n_heads, n_kv_heads,
           eps, p):
    """One layer on the hidden row x [1, dim] (SBUF) of sequence b -> the next layer's row (SBUF)."""
    d = c.shape[2]
    hd = n_heads * d
    q, k, v = qkv_rows(x, w_in, wqkv, c, s, n_heads, n_kv_heads, eps, p)
    att = nl.ndarray((min(hd, p), -(-hd // p)), dtype=x.dtype, buffer=nl.sbuf)
    decode_heads(att, _columns(q, n_heads, d), _columns(k, n_kv_heads, d), v, k_cache[b, :, :, :],
                 v_cache[b, :, :, :], before, d ** -0.5, x.dtype, p)
    for j in nl.affine_range(n_kv_heads):  # the new rows into the caches at pos, after the read (which masks pos)
        nisa.dma_copy(dst=row_at(k_cache[b, j, :, :], pos_i), src=k[:, j * d:(j + 1) * d])
        nisa.dma_copy(dst=row_at(v_cache[b, j, :, :], pos_i), src=v[:, j * d:(j + 1) * d])
    return mlp_residual(output_projection(att, wo, x, hd, p), w_post, gate, up, down, eps, p)


@jit
def transformer_step_kernel(tokens, pos, seed_state, embed, rope_cos, rope_sin, input_norms, wqkvs, wos, post_norms,
                            gates, ups, downs, final_norm, lm_head, k_caches, v_caches, n_heads, n_kv_heads, eps):
    b_size = tokens.shape[0]
    vocab, dim = embed.shape
    d = rope_cos.shape[1]
    inter = gates[0].shape[-1]
    s_len = k_caches[0].shape[2]
    p = nl.tile_size.pmax
    dt = embed.dtype
    f = (n_heads + 2 * n_kv_heads) * d
    expect = functools.partial(expect_tiled, "transformer_step_kernel")  # weights prepared once (DecodeStack)
    for i in range(len(wqkvs)):
        expect(f"wqkvs[{i}]", wqkvs[i], dim, f, "[P, dim / P, (heads + 2 kv_heads) * head_dim]")
        expect(f"wos[{i}]", wos[i], n_heads * d, dim, "[P, heads * head_dim / P, dim]")
        expect(f"gates[{i}]", gates[i], dim, inter, "[P, dim / P, intermediate]")
        expect(f"ups[{i}]", ups[i], dim, inter, "[P, dim / P, intermediate]")
        expect(f"downs[{i}]", downs[i], inter, dim, "[P, intermediate / P, dim]")
    expect("lm_head", lm_head, dim, vocab, "[P, dim / P, vocab]")
    token = nl.ndarray((b_size, 2), dtype=nl.int32, buffer=nl.shared_hbm)  # int64 words: [low, high]
    logits = nl.ndarray((b_size, vocab), dtype=dt, buffer=nl.shared_hbm)
    pos_i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=pos_i, src=low_words(pos, 1))
    before = positions_before(pos, n_heads, s_len)  # 1.0 where position < pos
    c = nl.ndarray((1, n_heads, d), dtype=dt, buffer=nl.sbuf)  # the position's rows, once per head
    s = nl.ndarray((1, n_heads, d), dtype=dt, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=rope_cos.ap(pattern=[[d, 1], [0, n_heads], [1, d]], offset=0, scalar_offset=pos_i,
                                         indirect_dim=0))
    nisa.dma_copy(dst=s, src=rope_sin.ap(pattern=[[d, 1], [0, n_heads], [1, d]], offset=0, scalar_offset=pos_i,
                                         indirect_dim=0))
    w_in = [load_broadcast(w, 1) for w in input_norms]
    w_post = [load_broadcast(w, 1) for w in post_norms]
    w_final = load_broadcast(final_norm, 1)
    for b in nl.affine_range(b_size):
        tok = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tok, src=low_words(tokens, 1, offset=b))
        x = nl.ndarray((1, dim), dtype=dt, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=row_at(embed, tok))
        for i in range(len(wqkvs)):
            x = _layer(x, b, pos_i, before, c, s, w_in[i], wqkvs[i], wos[i], w_post[i], gates[i], ups[i], downs[i],
                       k_caches[i], v_caches[i], n_heads, n_kv_heads, eps, p)
        h_t = transpose_rows(rmsnorm_rows(nl.ndarray((1, dim), dtype=dt, buffer=nl.sbuf), x, w_final, eps), p)
        row = nl.ndarray((1, vocab), dtype=dt, buffer=nl.sbuf)
        for _, v0, nv in tiles(vocab, nl.tile_size.gemm_moving_fmax):  # the head streamed 512 columns a DMA
            w_t = nl.ndarray((lm_head.shape[0], lm_head.shape[1], nv), dtype=dt, buffer=nl.sbuf)
            nisa.dma_copy(dst=w_t, src=lm_head[:, :, v0:v0 + nv])
            project(row[:, v0:v0 + nv], h_t, w_t, dim, p)
        nisa.dma_copy(dst=logits[b:b + 1, :], src=row)
        best, best_at = running_argmax(1)
        for _, c0, nc in tiles(vocab, MAX8_FMAX, carried=True):
            argmax_step(best, best_at, row[:, c0:c0 + nc], c0)
        words = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=words, value=0)
        nisa.tensor_copy(dst=words[:, 0:1], src=best_at)
        nisa.dma_copy(dst=token[b:b + 1, :], src=words)
    # the draw counted, as the sampler's counter advances at every draw (its low word; exact below 2**24)
    counter = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=counter, src=low_words(seed_state, 1, offset=1))
    nisa.tensor_scalar(dst=counter, data=counter, op0=nl.add, operand0=1)
    nisa.dma_copy(dst=low_words(seed_state, 1, offset=1), src=counter)
    return token.view(nl.int64), logits

