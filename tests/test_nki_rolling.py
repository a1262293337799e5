"""Loops kept loops in the compiled graph (nki/rolling.py): a large regular nl.affine_range /
nl.sequential_range loop is compiled as one iteration's graph called per iteration, so what is compiled does not
grow with the trip count, and every kernel still computes what nki.simulate (the interpreter, which runs every
iteration as written) computes. Where iterations differ (a last tile, Python state carried between them, a
tile used after the loop) the compile falls back to tracing them as written; the results are the reference."""

import pytest
import torch

from nativelab import nki
from nativelab.nki import language as nl
from nativelab.nki import rolling
from nativelab.nki._private import is_view_op

ROLL = 1  # any loop of MIN_TRIP or more iterations may roll, however few instructions it issues


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))


def _graph(kernel) -> torch.fx.GraphModule:
    return next(iter(kernel._traces.values())).source


def _has_loop(gm) -> bool:
    return bool(rolling.loop_bodies(gm))


def exp_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[0] // 128):
        x = nl.load(a[i * 128:(i + 1) * 128, :])
        y = nl.load(b[i * 128:(i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], nl.add(nl.exp(x), y))
    return out


def test_a_large_loop_compiles_to_one_iteration_whatever_its_trip_count():
    sizes = {}
    for tiles in (8, 24):
        a, b = torch.randn(128 * tiles, 64), torch.randn(128 * tiles, 64)
        kernel = nki.jit(exp_add, roll=ROLL)
        got = kernel(a, b)
        torch.testing.assert_close(got, torch.exp(a) + b)
        gm = _graph(kernel)
        assert _has_loop(gm)
        sizes[tiles] = len(gm.graph.nodes)
    assert sizes[8] == sizes[24]  # the rolled graph: the traced iterations and one body, at any trip count
    unrolled = nki.jit(exp_add, roll=False)
    unrolled(torch.randn(128 * 24, 64), torch.randn(128 * 24, 64))
    assert not _has_loop(_graph(unrolled)) and len(_graph(unrolled).graph.nodes) > 2 * sizes[24]


def test_the_default_keeps_a_small_loop_unrolled():
    kernel = nki.jit(exp_add)  # 8 iterations of a few nodes: Inductor compiles them fast, launches stay as they were
    kernel(torch.randn(128 * 8, 64), torch.randn(128 * 8, 64))
    assert not _has_loop(_graph(kernel))


def last_tile_doubled(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    n = a.shape[0] // 128
    for i in nl.affine_range(n):
        x = nl.load(a[i * 128:(i + 1) * 128, :])
        if i == n - 1:  # an iteration the first ones do not show
            x = nl.multiply(x, 2.0)
        nl.store(out[i * 128:(i + 1) * 128, :], x)
    return out


def test_an_iteration_unlike_the_first_ones_is_traced_as_written():
    a = torch.randn(128 * 10, 32)
    kernel = nki.jit(last_tile_doubled, roll=ROLL)
    got = kernel(a)
    want = a.clone()
    want[-128:] *= 2
    torch.testing.assert_close(got, want)
    assert _has_loop(_graph(kernel))  # iterations 3-8 rolled, the last traced


def scaled_by_position(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    scale = 1.0
    for i in nl.affine_range(a.shape[0] // 128):
        x = nl.load(a[i * 128:(i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], nl.multiply(x, scale))
        scale = scale * 1.5  # Python state carried between iterations: each iteration's immediate differs
    return out


def python_offset(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    last = nl.ndarray((128, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    row = 0
    for i in nl.affine_range(a.shape[0] // 128):
        nl.store(out[i * 128:(i + 1) * 128, :], nl.load(a[i * 128:(i + 1) * 128, :]))
        row += 128  # a Python int carried out of the loop: the store below reads the last iteration's rows
    nl.store(last, nl.load(a[row - 128:row, :]))
    return out, last


@pytest.mark.parametrize("fn", [scaled_by_position, python_offset])
def test_python_state_carried_between_iterations_is_compiled_as_written(fn):
    a = torch.randn(128 * 10, 32)
    kernel = nki.jit(fn, roll=ROLL)
    torch.testing.assert_close(kernel(a), nki.simulate(nki.jit(fn))(a))
    assert not _has_loop(_graph(kernel))


def running_sum(a, read_last: bool):
    out = nl.ndarray((128, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    acc = nl.zeros((128, a.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    last = nl.zeros((128, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    for i in nl.sequential_range(a.shape[0] // 128):
        x = nl.load(a[i * 128:(i + 1) * 128, :])
        acc[...] = nl.add(acc, nl.exp(x))  # a tile carried from one iteration to the next
        if read_last:
            last = x  # a tile of the iteration, read after the loop (the last iteration's)
    nl.store(out, nl.add(acc, last))
    return out


@pytest.mark.parametrize("read_last", [False, True])
def test_a_tile_carried_between_iterations_and_one_read_after_the_loop(read_last):
    a = torch.randn(128 * 12, 32)
    kernel = nki.jit(running_sum, roll=ROLL)
    got = kernel(a, read_last)
    want = torch.exp(a).reshape(12, 128, 32).sum(0) + (a[-128:] if read_last else 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert _has_loop(_graph(kernel)) is not read_last  # the carried tile rolls; the tile read after unrolls


def tensor_add(a, b):  # AWS's tensor_addition example's pattern: the rolled loop's body stores three tiles
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(a.shape[0] // 128):
        for n in nl.affine_range(a.shape[1] // 64):
            x = nl.load(a[m * 128:(m + 1) * 128, n * 64:(n + 1) * 64])
            y = nl.load(b[m * 128:(m + 1) * 128, n * 64:(n + 1) * 64])
            nl.store(out[m * 128:(m + 1) * 128, n * 64:(n + 1) * 64], nl.add(x, y))
    return out


def test_a_rolled_body_writes_its_tiles_in_place_without_copying_the_output():
    a, b = torch.randn(128 * 12, 192), torch.randn(128 * 12, 192)
    kernel = nki.jit(tensor_add, roll=ROLL)
    torch.testing.assert_close(kernel(a, b), a + b, rtol=0, atol=0)
    (body,) = rolling.loop_bodies(_graph(kernel))
    # nothing in an iteration is as large as the output: no copy of it carried from one iteration to the next
    sizes = [n.meta["val"].numel() for n in body.graph.nodes
             if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor) and not is_view_op(n.target)]
    assert sizes and max(sizes) <= 128 * 64
    assert sum(n.target is torch.ops.aten.copy_.default for n in body.graph.nodes) == 3


def block_prefix_sum(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out[0:128, :], nl.load(a[0:128, :]))
    for i in nl.sequential_range(1, a.shape[0] // 128):
        before = nl.load(out[(i - 1) * 128:i * 128, :])  # what the previous iteration wrote
        nl.store(out[i * 128:(i + 1) * 128, :], nl.add(before, nl.load(a[i * 128:(i + 1) * 128, :])))
    return out


def test_a_rolled_iteration_reads_what_the_one_before_wrote():
    a = torch.randn(128 * 12, 32)
    kernel = nki.jit(block_prefix_sum, roll=ROLL)
    torch.testing.assert_close(kernel(a), a.reshape(12, 128, 32).cumsum(0).reshape(-1, 32), rtol=1e-5, atol=1e-5)
    assert _has_loop(_graph(kernel))
