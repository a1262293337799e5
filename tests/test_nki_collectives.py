"""The LNC-2 collectives: nisa.sendrecv and nisa.core_barrier in kernel[2] launches (each program one physical
core, nl.program_id(0) its rank), interpreted and compiled, against PyTorch references; each broken rule as
the one error naming the kernel line, the value and the limit; the cost model's two cores."""

import warnings

import pytest
import torch

from nativelab import nki
from nativelab.nki import cost
from nativelab.nki import isa as nisa
from nativelab.nki import language as nl

sim = nki.simulate


@nki.jit
def _all_reduce(x):
    """Each rank sums its half of the rows' tiles, the ranks exchange their partial sums, both add: every
    rank holds the sum of all rows' tiles (rank r stores it into row r of the output)."""
    n, p, f = x.shape
    out = nl.ndarray((2, p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    r = nl.program_id(0)
    part = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=part, value=0.0)
    for i in nl.sequential_range(n // 2):  # a running sum: carried from one tile to the next
        t = nl.load(x[r * (n // 2) + i])
        nisa.tensor_tensor(dst=part, data1=part, data2=t, op=nl.add)
    mine = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=mine, src=part)
    theirs = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - r, recv_from_rank=1 - r, pipe_id=0)
    total = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=total, data1=mine, data2=theirs, op=nl.add)
    nl.store(out[r], total)
    return out


def _all_reduce_reference(x):
    n = x.shape[0]
    halves = [x[r * (n // 2):(r + 1) * (n // 2)].float().sum(0).to(x.dtype) for r in (0, 1)]
    total = (halves[0].float() + halves[1].float()).to(x.dtype)  # both ranks add in the same order
    return torch.stack([total, (halves[1].float() + halves[0].float()).to(x.dtype)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("run", ["simulate", "compiled"])
def test_sendrecv_all_reduce_matches_pytorch(run, dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 32, 16).to(dtype)
    kernel = sim(_all_reduce)[2] if run == "simulate" else _all_reduce[2]
    ref = _all_reduce_reference(x)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    got = kernel(x.to("neuron")).cpu() if run == "compiled" else kernel(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, ref, **tol)
    if run == "compiled":  # and on CPU tensors, served by the same compiled kernel
        torch.testing.assert_close(kernel(x), ref, **tol)


@nki.jit
def _sharding_info(x):
    """nkilib's get_program_sharding_info: nl.program_ndim(), nl.num_programs(axes=0), nl.program_id(axis=0)."""
    out = nl.ndarray((2, 1, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((1, 3), dtype=nl.float32, buffer=nl.sbuf)
    r = nl.program_id(axis=0)
    for j, v in enumerate((nl.program_ndim(), nl.num_programs(axes=0), r)):
        nisa.memset(t[:, j:j + 1], float(v))
    nl.store(out[r], t)
    return out


def test_lnc2_programs_see_their_rank_and_count():
    got = sim(_sharding_info)[2](torch.zeros(1))
    torch.testing.assert_close(got, torch.tensor([[[1.0, 2.0, 0.0]], [[1.0, 2.0, 1.0]]]))


@nki.jit
def _sendrecv_slices(x):
    """attention_tkg's idiom: send one slice of a buffer into another slice of the same buffer."""
    p, f = x.shape
    out = nl.ndarray((2, p, 2 * f), dtype=x.dtype, buffer=nl.shared_hbm)
    r = nl.program_id(0)
    buf = nl.ndarray((p, 2 * f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=buf[:, nl.ds(r * f, f)], src=x)
    nisa.tensor_scalar(dst=buf[:, nl.ds(r * f, f)], data=buf[:, nl.ds(r * f, f)], op0=nl.add, operand0=float(r))
    nisa.sendrecv(src=buf[:, nl.ds(r * f, f)], dst=buf[:, nl.ds((1 - r) * f, f)], send_to_rank=1 - r,
                  recv_from_rank=1 - r, pipe_id=0, dma_engine=nisa.dma_engine.gpsimd_dma)
    nl.store(out[r], buf)
    return out


def test_sendrecv_between_slices_of_one_buffer():
    x = torch.randn(16, 8)
    got = sim(_sendrecv_slices)[2](x)
    both = torch.cat([x, x + 1], 1)
    torch.testing.assert_close(got, torch.stack([both, both]))


@nki.jit
def _swap_halves(x, barrier):
    """Rank r writes half r of a shared HBM tensor, then reads the other half (after a barrier, or not)."""
    p, f = x.shape
    h = p // 2
    shared = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    seen = nl.ndarray((2, h, f), dtype=x.dtype, buffer=nl.shared_hbm)
    r = nl.program_id(0)
    t = nl.load(x[r * h:(r + 1) * h, :])
    nl.store(shared[r * h:(r + 1) * h, :], nl.multiply(t, 2.0))
    if barrier:
        nisa.core_barrier(shared, (0, 1))
    other = nl.load(shared[(1 - r) * h:(2 - r) * h, :])
    nl.store(seen[r], other)
    return shared, seen


def test_core_barrier_makes_the_partners_write_visible():
    x = torch.randn(32, 8)
    shared, seen = sim(_swap_halves)[2](x, True)
    torch.testing.assert_close(shared, 2 * x)
    torch.testing.assert_close(seen, torch.stack([2 * x[16:], 2 * x[:16]]))


def test_without_core_barrier_rank_0_reads_before_rank_1_writes():
    x = torch.randn(32, 8)
    with pytest.warns(nki.NkiWarning, match=r"nl\.load at .*test_nki_collectives\.py:\d+: reads .* never written"):
        shared, seen = sim(_swap_halves)[2](x, False)
    torch.testing.assert_close(seen[1], 2 * x[:16])  # rank 1 runs after rank 0 wrote its half


@nki.jit
def _count_blocks_in_step(x):
    """Both cores step an SBUF block counter and meet at a barrier on it after each block (the pattern of
    nki-library's moe_cte, bwmm_shard_on_I.py: core_barrier(block_idx, (0, 1)) on an SBUF tile)."""
    r = nl.program_id(0)
    out = nl.ndarray((2, 1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    block = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(block, value=0.0)
    for _ in range(x.shape[0]):
        nisa.tensor_scalar(dst=block, data=block, op0=nl.add, operand0=1.0)
        nisa.core_barrier(block, (0, 1))
    nl.store(out[r], block)
    return out


def test_core_barrier_on_an_sbuf_tile_synchronizes_and_anything_but_a_tensor_is_an_error():
    out = sim(_count_blocks_in_step)[2](torch.zeros(3, 1))
    torch.testing.assert_close(out, torch.full((2, 1, 1), 3.0))  # each core's own counter, 3 blocks

    @nki.jit
    def no_tensor(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        nisa.core_barrier(None, (0, 1))
        return out

    with pytest.raises(nki.NkiError, match=r"data must be the tensor the cores synchronize on"):
        sim(no_tensor)[2](torch.zeros(2, 2))


@nki.jit
def _one_core_barrier(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    nisa.core_barrier(out, (0))  # nkilib's call with one shard: waits for nobody
    return out


def test_one_core_barrier_in_a_one_program_launch_does_nothing():
    x = torch.randn(8, 8)
    torch.testing.assert_close(sim(_one_core_barrier)(x), x)


@nki.jit
def _exchange(x, send=None, recv=None, free=None, dtype=None, pipe=0, skip_rank=None, engine=None,
              cores=(0, 1), barrier_rank=None):
    p, f = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    r = nl.program_id(0)
    t = nl.load(x)
    got = nl.ndarray((p, free or f), dtype=dtype or x.dtype, buffer=nl.sbuf)
    if barrier_rank is not None and r == barrier_rank:
        nisa.core_barrier(out, cores)
    if r != skip_rank:
        nisa.sendrecv(src=t, dst=got, send_to_rank=1 - r if send is None else send,
                      recv_from_rank=1 - r if recv is None else recv, pipe_id=pipe if r == 0 else 0,
                      dma_engine=engine or nisa.dma_engine.dma)
    nl.store(out, t)
    return out


def _line(fn, text):
    import inspect
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("kwargs, grid, pattern", [
    (dict(send=2), 2, r"sendrecv at {file}:{sr}: send_to_rank is 2; the ranks of an LNC-2 launch are 0 or 1"),
    (dict(recv=-1), 2, r"sendrecv at {file}:{sr}: recv_from_rank is -1; the ranks of an LNC-2 launch are 0 or 1"),
    (dict(free=4), 2, r"sendrecv at {file}:{sr}: src \(16, 8\) and dst \(16, 4\) must have the same partition "
                      r"size and elements per partition \(16 x 8 vs 16 x 4\)"),
    (dict(dtype=nl.bfloat16), 2, r"sendrecv at {file}:{sr}: src is torch.float32 and dst is torch.bfloat16"),
    ({}, 1, r"sendrecv at {file}:{sr}: needs an LNC-2 launch: two programs, .*; this launch has 1 program "
            r"\(grid \(1,\)\)"),
    ({}, 4, r"sendrecv at {file}:{sr}: needs an LNC-2 launch: .*; this launch has 4 programs \(grid \(4,\)\)"),
    (dict(skip_rank=1), 2, r"sendrecv \(pipe 0\) at {file}:{sr}: rank 0's 1st sendrecv \(pipe 0\) has no "
                           r"partner: rank 1 finished after 0 of them"),
    (dict(pipe=3), 2, r"sendrecv \(pipe 3\) at {file}:{sr}: the two programs' collectives do not pair up: rank 0 "
                      r"waits at its 1st sendrecv \(pipe 3\) .* while rank 1 waits at its 1st sendrecv \(pipe 0\)"),
    (dict(barrier_rank=0), 2, r"core_barrier at {file}:{cb}: the two programs' collectives do not pair up: rank 0 "
                              r"waits at its 1st core_barrier .* while rank 1 waits at its 1st sendrecv"),
    (dict(barrier_rank=0, skip_rank=0), 1, r"core_barrier at {file}:{cb}: cores \(0, 1\) are the two cores of an "
                                           r"LNC-2 launch \(kernel\[2\]\); this launch has 1 program"),
    (dict(barrier_rank=0, cores=0), 2, r"core_barrier at {file}:{cb}: cores \(0,\): an LNC-2 launch synchronizes "
                                       r"cores=\(0, 1\)"),
    (dict(barrier_rank=0, cores=(0, 2)), 2, r"core_barrier at {file}:{cb}: cores \(0, 2\): only cores \(0, 1\)"),
])
def test_collective_errors_name_line_value_and_limit(kwargs, grid, pattern):
    file = r".*test_nki_collectives\.py"
    pattern = pattern.format(file=file, sr=_line(_exchange.fn, "nisa.sendrecv("),
                             cb=_line(_exchange.fn, "nisa.core_barrier("))
    with pytest.raises(nki.NkiError, match=pattern):
        sim(_exchange)[grid](torch.randn(16, 8), **kwargs)


def test_gpsimd_dma_limits_bytes_per_partition_and_partitions():
    line = _line(_exchange.fn, "nisa.sendrecv(")
    with pytest.raises(nki.NkiError, match=rf"sendrecv at .*:{line}: with dma_engine.gpsimd_dma a partition moves "
                                           rf"at most 1024 B of a 32-bit type .* src \(16, 300\) has 1200 B"):
        sim(_exchange)[2](torch.randn(16, 300), engine=nisa.dma_engine.gpsimd_dma)
    sim(_exchange)[2](torch.randn(16, 256), engine=nisa.dma_engine.gpsimd_dma)  # 1024 B: allowed
    with pytest.raises(nki.NkiError, match=rf"sendrecv at .*:{line}: with dma_engine.gpsimd_dma the tiles span a "
                                           rf"multiple of 16 partitions .* src \(24, 8\) has 24: pad it"):
        sim(_exchange)[2](torch.randn(24, 8), engine=nisa.dma_engine.gpsimd_dma)
    sim(_exchange)[2](torch.randn(24, 8))  # the DMA queues take any partition count


def test_lnc2_estimate_runs_the_two_cores_in_parallel_and_syncs_at_sendrecv():
    x = torch.randn(4, 32, 16)
    est = _all_reduce[2].estimate(x)
    assert est.cores == 2 and "2 NeuronCore-v3 (LNC-2)" in est.summary()
    ev = [(e, c) for e, c in zip(est.events, est.event_cores)]
    sends = [(e, c) for e, c in ev if e[0] == "sendrecv"]
    assert sorted(c for _, c in sends) == [0, 1]
    (a, _), (b, _) = sends
    assert (a[2], a[3]) == (b[2], b[3])  # both start when both are there, and end together
    nbytes = 32 * 16 * 4
    assert a[3] - a[2] == pytest.approx(nbytes / (cost.HBM_BYTES_PER_S / cost.CORES_PER_CHIP) + cost.DMA_FIXED_S)
    for core in (0, 1):  # each core's final add reads what it received: it starts after the exchange
        final_add = [e for e, c in ev if c == core and e[0] == "tensor_tensor"][-1]
        assert final_add[2] >= a[3]
    # the same work on one core, as two programs' worth in one: two cores take less than one doing both
    assert est.seconds < sum(end - start for _, _, start, end, _ in est.events)
    gpsimd = _sendrecv_slices[2].estimate(torch.randn(16, 8))  # on GpSimd's DMA: its lane, the same cost
    (g, _), = [(e, c) for e, c in zip(gpsimd.events, gpsimd.event_cores) if e[0] == "sendrecv" and c == 0]
    assert g[1] == "gpsimd"
    assert g[3] - g[2] == pytest.approx(16 * 8 * 4 / (cost.HBM_BYTES_PER_S / cost.CORES_PER_CHIP) + cost.DMA_FIXED_S)
    trace = est.chrome_trace()
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}
