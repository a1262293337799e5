"""Access patterns that move by offsets read at run time (.ap's scalar_offset / vector_offset: the gathers
and scatters of AWS's "NKI Access Patterns" guide) and nisa.dma_compute (the DMA engines' sum, and its
read-modify-write through such a view), against PyTorch indexing of the same tensors, interpreted on CPU and
neuron tensors and compiled; their errors name the line; the cost model orders a DMA after its offsets."""

import inspect
import warnings

import pytest
import torch

from nativelab import nki
from nativelab.nki import isa as nisa
from nativelab.nki import language as nl

sim = nki.simulate


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn.fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


@nki.jit
def _gather(a, rows):
    """Row rows[p] of a into partition p (a vector offset), then those rows scaled back into a copy of a."""
    n, f = rows.shape[0], a.shape[1]
    idx = nl.load(rows)
    got = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=got, src=a.ap([[f, n], [1, f]], 0, vector_offset=idx, indirect_dim=0))
    out = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=got)
    return out


@nki.jit
def _scatter_add(a, rows, upd):
    """A copy of a with upd added into rows `rows` (dma_compute's scatter read-modify-write)."""
    n, f = upd.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a)
    idx, u = nl.load(rows), nl.load(upd)
    target = out.ap([[f, n], [1, f]], 0, vector_offset=idx, indirect_dim=0)
    nisa.dma_compute(dst=target, srcs=[target, u], reduce_op=nl.add)
    return out


