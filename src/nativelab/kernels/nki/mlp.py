"""The SwiGLU MLP in NKI: down(silu(x @ gate.T) * (x @ up.T)).

    x      [tokens, dim] @ HBM
    gate   [P, dim / P, I] @ HBM     gate_proj.weight laid out once (layouts.tiled / prepared), as is
    up     [P, dim / P, I] @ HBM     up_proj.weight
    down   [P, I / P, dim] @ HBM     down_proj.weight
    -> [tokens, dim]

The Tensor Engine contracts over the partition dimension, so the kernel works with the intermediate activations
transposed: for each 128-token tile, x.T arrives by DMA transpose (hidden size on partitions), each 128-row
block of the intermediate size is gate.T's block (stationary) against x.T (moving), summed over the hidden
size's tiles in PSUM, which leaves silu(a) * b with the intermediate size on partitions: exactly the
stationary operand the down projection needs, summed over the intermediate size's tiles into [tokens, 512]
PSUM banks. Each weight arrives already in that layout, in the blocks the products use first: no launch
transposes a weight. The op (`mlp`) takes nn.Linear.weight ([out, in]) and lays each weight out on its first call."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki
from ..ops.mlp import _check as check_mlp  # the same argument checks as the PyTorch kernel's
from .layouts import expect_tiled, load_tiled, prepared
from .tiles import tiles


def swiglu_transposed(xt, g_t, u_t, dim, inter, n, dtype, p):
    """act.T [p, intermediate tiles, n] = (silu(x @ gate.T) * (x @ up.T)).T from x.T [p, hidden tiles, n],
    each product rounded to dtype as the reference rounds it (projections, silu, product)."""
    act = nl.ndarray((p, (inter + p - 1) // p, n), dtype=dtype, buffer=nl.sbuf)
    for i, i0, ni in tiles(inter, p):
        a_ps = nl.ndarray((ni, n), dtype=nl.float32, buffer=nl.psum)
        b_ps = nl.ndarray((ni, n), dtype=nl.float32, buffer=nl.psum)
        for k, _, nk in tiles(dim, p):
            nisa.nc_matmul(dst=a_ps, stationary=g_t[0:nk, k, i0:i0 + ni], moving=xt[0:nk, k, :])
            nisa.nc_matmul(dst=b_ps, stationary=u_t[0:nk, k, i0:i0 + ni], moving=xt[0:nk, k, :])
        a = nl.ndarray((ni, n), dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=a, src=a_ps)
        nisa.activation(dst=a, op=nl.silu, data=a)
        b = nl.ndarray((ni, n), dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=b, src=b_ps)
        nisa.tensor_tensor(dst=act[0:ni, i, :], data1=a, data2=b, op=nl.multiply)
    return act


def down_projection(out_rows, act, d_t, dim, inter, n, dtype, p, residual=None):
    """out_rows [n, dim] (HBM) = act @ down.T (+ residual [n, dim] in SBUF), from act.T and down.T's tiles."""
    for c, c0, nc in tiles(dim, nl.tile_size.gemm_moving_fmax):
        o_ps = nl.ndarray((n, nc), dtype=nl.float32, buffer=nl.psum)
        for i, _, ni in tiles(inter, p):
            nisa.nc_matmul(dst=o_ps, stationary=act[0:ni, i, :], moving=d_t[0:ni, i, c0:c0 + nc])
        y = nl.ndarray((n, nc), dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y, src=o_ps)
        if residual is not None:
            nisa.tensor_tensor(dst=y, data1=y, data2=residual[:, c0:c0 + nc], op=nl.add)
        nisa.dma_copy(dst=out_rows[:, c0:c0 + nc], src=y)


@jit
def mlp_kernel(x, gate, up, down):
    rows, dim = x.shape
    inter = gate.shape[-1]  # checked below
    p = nl.tile_size.pmax
    expect_tiled("mlp_kernel", "gate", gate, dim, inter, "[P, dim / P, intermediate]")
    expect_tiled("mlp_kernel", "up", up, dim, inter, "[P, dim / P, intermediate]")
    expect_tiled("mlp_kernel", "down", down, inter, dim, "[P, intermediate / P, dim]")
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xt = nl.ndarray((p, (dim + p - 1) // p, rows), dtype=x.dtype, buffer=nl.sbuf)  # x.T first: the small load
    for _, r0, n in tiles(rows, p):
        for k, k0, nk in tiles(dim, p):
            nisa.dma_transpose(dst=xt[0:nk, k, r0:r0 + n], src=x[r0:r0 + n, k0:k0 + nk])
    # the weights in the order the products use them: a PSUM bank's columns of gate and up at a time
    g_t, u_t = load_tiled(gate, up, n_block=nl.tile_size.gemm_moving_fmax)
    d_t = load_tiled(down, k_block=4)
    for _, r0, n in tiles(rows, p):
        act = swiglu_transposed(xt[:, :, r0:r0 + n], g_t, u_t, dim, inter, n, x.dtype, p)
        down_projection(out[r0:r0 + n, :], act, d_t, dim, inter, n, x.dtype, p)
    return out


_mlp = wrap_nki(mlp_kernel)


@nki_op("nativelab::nki_mlp", mutates_args=())
def mlp(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor) -> torch.Tensor:
    """x [..., dim] with nn.Linear.weight's ([out, in]), each laid out for the kernel once (`prepared`)."""
    check_mlp(x, gate_w, up_w, down_w, None)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return _mlp(flat, prepared(gate_w), prepared(up_w), prepared(down_w)).reshape(x.shape)
