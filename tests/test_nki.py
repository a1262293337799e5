"""NKI on the emulated device: each instruction against a NumPy/PyTorch reference of its documented
semantics, each NeuronCore-v3 limit as the one error it raises, and kernels traced, compiled and launched
on neuron and CPU tensors (eagerly, through @nki_op, and under torch.compile)."""

import warnings

import numpy as np
import pytest
import torch

from nativelab import nki
from nativelab.nki import isa as nisa
from nativelab.nki import language as nl

sim = nki.simulate  # interpreted: the instruction tests need no compile


def _bf16(t):
    return t.to(torch.bfloat16)


# --- instructions (interpreted, CPU tensors)


@nki.jit
def _matmul_tile(s, m):
    out = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    st = nl.ndarray(s.shape, dtype=s.dtype, buffer=nl.sbuf)
    mv = nl.ndarray(m.shape, dtype=m.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=s)
    nisa.dma_copy(dst=mv, src=m)
    acc = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_nc_matmul_is_stationary_transposed_times_moving_in_fp32():
    torch.manual_seed(0)
    s, m = _bf16(torch.randn(128, 96)), _bf16(torch.randn(128, 512))
    got = sim(_matmul_tile)(s, m)
    assert got.dtype == torch.float32
    # bf16 x bf16 products are exact in fp32; the reference sums them in float64
    torch.testing.assert_close(got, (s.double().T @ m.double()).float(), rtol=1e-5, atol=1e-4)


@nki.jit
def _matmul_accumulate(s, m, mode):
    """Two matmuls into one PSUM tile: K split in two halves; mode picks `accumulate` for the second."""
    k = s.shape[0] // 2
    out = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(2):
        st = nl.load(s[i * k:(i + 1) * k, :])
        mv = nl.load(m[i * k:(i + 1) * k, :])
        if i == 0 or mode == "default":
            nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
        else:
            nisa.nc_matmul(dst=acc, stationary=st, moving=mv, accumulate=(mode == "true"))
    nl.store(out, nl.copy(acc))
    return out


@pytest.mark.parametrize("mode", ["default", "true", "false"])
def test_nc_matmul_accumulates_over_the_contraction_in_psum(mode):
    torch.manual_seed(0)
    s, m = torch.randn(256, 64), torch.randn(256, 128)
    got = sim(_matmul_accumulate)(s, m, mode)
    top, bottom = s[:128].T @ m[:128], s[128:].T @ m[128:]
    ref = bottom if mode == "false" else top + bottom
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@nki.jit
def _matmuls_into_ap_slots(s, m):
    """Two matmuls (default accumulate), each into its own column slot of one PSUM tile, addressed as
    nki-library's TensorView addresses them: .ap() with the tile's own dtype (which reinterprets nothing)."""
    k, f, p = s.shape[0] // 2, m.shape[1], s.shape[1]
    out = nl.ndarray((p, 2 * f), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((p, 2 * f), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(2):
        st = nl.load(s[i * k:(i + 1) * k, :])
        mv = nl.load(m[i * k:(i + 1) * k, :])
        nisa.nc_matmul(dst=acc.ap(pattern=[[2 * f, p], [1, f]], offset=i * f, dtype=nl.float32),
                       stationary=st, moving=mv)
    nl.store(out, nl.copy(acc))
    return out


@pytest.mark.parametrize("run", ["simulate", pytest.param("compiled", marks=pytest.mark.slow)])
def test_a_matmul_into_an_unwritten_slot_overwrites_it(run, tmp_path, monkeypatch):
    # the second slot was never written: the default accumulate overwrites it (it used to add to whatever
    # memory the tile started with, once the first slot's write counted as all of the tile's)
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    torch.manual_seed(0)
    s, m = torch.randn(64, 32), torch.randn(64, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nki.NkiWarning)
        got = (sim(_matmuls_into_ap_slots) if run == "simulate" else _matmuls_into_ap_slots)(s, m)
    ref = torch.cat([s[:32].T @ m[:32], s[32:].T @ m[32:]], dim=1)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@nki.jit
def _activation(x, bias, sums):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    b = nl.load(bias)
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=y, op=nl.exp, data=t, scale=0.5, bias=b, reduce_op=nl.add, reduce_res=r)
    nl.store(out, y)
    nl.store(sums, r)
    return out


def test_activation_scale_bias_and_row_sum():
    torch.manual_seed(0)
    x, bias, sums = torch.randn(64, 40), torch.randn(64, 1), torch.zeros(64, 1)
    got = sim(_activation)(x, bias, sums)
    ref = torch.exp(x * 0.5 + bias)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(sums, ref.sum(1, keepdim=True), rtol=1e-5, atol=1e-5)


@nki.jit
def _elementwise(a, b, v):
    out = nl.ndarray((4,) + a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x, y, col = nl.load(a), nl.load(b), nl.load(v)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=t, data1=x, data2=y, op=nl.maximum)
    nl.store(out[0], t)
    nisa.tensor_scalar(dst=t, data=x, op0=nl.multiply, operand0=col, op1=nl.subtract, operand1=2.0, reverse1=True)
    nl.store(out[1], t)
    nisa.scalar_tensor_tensor(dst=t, data=x, op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=y)
    nl.store(out[2], t)
    nisa.reciprocal(dst=t, data=y)
    nl.store(out[3], t)
    return out


def test_vector_engine_elementwise_instructions():
    torch.manual_seed(0)
    a, b, v = torch.randn(32, 16), torch.rand(32, 16) + 0.5, torch.randn(32, 1)
    got = sim(_elementwise)(a, b, v)
    torch.testing.assert_close(got[0], torch.maximum(a, b))
    torch.testing.assert_close(got[1], 2.0 - a * v)  # reverse1: operand1 - (data * operand0)
    torch.testing.assert_close(got[2], (a + 1.0) * b)
    torch.testing.assert_close(got[3], 1.0 / b)


@nki.jit
def _reduce_copy(x):
    out_max = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    out_sum = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    out_bf16 = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    t = nl.load(x)
    r = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=r, data=t, op=nl.max, axis=1, keepdims=True)
    nl.store(out_max, r)
    nisa.tensor_reduce(r, nl.add, t, 1, negate=True, keepdims=True)  # positional: (dst, op, data, axis)
    nl.store(out_sum, r)
    c = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=c, src=t, engine=nisa.engine.scalar)
    nl.store(out_bf16, c)
    return out_max, out_sum, out_bf16


