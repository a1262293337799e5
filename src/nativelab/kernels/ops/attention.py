"""Causal attention for prefill (context encoding, `attention_cte`) and for decode against the static KV cache
(token generation, `attention_tkg`), grouped-query aware. Layouts: q (B, H, T, D), k / v (B, Hkv, T, D)."""

from __future__ import annotations

import torch

from ..interface import kernel_op, wrap_kernel
from ._checks import check_dim, check_float, check_rank, check_same


def _expand_kv(k: torch.Tensor, n_heads: int) -> torch.Tensor:
    return k if k.shape[1] == n_heads else k.repeat_interleave(n_heads // k.shape[1], dim=1)


def reference_attention_cte(q, k, v):
    """Causal attention over the T positions of a prompt."""
    t = q.shape[2]
    scores = (q @ _expand_kv(k, q.shape[1]).transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1).type_as(q)
    return probs @ _expand_kv(v, q.shape[1])


def reference_attention_tkg(q, k_new, v_new, k_cache, v_cache, pos):
    """Write k_new / v_new at positions `pos` into the caches (in place), then attend from q (at those
    positions) to every cache position up to its own."""
    k_cache.index_copy_(2, pos, k_new)
    v_cache.index_copy_(2, pos, v_new)
    s = k_cache.shape[2]
    scores = (q @ _expand_kv(k_cache, q.shape[1]).transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    filled = torch.arange(s, device=q.device).view(1, s) <= pos.view(-1, 1)  # (T, S): causal over the cache
    probs = torch.softmax(scores.masked_fill(~filled, float("-inf")), dim=-1).type_as(q)
    return probs @ _expand_kv(v_cache, q.shape[1])


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.attention_cte:attention_cte"})
def attention_cte_kernel(q, k, v, out):
    out.copy_(reference_attention_cte(q, k, v))


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.attention_tkg:attention_tkg",
                      "host": "nativelab.kernels.cpu.decode:attention_tkg"})
def attention_tkg_kernel(q, k_new, v_new, k_cache, v_cache, pos, out):
    out.copy_(reference_attention_tkg(q, k_new, v_new, k_cache, v_cache, pos))


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(name, t, 4)
        check_float(name, t)
    b, h, t, d = q.shape
    if k.shape[1] == 0 or h % k.shape[1]:
        raise ValueError(f"k: {k.shape[1]} kv heads do not divide q's {h} heads (grouped-query attention)")
    for name, x in (("k", k), ("v", v)):
        check_dim(name, x, 0, b, "q's batch")
        check_dim(name, x, 3, d, "q's head_dim")
    check_dim("v", v, 1, k.shape[1], "k's kv heads")


def _check_cte(q, k, v):
    _check_qkv(q, k, v)
    check_dim("k", k, 2, q.shape[2], "q's sequence length")
    check_dim("v", v, 2, q.shape[2], "q's sequence length")
    check_same("q, k, v", q, k, v)


@kernel_op("nativelab::attention_cte", mutates_args=())
def attention_cte(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    _check_cte(q, k, v)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    attention_cte_kernel(q, k, v, out)
    return out


@kernel_op("nativelab::attention_tkg", mutates_args=("k_cache", "v_cache"))
def attention_tkg(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    _check_qkv(q, k_new, v_new)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_rank(name, c, 4)
        check_dim(name, c, 1, k_new.shape[1], "k_new's kv heads")
        check_dim(name, c, 3, q.shape[3], "q's head_dim")
    if pos.dim() != 1 or pos.shape[0] != q.shape[2]:
        raise ValueError(f"pos: expected shape ({q.shape[2]},) (one position per query), got {tuple(pos.shape)}")
    check_same("q, k_new, v_new, k_cache, v_cache", q, k_new, v_new, k_cache, v_cache)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    attention_tkg_kernel(q, k_new, v_new, k_cache, v_cache, pos, out)
    return out
