"""RoPE on (B, H, T, D) with (T, D) cos/sin tables, pairing the two halves of D (Hugging Face convention)."""

from __future__ import annotations

import torch

from ..interface import kernel_op, wrap_kernel
from ._checks import check_dim, check_float, check_rank, check_same


def reference_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.rope:rope"})
def rope_kernel(x, cos, sin, out):
    out.copy_(reference_rope(x, cos, sin))


def _check(x, cos, sin):
    check_rank("x", x, 4)
    check_float("x", x)
    if x.shape[-1] % 2:
        raise ValueError(f"x: head_dim must be even for RoPE, got {x.shape[-1]}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_rank(name, t, 2)
        check_dim(name, t, 0, x.shape[2], "x's sequence length")
        check_dim(name, t, 1, x.shape[3], "x's head_dim")
    check_same("x, cos, sin", x, cos, sin)


@kernel_op("nativelab::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    _check(x, cos, sin)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rope_kernel(x, cos, sin, out)
    return out


@kernel_op("nativelab::rope_", mutates_args=("x",))
def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """RoPE in place."""
    _check(x, cos, sin)
    rope_kernel(x, cos, sin, x)
