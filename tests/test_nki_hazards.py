"""The hazard checker (nki/hazards.py: races between nl.affine_range iterations and a grid's programs, from the
accesses a trace records) and the order check (nki.simulate(kernel, order=...), nki/order.py)."""

import inspect
import pickle
import warnings

import numpy as np
import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
from nativelab import settings
from nativelab.nki.hazards import HazardError, HazardWarning

P, F = 128, 64


def _line(fn, text: str) -> str:
    """`file:line` of the first line of fn's source holding `text`, as the checker names it."""
    lines, start = inspect.getsourcelines(fn)
    k = next(i for i, s in enumerate(lines) if text in s)
    return f":{start + k}"


def _hazards(kernel, *args) -> list:
    """The HazardWarnings a first launch of the kernel gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel(*args)
    return [w.message.hazard for w in caught if issubclass(w.category, HazardWarning)]


def _running_sum(loop):
    def kernel(x):
        out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for i in loop(4):
            t = nl.load(x[i])
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)  # the running sum
        nl.store(out, acc)
        return out
    return kernel


def _same_rows(loop):
    def kernel(x):
        out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        for i in loop(4):
            t = nl.load(x[i])
            nl.store(out, t)  # every iteration, the same rows
        return out
    return kernel


def _shift_down(loop):
    """out rows i+1 read, out rows i written (in place): iteration i+1 writes what iteration i read."""
    def kernel(buf):
        for i in loop(3):
            t = nl.load(buf[i + 1])
            nl.store(buf[i], t)  # the write
        return buf
    return kernel


def _psum_reused(loop):
    """One PSUM tile for every iteration's product, copied out: iteration i+1's matmul overwrites it."""
    def kernel(a, b):
        out = nl.ndarray((4, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        ps = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.psum)
        at = nl.load(a)
        for i in loop(4):
            bt = nl.load(b[i])
            nisa.nc_matmul(dst=ps, stationary=at, moving=bt, accumulate=False)
            res = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=ps)  # the read
            nl.store(out[i], res)
        return out
    return kernel


def test_running_sum_in_affine_range_is_a_raw_hazard_at_its_lines():
    fn = _running_sum(nl.affine_range)
    found = _hazards(nki.jit(fn), torch.randn(4, P, F))
    assert len(found) == 1
    h = found[0]
    assert h.kind == "RAW" and set(h.also) == {"WAW", "WAR"} and h.memory == "sbuf"
    assert h.loop.startswith("nl.affine_range at") and h.loop.endswith(_line(fn, "for i in loop"))
    assert h.first[0] == h.second[0] == "tensor_tensor" and h.first[1].endswith(_line(fn, "the running sum"))
    assert (h.first[2], h.second[2]) == (0, 1) and h.site.endswith(_line(fn, "acc = nl.ndarray"))
    assert "RAW" in h.message() and h.loop in h.message()


def test_stores_to_the_same_rows_are_a_waw_hazard_in_hbm():
    fn = _same_rows(nl.affine_range)
    (h,) = _hazards(nki.jit(fn), torch.randn(4, P, F))
    assert h.kind == "WAW" and h.also == () and h.memory == "shared_hbm"
    assert h.first[0] == "nl.store" and h.first[1].endswith(_line(fn, "the same rows"))
    assert h.loop.endswith(_line(fn, "for i in loop"))


def test_a_write_of_what_another_iteration_read_is_a_war_hazard():
    fn = _shift_down(nl.affine_range)
    (h,) = _hazards(nki.jit(fn), torch.randn(4, P, F))
    assert h.kind == "WAR" and h.also == () and h.memory == "hbm"  # a kernel argument
    assert h.first[0] == "nl.load" and h.second[0] == "nl.store" and h.second[1].endswith(_line(fn, "the write"))
    assert (h.first[2], h.second[2]) == (0, 1)


def test_a_psum_tile_reused_across_iterations_is_a_hazard_but_its_matmuls_are_not():
    fn = _psum_reused(nl.affine_range)
    (h,) = _hazards(nki.jit(fn), torch.randn(P, P), torch.randn(4, P, F))
    assert h.kind == "RAW" and h.also == ("WAR",) and h.memory == "psum"  # no WAW: matmuls into one tile
    assert (h.first[0], h.second[0]) == ("nc_matmul", "tensor_copy") and h.second[1].endswith(_line(fn, "the read"))


@pytest.mark.parametrize("loop", [nl.sequential_range, nl.static_range, range])
@pytest.mark.parametrize("make", [_running_sum, _same_rows, _shift_down])
def test_sequential_static_and_python_loops_are_never_reported(loop, make):
    assert _hazards(nki.jit(make(loop)), torch.randn(4, P, F)) == []


def test_the_sequential_psum_kernel_is_silent_and_equal_to_torch():
    a, b = torch.randn(P, P), torch.randn(4, P, F)
    k = nki.jit(_psum_reused(nl.sequential_range))
    assert _hazards(k, a, b) == []
    torch.testing.assert_close(k(a, b), torch.stack([a.T @ b[i] for i in range(4)]), rtol=1e-4, atol=1e-4)


@nki.jit
def _matmul_k_loop(a, b):
    """out = a.T @ b, K in 128-row tiles accumulated in one PSUM tile across an affine_range (AWS's example)."""
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    ps = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(a.shape[0] // P):
        at = nl.load(a[k * P:(k + 1) * P])
        bt = nl.load(b[k * P:(k + 1) * P])
        nisa.nc_matmul(dst=ps, stationary=at, moving=bt)
    res = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=ps)
    nl.store(out, res)
    return out


@nki.jit
def _plus_equals(a, b):
    """AWS's affine_range example #2: result_psum += nl.matmul(...) into a buffer defined outside the loop."""
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((P, F), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(a.shape[0] // P):
        acc += nl.matmul(nl.load(a[k * P:(k + 1) * P]), nl.load(b[k * P:(k + 1) * P]), transpose_x=True)
    res = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nl.store(out, res)
    return out


@nki.jit
def _rmw_rows(x):
    """out[0] += x[i] for each i, by the DMA engine's read-modify-write (dma_copy dst_rmw_op=nl.add)."""
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.shared_hbm)
    zero = nl.zeros((P, F), dtype=nl.float32, buffer=nl.sbuf)
    nl.store(out, zero)
    for i in nl.affine_range(x.shape[0]):
        t = nl.load(x[i])
        nisa.dma_copy(dst=out, src=t, dst_rmw_op=nl.add)
    return out


@nki.jit
def _fresh_tiles_and_column_blocks(x):
    """Each iteration its own tiles (allocated in the body), writing its own columns of one output: the
    columns' byte ranges overlap (row-major), their elements do not."""
    out = nl.ndarray((P, 4 * F), dtype=x.dtype, buffer=nl.shared_hbm)
    for j in nl.affine_range(4):
        t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[:, j * F:(j + 1) * F])
        u = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=2.0)
        nisa.tensor_tensor(dst=u, data1=u, data2=t, op=nl.add)  # reads and writes its own tile: no race
        nl.store(out[:, j * F:(j + 1) * F], u)
    return out