def test_tensor_reduce_negate_and_copy_rounds_to_bf16():
    torch.manual_seed(0)
    x = torch.randn(16, 48)
    mx, sm, c = sim(_reduce_copy)(x)
    torch.testing.assert_close(mx, x.amax(1, keepdim=True))
    torch.testing.assert_close(sm, -x.sum(1, keepdim=True))
    assert c.dtype == torch.bfloat16 and torch.equal(c, x.to(torch.bfloat16))


@nki.jit
def _fill(shape_p):
    out = nl.ndarray((2, shape_p, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((shape_p, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=3.5)
    nl.store(out[0], t)
    nisa.iota(dst=t, offset=10, channel_multiplier=100, pattern=[[2, 8]])
    nl.store(out[1], t)
    return out


def test_memset_and_iota():
    got = sim(_fill)(4)
    assert torch.equal(got[0], torch.full((4, 8), 3.5))
    ref = 10 + 100 * torch.arange(4.0)[:, None] + 2 * torch.arange(8.0)[None, :]
    assert torch.equal(got[1], ref)


@nki.jit
def _transpose_and_ap(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    sub = nl.ndarray((x.shape[0], x.shape[1] // 2), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    p = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=p, data=t)
    nl.store(out, nl.copy(p))
    # every other column, through an access pattern: [[partition step, P], [2, F/2]]
    s = nl.ndarray(sub.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=s, src=t.ap(pattern=[[x.shape[1], x.shape[0]], [2, x.shape[1] // 2]], offset=1))
    nl.store(sub, s)
    return out, sub


def test_nc_transpose_and_access_pattern():
    x = torch.randn(32, 64)
    t, sub = sim(_transpose_and_ap)(x)
    assert torch.equal(t, x.T)
    assert torch.equal(sub, x[:, 1::2])


@nki.jit
def _nl_ops(a, b):
    out = nl.ndarray((3,) + a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    nl.store(out[0], nl.softmax(x, axis=1))
    nl.store(out[1], nl.exp(x) * y - 1.0)
    nl.store(out[2], nl.rms_norm(x, y, axis=1, n=a.shape[1], epsilon=1e-5))
    return out


def test_language_softmax_math_rmsnorm():
    torch.manual_seed(0)
    a, b = torch.randn(8, 32), torch.randn(8, 32)
    got = sim(_nl_ops)(a, b)
    torch.testing.assert_close(got[0], torch.softmax(a, 1))
    torch.testing.assert_close(got[1], torch.exp(a) * b - 1.0)
    torch.testing.assert_close(got[2], a * torch.rsqrt(a.pow(2).mean(1, keepdim=True) + 1e-5) * b)


@nki.jit
def _program_ids(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    rows = x.shape[0] // nl.num_programs(0)
    t = nl.load(x[i * rows:(i + 1) * rows, :])
    nl.store(out[i * rows:(i + 1) * rows, :], t + float(i))
    return out


def test_spmd_grid_program_ids():
    x = torch.randn(8, 4)
    got = sim(_program_ids)[4](x)
    torch.testing.assert_close(got, x + torch.arange(4.0).repeat_interleave(2)[:, None])


@nki.jit
def _with_defaults(x, scale=1.0, shift=0.0, negate=False):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=-scale if negate else scale, op1=nl.add,
                       operand1=shift)
    nl.store(out, r)
    return out


def test_keyword_arguments_after_skipped_defaults():
    """A keyword given past defaults left out reaches its own parameter (AWS's RoPE is called this way)."""
    x = torch.randn(4, 8)
    torch.testing.assert_close(sim(_with_defaults)(x, negate=True), -x)
    torch.testing.assert_close(sim(_with_defaults)(x, shift=2.0), x + 2.0)


@nki.jit
def _returns_a_reshape(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out.reshape((1,) + tuple(x.shape))


def test_a_kernel_may_return_a_view_of_its_output():
    x = torch.randn(4, 8)
    got = sim(_returns_a_reshape)(x)
    assert got.shape == (1, 4, 8) and torch.equal(got[0], x)


@nki.jit
def _scalar_reduce_and_fills(x):
    out = nl.ndarray((2,) + x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    row = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t = nl.load(x)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    m = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(r, data=t, op0=nl.multiply, operand0=0.5, reduce_op=nl.maximum, reduce_res=m)
    nl.store(out[0], r)
    nl.store(row, m)
    nisa.memset(dst=r, value=-1e300)  # beyond bf16's and fp32's range: saturates to -inf
    nl.store(out[1], r)
    return out, row


def test_tensor_scalar_reduce_and_out_of_range_fills():
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    out, row = sim(_scalar_reduce_and_fills)(x)
    torch.testing.assert_close(out[0], (x.float() * 0.5).to(torch.bfloat16))
    torch.testing.assert_close(row, (x.float() * 0.5).amax(1, keepdim=True))
    assert torch.all(out[1] == -torch.inf)


def test_nki_objects_take_their_class_attributes_as_fields():
    """nkilib's configuration classes: @dataclass over nl.NKIObject with unannotated defaults."""
    from dataclasses import dataclass

    @dataclass
    class Params(nl.NKIObject):
        index = None
        offset = 0

    p = Params(index=3)
    assert (p.index, p.offset) == (3, 0)


@nki.jit
def _ap_writes_and_shuffle(x):
    out = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.shared_hbm)
    shuffled = nl.ndarray((32, 8), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x[0:4, :])
    t = nl.load(x[4:6, 0:4])
    nisa.dma_copy(dst=out.ap(pattern=[[8, 4], [2, 4]], offset=1)[0:2, :], src=t)  # odd columns, rows 0-1
    s = nl.ndarray((32, 8), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=x[0:32, :])
    nisa.nc_stream_shuffle(dst=s, src=s, shuffle_mask=[3] * 16 + [255] * 16)  # rows 0-15 <- row 3
    nl.store(shuffled, s)
    return out, shuffled


@pytest.mark.parametrize("run", ["simulate", pytest.param("compiled", marks=pytest.mark.slow)])
def test_writes_through_access_patterns_and_stream_shuffle(run, tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    x = torch.randn(32, 8)
    out, shuffled = (sim(_ap_writes_and_shuffle) if run == "simulate" else _ap_writes_and_shuffle)(x)
    ref = x[0:4].clone()
    ref[0:2, 1::2] = x[4:6, 0:4]
    torch.testing.assert_close(out, ref)
    ref_s = x.clone()
    ref_s[0:16] = x[3]
    torch.testing.assert_close(shuffled, ref_s)


def test_numpy_arrays_in_and_out():
    a, b = np.random.rand(4, 8).astype(np.float32), np.random.rand(4, 8).astype(np.float32)
    got = sim(_add)(a, b)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, a + b, rtol=1e-6)


@nki.jit
def _copies_are_snapshots(x):
    """A copy of a tile is a snapshot: writing the source afterwards (in place, partly) leaves it alone."""
    out = nl.ndarray((3,) + x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    s = nl.load(x)  # SBUF copy of the input
    u = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u, src=s)  # a copy of the copy
    nisa.memset(dst=s[:, 0:2], value=7.0)  # partial write of s
    nisa.dma_copy(dst=x[:, 0:1], src=s[:, 0:1])  # and of the input itself
    nl.store(out[0], u)
    nl.store(out[1], s)
    nl.store(out[2], nl.load(x))
    return out


@pytest.mark.parametrize("run", ["simulate", pytest.param("compiled", marks=pytest.mark.slow)])
def test_copies_are_snapshots_when_the_source_is_written(run, tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    x = torch.randn(8, 4)
    arg = x.clone()
    got = (sim(_copies_are_snapshots) if run == "simulate" else _copies_are_snapshots)(arg)
    s = x.clone()
    s[:, 0:2] = 7.0
    x_after = x.clone()
    x_after[:, 0:1] = 7.0
    torch.testing.assert_close(got[0], x)
    torch.testing.assert_close(got[1], s)
    torch.testing.assert_close(got[2], x_after)
    torch.testing.assert_close(arg, x_after)  # the kernel wrote its argument


@nki.jit
def _matmul_sees_rewritten_operand(s, m):
    """A bf16 operand read by one matmul, then partly overwritten, then read by a second."""
    out = nl.ndarray((2, s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    st = nl.load(s)
    mv = nl.ndarray(m.shape, dtype=m.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mv, src=m)
    for i in nl.sequential_range(2):  # the second matmul reads the first iteration's memset: carried
        acc = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
        nl.store(out[i], nl.copy(acc))
        nisa.memset(dst=mv[0:4, :], value=1.0)
    return out


@pytest.mark.parametrize("run", ["simulate", pytest.param("compiled", marks=pytest.mark.slow)])
def test_a_matmul_operand_written_between_matmuls(run, tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    s, m = _bf16(torch.randn(16, 8)), _bf16(torch.randn(16, 32))
    got = (sim(_matmul_sees_rewritten_operand) if run == "simulate" else _matmul_sees_rewritten_operand)(s, m)
    m2 = m.clone()
    m2[0:4] = 1.0
    torch.testing.assert_close(got[0], s.float().T @ m.float())
    torch.testing.assert_close(got[1], s.float().T @ m2.float())


@nki.jit
def _masks_and_scans(x, pred, a, b):
    out = nl.ndarray((3,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    top = nl.ndarray((x.shape[0], 8), dtype=nl.float32, buffer=nl.shared_hbm)
    idx = nl.ndarray((x.shape[0], 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    row_max = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
    t, pt, at, bt = nl.load(x), nl.load(pred), nl.load(a), nl.load(b)
    r = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    # causal mask: keep column j of row p where p - j >= 0
    nisa.affine_select(dst=r, pattern=[[-1, x.shape[1]]], offset=0, channel_multiplier=1, on_true_tile=t,
                       on_false_value=-1e4, cmp_op=nl.greater_equal)
    nl.store(out[0], r)
    m = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=r, predicate=pt, on_true=t, on_false=0.0, reduce_res=m, reduce_op=nl.maximum)
    nl.store(out[1], r)
    nl.store(row_max, m)
    nisa.tensor_tensor_scan(dst=r, data0=at, data1=bt, initial=0.0, op0=nl.multiply, op1=nl.add)
    nl.store(out[2], r)
    v = nl.ndarray((x.shape[0], 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=v, src=t)
    nl.store(top, v)
    i = nl.ndarray((x.shape[0], 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=i, data=t, vals=v)
    nl.store(idx, i)
    return out, top, idx, row_max


@pytest.mark.parametrize("run", ["simulate", pytest.param("compiled", marks=pytest.mark.slow)])
def test_affine_select_select_reduce_scan_max8_find_index8(run, tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    torch.manual_seed(0)
    x = torch.randn(16, 24)
    pred = (torch.rand(16, 24) > 0.5).to(torch.int8)
    a, b = torch.rand(16, 24), torch.randn(16, 24)
    out, top, idx, row_max = (sim(_masks_and_scans) if run == "simulate" else _masks_and_scans)(x, pred, a, b)
    p, j = torch.arange(16)[:, None], torch.arange(24)[None, :]
    torch.testing.assert_close(out[0], torch.where(p - j >= 0, x, torch.tensor(-1e4)))
    sel = torch.where(pred != 0, x, torch.tensor(0.0))
    torch.testing.assert_close(out[1], sel)
    torch.testing.assert_close(row_max, sel.amax(1, keepdim=True))
    scan = torch.zeros(16, 24)
    prev = torch.zeros(16)
    for i in range(24):  # r[i] = a[i] * r[i-1] + b[i]
        prev = a[:, i] * prev + b[:, i]
        scan[:, i] = prev
    torch.testing.assert_close(out[2], scan)
    ref_top = torch.topk(x, 8, dim=1)
    torch.testing.assert_close(top, ref_top.values)
    assert torch.equal(idx.to(torch.int64), ref_top.indices)


@nki.jit
def _scan(a, b, init, op0, op1, reverse0, reverse1):
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    r = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst=r, data0=nl.load(a), data1=nl.load(b), initial=nl.load(init), op0=op0, op1=op1,
                            reverse0=reverse0, reverse1=reverse1)
    nl.store(out, r)
    return out


@pytest.mark.parametrize("op1", [nl.add, nl.subtract, nl.multiply, nl.maximum])
@pytest.mark.parametrize("op0", [nl.add, nl.subtract, nl.multiply, nl.maximum])
def test_tensor_tensor_scan_is_the_recurrence_for_every_operator_pair(op0, op1):
    """AWS's nki.isa.tensor_tensor_scan page: result[i] = (data0[i] <op0> result[i-1]) <op1> data1[i], each
    operand order reversed by reverse0 / reverse1; checked against that recurrence run in order, in float64 (the
    add / subtract / multiply pairs are composed in log2(n) steps, so their fp32 sums round in another order)."""
    torch.manual_seed(0)
    a, b = torch.rand(8, 300) * 0.5 + 0.5, torch.randn(8, 300) * 0.1
    init = torch.randn(8, 1)
    f = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "maximum": torch.maximum}
    for reverse0 in (False, True):
        for reverse1 in (False, True):
            got = sim(_scan)(a, b, init, op0, op1, reverse0, reverse1)
            prev, want = init[:, 0].double(), torch.empty(8, 300, dtype=torch.float64)
            for i in range(300):
                x = (prev, a[:, i].double()) if reverse0 else (a[:, i].double(), prev)
                y = f[op0.name](*x)
                prev = f[op1.name](*((b[:, i].double(), y) if reverse1 else (y, b[:, i].double())))
                want[:, i] = prev
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


# --- limits: one error each, naming the instruction, the kernel's line, the value and the limit


def _line_of(fn, text):
    import inspect

    lines, start = inspect.getsourcelines(fn.fn if hasattr(fn, "fn") else fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


@nki.jit
def _too_many_partitions(x):
    t = nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.sbuf)  # LIMIT
    nisa.dma_copy(dst=t, src=x)
    return x


@nki.jit
def _wide_stationary(s, m):
    st, mv = nl.load(s), nl.load(m)
    nisa.nc_matmul(st, mv)  # LIMIT
    return s


@nki.jit
def _matmul_into(s, m, buffer):
    st, mv = nl.load(s), nl.load(m)
    acc = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=buffer)
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv)  # LIMIT
    return s


@nki.jit
def _psum_banks(x):
    s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=s, value=1.0)
    tiles = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(9)]
    for p in tiles:
        nisa.nc_matmul(dst=p, stationary=s[:, 0:128], moving=s)  # LIMIT
    for p in tiles:  # read after all are written: nine banks live at once
        nisa.tensor_copy(dst=s, src=p)
    return x


@nki.jit
def _psum_tile_per_iteration(x):
    for i in nl.affine_range(9):  # one bank per iteration: the body's tiles are live for their iteration
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.memset(dst=p, value=0.0)
    return x


def test_tiles_allocated_in_a_loop_body_live_for_one_iteration():
    sim(_psum_tile_per_iteration)(torch.zeros(1))


@nki.jit
def _sbuf_capacity(x):
    a = nl.ndarray((128, 40 * 1024), dtype=nl.float32, buffer=nl.sbuf)  # 160 KiB per partition
    nisa.memset(dst=a, value=0.0)
    nisa.tensor_scalar(dst=a, data=a, op0=nl.add, operand0=1.0)
    b = nl.ndarray((128, 20 * 1024), dtype=nl.float32, buffer=nl.sbuf)  # 80 KiB more: over 224 KiB
    nisa.tensor_copy(dst=b, src=a[:, 0:20 * 1024])  # LIMIT
    nisa.tensor_copy(dst=a[:, 0:20 * 1024], src=b)  # a is still live here
    return x


@nki.jit
def _out_of_bounds(x):
    t = nl.load(x[0:128, 0:64])  # LIMIT
    return x


@pytest.mark.parametrize("kernel, args, expected", [
    (_too_many_partitions, (torch.zeros(256, 4),), ["nl.ndarray", "256 partitions", "at most 128"]),
    (_wide_stationary, (torch.zeros(64, 256), torch.zeros(64, 64)),
     ["nc_matmul", "stationary free size 256", "exceeds 128"]),
    (_matmul_into, (torch.zeros(64, 64), torch.zeros(64, 1024), nl.psum),
     ["nc_matmul", "moving free size 1024", "exceeds 512"]),
    (_matmul_into, (torch.zeros(64, 64), torch.zeros(64, 64), nl.sbuf),
     ["nc_matmul", "writes its result to PSUM", "nl.sbuf"]),
    (_psum_banks, (torch.zeros(1),), ["needs 262144 B (128 partitions x 2048 B)",
                                      "with 2097152 B already live in 8 tile(s)", "8 banks of 2048 B"]),
    (_sbuf_capacity, (torch.zeros(1),), ["needs 10485760 B (128 partitions x 81920 B)",
                                         "with 20971520 B already live", "128 partitions x 229376 B"]),
    (_out_of_bounds, (torch.zeros(64, 64),), ["indexing", "slice 0:128", "dimension 0 of size 64"]),
], ids=["partitions", "stationary", "moving", "psum-output", "psum-banks", "sbuf-capacity", "hbm-bounds"])
def test_limit_violation_is_one_error_at_the_kernel_line(kernel, args, expected):
    with pytest.raises(nki.NkiError) as e:
        kernel(*args)
    msg = str(e.value)
    assert f"test_nki.py:{_line_of(kernel, '# LIMIT')}" in msg, msg
    for part in expected:
        assert part in msg, msg


@nki.jit
def _reads_unwritten(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:2], src=x[:, 0:2])
    nisa.dma_copy(dst=out, src=t)  # LIMIT
    return out


def test_reading_an_unwritten_tile_warns_at_the_line():
    with pytest.warns(nki.NkiWarning, match=f"test_nki.py:{_line_of(_reads_unwritten, '# LIMIT')}.*never written"):
        sim(_reads_unwritten)(torch.zeros(4, 4))


@nki.jit
def _reads_unwritten_half(x, how):
    """Writes the left half of a tile through .ap() with the tile's own dtype, then reads the right half."""
    p, n = x.shape[0], x.shape[1] // 2
    out = nl.ndarray((p, n), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t.ap(pattern=[[2 * n, p], [1, n]], offset=0, dtype=x.dtype), src=x[:, 0:n])
    right = t.ap(pattern=[[2 * n, p], [1, n]], offset=n, dtype=x.dtype) if how == "ap" else t.view(x.dtype)[:, n:]
    nisa.dma_copy(dst=out, src=right)  # LIMIT
    return out


@pytest.mark.parametrize("how", ["ap", "view"])
def test_a_view_in_the_tiles_own_dtype_tracks_what_was_written(how):
    with pytest.warns(nki.NkiWarning, match=f"test_nki.py:{_line_of(_reads_unwritten_half, '# LIMIT')}.*never written"):
        sim(_reads_unwritten_half)(torch.zeros(4, 8), how)


@nki.jit
def _accumulates_into_unwritten(s, m):
    out = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=nl.load(s), moving=nl.load(m), accumulate=True)  # LIMIT
    nl.store(out, nl.copy(acc))
    return out


def test_accumulating_into_an_unwritten_tile_warns_at_the_line():
    line = _line_of(_accumulates_into_unwritten, "# LIMIT")
    with pytest.warns(nki.NkiWarning, match=f"test_nki.py:{line}: accumulates into .* never written"):
        sim(_accumulates_into_unwritten)(torch.zeros(8, 4), torch.zeros(8, 4))


# --- compiled kernels: eager on neuron and CPU, through @nki_op, and under torch.compile


@nki.jit
def _add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_compiled_kernel_on_device_and_cpu(device, tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    a, b = torch.randn(128, 32), torch.randn(128, 32)
    got = _add(a.to(device), b.to(device))
    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), a + b)
    got = _matmul_tile(_bf16(a[:, :16]).to(device), _bf16(b).to(device))  # a second signature
    torch.testing.assert_close(got.cpu(), _bf16(a[:, :16]).float().T @ _bf16(b).float(), rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_a_launch_is_a_device_kernel_no_fallback(tmp_path, monkeypatch):
    """Op tracking sees an NKI launch as one kernel on the device, and nothing falls back to the CPU."""
    import nativelab

    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    a = torch.randn(128, 16).to("neuron")
    nativelab.clear_op_tracking()
    _add(a, a)
    torch.neuron.synchronize()
    assert "kernel:_add" in nativelab.get_executed_ops()
    assert nativelab.get_fallback_ops() == []


@pytest.mark.slow
def test_nki_op_eager_and_compiled(tmp_path, monkeypatch):
    """An NKI kernel behind wrap_nki + @nki_op: eager on the device, and inside torch.compile(backend="neuron")."""
    from nativelab.kernels import nki_op, wrap_nki
    from nativelab.kernels.nki import rmsnorm_kernel
    from nativelab.kernels.ops import reference_rmsnorm

    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    kernel = wrap_nki(rmsnorm_kernel)
    assert kernel is rmsnorm_kernel

    @nki_op("nki_test::rmsnorm", mutates_args=())
    def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return kernel(x, w, 1e-5)

    torch.manual_seed(0)
    x, w = torch.randn(200, 64), torch.randn(64)
    ref = reference_rmsnorm(x, w, 1e-5)
    xd, wd = x.to("neuron"), w.to("neuron")
    torch.testing.assert_close(rmsnorm(xd, wd).cpu(), ref, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(lambda x, w: rmsnorm(x, w) * 2.0, backend="neuron")
    torch.testing.assert_close(compiled(xd, wd).cpu(), ref * 2.0, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_lab1_step4_prints_the_guides_two_lines():
    import pathlib
    import subprocess
    import sys

    script = pathlib.Path(__file__).parent.parent / "labs" / "lab1" / "nki_integration.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Eager mode - NKI add result shape: torch.Size([128]), device: neuron:0" in r.stdout
    assert "Compiled mode - NKI add result shape: torch.Size([128]), device: neuron:0" in r.stdout


def test_import_nki_is_nativelabs_stand_in():
    """`import nki`, `nki.language`, `nki.isa` resolve to nativelab.nki where AWS's nki is absent."""
    import nki as stand_in
    import nki.isa as stand_in_isa
    import nki.language as stand_in_nl

    from nativelab import stand_ins

    assert stand_ins.is_stand_in(stand_in) and stand_in.jit is nki.jit
    assert stand_in_nl.ndarray is nl.ndarray and stand_in_nl.tile_size.pmax == 128
    assert stand_in_isa.nc_matmul is nisa.nc_matmul
    from nki.isa.constants import dge_mode, oob_mode  # nkilib's imports

    assert dge_mode.hwdge is not None and oob_mode.error and isinstance(stand_in_nl.bfloat16, stand_in.dtype)
    assert stand_in_isa.dma_engine.gpsimd_dma
    x = torch.randn(4, 8)
    torch.testing.assert_close(stand_in.simulate(_add)(x, x), 2 * x)


def test_aws_nki_wins_where_installed(tmp_path):
    from conftest import run_python

    (tmp_path / "nki").mkdir()
    (tmp_path / "nki" / "__init__.py").write_text("REAL = True\n")
    import os

    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = run_python("import torch, nativelab, nki\nprint(nki.REAL)", env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True"]


# --- the cost model


def test_estimate_of_one_matmul_follows_the_published_rates(tmp_path):
    """One 128x128 @ 128x512 nc_matmul: max(N, 64) TensorE cycles at 2.4 GHz in bf16, 4x in fp32; DMAs at
    the core's share of 2.9 TB/s plus 600 ns each; each instruction waits for the ones whose output it reads."""
    from nativelab.nki import cost

    bf16 = _matmul_tile.estimate(torch.empty(128, 128, dtype=torch.bfloat16), torch.empty(128, 512, dtype=torch.bfloat16))
    fp32 = _matmul_tile.estimate(torch.empty(128, 128), torch.empty(128, 512))
    assert bf16.busy["tensor"] == pytest.approx(512 / 2.4e9)
    assert fp32.busy["tensor"] == pytest.approx(4 * 512 / 2.4e9)
    loaded = (128 * 128 + 128 * 512) * 2 + 128 * 512 * 4  # two bf16 loads and the fp32 store
    assert bf16.busy["dma"] == pytest.approx(loaded / (2.9e12 / 8))
    (_, _, s1, e1, _), (_, _, s2, e2, _), (_, _, sm, em, _), (_, _, sc, ec, _), (_, _, ss, es, _) = bf16.events
    assert s2 == pytest.approx(s1 + (128 * 128 * 2) / (2.9e12 / 8))  # the DMA lane is free once the bytes moved
    assert sm == pytest.approx(max(e1, e2)) and sc == pytest.approx(em) and ss == pytest.approx(ec)
    assert e1 - s1 == pytest.approx(128 * 128 * 2 / (2.9e12 / 8) + 600e-9)  # ... its result 600 ns later
    assert bf16.seconds == pytest.approx(es)
    assert bf16.bound == "dma" and "est. trn2" in bf16.summary()
    path = tmp_path / "trace.json"
    bf16.save_trace(path)
    import json

    events = json.loads(path.read_text())["traceEvents"]
    lanes = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert lanes == set(cost.ENGINES)
    assert [e["name"] for e in events if e["ph"] == "X"] == ["dma_copy", "dma_copy", "nc_matmul", "tensor_copy", "dma_copy"]



def test_the_neuroncore_v2_target_has_the_trn1_guide_figures():
    """[trn1] 'Trainium/Inferentia2 Architecture Guide for NKI': Tensor 2.8, Vector 1.12, Scalar 1.4, GpSimd
    1.4 GHz; 2 NeuronCore-v2 share 820 GB/s of HBM (16 DMA engines x 27 GiB/s = 464 GB/s per core is above its
    410 GB/s share); no Vector bf16 performance mode. NeuronCore-v3 stays the default, with [trn2]'s figures."""
    from nativelab.nki import cost

    v2, v3 = cost.NEURONCORE_V2, cost.NEURONCORE_V3
    assert (v2.tensor_ghz, v2.vector_ghz, v2.scalar_ghz, v2.gpsimd_ghz) == (2.8, 1.12, 1.4, 1.4)
    # a core's HBM share (410 GB/s) is below its 16 queues' 464 GB/s; its transfers keep the fitted 4 queues busy
    assert 820e9 / 2 < 16 * 27 * 2**30 and v2.dma_bytes_per_s == pytest.approx(4 * 27 * 2**30)
    assert v2.dma_bytes_per_s < 820e9 / 2
    assert (v2.vector_bf16_copy_speedup, v2.vector_bf16_tt_speedup) == (1, 1)
    assert (v3.tensor_ghz, v3.vector_ghz, v3.dma_bytes_per_s) == (2.4, 0.96, 2.9e12 / 8)
    assert (v2.instance, v3.instance) == ("trn1", "trn2")


def test_the_estimate_fits_at_most_one_constant_and_names_its_measurement():
    """The brief: every figure cited, at most one fitted, named with the measurement it was fitted on. The fitted
    count of queues is the one nearest the measured rate: 5.4 GB in 51.80 ms over 27 GiB/s queues."""
    from nativelab.nki import cost

    assert list(cost.FITTED) == ["DMA_QUEUES_IN_USE_V2"] and "51.80 ms" in cost.FITTED["DMA_QUEUES_IN_USE_V2"]
    assert cost.DMA_QUEUES_IN_USE_V2 == round(5.4e9 / 51.80e-3 / (27 * 2**30))
    assert cost.NEURONCORE_V3.dma_queues_in_use == 0  # v3: no measurement to fit it to


def test_an_estimate_on_neuroncore_v2_scales_with_its_clocks_and_bandwidth():
    """The same trace on the two targets: the matmul's TensorE time scales with the Tensor clock (2.4 / 2.8 GHz),
    the DMA lane's with each core's DMA rate (362.5 GB/s, its HBM share, / 116 GB/s, 4 queues), the Vector copy's with the Vector clock (and
    no bf16 perf mode on v2); the default is NeuronCore-v3."""
    from nativelab.nki import cost

    a, b = torch.empty(128, 128, dtype=torch.bfloat16), torch.empty(128, 512, dtype=torch.bfloat16)
    v3 = _matmul_tile.estimate(a, b)
    v2 = _matmul_tile.estimate(a, b, target=cost.NEURONCORE_V2)
    assert v3.busy == _matmul_tile.estimate(a, b, target=cost.NEURONCORE_V3).busy
    assert v2.busy["tensor"] == pytest.approx(v3.busy["tensor"] * 2.4 / 2.8)
    assert v2.busy["dma"] == pytest.approx(v3.busy["dma"] * (2.9e12 / 8) / (4 * 27 * 2**30))
    assert v2.busy["vector"] == pytest.approx(v3.busy["vector"] * 0.96 / 1.12)  # the fp32 PSUM copy
    assert "est. trn1" in v2.summary() and "NeuronCore-v2" in v2.summary()


@nki.jit
def _where_tiles(c, x, y):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.where(nl.load(c), nl.load(x), nl.load(y)))
    return out


@nki.jit
def _where_scalar(c, x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.where(nl.load(c), nl.load(x), 0.0))
    return out


@pytest.mark.parametrize("run", ["simulate", pytest.param("compiled", marks=pytest.mark.slow)])
def test_where_streams_the_condition_and_each_tile_operand(run):
    """nl.where on the Vector Engine: k streamed inputs of N fp32 elements per partition take k * N cycles at
    0.96 GHz (the condition and each tile operand; a scalar operand is an immediate)."""
    c, x = torch.ones(128, 512, dtype=torch.uint8), torch.randn(128, 512)
    two = _where_scalar.estimate(c, x)
    three = _where_tiles.estimate(c, x, x)
    assert two.busy["vector"] == pytest.approx(2 * 512 / 0.96e9)
    assert three.busy["vector"] == pytest.approx(3 * 512 / 0.96e9)
    where = sim(_where_tiles) if run == "simulate" else _where_tiles
    torch.testing.assert_close(where(c == 0, x, -x), -x)


def test_independent_tiles_overlap_on_different_engines():
    """Loads of the next tile run while the Tensor Engine multiplies the previous one: the estimate is below
    the instructions' times run one after another (and at least the busiest engine's time)."""
    e = _matmul_accumulate.estimate(torch.empty(256, 128, dtype=torch.bfloat16),
                                    torch.empty(256, 512, dtype=torch.bfloat16), "default")
    serial = sum(end - start for _, _, start, end, _ in e.events)
    assert max(e.busy.values()) <= e.seconds < 0.9 * serial


@nki.jit
def _two_column_blocks(a):
    """Two column blocks of one SBUF tile loaded by two DMAs; a copy of the first block, then of the second."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    half = a.shape[1] // 2
    nisa.dma_copy(dst=t[:, 0:half], src=a[:, 0:half])
    nisa.dma_copy(dst=t[:, half:], src=a[:, half:])
    y = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y[:, 0:half], src=t[:, 0:half])
    nisa.tensor_copy(dst=y[:, half:], src=t[:, half:])
    nisa.dma_copy(dst=out, src=y)
    return out


def test_a_column_block_waits_only_for_the_block_it_reads():
    """Dependencies are per block of a tile: the copy of the first column block starts when that block's DMA
    ends, before the second block's DMA does (a tile's first-to-last element span would make it wait for
    both: every partition's row spans the other block's columns)."""
    a = torch.randn(128, 2048)
    e = _two_column_blocks.estimate(a)
    (_, _, _, load0, _), (_, _, _, load1, _), (_, _, copy0, _, _), (_, _, copy1, _, _) = e.events[:4]
    assert copy0 == pytest.approx(load0) and load0 < load1
    assert copy1 >= load1
    torch.testing.assert_close(sim(_two_column_blocks)(a), a)


@nki.jit
def _find_index8(data, vals):
    idx = nl.ndarray((data.shape[0], 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    i = nl.ndarray((data.shape[0], 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=i, data=nl.load(data), vals=nl.load(vals))
    nl.store(idx, i)
    return idx


@pytest.mark.parametrize("run", ["simulate", pytest.param("compiled", marks=pytest.mark.slow)])
def test_find_index8_gives_first_occurrences_and_all_ones_where_absent(run):
    """Each value's first index in its partition (repeated values: the first), 0xFFFFFFFF (-1 as uint32)
    for a value the partition does not hold, against NumPy."""
    data = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0, 5.0, 0.5, 2.0, 9.0, 7.0],
                         [0.0, 0.0, 4.0, 4.0, 8.0, 6.0, 6.0, 1.0, 2.0, 3.0]])
    vals = torch.tensor([[3.0, 1.0, 2.0, 4.0, 9.0, 7.0, 0.5, 5.0], [6.0, 4.0, 0.0, 8.0, 3.0, 2.5, 1.0, 2.0]])
    got = (sim(_find_index8) if run == "simulate" else _find_index8)(data, vals)
    want = [[int(np.flatnonzero(r == v)[0]) if (r == v).any() else 2 ** 32 - 1 for v in vs]
            for r, vs in zip(data.numpy(), vals.numpy())]
    assert got.to(torch.int64).tolist() == want


@nki.jit
def _add_to_a_copy(x, where):
    """tensor_tensor(copy of x, x): the copy in `where` (nl.psum or nl.sbuf)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    c = nl.ndarray(x.shape, dtype=x.dtype, buffer=where)
    nisa.tensor_copy(dst=c, src=a)
    s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s, data1=c, data2=a, op=nl.add)
    nisa.dma_copy(dst=out, src=s)
    return out


def test_tensor_tensor_with_one_input_in_psum_takes_n_vector_cycles_and_2n_from_sbuf():
    """The nki.isa.tensor_tensor page (SDK 2.26): 'max(MIN_II, N)' Vector cycles when 'one input tile is in PSUM
    and the other is in SBUF', 'max(MIN_II, 2N)' otherwise (fp32 here: no bf16 row)."""
    x = torch.randn(128, 512)
    for where, cycles in ((nl.psum, 512), (nl.sbuf, 1024)):
        est = _add_to_a_copy.estimate(x, where)
        (start, end), = [(e[2], e[3]) for e in est.events if e[0] == "tensor_tensor"]
        assert end - start == pytest.approx(cycles / 0.96e9)
        torch.testing.assert_close(_add_to_a_copy(x, where), 2 * x)
