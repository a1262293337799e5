"""out = a + b, 128 rows at a time: the guide's Step 4 kernel, for any [rows, columns] shape."""

from __future__ import annotations

import torch

from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_nki


@jit
def add_kernel(a, b):
    rows, cols = a.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((rows + nl.tile_size.pmax - 1) // nl.tile_size.pmax):
        r0 = i * nl.tile_size.pmax
        r1 = min(rows, r0 + nl.tile_size.pmax)
        nl.store(out[r0:r1, :], nl.add(nl.load(a[r0:r1, :]), nl.load(b[r0:r1, :])))
    return out


_add = wrap_nki(add_kernel)


@nki_op("nativelab::nki_add", mutates_args=())
def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"nki_add: a and b must have one shape and dtype, got {tuple(a.shape)} {a.dtype} and "
                         f"{tuple(b.shape)} {b.dtype}")
    flat = a.reshape(-1, a.shape[-1]) if a.dim() != 1 else a.reshape(1, -1)
    return _add(flat.contiguous(), b.reshape(flat.shape).contiguous()).reshape(a.shape)
