"""What the library's NKI kernels share: tiling a size into the hardware's tile sizes, moving rows of activations
onto the partitions (where the Tensor Engine contracts), and addressing a row by a position read at run time.
Weights come laid out already: layouts.py."""

from __future__ import annotations

from ...nki import isa as nisa
from ...nki import language as nl


def tiles(size: int, step: int, carried: bool = False):
    """(index, start, length) of each tile of `size` in steps of `step` (the last may be partial), as an
    nl.affine_range loop: the tiles a body allocates are live for its iteration only. carried=True: the body
    carries a value from one tile to the next (a running maximum, a sum read back): an nl.sequential_range,
    as AWS's pages require of a loop-carried dependency (nki/hazards.py)."""
    loop = nl.sequential_range if carried else nl.affine_range
    for i in loop((size + step - 1) // step):
        yield i, i * step, min(size, i * step + step) - i * step


def transpose_rows(h, p):
    """h [n, dim] (SBUF) -> h.T in 128-row tiles [p, dim tiles, n], by Tensor Engine transposes."""
    n, dim = h.shape
    h_t = nl.ndarray((p, (dim + p - 1) // p, n), dtype=h.dtype, buffer=nl.sbuf)
    for k, k0, nk in tiles(dim, p):
        transpose_into(h_t[0:nk, k, :], h[:, k0:k0 + nk])
    return h_t


def transpose_into(dst, data):
    """dst [m, n] (SBUF) = data [n, m].T: a Tensor Engine transpose into PSUM, copied out (exact)."""
    n, m = data.shape
    t_ps = nl.ndarray((m, n), dtype=data.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=t_ps, data=data)
    nisa.tensor_copy(dst=dst, src=t_ps)
    return dst


def store_spread(row, spread, n, p):
    """row [n] (HBM) = a row spread over partitions, spread [P, n / P] holding row[c * P + p] at [p, c] (the
    attention's outputs), by strided DMAs (a partial last column: its rows only)."""
    full = n // p
    if full:
        nisa.dma_copy(dst=row.ap(pattern=[[1, p], [p, full]], offset=0), src=spread[:, 0:full])
    if n % p:
        nisa.dma_copy(dst=row.ap(pattern=[[1, n % p], [1, 1]], offset=full * p), src=spread[0:n % p, full:full + 1])


def low_words(t, n: int, offset: int = 0):
    """The low 32-bit words of n int64 values of t from element `offset`: a [n, 1] int32 view (little-endian)."""
    return t.ap(pattern=[[2, n], [1, 1]], offset=2 * offset, dtype=nl.int32)


def row_at(table, at):
    """table [rows, cols] (HBM): the row at the (1, 1) int32 SBUF value `at`, as a [1, cols] view (a DMA whose
    address moves by a value read at run time)."""
    cols = table.shape[1]
    return table.ap(pattern=[[cols, 1], [1, cols]], offset=0, scalar_offset=at, indirect_dim=0)
