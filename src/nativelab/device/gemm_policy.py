"""How the device runs bf16 matrix products on this host: in bf16, or as fp32 GEMMs of upcast operands.

The device's matmul unit takes bf16 operands and accumulates in fp32. A product of two bf16 numbers is exact in
fp32 (8-bit significands), so an fp32 GEMM on upcast operands, rounded back to bf16, computes the same thing up
to the order of the fp32 additions. Which is faster depends on the CPU (measured with torch 2.13):

- no bf16 instructions (AVX2 machines: AMD Zen, older Intel; or oneDNN capped with ONEDNN_MAX_CPU_ISA=AVX2):
  oneDNN's bf16 GEMM falls back to slow code; a 1024x576 @ 576x1536 product ran at 1.2 GFLOP/s against
  87.6 GFLOP/s in fp32 (73x) on an AMD EPYC. On the Xeon capped to AVX2: 12x (weight-layout operand) to 128x
  slower than fp32 on the upcast operands, already 1.4-17x at 4 rows. Upcast every product from 4 rows.
- AVX512_BF16 without AMX: oneDNN's bf16 GEMM (avx512_core_bf16) ran 512x576x1536 in 5.5 ms, MKL's fp32 GEMM
  in 3.3 ms with the casts (1.65x); at 64 rows 1.1-1.3x, at 16 rows 0.75x. Upcast from 64 rows.
- AMX: bf16 tiles run ~5x fp32 (740 vs 140 GFLOP/s at 2048^3): keep bf16.

Matrix-vector products (decode: x @ W^T) are bandwidth-bound and vectorized in bf16 even with oneDNN capped:
upcasting their weights would double the bytes read, so products with fewer than `min_rows()` rows stay bf16.
Eager device ops (and autocast, which reaches them) and compiled graphs share this decision.
"""

from __future__ import annotations

import functools

import torch

from . import cpu_info, state

# Rows (the smaller of M and N) from which upcasting pays, measured as in the module docstring.
_MIN_ROWS_NO_BF16 = 4
_MIN_ROWS_AVX512_BF16 = 64
# ATen matrix products the device's eager ops upcast -> positions of their two matrix operands
OPS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::addmm": (1, 2), "aten::baddbmm": (1, 2)}


def min_rows() -> int | None:
    """Rows from which a bf16 product runs as an fp32 GEMM on this host; None: never (AMX).
    NATIVELAB_BF16_GEMM=bf16 keeps every product in bf16, =fp32 upcasts from 4 rows, =auto (default) decides."""
    choice = state.device.bf16_gemm
    if choice == "bf16":
        return None
    return _MIN_ROWS_NO_BF16 if choice == "fp32" else _rows_for_this_cpu()


@functools.cache
def _rows_for_this_cpu() -> int | None:
    if not cpu_info.has_bf16_instructions():
        return _MIN_ROWS_NO_BF16
    return None if cpu_info.has_amx() else _MIN_ROWS_AVX512_BF16


def upcast(m: int, k: int, n: int) -> bool:
    """Whether an (m x k) @ (k x n) bf16 product should run as an fp32 GEMM of upcast operands here."""
    rows = min_rows()
    return rows is not None and min(m, n) >= rows and k >= rows


def upcast_args(name: str, args) -> bool:
    """For a device op about to run on host tensors: is it a bf16 matrix product the policy upcasts?
    `name` is the ATen op ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::baddbmm'), args its arguments."""
    pos = OPS.get(name)
    if pos is None:
        return False
    a, b = args[pos[0]], args[pos[1]]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16 or a.dim() < 2 or b.dim() < 2:
        return False
    batch = a.numel() // (a.shape[-2] * a.shape[-1]) if a.numel() else 0
    return upcast(a.shape[-2] * max(batch, 1), a.shape[-1], b.shape[-1])


def upcast_tensors(args: list) -> list:
    """`args` with every bf16 tensor upcast to fp32 (addmm's bias too: it is added in the fp32 accumulator)."""
    return [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
