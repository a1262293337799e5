"""Softmax over the last dimension in NKI, rows on partitions: the Vector Engine finds each row's maximum
(negated), the Scalar Engine computes exp(x - max) and its row sum in one activation, the Vector Engine
multiplies by the sum's reciprocal."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki


def reference_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


@jit
def softmax_kernel(x):
    rows, d = x.shape
    p = nl.tile_size.pmax
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((rows + p - 1) // p):
        r0 = i * p
        n = min(rows, r0 + p) - r0
        t = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + n, :])
        neg_max = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, data=t, op=nl.max, axis=1, negate=True, keepdims=True)
        e = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=t, bias=neg_max, reduce_op=nl.add, reduce_res=total)
        inv = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=total)
        y = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=e, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[r0:r0 + n, :], src=y)
    return out


_softmax = wrap_nki(softmax_kernel)


@nki_op("nativelab::nki_softmax", mutates_args=())
def softmax(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return _softmax(flat).reshape(x.shape)
