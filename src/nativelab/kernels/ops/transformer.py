"""`transformer_tkg`: one decode step through every layer in one kernel (the guide's mega-kernel).

Per layer: RMSNorm + QKV + RoPE, the cache write and attention over the cache, output projection + residual,
RMSNorm + SwiGLU + residual; then the final norm and the LM head. The whole step is one traced function, so
the generated code keeps intermediates out of device memory between the pieces.

The model's tensors travel as `DecodeWeights.flat()`'s two lists (`weights`, baked on the traced path, and
`caches`, written); every implementation reads them back by name (decode_weights.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..interface import kernel_op, wrap_kernel
from ._checks import check_float, check_rank
from .attention import reference_attention_tkg
from .decode_weights import DecodeWeights
from .mlp import reference_mlp
from .qkv import reference_qkv
from .rmsnorm import reference_rmsnorm
from .sample import _sample, check_sampling


def reference_transformer_tkg(x, pos, cos, sin, w: DecodeWeights, n_heads: int, n_kv_heads: int,
                              eps: float = 1e-5):
    """x (B, T, dim) at positions pos (T,) -> logits (B, T, vocab); cos / sin are (T, head_dim) rows; writes
    the T positions of w's caches."""
    b, t, _ = x.shape
    for i in range(w.n_layers):
        q, k, v = reference_qkv(x, w.input_norms[i], w.wqs[i], w.wks[i], w.wvs[i], cos, sin, n_heads, n_kv_heads,
                                eps)
        att = reference_attention_tkg(q, k, v, w.k_caches[i], w.v_caches[i], pos)
        x = x + F.linear(att.transpose(1, 2).reshape(b, t, -1), w.wos[i])
        x = reference_mlp(x, w.gates[i], w.ups[i], w.downs[i], w.post_norms[i], eps, residual=True)
    return F.linear(reference_rmsnorm(x, w.final_norm, eps), w.lm_head)


@wrap_kernel(weights=(4,),  # `weights`: baked; `caches` stay inputs (written)
             targets={"cuda": "nativelab.kernels.triton.transformer:transformer_tkg",
                      "host": "nativelab.kernels.cpu.decode:transformer_tkg"})
def transformer_tkg_kernel(x, pos, cos, sin, weights, caches, n_heads, n_kv_heads, eps, out):
    out.copy_(reference_transformer_tkg(x, pos, cos, sin, DecodeWeights.unflatten(weights, caches), n_heads,
                                        n_kv_heads, eps))


@kernel_op("nativelab::transformer_tkg", mutates_args=("caches",))
def transformer_tkg(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    weights: list[torch.Tensor], caches: list[torch.Tensor], n_heads: int, n_kv_heads: int,
                    eps: float = 1e-5) -> torch.Tensor:
    """One decode step's hidden state x (B, T, dim) -> logits (B, T, vocab): `weights, caches =
    DecodeWeights.of(model).flat()` (the embedding among them, unused here)."""
    check_rank("x", x, 3)
    check_float("x", x)
    w = DecodeWeights.unflatten(weights, caches)
    w.check(x.shape[2])
    out = torch.empty(x.shape[0], x.shape[1], w.lm_head.shape[0], dtype=x.dtype, device=x.device)
    transformer_tkg_kernel(x, pos, cos, sin, weights, caches, n_heads, n_kv_heads, eps, out)
    return out


def reference_transformer_tkg_token(tokens, pos, seed_state, w: DecodeWeights, rope_cos, rope_sin, n_heads: int,
                                    n_kv_heads: int, eps: float = 1e-5):
    """tokens (B, T) at positions pos (T,) -> logits (B, T, vocab): the embedding lookup, the model's RoPE rows
    in its dtype, then `reference_transformer_tkg`."""
    x = F.embedding(tokens, w.embed)
    cos, sin = rope_cos[pos].to(w.embed.dtype), rope_sin[pos].to(w.embed.dtype)
    return reference_transformer_tkg(x, pos, cos, sin, w, n_heads, n_kv_heads, eps)


# The parameters are baked in on the traced path; the RoPE tables are buffers, so inputs (a compiled graph passes
# them as host views made while the queue runs, inference tensors that carry no version to key a bake on).
@wrap_kernel(weights=(3,), targets={"host": "nativelab.kernels.cpu.decode:transformer_tkg_token"})
def transformer_tkg_token_kernel(tokens, pos, seed_state, weights, caches, rope_cos, rope_sin, n_heads, n_kv_heads,
                                 eps, temperature, top_k, top_p, logits, out):
    """The whole step from token ids (1, T): every token's cache rows, the last token's logits (B, 1, vocab),
    and the token `sample` draws from them (argmax for temperature <= 0), the sampler's counter advancing
    once."""
    w = DecodeWeights.unflatten(weights, caches)
    logits.copy_(reference_transformer_tkg_token(tokens, pos, seed_state, w, rope_cos, rope_sin, n_heads,
                                                 n_kv_heads, eps)[:, -1:])
    out.copy_(_sample(logits[:, -1], seed_state, temperature, top_k, top_p))
    seed_state[1:].add_(1)


@kernel_op("nativelab::transformer_tkg_token", mutates_args=("seed_state", "caches"))
def transformer_tkg_token(tokens: torch.Tensor, pos: torch.Tensor, seed_state: torch.Tensor,
                          weights: list[torch.Tensor], caches: list[torch.Tensor], rope_cos: torch.Tensor,
                          rope_sin: torch.Tensor, n_heads: int, n_kv_heads: int, eps: float, temperature: float,
                          top_k: int, top_p: float) -> torch.Tensor:
    """One step, token ids in, next token out (B,): embedding, every layer (`transformer_tkg`), final
    norm, LM head and the draw (`sample`'s: argmax for temperature 0, else top-k / top-p) in one launch, so the
    experimental tier's compiled step is this op. tokens (B, T) at positions pos (T,): T == 1 is a decode step,
    T > 1 a prompt's prefill (every token's cache rows written; the LM head and the draw for the last token
    only, since only its token is returned). `weights, caches = DecodeWeights.of(model).flat()`; `rope_cos` /
    `rope_sin` are the model's whole (max_seq_len, head_dim) tables; `seed_state` is the sampler's
    [seed, counter], advanced by every call."""
    check_rank("tokens", tokens, 2)
    if tokens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"tokens: expected int32 or int64 token ids, got {tokens.dtype}")
    w = DecodeWeights.unflatten(weights, caches)
    w.check(w.embed.shape[1])
    check_sampling(seed_state, w.embed.device, top_k, top_p)
    b, t = tokens.shape
    if pos.shape != (t,):
        raise ValueError(f"pos: expected one position per token, shape ({t},), got {tuple(pos.shape)}")
    logits = torch.empty(b, 1, w.lm_head.shape[0], dtype=w.embed.dtype, device=w.embed.device)  # the last token's
    out = torch.empty(b, dtype=torch.int64, device=w.embed.device)
    transformer_tkg_token_kernel(tokens, pos, seed_state, weights, caches, rope_cos, rope_sin, n_heads, n_kv_heads,
                                 eps, float(temperature), int(top_k), float(top_p), logits, out)
    return out
