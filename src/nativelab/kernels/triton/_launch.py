"""Launch helpers shared by the Triton kernels."""

from __future__ import annotations

import os

import torch
import triton


def block(n: int, least: int = 16) -> int:
    """A power-of-two block covering n (Triton block sizes are powers of two; tl.dot needs >= 16)."""
    return max(least, triton.next_power_of_2(n))


def dot_precision(dtype: torch.dtype) -> str:
    """float32 products in full precision (as cuBLAS does by default), not TF32."""
    return "ieee" if dtype == torch.float32 else "tf32"


def rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, last dim) with unit stride along the last dim (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def interpreted() -> bool:
    """Under TRITON_INTERPRET=1 (CPU tests): its tl.dot multiplies bfloat16 as raw 16-bit integers, so the
    kernels upcast their dot operands to float32 there (on a GPU they stay bfloat16 for the tensor cores)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
