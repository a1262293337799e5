"""Greedy sampling in NKI: the index of each row's largest logit (torch.argmax's: the first, on ties).

Rows on partitions; the Vector Engine's max8 finds a chunk's largest values (at most 16384 per partition)
and nc_find_index8 their first positions, and a running (value, index) pair per row keeps the first chunk
holding the maximum (a later chunk replaces it only when strictly greater). Top-k / top-p sampling stays the
PyTorch sampler's (kernels/ops/sample.py)."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki
from ..ops._checks import check_float, check_rank
from .tiles import tiles

_MAX8_FMAX = 16384  # max8 reads at most 16384 elements per partition (the nki.isa.max8 page)


@jit
def argmax_kernel(logits):
    rows, vocab = logits.shape
    p = nl.tile_size.pmax
    out = nl.ndarray((rows, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    chunk = min(vocab, _MAX8_FMAX)
    for _, r0, n in tiles(rows, p):
        best = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        best_at = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)  # indices < 2**24: exact in fp32
        nisa.memset(dst=best, value=-float("inf"))
        nisa.memset(dst=best_at, value=0.0)
        for _, c0, nc in tiles(vocab, chunk):
            t = nl.ndarray((n, nc), dtype=logits.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=logits[r0:r0 + n, c0:c0 + nc])
            top = nl.ndarray((n, 8), dtype=logits.dtype, buffer=nl.sbuf)
            nisa.max8(dst=top, src=t)
            at = nl.ndarray((n, 8), dtype=nl.uint32, buffer=nl.sbuf)
            nisa.nc_find_index8(dst=at, data=t, vals=top)
            at_f = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=at_f, data=at[:, 0:1], op0=nl.add, operand0=float(c0))
            greater = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=greater, data1=top[:, 0:1], data2=best, op=nl.greater)
            nisa.tensor_copy_predicated(dst=best_at, src=at_f, predicate=greater)
            nisa.tensor_tensor(dst=best, data1=best, data2=top[:, 0:1], op=nl.maximum)
        res = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=best_at)
        nisa.dma_copy(dst=out[r0:r0 + n, :], src=res)
    return out


_argmax = wrap_nki(argmax_kernel)


@nki_op("nativelab::nki_argmax", mutates_args=())
def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The greedy token of each row of logits (B, V): int64 (B,), as logits.argmax(-1)."""
    check_rank("logits", logits, 2)
    check_float("logits", logits)
    if logits.shape[1] < 8:
        raise ValueError(f"nki_argmax: needs at least 8 logits per row (max8), got {logits.shape[1]}")
    return _argmax(logits.contiguous()).reshape(-1).to(torch.int64)