def test_allowed_accumulations_and_fresh_tiles_are_silent_and_right():
    a, b, x = torch.randn(4 * P, P), torch.randn(4 * P, F), torch.randn(3, P, F)
    for kernel, args, want in ((_matmul_k_loop, (a, b), a.T @ b), (_plus_equals, (a, b), a.T @ b),
                               (_rmw_rows, (x,), x.sum(0))):
        assert _hazards(kernel, *args) == [], kernel.name
        torch.testing.assert_close(kernel(*args), want, rtol=1e-4, atol=1e-4)
    y = torch.randn(P, 4 * F)
    assert _hazards(_fresh_tiles_and_column_blocks, y) == []
    torch.testing.assert_close(_fresh_tiles_and_column_blocks(y), 3 * y)


@nki.jit
def _grid_store(x, own: bool):
    out = nl.ndarray((4, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    t = nl.load(x[i])
    nl.store(out[i] if own else out[0], t)
    return out


def test_programs_of_a_grid_writing_the_same_rows_race():
    x = torch.randn(4, P, F)
    (h,) = _hazards(_grid_store[4], x, False)
    assert h.kind == "WAW" and h.loop == "the launch grid (4,)" and (h.first[2], h.second[2]) == (0, 1)
    assert "program 0's nl.store" in h.message()
    assert _hazards(_grid_store[4], x, True) == []


@nki.jit
def _lnc2_handoff(x, barrier: bool):
    """Rank 0 writes a shared scratch tensor that rank 1 reads: ordered by a core_barrier, else a race."""
    out = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    scratch = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    rank = nl.program_id(0)
    if rank == 0:
        nl.store(scratch, nl.load(x))
    if barrier:
        nisa.core_barrier(scratch, (0, 1))
    if rank == 1:
        nl.store(out, nl.load(scratch))
    return out


def test_an_lnc2_handoff_races_unless_a_barrier_orders_it():
    x = torch.randn(P, F)
    (h,) = _hazards(_lnc2_handoff[2], x, False)
    assert h.kind == "RAW" and h.loop == "the launch grid (2,)" and (h.first[2], h.second[2]) == (0, 1)
    assert _hazards(_lnc2_handoff[2], x, True) == []
    torch.testing.assert_close(_lnc2_handoff[2](x, True), x)


def test_strict_mode_raises_every_hazard_as_one_error():
    x = torch.randn(4, P, F)
    with pytest.raises(HazardError, match=r"RAW hazard .* tensor_tensor") as err:
        nki.jit(_running_sum(nl.affine_range), check="hazards-strict")(x)
    assert [h.kind for h in err.value.hazards] == ["RAW"]
    with settings.NKI_HAZARDS.set("strict"), pytest.raises(HazardError, match="WAW hazard"):
        nki.jit(_same_rows(nl.affine_range))(x)
    with settings.NKI_HAZARDS.set("off"):
        assert _hazards(nki.jit(_same_rows(nl.affine_range)), x) == []
    with pytest.raises(ValueError, match="check must be"):
        nki.jit(_same_rows(nl.affine_range), check="races")(x)


def test_hazard_and_order_errors_survive_pickling_with_their_message():
    # pytest-xdist and multiprocessing rebuild warnings and errors from their message alone (CI broke on it).
    x = torch.randn(4, P, F)
    with pytest.warns(HazardWarning) as caught:
        nki.jit(_same_rows(nl.affine_range), check="hazards")(x)
    with pytest.raises(HazardError) as err:
        nki.jit(_same_rows(nl.affine_range), check="hazards-strict")(x)
    with pytest.raises(nki.OrderError) as order:
        nki.simulate(nki.jit(_same_rows(nl.affine_range), check="off"), order="reverse")(x)
    for e in (caught[0].message, err.value, order.value):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e) and str(e)


def test_kernel_hazards_lists_them_without_a_launch():
    k = nki.jit(_same_rows(nl.affine_range))
    with settings.NKI_HAZARDS.set("off"):
        assert [h.kind for h in k.hazards(torch.randn(4, P, F))] == ["WAW"]
    assert _matmul_k_loop.hazards(torch.randn(2 * P, P), torch.randn(2 * P, F)) == []


def test_kernel_hazards_takes_numpy_arrays_as_a_launch_does():
    """Standalone NKI passes NumPy arrays (AWS's nki.simulate quick start); hazards() takes what a launch takes."""
    x = np.random.rand(4, P, F).astype(np.float32)
    assert [h.kind for h in nki.jit(_same_rows(nl.affine_range)).hazards(x)] == ["WAW"]
    assert nki.jit(_same_rows(nl.sequential_range)).hazards(x) == []


def test_the_order_check_finds_a_planted_race_and_the_loop_it_traces_to():
    fn = _same_rows(nl.affine_range)
    x = torch.randn(4, P, F)
    with pytest.raises(nki.OrderError, match="order check") as err:
        nki.simulate(nki.jit(fn, check="off"), order="reverse")(x)
    e = err.value
    assert e.output == "output 0" and e.index == (0, 0) and e.loop.endswith(_line(fn, "for i in loop"))
    assert e.expected == x[3, 0, 0].item() and e.got == x[0, 0, 0].item()  # the last iteration's store wins
    with pytest.raises(nki.OrderError):
        nki.simulate(nki.jit(fn, check="off"), order="shuffle", seed=1)(x)


def test_the_order_check_passes_race_free_kernels_and_allowed_accumulations():
    y = torch.randn(P, 4 * F)
    for order in ("reverse", "shuffle"):
        torch.testing.assert_close(nki.simulate(_fresh_tiles_and_column_blocks, order=order)(y), 3 * y)
    a, b = torch.randn(8 * P, P), torch.randn(8 * P, F)
    got = nki.simulate(_matmul_k_loop, order="reverse")(a, b)  # reordered fp32 sums: not a difference
    assert torch.equal(got, nki.simulate(_matmul_k_loop)(a, b))
    x = torch.randn(4, P, F)
    torch.testing.assert_close(nki.simulate(_grid_store[4], order="reverse")(x, True), x)
    with pytest.raises(nki.OrderError, match="launch grid"):
        nki.simulate(_grid_store[4], order="reverse")(x, False)
    with pytest.raises(ValueError, match="order must be"):
        nki.simulate(_grid_store, order="backwards")


@nki.jit
def _tiles_kept_in_a_list(x):
    """Each iteration loads a tile into a Python list that a later loop reads (AWS's matmul tutorials): in
    another order the list would hold other tiles, which the chip (the trace runs in order) never does."""
    out = nl.ndarray((4, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    kept = []
    for i in nl.affine_range(4):
        t = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i])
        kept.append(t)
    for i in nl.affine_range(4):
        nl.store(out[i], kept[i])
    return out


def test_the_order_check_keeps_loops_whose_tiles_outlive_their_iteration_in_order():
    x = torch.randn(4, P, F)
    assert _hazards(_tiles_kept_in_a_list, x) == []
    with pytest.warns(nki.NkiWarning, match="used after their iteration"):
        got = nki.simulate(_tiles_kept_in_a_list, order="reverse")(x)
    torch.testing.assert_close(got, x)
