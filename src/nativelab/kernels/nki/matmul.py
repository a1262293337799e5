"""out[M, N] = a[M, K] @ b[K, N] on the Tensor Engine: a block of b's columns stays in SBUF while every row
tile of a streams past it; a's tiles arrive transposed (K on partitions) by DMA; each 128 x 512 output tile
sums its K tiles in one PSUM bank (fp32) and is rounded once to the output dtype."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki

_B_BLOCK_BYTES = 128 * 1024  # per partition: b's resident block (SBUF has 224 KiB per partition)


@jit
def matmul_kernel(a, b):
    m_size, k_size = a.shape
    _, n_size = b.shape
    tm, tk, tn = nl.tile_size.pmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    k_tiles = (k_size + tk - 1) // tk
    item = 2 if a.dtype in (nl.bfloat16, nl.float16) else 4
    block = max(tn, min(n_size, _B_BLOCK_BYTES // (k_tiles * item)) // tn * tn)  # b's columns kept in SBUF
    out = nl.ndarray((m_size, n_size), dtype=a.dtype, buffer=nl.shared_hbm)
    for nb in nl.affine_range((n_size + block - 1) // block):
        n0, n1 = nb * block, min(n_size, nb * block + block)
        b_block = nl.ndarray((tk, k_tiles, n1 - n0), dtype=b.dtype, buffer=nl.sbuf)  # [k, k tile, n]
        for k in nl.affine_range(k_tiles):
            k0, k1 = k * tk, min(k_size, k * tk + tk)
            nisa.dma_copy(dst=b_block[0:k1 - k0, k, :], src=b[k0:k1, n0:n1])
        for m in nl.affine_range((m_size + tm - 1) // tm):
            m0, m1 = m * tm, min(m_size, m * tm + tm)
            a_block = nl.ndarray((tk, k_tiles, m1 - m0), dtype=a.dtype, buffer=nl.sbuf)  # a's rows, transposed
            for k in nl.affine_range(k_tiles):
                k0, k1 = k * tk, min(k_size, k * tk + tk)
                nisa.dma_transpose(dst=a_block[0:k1 - k0, k, :], src=a[m0:m1, k0:k1])
            for n in nl.affine_range((n1 - n0 + tn - 1) // tn):
                c0, c1 = n * tn, min(n1 - n0, n * tn + tn)
                acc = nl.ndarray((m1 - m0, c1 - c0), dtype=nl.float32, buffer=nl.psum)
                for k in nl.affine_range(k_tiles):
                    kk = min(k_size, k * tk + tk) - k * tk
                    nisa.nc_matmul(dst=acc, stationary=a_block[0:kk, k, :], moving=b_block[0:kk, k, c0:c1])
                res = nl.ndarray((m1 - m0, c1 - c0), dtype=a.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=res, src=acc)
                nisa.dma_copy(dst=out[m0:m1, n0 + c0:n0 + c1], src=res)
    return out


_matmul = wrap_nki(matmul_kernel)


@nki_op("nativelab::nki_matmul", mutates_args=())
def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(f"nki_matmul: needs a [M, K] and b [K, N] of one dtype, got {tuple(a.shape)} {a.dtype} "
                         f"and {tuple(b.shape)} {b.dtype}")
    return _matmul(a.contiguous(), b.contiguous())