@nki.jit
def _window(k, start):
    """k[b, start : start + 16, :] for each batch b: a scalar offset along dim 1 (attention's KV window)."""
    b, s, d = k.shape
    at = nl.load(start)
    out = nl.ndarray((b, 16, d), dtype=k.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(b):
        t = nl.ndarray((16, d), dtype=k.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=k.ap([[d, 16], [1, d]], offset=i * s * d, scalar_offset=at, indirect_dim=1))
        nisa.dma_copy(dst=out[i], src=t)
    return out


@nki.jit
def _window_of_reshape(k4, start):
    """The window of _window through a reshape (b, 1, s, d) -> (b, s, d): indirect_dim 1 is the reshape's
    dimension 1 (positions), not the allocation's (its one head), as nki-library's KV-cache update writes it."""
    b, _, s, d = k4.shape
    k = k4.reshape((b, s, d))
    at = nl.load(start)
    out = nl.ndarray((b, 16, d), dtype=k4.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(b):
        t = nl.ndarray((16, d), dtype=k4.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=k.ap([[d, 16], [1, d]], offset=i * s * d, scalar_offset=at, indirect_dim=1))
        nisa.dma_copy(dst=out[i], src=t)
    return out


def test_a_scalar_offset_moves_along_the_dimension_of_the_view_it_is_taken_of():
    k = torch.randn(2, 1, 50, 8)
    start = torch.tensor([[21]], dtype=torch.int32)
    assert torch.equal(sim(_window_of_reshape)(k, start), k[:, 0, 21:37])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_a_vector_offset_gathers_rows_and_a_scalar_offset_moves_the_window(dtype, device):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(40, 24, generator=g).to(dtype)
    rows = torch.tensor([[7], [0], [39], [7], [12]], dtype=torch.int32)
    got = sim(_gather)(a.to(device), rows.to(device)).cpu()
    assert torch.equal(got, a[rows[:, 0].long()])
    k = torch.randn(3, 50, 8, generator=g).to(dtype)
    start = torch.tensor([[21]], dtype=torch.int32)
    assert torch.equal(sim(_window)(k.to(device), start.to(device)).cpu(), k[:, 21:37])


def test_dma_compute_scatter_adds_rows_in_fp32_and_sums_sources():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(32, 16, generator=g).to(torch.bfloat16)
    rows = torch.tensor([[3], [30], [9]], dtype=torch.int32)
    upd = torch.randn(3, 16, generator=g).to(torch.bfloat16)
    ref = a.clone()
    ref[rows[:, 0].long()] = (a[rows[:, 0].long()].float() + upd.float()).to(torch.bfloat16)  # one rounding
    assert torch.equal(sim(_scatter_add)(a, rows, upd), ref)
    assert torch.equal(_scatter_add(a, rows, upd), ref)  # compiled: the gather, the sum, the scatter


@nki.jit
def _sum3(x, y, z):
    out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_compute(out, [x, y, z], nl.add)
    return out


def test_dma_compute_sums_in_fp32_and_rounds_once():
    x = torch.full((4, 8), 1.0)
    y = torch.full((4, 8), 3 * 2.0 ** -10)  # rounded after each add: bf16(1 + 3 2^-10) = 1, twice; once: 1 + 2^-7
    ref = (x + y + y).to(torch.bfloat16)
    assert torch.equal(sim(_sum3)(x, y, y), ref) and ref[0, 0].item() == 1.0078125


@nki.jit
def _two_rows(a, rows):
    idx = nl.load(rows)
    t = nl.ndarray((2, 8), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.ap([[8, 2], [1, 8]], 0, vector_offset=idx, indirect_dim=0))  # LIMIT
    return a


@nki.jit
def _too_many_sources(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_compute(out, [x] * 17, nl.add)  # LIMIT
    return out


@pytest.mark.parametrize("kernel,args,expected", [
    (_two_rows, (torch.zeros(4, 8), torch.tensor([[1], [4]], dtype=torch.int32)),
     ["runtime offsets [1, 4]", "element 39", "of 32 elements (out of bounds", "oob_mode.skip"]),
    (_two_rows, (torch.zeros(4, 8), torch.tensor([[1], [2], [3]], dtype=torch.int32)),
     ["vector_offset (3, 1)", "one offset per index of the pattern's first dimension (2, 1)"]),
    (_too_many_sources, (torch.zeros(2, 2),), ["dma_compute", "1 to 16 source tensors, got 17"]),
])
def test_runtime_offset_and_dma_compute_errors_name_the_line(kernel, args, expected):
    with pytest.raises(nki.NkiError) as e:
        sim(kernel)(*args)
    wanted = [f"test_nki_indirect.py:{_line_of(kernel, '# LIMIT')}", *expected]
    assert [w for w in wanted if w not in str(e.value)] == [], str(e.value)


@nki.jit
def _computed_rows(a):
    idx = nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(idx, [[1, 1]], 0, 2)  # rows 0, 2, 4, 6
    got = nl.ndarray((4, 64), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=got, src=a.ap([[64, 4], [1, 64]], 0, vector_offset=idx, indirect_dim=0))
    out = nl.ndarray((4, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=got)
    return out


def test_a_gather_waits_for_its_offsets_and_dma_compute_moves_every_source():
    """The cost model: the gathering DMA starts when the iota that computed its offsets ends; dma_compute's
    bytes are its sources' (each streamed through the engine) at a core's share of 2.9 TB/s."""
    a = torch.arange(8 * 64, dtype=torch.float32).reshape(8, 64)
    assert torch.equal(sim(_computed_rows)(a), a[[0, 2, 4, 6]])
    events = _computed_rows.estimate(a).events
    (_, _, _, iota_end, _), (name, _, dma_start, _, _) = events[0], events[1]
    assert events[0][0] == "iota" and name == "dma_copy" and dma_start >= iota_end > 0
    est = _sum3.estimate(torch.empty(128, 64), torch.empty(128, 64), torch.empty(128, 64))
    assert est.busy["dma"] == pytest.approx(3 * 128 * 64 * 4 / (2.9e12 / 8))


@nki.jit
def _selects(a, k, at):
    """a.vector_select(0, rows) and k.select(1, <runtime index>), and the index through a register."""
    rows = nl.load(at)
    got = nl.ndarray((2, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=got, src=a.vector_select(0, rows))
    one = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=one, src=at[1:2, :])
    col = nl.ndarray((k.shape[0], k.shape[2]), dtype=k.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=col, src=k.select(1, one))
    reg = nisa.register_alloc(one)
    col2 = nl.ndarray((k.shape[0], k.shape[2]), dtype=k.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=col2, src=k.ap([[k.shape[1] * k.shape[2], k.shape[0]], [1, k.shape[2]]], 0,
                                     scalar_offset=reg, indirect_dim=1))
    back = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(back, reg)
    outs = [nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm) for t in (got, col, col2, back)]
    for o, t in zip(outs, (got, col, col2, back)):
        nisa.dma_copy(dst=o, src=t)
    assert a.vector_select(0, rows).is_indirect() and not a.select(0, 1).is_indirect()
    return tuple(outs)


def test_select_vector_select_and_a_register_as_runtime_offset():
    g = torch.Generator().manual_seed(2)
    a, k = torch.randn(10, 6, generator=g), torch.randn(4, 9, 5, generator=g)
    at = torch.tensor([[8], [3]], dtype=torch.int32)
    got, col, col2, back = sim(_selects)(a, k, at)
    assert torch.equal(got, a[[8, 3]]) and torch.equal(col, k[:, 3]) and torch.equal(col2, k[:, 3])
    assert back.item() == 3


@nki.jit
def _register_loops(x, n, with_loaded_bound):
    """A loop bounded by a register set from an immediate is traced (unrolled); one bounded by a loaded
    register adds the loaded count at run time."""
    t = nl.load(x)
    bound = nisa.register_alloc()
    nisa.register_move(bound, 3)
    for _ in nl.dynamic_range(bound):
        t = nl.add(t, 1.0)
    if with_loaded_bound:
        loaded = nisa.register_alloc(nl.load(n))
        for _ in nl.dynamic_range(loaded):
            t = nl.add(t, 1.0)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


def test_a_register_bound_known_when_tracing_compiles_and_a_loaded_one_runs_interpreted():
    n = torch.tensor([[2]], dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nki.NkiWarning)  # compiled: no "runs interpreted" warning
        assert torch.equal(_register_loops(torch.zeros(2, 4), n, False), torch.full((2, 4), 3.0))
    with pytest.warns(nki.NkiWarning, match="runs interpreted"):
        assert torch.equal(_register_loops(torch.zeros(2, 4), n, True), torch.full((2, 4), 5.0))


@nki.jit
def _gather_skipping(a, rows, fill):
    """Rows rows[p] of a into a tile first filled with `fill`, then (oob_mode.skip) the tile's rows scattered
    back to rows rows[p] + 2 of a copy of a: rows out of bounds are skipped both ways."""
    n, f = rows.shape[0], a.shape[1]
    idx = nl.load(rows)
    got = nl.full((n, f), fill, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=got, src=a.ap([[f, n], [1, f]], 0, vector_offset=idx, indirect_dim=0),
                  oob_mode=nisa.oob_mode.skip)
    out = nl.ndarray((n, f), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=got)
    moved = nl.ndarray((n, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=moved, data=idx, op0=nl.add, operand0=2)
    back = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=back, src=a)
    nisa.dma_copy(dst=back.ap([[f, n], [1, f]], 0, vector_offset=moved, indirect_dim=0), src=got,
                  oob_mode=nisa.oob_mode.skip)
    return out, back


@pytest.mark.parametrize("run", ["interpreted", "compiled"])
def test_oob_mode_skip_leaves_out_of_bounds_rows_as_they_were(run):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(10, 8, generator=g)
    rows = torch.tensor([[3], [10], [-1], [9], [0], [40]], dtype=torch.int32)  # 10, -1, 40: outside 10 rows
    kernel = sim(_gather_skipping) if run == "interpreted" else _gather_skipping
    out, back = kernel(a, rows, 7.0)
    r = rows[:, 0].long()
    inside = (r >= 0) & (r < 10)
    want = torch.full((6, 8), 7.0)
    want[inside] = a[r[inside]]
    assert torch.equal(out, want)
    want_back = a.clone()
    dest = r + 2
    keep = (dest >= 0) & (dest < 10)  # row 9 + 2 = 11 is skipped too; -1 + 2 = 1 is written (the filled row)
    want_back[dest[keep]] = want[keep]
    assert torch.equal(back, want_back)
    with pytest.raises(nki.NkiError, match="oob_mode.skip"):  # the default mode: an error, as before
        sim(_gather)(a, rows)


@nki.jit
def _scatter_add_repeated(a, rows, upd, via_copy=False):
    """index_add through dma_compute(unique_indices=False), or dma_copy(dst_rmw_op=nl.add)."""
    n, f = upd.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a)
    idx, u = nl.load(rows), nl.load(upd)
    target = out.ap([[f, n], [1, f]], 0, vector_offset=idx, indirect_dim=0)
    if via_copy:
        nisa.dma_copy(dst=target, src=u, dst_rmw_op=nl.add)
    else:
        nisa.dma_compute(dst=target, srcs=[target, u], reduce_op=nl.add, unique_indices=False)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dma_compute_with_repeated_indices_adds_every_update_like_index_add(dtype):
    """unique_indices=False: row 5 gets three updates and row 0 two, each summed in fp32 and rounded once
    (values are multiples of 1/8, so every order of the fp32 sum is exact; one rounding to bf16)."""
    g = torch.Generator().manual_seed(4)
    a = (torch.randint(-2048, 2048, (8, 16), generator=g) / 8).to(dtype)  # 9+ bits: bf16 rounds the sums
    rows = torch.tensor([[5], [0], [5], [2], [5], [0]], dtype=torch.int32)
    upd = (torch.randint(-16, 16, (6, 16), generator=g) / 8).to(dtype)
    ref = a.float().clone().index_add_(0, rows[:, 0].long(), upd.float()).to(dtype)
    assert torch.equal(sim(_scatter_add_repeated)(a, rows, upd), ref)
    assert torch.equal(sim(_scatter_add_repeated)(a, rows, upd, True), ref)
    if dtype == torch.bfloat16:  # compiled (one dtype: a compile costs seconds)
        assert torch.equal(_scatter_add_repeated(a, rows, upd), ref)
