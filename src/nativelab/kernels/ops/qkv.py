"""RMSNorm + Q/K/V projections + RoPE in one kernel, for grouped-query attention.

x (B, T, dim) -> q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, D); RoPE applied to q and k."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..interface import kernel_op, wrap_kernel
from ._checks import check_dim, check_float, check_rank, check_same
from .rmsnorm import reference_rmsnorm
from .rope import reference_rope


def reference_qkv(x, norm_w, wq, wk, wv, cos, sin, n_heads: int, n_kv_heads: int, eps: float = 1e-5):
    b, t, _ = x.shape
    d = wq.shape[0] // n_heads
    h = reference_rmsnorm(x, norm_w, eps)
    q = F.linear(h, wq).view(b, t, n_heads, d).transpose(1, 2)
    k = F.linear(h, wk).view(b, t, n_kv_heads, d).transpose(1, 2)
    v = F.linear(h, wv).view(b, t, n_kv_heads, d).transpose(1, 2)
    return reference_rope(q, cos, sin), reference_rope(k, cos, sin), v


@wrap_kernel(weights=(1, 2, 3, 4), targets={"cuda": "nativelab.kernels.triton.qkv:qkv",
                                            "host": "nativelab.kernels.cpu.decode:qkv"})
def qkv_kernel(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, q_out, k_out, v_out):
    q, k, v = reference_qkv(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps)
    q_out.copy_(q)
    k_out.copy_(k)
    v_out.copy_(v)


def check_qkv_args(x, norm_w, wq, wk, wv, cos, sin, n_heads: int, n_kv_heads: int) -> None:
    """qkv's argument checks (its NKI twin's too): shapes, head counts, one device and dtype."""
    check_rank("x", x, 3)
    check_float("x", x)
    b, t, dim = x.shape
    if n_heads <= 0 or n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads}, n_kv_heads={n_kv_heads}: n_heads must be a multiple of n_kv_heads")
    check_rank("wq", wq, 2)
    if wq.shape[0] % n_heads:
        raise ValueError(f"wq: {wq.shape[0]} output features do not split into n_heads={n_heads}")
    d = wq.shape[0] // n_heads
    check_dim("wq", wq, 1, dim, "x's hidden size: weights are [out, in]")
    for name, w in (("wk", wk), ("wv", wv)):
        check_rank(name, w, 2)
        check_dim(name, w, 0, n_kv_heads * d, "n_kv_heads * head_dim")
        check_dim(name, w, 1, dim, "x's hidden size: weights are [out, in]")
    check_dim("norm_w", norm_w, 0, dim, "x's hidden size")
    for name, tab in (("cos", cos), ("sin", sin)):
        check_rank(name, tab, 2)
        check_dim(name, tab, 0, t, "x's sequence length")
        check_dim(name, tab, 1, d, "head_dim")
    check_same("x, weights and tables", x, norm_w, wq, wk, wv, cos, sin)


@kernel_op("nativelab::qkv", mutates_args=())
def qkv(x: torch.Tensor, norm_w: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
        cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int,
        eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_qkv_args(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads)
    b, t, _ = x.shape
    d = wq.shape[0] // n_heads
    q = torch.empty(b, n_heads, t, d, dtype=x.dtype, device=x.device)
    k = torch.empty(b, n_kv_heads, t, d, dtype=x.dtype, device=x.device)
    v = torch.empty(b, n_kv_heads, t, d, dtype=x.dtype, device=x.device)
    qkv_kernel(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, q, k, v)
    return q, k, v
