"""`transformer_tkg`: one decode step through every layer in one kernel (the guide's mega-kernel).

Per layer: RMSNorm + QKV + RoPE, the cache write and attention over the cache, output projection + residual,
RMSNorm + SwiGLU + residual; then the final norm and the LM head. The whole step is one traced function, so
the generated code keeps intermediates out of device memory between the pieces."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..interface import kernel_op, wrap_kernel
from ._checks import check_float, check_rank
from .attention import reference_attention_tkg
from .mlp import reference_mlp
from .qkv import reference_qkv
from .rmsnorm import reference_rmsnorm
from .sample import _sample, check_sampling


def reference_transformer_tkg(x, pos, cos, sin, input_norms, wqs, wks, wvs, wos, post_norms, gates, ups, downs,
                              k_caches, v_caches, final_norm, lm_head, n_heads: int, n_kv_heads: int,
                              eps: float = 1e-5):
    """x (B, T, dim) at positions pos (T,) -> logits (B, T, vocab); cos / sin are (T, head_dim) rows."""
    b, t, _ = x.shape
    for i in range(len(wqs)):
        q, k, v = reference_qkv(x, input_norms[i], wqs[i], wks[i], wvs[i], cos, sin, n_heads, n_kv_heads, eps)
        att = reference_attention_tkg(q, k, v, k_caches[i], v_caches[i], pos)
        x = x + F.linear(att.transpose(1, 2).reshape(b, t, -1), wos[i])
        x = reference_mlp(x, gates[i], ups[i], downs[i], post_norms[i], eps, residual=True)
    return F.linear(reference_rmsnorm(x, final_norm, eps), lm_head)


@wrap_kernel(weights=(4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16),
             targets={"cuda": "nativelab.kernels.triton.transformer:transformer_tkg",
                      "host": "nativelab.kernels.cpu.decode:transformer_tkg"})
def transformer_tkg_kernel(x, pos, cos, sin, input_norms, wqs, wks, wvs, wos, post_norms, gates, ups, downs,
                           k_caches, v_caches, final_norm, lm_head, n_heads, n_kv_heads, eps, out):
    out.copy_(reference_transformer_tkg(x, pos, cos, sin, input_norms, wqs, wks, wvs, wos, post_norms, gates,
                                        ups, downs, k_caches, v_caches, final_norm, lm_head, n_heads,
                                        n_kv_heads, eps))


def _check_layers(hidden: int, lm_head: torch.Tensor, wqs: list[torch.Tensor], **lists: list[torch.Tensor]) -> None:
    """Every per-layer list holds one tensor per layer (as many as `wqs`); the LM head is [vocab, hidden]."""
    n = len(wqs)
    for name, lst in lists.items():
        if len(lst) != n:
            raise ValueError(f"{name}: expected one tensor per layer ({n}), got {len(lst)}")
    if lm_head.dim() != 2 or lm_head.shape[1] != hidden:
        raise ValueError(f"lm_head: expected [vocab, {hidden}], got {tuple(lm_head.shape)}")


@kernel_op("nativelab::transformer_tkg", mutates_args=("k_caches", "v_caches"))
def transformer_tkg(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    input_norms: list[torch.Tensor], wqs: list[torch.Tensor], wks: list[torch.Tensor],
                    wvs: list[torch.Tensor], wos: list[torch.Tensor], post_norms: list[torch.Tensor],
                    gates: list[torch.Tensor], ups: list[torch.Tensor], downs: list[torch.Tensor],
                    k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], final_norm: torch.Tensor,
                    lm_head: torch.Tensor, n_heads: int, n_kv_heads: int, eps: float = 1e-5) -> torch.Tensor:
    check_rank("x", x, 3)
    check_float("x", x)
    _check_layers(x.shape[2], lm_head, wqs, input_norms=input_norms, wks=wks, wvs=wvs, wos=wos,
                  post_norms=post_norms, gates=gates, ups=ups, downs=downs, k_caches=k_caches, v_caches=v_caches)
    out = torch.empty(x.shape[0], x.shape[1], lm_head.shape[0], dtype=x.dtype, device=x.device)
    transformer_tkg_kernel(x, pos, cos, sin, input_norms, wqs, wks, wvs, wos, post_norms, gates, ups, downs,
                           k_caches, v_caches, final_norm, lm_head, n_heads, n_kv_heads, eps, out)
    return out


def reference_transformer_tkg_token(tokens, pos, seed_state, embed, rope_cos, rope_sin, input_norms, wqs, wks, wvs,
                                    wos, post_norms, gates, ups, downs, k_caches, v_caches, final_norm, lm_head,
                                    n_heads: int, n_kv_heads: int, eps: float = 1e-5):
    """tokens (B, T) at positions pos (T,) -> logits (B, T, vocab): the embedding lookup, the model's RoPE rows
    in its dtype, then `reference_transformer_tkg`."""
    x = F.embedding(tokens, embed)
    cos, sin = rope_cos[pos].to(embed.dtype), rope_sin[pos].to(embed.dtype)
    return reference_transformer_tkg(x, pos, cos, sin, input_norms, wqs, wks, wvs, wos, post_norms, gates, ups,
                                     downs, k_caches, v_caches, final_norm, lm_head, n_heads, n_kv_heads, eps)


# The parameters are baked in on the traced path; the RoPE tables are buffers, so inputs (a compiled graph passes
# them as host views made while the queue runs, inference tensors that carry no version to key a bake on).
@wrap_kernel(weights=(3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 17, 18),
             targets={"host": "nativelab.kernels.cpu.decode:transformer_tkg_token"})
def transformer_tkg_token_kernel(tokens, pos, seed_state, embed, rope_cos, rope_sin, input_norms, wqs, wks, wvs, wos,
                                 post_norms, gates, ups, downs, k_caches, v_caches, final_norm, lm_head, n_heads,
                                 n_kv_heads, eps, temperature, top_k, top_p, logits, out):
    """The whole step from token ids (1, T): every token's cache rows, the last token's logits (B, 1, vocab),
    and the token `sample` draws from them (argmax for temperature <= 0), the sampler's counter advancing
    once."""
    logits.copy_(reference_transformer_tkg_token(tokens, pos, seed_state, embed, rope_cos, rope_sin, input_norms,
                                                 wqs, wks, wvs, wos, post_norms, gates, ups, downs, k_caches,
                                                 v_caches, final_norm, lm_head, n_heads, n_kv_heads, eps)[:, -1:])
    out.copy_(_sample(logits[:, -1], seed_state, temperature, top_k, top_p))
    seed_state[1:].add_(1)


@kernel_op("nativelab::transformer_tkg_token", mutates_args=("seed_state", "k_caches", "v_caches"))
def transformer_tkg_token(tokens: torch.Tensor, pos: torch.Tensor, seed_state: torch.Tensor, embed: torch.Tensor,
                          rope_cos: torch.Tensor, rope_sin: torch.Tensor, input_norms: list[torch.Tensor],
                          wqs: list[torch.Tensor], wks: list[torch.Tensor], wvs: list[torch.Tensor],
                          wos: list[torch.Tensor], post_norms: list[torch.Tensor], gates: list[torch.Tensor],
                          ups: list[torch.Tensor], downs: list[torch.Tensor], k_caches: list[torch.Tensor],
                          v_caches: list[torch.Tensor], final_norm: torch.Tensor, lm_head: torch.Tensor,
                          n_heads: int, n_kv_heads: int, eps: float, temperature: float, top_k: int,
                          top_p: float) -> torch.Tensor:
    """One step, token ids in, next token out (B,): embedding, every layer (`transformer_tkg`), final
    norm, LM head and the draw (`sample`'s: argmax for temperature 0, else top-k / top-p) in one launch, so the
    experimental tier's compiled step is this op. tokens (B, T) at positions pos (T,): T == 1 is a decode step,
    T > 1 a prompt's prefill (every token's cache rows written; the LM head and the draw for the last token
    only, since only its token is returned). `rope_cos` / `rope_sin` are the model's whole (max_seq_len,
    head_dim) tables; `seed_state` is the sampler's [seed, counter], advanced by every call."""
    check_rank("tokens", tokens, 2)
    if tokens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"tokens: expected int32 or int64 token ids, got {tokens.dtype}")
    _check_layers(embed.shape[1], lm_head, wqs, input_norms=input_norms, wks=wks, wvs=wvs, wos=wos,
                  post_norms=post_norms, gates=gates, ups=ups, downs=downs, k_caches=k_caches, v_caches=v_caches)
    check_sampling(seed_state, embed.device, top_k, top_p)
    b, t = tokens.shape
    if pos.shape != (t,):
        raise ValueError(f"pos: expected one position per token, shape ({t},), got {tuple(pos.shape)}")
    logits = torch.empty(b, 1, lm_head.shape[0], dtype=embed.dtype, device=embed.device)  # the last token's
    out = torch.empty(b, dtype=torch.int64, device=embed.device)
    transformer_tkg_token_kernel(tokens, pos, seed_state, embed, rope_cos, rope_sin, input_norms, wqs, wks, wvs, wos,
                                 post_norms, gates, ups, downs, k_caches, v_caches, final_norm, lm_head, n_heads,
                                 n_kv_heads, eps, float(temperature), int(top_k), float(top_p), logits, out)
    return out
