"""NKI instructions and nl functions beyond the core set (statistics, range selection, match-and-replace,
random numbers and dropout, the remaining elementwise functions), each against a NumPy/PyTorch reference of
its documented semantics (the NKI 0.5.0 API pages), its limits as the one error they raise, and its cost as
the per-instruction formula AWS states."""

import inspect
import math

import numpy as np

import pytest
import torch

from nativelab import nki
from nativelab.nki import isa as nisa
from nativelab.nki import language as nl

sim = nki.simulate  # interpreted on CPU tensors: no compile


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn.fn if hasattr(fn, "fn") else fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _hbm(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)


# --- bn_stats / bn_aggr / nl.var


@nki.jit
def _moments(x):
    p, n = x.shape
    t = nl.load(x)
    chunks = (n + 511) // 512
    stats = nl.ndarray((p, 6 * chunks), dtype=nl.float32, buffer=nl.sbuf)
    for c in nl.affine_range(chunks):
        nisa.bn_stats(dst=stats[:, 6 * c:6 * c + 6], data=t[:, 512 * c:min(512 * (c + 1), n)])
    first = _hbm((p, 6))
    nl.store(first, stats[:, 0:6])
    mv = nl.ndarray((p, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=mv, data=stats)
    out = _hbm((p, 2))
    nl.store(out, mv)
    v = _hbm((p, 1))
    nl.store(v, nl.var(t, axis=1, dtype=nl.float32))
    return first, out, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bn_stats_halves_and_bn_aggr_mean_variance(dtype):
    torch.manual_seed(0)
    x = (torch.randn(64, 1100) * 3 + 1).to(dtype)
    first, mv, v = sim(_moments)(x)
    xf = x.float()
    s = xf[:, :512]
    even, odd = s[:, 0::2], s[:, 1::2]
    ref_first = torch.stack([torch.full((64,), 256.0), even.mean(1), even.var(1, correction=0) * 256,
                             torch.full((64,), 256.0), odd.mean(1), odd.var(1, correction=0) * 256], dim=1)
    torch.testing.assert_close(first, ref_first, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(mv[:, 0], xf.mean(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mv[:, 1], xf.var(1, correction=0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(v[:, 0], xf.var(1, correction=0), rtol=1e-5, atol=1e-4)


@nki.jit
def _bn_stats_one(x):
    out = _hbm((x.shape[0], 6))
    st = nl.ndarray((x.shape[0], 6), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_stats(dst=st, data=nl.load(x))
    nl.store(out, st)
    return out


def test_bn_stats_of_an_odd_count():
    x = torch.tensor([[1.0, 2.0, 4.0]])  # even: 1, 4 (mean 2.5, M2 4.5); odd: 2
    torch.testing.assert_close(sim(_bn_stats_one)(x), torch.tensor([[2.0, 2.5, 4.5, 1.0, 2.0, 0.0]]))


# --- range_select and the Vector Engine's accumulators


@nki.jit
def _range_select(x, lo, hi, out_dtype):
    p, n = x.shape
    t, b0, b1 = nl.load(x), nl.load(lo), nl.load(hi)
    first, second = nl.ndarray((p, n), dtype=out_dtype, buffer=nl.sbuf), nl.ndarray((p, n), dtype=out_dtype, buffer=nl.sbuf)
    m1, m2 = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf), nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    # columns range_start + j in [lo, hi): the first half, then the second half reduced onto the registers
    half = n // 2
    nisa.range_select(dst=first[:, 0:half], on_true_tile=t[:, 0:half], comp_op0=nl.greater_equal, comp_op1=nl.less,
                      bound0=b0, bound1=b1, reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=m1, range_start=0)
    nisa.range_select(dst=first[:, half:n], on_true_tile=t[:, half:n], comp_op0=nl.greater_equal, comp_op1=nl.less,
                      bound0=b0, bound1=b1, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=m2, range_start=half)
    nisa.range_select(dst=second, on_true_tile=t, comp_op0=nl.equal, comp_op1=nl.less_equal, bound0=b0,
                      bound1=b1)
    out = _hbm((2, p, n), out_dtype)
    nl.store(out[0], first)
    nl.store(out[1], second)
    maxes = _hbm((p, 2))
    nl.store(maxes[:, 0:1], m1)
    nl.store(maxes[:, 1:2], m2)
    return out, maxes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_range_select_masks_by_free_index_and_accumulates_the_max(dtype):
    torch.manual_seed(0)
    x = torch.randn(32, 40)
    lo = torch.randint(0, 30, (32, 1)).float()
    hi = lo + torch.randint(1, 15, (32, 1)).float()
    out, maxes = sim(_range_select)(x, lo, hi, dtype)
    j = torch.arange(40).float()[None, :]
    fmin = torch.tensor(torch.finfo(torch.float32).min)
    ref = torch.where((j >= lo) & (j < hi), x, fmin)
    torch.testing.assert_close(out[0], ref.to(dtype))  # bf16: FP32_MIN rounds to -inf, as the page says
    if dtype == torch.bfloat16:
        assert torch.isneginf(out[0][ref == fmin]).all()
    torch.testing.assert_close(maxes[:, 0], ref[:, :20].amax(1))  # the first call's own rows
    torch.testing.assert_close(maxes[:, 1], ref.amax(1))  # reduce: the maximum over both calls
    torch.testing.assert_close(out[1], torch.where((j == lo) & (j <= hi), x, fmin).to(dtype))


@nki.jit
def _range_select_spelled(x, lo, hi):
    t, b0, b1 = nl.load(x), nl.load(lo), nl.load(hi)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    # fp32's lowest value as a decimal literal: it rounds to FP32_MIN in fp32, which is what the engine gets
    nisa.range_select(dst=dst, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                      on_false_value=-3.4028235e38)
    out = _hbm(x.shape)
    nl.store(out, dst)
    return out


def test_a_scalar_operand_is_rounded_to_fp32_as_the_engine_reads_it():
    """nki.isa.range_select's page: on_false_value must be FP32_MIN. -3.4028235e38 is past fp32's largest magnitude
    by less than half its spacing, so it rounds to it (IEEE 754 round to nearest), as NumPy and torch round it:
    nki-library's attention_cte passes it (its _FLOAT32_MIN). Only what rounds past fp32's range is -inf."""
    x = torch.randn(4, 16)
    lo, hi = torch.full((4, 1), 2.0), torch.full((4, 1), 9.0)
    out = sim(_range_select_spelled)(x, lo, hi)
    j = torch.arange(16)[None, :]
    lowest = torch.finfo(torch.float32).min
    assert float(torch.tensor(-3.4028235e38, dtype=torch.float32)) == lowest
    torch.testing.assert_close(out, torch.where((j >= 2) & (j < 9), x, torch.tensor(lowest)))
    from nativelab.nki.isa import _f32

    assert _f32(-3.4028235e38) == lowest and _f32(-3.5e38) == -math.inf and _f32(0.1) == float(torch.tensor(0.1))


# --- nc_match_replace8


@nki.jit
def _match_replace(x):
    p, n = x.shape
    t = nl.load(x)
    top = nl.ndarray((p, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=t)
    replaced = nl.ndarray((p, n), dtype=nl.float32, buffer=nl.sbuf)
    idx = nl.ndarray((p, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_match_replace8(dst=replaced, data=t, vals=top, imm=-1e30, dst_idx=idx)
    top2 = nl.ndarray((p, 8), dtype=nl.float32, buffer=nl.sbuf)  # the next 8: a top-16 in two steps
    nisa.max8(dst=top2, src=replaced)
    out, idx_out, top_out = _hbm((p, n)), _hbm((p, 8), nl.uint32), _hbm((p, 16))
    nl.store(out, replaced)
    nl.store(idx_out, idx)
    nl.store(top_out[:, 0:8], top)
    nl.store(top_out[:, 8:16], top2)
    return out, idx_out, top_out


def test_nc_match_replace8_replaces_first_occurrences_in_order():
    torch.manual_seed(0)
    x = torch.randint(0, 12, (16, 40)).float()  # many ties: a value in the top 8 twice replaces two elements
    out, idx, top = sim(_match_replace)(x)
    ref, ref_idx = x.clone().numpy(), np.zeros((16, 8), dtype=np.int64)
    vals = torch.topk(x, 8, dim=1).values.numpy()
    for i in range(16):  # the page's NumPy equivalent
        for j in range(8):
            hits = np.where(ref[i] == vals[i, j])[0]
            ref_idx[i, j] = hits[0]
            ref[i, hits[0]] = -1e30
    torch.testing.assert_close(out, torch.from_numpy(ref))
    assert torch.equal(idx.to(torch.int64), torch.from_numpy(ref_idx))
    torch.testing.assert_close(top, torch.topk(x, 16, dim=1).values)


# --- random numbers: rng, set_rng_seed, rand_get_state / rand_set_state, dropout, nl.rand / dropout


@nki.jit
def _draws(seed, state):
    p = state.shape[0]
    s = nl.load(seed)
    a, b = nl.ndarray((p, 64), dtype=nl.uint32, buffer=nl.sbuf), nl.ndarray((p, 64), dtype=nl.int8, buffer=nl.sbuf)
    again = nl.ndarray((p, 64), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.set_rng_seed(s)
    nisa.rng(dst=a)
    nisa.set_rng_seed(s)
    nisa.rng(dst=b)  # the same draws, truncated to their low 8 bits
    nisa.rng(dst=again)  # the sequence goes on
    # GpSimd: a state set, read back, and resumed
    st = nl.load(state)
    nisa.rand_set_state(src_seeds=st)
    got = nl.ndarray((p, 6), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rand_get_state(dst=got)
    g1, g2 = nl.ndarray((p, 32), dtype=nl.int32, buffer=nl.sbuf), nl.ndarray((p, 32), dtype=nl.int32, buffer=nl.sbuf)
    nisa.rng(dst=g1, engine=nisa.engine.gpsimd)
    mid = nl.ndarray((p, 6), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rand_get_state(dst=mid)
    nisa.rng(dst=g2, engine=nisa.engine.gpsimd)
    r1, r2 = nl.ndarray((p, 32), dtype=nl.int32, buffer=nl.sbuf), nl.ndarray((p, 32), dtype=nl.int32, buffer=nl.sbuf)
    nisa.rand_set_state(src_seeds=mid)
    nisa.rng(dst=r2, engine=nisa.engine.gpsimd)
    nisa.rand_set_state(src_seeds=st)
    nisa.rng(dst=r1, engine=nisa.engine.gpsimd)
    outs = [_hbm((p, 64), nl.uint32), _hbm((p, 64), nl.int8), _hbm((p, 64), nl.uint32), _hbm((p, 6), nl.uint32),
            _hbm((4, p, 32), nl.int32)]
    for o, t in zip(outs[:4], (a, b, again, got)):
        nl.store(o, t)
    for k, t in enumerate((g1, g2, r1, r2)):
        nl.store(outs[4][k], t)
    return tuple(outs)


def _state(p=128):
    return torch.randint(0, 2**32, (p, 6), dtype=torch.int64).to(torch.uint32)


def test_rng_seeded_sequences_truncation_and_gpsimd_state():
    torch.manual_seed(0)
    seed, state = torch.tensor([[1234]], dtype=torch.int32), _state()
    a, b, again, got, g = sim(_draws)(seed, state)
    a64 = a.to(torch.int64)
    low = a64 & 0xFF
    assert torch.equal(b.to(torch.int64), low - ((low >> 7) << 8))  # the same bits, the least significant 8
    assert not torch.equal(again, a)
    assert a64.unique().numel() > 0.999 * a64.numel()  # 32 random bits: practically no repeats
    assert abs(a64.double().mean().item() / 2**32 - 0.5) < 0.01
    assert torch.equal(got, state)
    g1, g2, r1, r2 = g
    assert torch.equal(r1, g1) and torch.equal(r2, g2) and not torch.equal(g1, g2)
    assert not torch.equal(g1[0], g1[1])  # lanes draw independently
    a2 = sim(_draws)(torch.tensor([[1234]], dtype=torch.int32), state)[0]
    a3 = sim(_draws)(torch.tensor([[1235]], dtype=torch.int32), state)[0]
    assert torch.equal(a2, a) and not torch.equal(a3, a)


@nki.jit
def _dropout(x, probs, ints):
    p, n = x.shape
    t, pr, it = nl.load(x), nl.load(probs), nl.load(ints)
    outs = _hbm((4, p, n))
    kept = nl.ndarray((p, n), dtype=nl.float32, buffer=nl.sbuf)
    for k, prob in enumerate((0.0, 1.0)):
        nisa.dropout(dst=kept, data=t, prob=prob)
        nl.store(outs[k], kept)
    nisa.dropout(dst=kept, data=t, prob=pr)
    nl.store(outs[2], kept)
    nl.store(outs[3], nl.dropout(t, 0.25))
    ints_out = _hbm((p, n), nl.int32)
    di = nl.ndarray((p, n), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dropout(dst=di, data=it, prob=pr)
    nl.store(ints_out, di)
    u = _hbm((p, n))
    nl.store(u, nl.rand((p, n), dtype=nl.float32))
    return outs, ints_out, u


def _binomial_ok(dropped, prob, n):  # within 5 standard deviations of n * prob
    return (dropped - n * prob).abs() <= 5 * (n * prob * (1 - prob)).sqrt() + 1e-9


def test_dropout_zeroes_with_the_given_probability_and_keeps_the_rest():
    torch.manual_seed(0)
    x = torch.rand(128, 1024) + 1.0  # no zeros of its own
    probs = torch.linspace(0, 1, 128).reshape(128, 1)
    ints = torch.randint(1, 100, (128, 1024), dtype=torch.int32)
    outs, di, u = sim(_dropout)(x, probs, ints)
    assert torch.equal(outs[0], x) and torch.equal(outs[1], torch.zeros_like(x))
    for got, prob in ((outs[2], probs[:, 0]), (outs[3], torch.full((128,), 0.25))):
        dropped = (got == 0).sum(1).double()
        assert _binomial_ok(dropped, prob.double(), 1024).all()
        assert torch.equal(got[got != 0], x[got != 0])  # kept elements unchanged (not rescaled)
    assert _binomial_ok((di == 0).sum(1).double(), probs[:, 0].double(), 1024).all()
    assert torch.equal(di[di != 0], ints[di != 0])
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean().item() - 0.5) < 0.01


# --- the remaining nl functions


@nki.jit
def _functions(x, ints, table, idx):
    p, n = x.shape
    t = nl.load(x)
    outs = _hbm((4, p, n))
    for k, f in enumerate((nl.gelu_dx, nl.gelu_apprx_sigmoid_dx, nl.silu_dx)):
        nl.store(outs[k], f(t))
    nl.store(outs[3], nl.average(t, nl.multiply(t, 3.0)))
    pr = nl.ndarray((p, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=pr, op=nl.prelu, data=t)  # slope 0 without activate2's relu_param
    prelu = _hbm((p, n))
    nl.store(prelu, pr)
    inv = _hbm((p, n), nl.int32)
    nl.store(inv, nl.invert(nl.load(ints)))
    tr = _hbm((n, p))
    nl.store(tr, nl.load_transpose2d(x))
    g = _hbm(idx.shape)
    nl.store(g, nl.gather_flattened(nl.load(table), nl.load(idx)))
    acc = nl.zeros((p, n), dtype=nl.float32)
    with nl.no_reorder():
        for _ in nl.dynamic_range(3):
            acc = nl.add(acc, t)
    loops = _hbm((p, n))
    nl.store(loops, acc)
    flags = (nl.is_hbm(x), nl.is_sbuf(t), nl.is_psum(nl.psum), nl.is_on_chip(nl.MemoryRegion.sbuf))
    return outs, inv, tr, g, loops, flags, prelu


def test_isa_module_names_kernels_import():
    assert nisa.get_nc_sub_version() == 0 and nisa.get_nc_version() == nisa.nc_version.gen3
    assert (nisa.vector_engine, nisa.scalar_engine, nisa.gpsimd_engine) == (nisa.engine.vector, nisa.engine.scalar,
                                                                            nisa.engine.gpsimd)
    with pytest.raises(nisa.NkiValidationError, match="bn_stats"):
        sim(_bn_stats_wide)(torch.zeros(8, 600))


def test_remaining_nl_functions():
    torch.manual_seed(0)
    x = torch.randn(16, 24) * 3
    ints = torch.randint(-1000, 1000, (16, 24), dtype=torch.int32)
    table = torch.randn(16, 10)
    idx = torch.randint(0, 10, (16, 5), dtype=torch.int32)
    outs, inv, tr, g, loops, flags, prelu = sim(_functions)(x, ints, table, idx)
    torch.testing.assert_close(prelu, torch.relu(x))
    xs = x.clone().requires_grad_()
    for k, f in enumerate((torch.nn.functional.gelu, lambda v: v * torch.sigmoid(1.702 * v), torch.nn.functional.silu)):
        (grad,) = torch.autograd.grad(f(xs).sum(), xs)  # the derivative by autograd
        torch.testing.assert_close(outs[k], grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[3], 2 * x)
    assert torch.equal(inv, ~ints)
    torch.testing.assert_close(tr, x.T)
    torch.testing.assert_close(g, torch.gather(table, 1, idx.long()))
    torch.testing.assert_close(loops, 3 * x)
    assert flags == (True, True, True, True)


# --- limits: one error each, at the kernel's line


@nki.jit
def _bn_stats_wide(x):
    st = nl.ndarray((x.shape[0], 6), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_stats(dst=st, data=nl.load(x))  # LIMIT
    return x


@nki.jit
def _range_select_fill(x):
    t = nl.load(x)
    b = nl.zeros((x.shape[0], 1), dtype=nl.float32)
    nisa.range_select(dst=t, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b,  # LIMIT
                      bound1=b, on_false_value=0.0)
    return x


@nki.jit
def _rng_float(x):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.rng(dst=t)  # LIMIT
    return x


@nki.jit
def _vector_state(x):
    t = nl.ndarray((x.shape[0], 24), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rand_get_state(dst=t, engine=nisa.engine.vector)  # LIMIT
    return x


@nki.jit
def _gpsimd_rng_psum(x):
    t = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.psum)
    nisa.rng(dst=t, engine=nisa.engine.gpsimd)  # LIMIT
    return x


@nki.jit
def _dropout_dtype(x):
    t = nl.load(x)
    d = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dropout(dst=d, data=t, prob=0.5)  # LIMIT
    return x


@nki.jit
def _abs_max(x):
    t = nl.load(x)
    nl.abs_max(t, t)  # LIMIT
    return x


@pytest.mark.parametrize("kernel, args, expected", [
    (_bn_stats_wide, (torch.zeros(8, 600),), ["bn_stats", "600 elements per partition", "at most 512"]),
    (_range_select_fill, (torch.zeros(8, 16),), ["range_select", "on_false_value must be FP32_MIN", "got 0.0"]),
    (_rng_float, (torch.zeros(8, 16),), ["rng", "integer tiles", "torch.float32"]),
    (_vector_state, (torch.zeros(8, 16),), ["rand_get_state", "NeuronCore-v4", "NeuronCore-v3"]),
    (_gpsimd_rng_psum, (torch.zeros(8, 16),), ["rng", "nl.psum", "gpsimd engine accesses nl.sbuf"]),
    (_dropout_dtype, (torch.zeros(8, 16),), ["dropout", "data's dtype torch.float32", "torch.bfloat16"]),
    (_abs_max, (torch.zeros(8, 16),), ["nl.abs_max", "NeuronCore-v4"]),
], ids=["bn-stats-fmax", "range-select-fill", "rng-dtype", "vector-state-v4", "gpsimd-psum", "dropout-dtype",
        "abs-max-v4"])
def test_limit_violation_names_the_line_value_and_limit(kernel, args, expected):
    with pytest.raises(nki.NkiError) as e:
        sim(kernel)(*args)
    msg = str(e.value)
    assert f"test_nki_isa.py:{_line_of(kernel, '# LIMIT')}" in msg, msg
    for part in expected:
        assert part in msg, msg


# --- cost: the per-instruction formulas of the NKI ISA reference


def test_costs_follow_the_published_formulas():
    """bn_stats: max(64, N) Vector cycles; bn_aggr: max(64, 13 N / 3); range_select, dropout and
    nc_match_replace8: max(64, N); at the Vector Engine's 0.96 GHz."""
    est = _moments.estimate(torch.empty(64, 1100))
    vec = [(name, end - start) for name, engine, start, end, _ in est.events if engine == "vector"]
    assert [n for n, _ in vec] == ["bn_stats", "bn_stats", "bn_stats", "bn_aggr", "nl.var"]
    ghz = 0.96e9
    for (_, took), n in zip(vec[:3], (512, 512, 76)):
        assert took == pytest.approx(max(64, n) / ghz)
    assert vec[3][1] == pytest.approx(max(64, 13 * 18 / 3) / ghz)
    est = _dropout.estimate(torch.empty(128, 1024), torch.empty(128, 1), torch.empty(128, 1024, dtype=torch.int32))
    drops = [end - start for name, _, start, end, _ in est.events if name == "dropout"]
    assert drops and all(d == pytest.approx(1024 / ghz) for d in drops)


@nki.jit
def _elementwise(x, y, col):
    tx, ty, tc = nl.load(x), nl.load(y), nl.load(col)
    out = _hbm(x.shape, x.dtype)
    a = nl.add(tx, ty)  # two tiles
    b = nl.multiply(a, 2.0)  # a scalar operand
    nl.store(out, nl.subtract(b, tc))  # a [P, 1] vector operand
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_nl_binary_op_of_two_tiles_costs_both_reads(dtype):
    """AWS's Vector Engine cost model: one input tile, roughly N cycles; two input tiles, roughly 2N (the
    Trainium/Inferentia2 architecture guide); bf16 tensor_tensor in SBUF runs 2x, tensor_scalar 4x (the
    Trainium2 guide's perf mode). N = 512 elements per partition, at 0.96 GHz."""
    n = 512
    est = _elementwise.estimate(torch.empty(128, n, dtype=dtype), torch.empty(128, n, dtype=dtype),
                                torch.empty(128, 1, dtype=dtype))
    took = {name: end - start for name, engine, start, end, _ in est.events if engine == "vector"}
    two, one = (2, 4) if dtype == torch.bfloat16 else (1, 1)
    assert took["nl.add"] == pytest.approx(max(2 * n / two, 64) / 0.96e9)
    assert took["nl.multiply"] == pytest.approx(max(n / one, 64) / 0.96e9)
    assert took["nl.subtract"] == pytest.approx(max(n / one, 64) / 0.96e9)
    torch.manual_seed(0)
    x, y, c = torch.randn(128, n).to(dtype), torch.randn(128, n).to(dtype), torch.randn(128, 1).to(dtype)
    ref = ((x.float() + y.float()).to(dtype).float() * 2).to(dtype).float() - c.float()  # each op rounds
    torch.testing.assert_close(sim(_elementwise)(x, y, c), ref.to(dtype))


# --- compiled: the same seed gives the interpreter's values, on neuron and CPU tensors


@nki.jit
def _seeded(x, seed):
    p, n = x.shape
    t = nl.load(x)
    nl.random_seed(nl.load(seed))
    d = nl.dropout(t, 0.5)
    bits = nl.ndarray((p, n), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rng(dst=bits)
    stats = nl.ndarray((p, 6), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_stats(dst=stats, data=t)
    mv = nl.ndarray((p, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=mv, data=stats)
    outs = _hbm((p, n)), _hbm((p, n), nl.uint32), _hbm((p, 2))
    for o, v in zip(outs, (d, bits, mv)):
        nl.store(o, v)
    return outs


@pytest.mark.slow
@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_compiled_seeded_kernel_equals_the_interpreter(device, tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    torch.manual_seed(0)
    x, seed = torch.randn(128, 256), torch.tensor([[7]], dtype=torch.int32)
    want = sim(_seeded)(x, seed)
    got = _seeded(x.to(device), seed.to(device))
    for g in got:
        assert g.device.type == device
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])  # the same random values
    torch.testing.assert_close(got[2].cpu(), want[2], rtol=1e-6, atol=1e-6)  # Inductor may sum in another order
    torch.testing.assert_close(want[2][:, 1], x.var(1, correction=0), rtol=1e-5, atol=1e-5)


@nki.jit
def _clamp_by_immediates(x):
    out = nl.ndarray((2,) + x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(r, t, op0=nl.maximum, operand0=-0.5, op1=nl.minimum, operand1=0.75)
    nl.store(out[0], r)
    nisa.tensor_scalar(r, t, op0=nl.minimum, operand0=0.25, reverse0=True)  # immediate first: same result
    nl.store(out[1], r)
    return out


def test_tensor_scalar_maximum_minimum_with_immediates():
    """nkilib's attention_tkg clamps with nisa.tensor_scalar(..., op0=nl.maximum, operand0=<float>)."""
    x = torch.randn(16, 32)
    x[0, 0] = float("nan")
    got = sim(_clamp_by_immediates)(x)
    torch.testing.assert_close(got[0], x.clamp(-0.5, 0.75), equal_nan=True)
    torch.testing.assert_close(got[1], x.clamp(max=0.25), equal_nan=True)


# --- tensor_scalar_cumulative, gathers, nonzero_with_count, sequence_bounds


@nki.jit
def _cumulative(x, imm):
    p, n = x.shape
    t, v = nl.load(x), nl.load(imm)
    outs = _hbm((6, p, n))
    r = nl.ndarray((p, n), dtype=nl.float32, buffer=nl.sbuf)
    for k, op1 in enumerate((nl.add, nl.multiply, nl.maximum, nl.subtract)):
        nisa.tensor_scalar_cumulative(dst=r, src=t, op0=nl.add, op1=op1, imm0=v)
        nl.store(outs[k], r)
    nisa.tensor_scalar_cumulative(dst=r, src=t, op0=nl.multiply, op1=nl.add, imm0=2.0, imm1=v,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce)
    nl.store(outs[4], r)
    nisa.tensor_scalar_cumulative(dst=r, src=t, op0=nl.multiply, op1=nl.add, imm0=1.0,
                                  reduce_cmd=nisa.reduce_cmd.reduce)  # goes on from the previous sums
    nl.store(outs[5], r)
    return outs


def test_tensor_scalar_cumulative_scans_with_the_accumulator():
    torch.manual_seed(0)
    x, imm = torch.rand(8, 12) + 0.5, torch.rand(8, 1)
    outs = sim(_cumulative)(x, imm)
    a = x + imm
    torch.testing.assert_close(outs[0], torch.cumsum(a, 1))
    torch.testing.assert_close(outs[1], torch.cumprod(a, 1))
    torch.testing.assert_close(outs[2], torch.cummax(a, 1).values)
    reg, alt = torch.zeros(8), []
    for i in range(12):  # the page's pseudocode: reg = op1(op0(x, imm0), reg) = a - reg
        reg = a[:, i] - reg
        alt.append(reg)
    torch.testing.assert_close(outs[3], torch.stack(alt, 1))
    loaded = imm + torch.cumsum(2 * x, 1)
    torch.testing.assert_close(outs[4], loaded)
    torch.testing.assert_close(outs[5], loaded[:, -1:] + torch.cumsum(x, 1))


@nki.jit
def _gathers(src, index, data, idx):
    g = nisa.local_gather(None, nl.load(src), nl.load(index), num_elem_per_idx=4, num_valid_indices=40)
    out = _hbm(g.shape)
    nl.store(out, g)
    n = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.nc_n_gather(dst=n, data=nl.load(data), indices=nl.load(idx))
    out2 = _hbm(idx.shape)
    nl.store(out2, n)
    return out, out2


def test_local_gather_and_nc_n_gather():
    torch.manual_seed(0)
    src = torch.randn(32, 64, 4)
    per_core = torch.randint(0, 64, (16, 3)) * 4  # element offsets of 4-element groups
    index = per_core.repeat(2, 1).to(torch.uint16)
    data, idx = torch.randn(32, 100), torch.randint(0, 100, (32, 7)).to(torch.uint32)
    g, n = sim(_gathers)(src, index, data, idx)
    flat = per_core.T.flatten()[:40]  # flattened partition-first (order="F"), the first 40
    ref = src.reshape(32, 64 * 4)[:, (flat[:, None] + torch.arange(4)).flatten()].reshape(32, 40, 4)
    torch.testing.assert_close(g, ref)
    torch.testing.assert_close(n, torch.gather(data, 1, idx.long()))


@nki.jit
def _nonzero_bounds(x, seg):
    p, t = x.shape
    d = nl.full((p, t + 1), 7, dtype=nl.int32)
    nisa.nonzero_with_count(dst=d, src=nl.load(x), index_offset=16, padding_val=-1)
    out = _hbm((p, t + 1), nl.int32)
    nl.store(out, d)
    b = nisa.sequence_bounds(None, nl.load(seg))
    bounds = _hbm(b.shape, b.dtype)
    nl.store(bounds, b)
    return out, bounds


def test_nonzero_with_count_and_sequence_bounds():
    x = torch.zeros(32, 8)
    x[0] = torch.tensor([0, 1, 1, 0, 0, 1, 0, 0.0])  # the page's example
    x[16] = torch.tensor([3, 0, 0, 0, 0, 0, 0, 2.0])
    x[5] = 1.0  # not a core's first partition: not read, its row not written
    seg = torch.tensor([[0, 1, 1, 2, 2, 2, 0, 3, 1, 1, 0, 0.0]])
    out, bounds = sim(_nonzero_bounds)(x, seg)
    assert out[0].tolist() == [17, 18, 21, -1, -1, -1, -1, -1, 3]
    assert out[16].tolist() == [16, 23, -1, -1, -1, -1, -1, -1, 2]
    assert (out[5] == 7).all() and (out[1] == 7).all()
    n = 12
    s = seg[0].tolist()
    lo, hi = [], []
    for i, v in enumerate(s):  # runs of equal ids: start, exclusive end; padding (0): n, -1
        a = i
        while a > 0 and s[a - 1] == v:
            a -= 1
        b = i + 1
        while b < n and s[b] == v:
            b += 1
        lo.append(n if v == 0 else a)
        hi.append(-1 if v == 0 else b)
    assert bounds.shape == (1, 2, n) and bounds[0].tolist() == [lo, hi]


def _compiled_cases():
    torch.manual_seed(0)
    x = torch.zeros(32, 8)
    x[0] = torch.tensor([0, 1, 1, 0, 0, 1, 0, 0.0])
    return {
        "moments": (_moments, (torch.randn(64, 1100),)),
        "range_select": (_range_select, (torch.randn(32, 40), torch.zeros(32, 1) + 3, torch.zeros(32, 1) + 20,
                                         torch.bfloat16)),
        "match_replace": (_match_replace, (torch.randint(0, 12, (16, 40)).float(),)),
        "cumulative": (_cumulative, (torch.rand(8, 12) + 0.5, torch.rand(8, 1))),
        "gathers": (_gathers, (torch.randn(32, 64, 4), (torch.randint(0, 64, (32, 3)) * 4).to(torch.uint16),
                               torch.randn(32, 100), torch.randint(0, 100, (32, 7)).to(torch.uint32))),
        "nonzero_bounds": (_nonzero_bounds, (x, torch.tensor([[0, 1, 1, 2, 2, 2, 0, 3, 1, 1, 0, 0.0]]))),
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", list(_compiled_cases()))
def test_compiled_on_neuron_equals_the_interpreter(case, tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    kernel, args = _compiled_cases()[case]
    want = sim(kernel)(*args)
    got = kernel(*[a.to("neuron") if isinstance(a, torch.Tensor) else a for a in args])
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.device.type == "neuron"
        torch.testing.assert_close(g.cpu(), w, rtol=1e-6, atol=1e-6)


def test_gpsimd_costs_include_the_startup_overhead():
    """iota / affine_select (and the GpSimd instructions without a cost of their own): 150 + N GpSimd cycles at
    1.2 GHz, N the elements per partition."""
    x = torch.zeros(32, 8)
    est = _nonzero_bounds.estimate(x, torch.zeros(1, 12))
    gpsimd = {name: end - start for name, engine, start, end, _ in est.events if engine == "gpsimd"}
    assert gpsimd["nonzero_with_count"] == pytest.approx((150 + 8) / 1.2e9)
    assert gpsimd["sequence_bounds"] == pytest.approx((150 + 12) / 1.2e9)
