"""RMSNorm in NKI: y = x * rsqrt(mean(x^2) + eps) * weight, tokens on partitions (128 per tile), the hidden
size along the free dimension: the Scalar Engine squares and sums each row in one activation, the Vector
Engine scales by the row's rsqrt and multiplies by the weight, which one DMA broadcasts to every partition."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki


def load_broadcast(weight, n):
    """weight [d] (HBM) on each of n partitions: one DMA with partition step 0."""
    d = weight.shape[0]
    w = nl.ndarray((n, d), dtype=weight.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w, src=weight.ap(pattern=[[0, n], [1, d]]))
    return w


def rmsnorm_rows(y, t, w, eps):
    """y [n, d] = rmsnorm of the rows of t [n, d] (SBUF) with w [>= n, d] (the weight on every partition),
    rounded like the reference: x * rsqrt(mean(x^2) + eps) to x's dtype, then * w."""
    n, d = t.shape
    sq = nl.ndarray((n, d), dtype=nl.float32, buffer=nl.sbuf)
    ss = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq, op=nl.square, data=t, reduce_op=nl.add, reduce_res=ss)
    r = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=ss, op0=nl.multiply, operand0=1.0 / d, op1=nl.add, operand1=eps)
    nisa.activation(dst=r, op=nl.rsqrt, data=r)
    nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=r)
    nisa.tensor_tensor(dst=y, data1=y, data2=w[0:n, :], op=nl.multiply)
    return y


@jit
def rmsnorm_kernel(x, weight, eps):
    rows, d = x.shape
    p = nl.tile_size.pmax
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    w = load_broadcast(weight, p)
    for i in nl.affine_range((rows + p - 1) // p):
        r0 = i * p
        n = min(rows, r0 + p) - r0
        t = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0:r0 + n, :])
        y = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.sbuf)
        rmsnorm_rows(y, t, w, eps)
        nisa.dma_copy(dst=out[r0:r0 + n, :], src=y)
    return out


_rmsnorm = wrap_nki(rmsnorm_kernel)


@nki_op("nativelab::nki_rmsnorm", mutates_args=())
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"nki_rmsnorm: weight must be [{x.shape[-1]}] (x's last dimension), got {tuple(weight.shape)}")
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return _rmsnorm(flat, weight.contiguous(), float(eps)).reshape(x.shape)
