"""The compiled path's tile fusion (nki/fusion.py) against the unfused compile (every instruction recorded as
issued) and nki.simulate (interpreted): ragged last tiles, partial partitions, PSUM accumulation across K
tiles, broadcast access patterns, operands rewritten between matmuls and sequential dependencies. The
unfused compile equals nki.simulate exactly (fp32 operands: within fp32's sum bound, the BLAS choosing
its kernel by layout); the fused GEMM sums the same fp32 products in another order
(within fp32's accumulation error of the tile-by-tile sum, plus one bf16 step where it is rounded to bf16);
kernels without matmuls compile to the same graph, so to the same values."""

import copy

import pytest
import torch

from nativelab import nki
from nativelab.kernels import nki as nk
from nativelab.nki import isa as nisa
from nativelab.nki import language as nl

pytestmark = pytest.mark.slow  # every test compiles kernels


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))


def _three_ways(kernel, *args):
    """(fused compiled, unfused compiled, simulated) results of one kernel, and the fused graph."""
    fused = nki.JitKernel(kernel.fn, kernel.grid)
    unfused = nki.JitKernel(kernel.fn, kernel.grid, fuse=False)
    got = [k(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
           for k in (fused, unfused, nki.simulate(kernel))]
    return got, next(iter(fused._traces.values())).source


def _gemms(gm: torch.fx.GraphModule) -> int:
    """GEMMs left in a recorded graph once its dead code is gone (the compiler drops the rest too)."""
    graph = copy.deepcopy(gm.graph)
    graph.eliminate_dead_code()
    return sum(1 for n in graph.nodes if n.target is torch.ops.aten.mm.default)


def _same_sum_rounded(got: torch.Tensor, ref: torch.Tensor, s: torch.Tensor, m: torch.Tensor) -> None:
    """got and ref are s.T @ m summed in fp32 in two orders, each rounded once to got's dtype: each fp32 sum
    is within K * 2^-24 * (|s|.T @ |m|) of the exact one, and rounding to bf16 adds at most one bf16 step."""
    g, r = got.double(), ref.double()
    fp32_error = 2 * s.shape[0] * 2.0 ** -24 * (s.double().abs().T @ m.double().abs())
    step = torch.finfo(got.dtype).eps * torch.maximum(g.abs(), r.abs()) if got.dtype != torch.float32 else 0
    excess = (g - r).abs() - (fp32_error + step)
    assert (excess <= 0).all(), f"differ by {excess.max().item()} beyond the bound"


@pytest.mark.parametrize("m, k, n", [(200, 300, 700), (64, 72, 100), (512, 256, 1024)])
def test_tiled_matmul_is_one_gemm_equal_to_the_tiles(m, k, n):
    """Ragged last tiles in M, K and N, a contraction under one partition tile (72): one GEMM reading the
    arguments, within one bf16 step of the tile-by-tile sum, which equals nki.simulate exactly."""
    torch.manual_seed(0)
    a, b = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
    (fused, unfused, simulated), code = _three_ways(nk.matmul_kernel, a, b)
    assert torch.equal(unfused, simulated)
    _same_sum_rounded(fused, unfused, a.T, b)
    torch.testing.assert_close(fused.float(), (a.double() @ b.double()).float(), rtol=2e-2, atol=1e-1)
    assert _gemms(code) == 1


def test_fp32_matmul_fuses_in_fp32():
    torch.manual_seed(0)
    a, b = torch.randn(130, 260), torch.randn(260, 520)
    (fused, unfused, simulated), code = _three_ways(nk.matmul_kernel, a, b)
    # Not torch.equal: the BLAS picks its fp32 kernel by shape and layout (the 8-column last tile is summed
    # in another order by Inductor's call than by eager on Zen 4), so both are held to fp32's sum bound.
    _same_sum_rounded(unfused, simulated, a.T, b)
    _same_sum_rounded(fused, unfused, a.T, b)
    assert fused.dtype == torch.float32 and _gemms(code) == 1


@nki.jit
def _psum_read_in_fp32(s, m):
    """K tiles accumulated into one PSUM tile that is read in fp32 (no rounding to bf16), then more K tiles
    accumulated onto it after another instruction read it."""
    kt = s.shape[0] // 128
    out = nl.ndarray((2, s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for k in nl.affine_range(kt):
        nisa.nc_matmul(dst=acc, stationary=nl.load(s[k * 128:(k + 1) * 128, :]), moving=nl.load(m[k * 128:(k + 1) * 128, :]))
    first = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=first, src=acc)
    nl.store(out[0], first)
    for k in nl.affine_range(kt):  # accumulates onto what is there
        nisa.nc_matmul(dst=acc, stationary=nl.load(s[k * 128:(k + 1) * 128, :]), moving=nl.load(m[k * 128:(k + 1) * 128, :]))
    nl.store(out[1], nl.copy(acc))
    return out


def test_psum_accumulation_read_in_fp32_and_accumulated_again():
    torch.manual_seed(0)
    s, m = torch.randn(384, 96, dtype=torch.bfloat16), torch.randn(384, 256, dtype=torch.bfloat16)
    (fused, unfused, simulated), _ = _three_ways(_psum_read_in_fp32, s, m)
    assert torch.equal(unfused, simulated)
    ref = s.double().T @ m.double()
    torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(fused[0].double(), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(fused[1].double(), 2 * ref, rtol=1e-5, atol=1e-4)


@nki.jit
def _broadcast_moving(x, v):
    """moving = one row of v on every partition (a partition step of 0), stationary from x: x.T @ (1 v)."""
    k, m = x.shape
    out = nl.ndarray((m, v.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    st = nl.load(x)
    mv = nl.ndarray((k, v.shape[0]), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mv, src=v.ap(pattern=[[0, k], [1, v.shape[0]]]))
    acc = nl.ndarray((m, v.shape[0]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
    res = nl.ndarray(acc.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nl.store(out, res)
    return out


def test_broadcast_access_pattern_operand():
    torch.manual_seed(0)
    x, v = torch.randn(100, 64, dtype=torch.bfloat16), torch.randn(48, dtype=torch.bfloat16)
    (fused, unfused, simulated), code = _three_ways(_broadcast_moving, x, v)
    assert torch.equal(unfused, simulated)
    _same_sum_rounded(fused, unfused, x, v[None, :].expand(x.shape[0], -1))
    ref = x.double().sum(0)[:, None] * v.double()[None, :]
    torch.testing.assert_close(fused.float(), ref.float(), rtol=2e-2, atol=2e-2)
    assert _gemms(code) == 1


@nki.jit
def _recurrence(w, h0, steps):
    """h <- tanh(w.T @ h) for `steps` steps over sequential_range: each matmul reads the previous result,
    written into the same SBUF tile in place (rows 0:16) and as a whole (the rest)."""
    k = w.shape[0]
    out = nl.ndarray((steps, k, h0.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    wt = nl.load(w)
    h = nl.load(h0)
    for i in nl.sequential_range(steps):
        acc = nl.ndarray((k, h0.shape[1]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=wt, moving=h)
        t = nl.ndarray((k, h0.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=t, op=nl.tanh, data=acc)
        nisa.tensor_copy(dst=h[0:16, :], src=t[0:16, :])  # in place: the matmul above must not see it
        nisa.tensor_copy(dst=h[16:k, :], src=t[16:k, :])
        nl.store(out[i], t)
    return out


def test_sequential_range_dependencies_are_not_fused():
    torch.manual_seed(0)
    w, h0 = torch.randn(64, 64) * 0.2, torch.randn(64, 16)  # 64 x 64 x 16: a GEMM, not fusion's tiny product
    (fused, unfused, simulated), code = _three_ways(_recurrence, w, h0, 4)
    torch.testing.assert_close(unfused, simulated, rtol=1e-6, atol=1e-6)  # Inductor's tanh: last bits
    h, ref = h0.double(), []
    for _ in range(4):
        h = torch.tanh(w.double().T @ h)
        ref.append(h)
    torch.testing.assert_close(fused.double(), torch.stack(ref), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused, unfused, rtol=1e-6, atol=1e-6)
    assert _gemms(code) == 4  # one per step: each reads the last


@nki.jit
def _operand_rewritten_in_place(s, m):
    """Two K tiles into one PSUM tile through one SBUF tile whose first rows are rewritten in place between
    the matmuls: the products are of different values, not one stacked operand."""
    out = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    st = nl.ndarray((128, s.shape[1]), dtype=s.dtype, buffer=nl.sbuf)
    mv = nl.load(m[0:128, :])
    acc = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.dma_copy(dst=st, src=s[0:128, :])
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
    nisa.dma_copy(dst=st[0:32, :], src=s[128:160, :])
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
    nl.store(out, nl.copy(acc))
    return out


def test_an_operand_rewritten_between_accumulating_matmuls():
    torch.manual_seed(0)
    s, m = torch.randn(160, 32), torch.randn(128, 64)
    (fused, unfused, simulated), _ = _three_ways(_operand_rewritten_in_place, s, m)
    assert torch.equal(unfused, simulated)
    s2 = s[0:128].clone()
    s2[0:32] = s[128:160]
    ref = s[0:128].double().T @ m.double() + s2.double().T @ m.double()
    torch.testing.assert_close(fused.double(), ref, rtol=1e-5, atol=1e-4)


@nki.jit
def _store_twice(a, b):
    """Two GEMM tiles stored over the same output block: the last store wins, nothing is merged."""
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(2):
        acc = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=nl.load(a[i * 64:(i + 1) * 64, :]), moving=nl.load(b[i * 64:(i + 1) * 64, :]))
        res = nl.ndarray(acc.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nl.store(out, res)
    return out


def test_overlapping_stores_keep_their_order():
    torch.manual_seed(0)
    a, b = torch.randn(128, 32, dtype=torch.bfloat16), torch.randn(128, 48, dtype=torch.bfloat16)
    (fused, unfused, simulated), _ = _three_ways(_store_twice, a, b)
    assert torch.equal(unfused, simulated)
    _same_sum_rounded(fused, unfused, a[64:], b[64:])
    torch.testing.assert_close(fused.float(), (a[64:].double().T @ b[64:].double()).float(), rtol=2e-2, atol=2e-2)


@nki.jit
def _writes_its_argument(a, b):
    """The kernel overwrites part of its argument `a` after loading a tile of it: the GEMM must read the
    tile's snapshot, not the argument."""
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    st = nl.load(a)
    nl.store(a[0:8, :], nl.zeros((8, a.shape[1]), dtype=a.dtype))
    acc = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=st, moving=nl.load(b))
    res = nl.ndarray(acc.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nl.store(out, res)
    return out


def test_a_kernel_that_writes_its_argument_multiplies_the_loaded_values():
    torch.manual_seed(0)
    a, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(64, 16, dtype=torch.bfloat16)
    (fused, unfused, simulated), _ = _three_ways(_writes_its_argument, a, b)
    assert torch.equal(unfused, simulated)
    _same_sum_rounded(fused, unfused, a, b)
    torch.testing.assert_close(fused.float(), (a.double().T @ b.double()).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["add", "rmsnorm", "softmax"])
def test_kernels_without_matmuls_compile_to_the_same_values(name):
    torch.manual_seed(0)
    x = torch.randn(300, 96, dtype=torch.bfloat16)
    kernel, args = {"add": (nk.add_kernel, (x, x * 2)), "rmsnorm": (nk.rmsnorm_kernel, (x, x[0], 1e-5)),
                    "softmax": (nk.softmax_kernel, (x,))}[name]
    (fused, unfused, simulated), _ = _three_ways(kernel, *args)
    assert torch.equal(fused, unfused)
    # Inductor's rsqrt / exp differ from eager's in the last bits of fp32, now and then one bf16 step
    torch.testing.assert_close(unfused, simulated, rtol=1e-2, atol=1e-2)


def test_an_estimate_does_not_depend_on_which_tiles_python_freed():
    """Tiles are told apart by allocation, not by id(): a dropped tile's id, reused by a later one, made
    the later tile depend on the earlier's readers (the critical path varied from one trace to the next)."""
    def shapes(n):
        return [torch.empty(n, n, dtype=torch.bfloat16, device="meta")] * 2

    kernel = nki.JitKernel(nk.matmul_kernel.fn)
    first = kernel.estimate(*shapes(1024)).seconds
    kernel.estimate(*shapes(512))  # another trace in between: Python hands out other ids next time
    kernel._traces.clear()
    assert kernel.estimate(*shapes(1024)).seconds == first


@nki.jit
def _computed_times_loaded_transposed(x, w):
    """exp(x).T @ w.T: the stationary side computed on chip (one [p, K tiles, M] tile), the moving side w
    [N, K] loaded transposed by DMA into one [p, K tiles, N] tile, K summed in one PSUM tile."""
    k, m = x.shape
    n, p = w.shape[0], 128
    kt = (k + p - 1) // p
    out = nl.ndarray((m, n), dtype=x.dtype, buffer=nl.shared_hbm)
    xs = nl.ndarray((p, kt, m), dtype=x.dtype, buffer=nl.sbuf)
    wt = nl.ndarray((p, kt, n), dtype=w.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(kt):
        k0 = i * p
        nk = min(k, k0 + p) - k0
        nisa.activation(dst=xs[0:nk, i, :], op=nl.exp, data=nl.load(x[k0:k0 + nk, :]))
        nisa.dma_transpose(dst=wt[0:nk, i, :], src=w[:, k0:k0 + nk])
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(kt):
        nk = min(k, i * p + p) - i * p
        nisa.nc_matmul(dst=acc, stationary=xs[0:nk, i, :], moving=wt[0:nk, i, :])
    res = nl.ndarray(acc.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nl.store(out, res)
    return out


def _reads_argument(gm: torch.fx.GraphModule, index: int, upcast: bool = False) -> bool:
    """Every live GEMM has an operand that is a view of the graph's `index`-th argument (no copy of it;
    upcast: or its fp32 conversion)."""
    graph = copy.deepcopy(gm.graph)
    graph.eliminate_dead_code()
    arg = [n for n in graph.nodes if n.op == "placeholder"][index]
    views = {torch.ops.aten.view.default, torch.ops.aten.as_strided.default, torch.ops.aten.t.default,
             torch.ops.aten.permute.default, torch.ops.aten.slice.Tensor, torch.ops.aten.select.int,
             torch.ops.aten.alias.default}

    if upcast:
        views.add(torch.ops.aten._to_copy.default)

    def root(n):
        while n.op == "call_function" and n.target in views:
            n = n.args[0]
        return n

    gemms = [n for n in graph.nodes if n.target is torch.ops.aten.mm.default]
    return bool(gemms) and all(any(root(a) is arg for a in g.args[:2]) for g in gemms)


@pytest.mark.parametrize("k, m, n", [(300, 40, 200), (256, 1, 500), (384, 3, 512)])
def test_a_weight_loaded_transposed_is_read_where_it_is(k, m, n):
    """One side of the GEMM copies an argument (a weight loaded transposed), the other is computed: the
    one GEMM reads the argument itself (the transposed copy is dead code) against the computed tiles
    stacked, with a ragged last K tile (300) and one-token products (m 1, 3)."""
    torch.manual_seed(0)
    x, w = torch.randn(k, m, dtype=torch.bfloat16) * 0.5, torch.randn(n, k, dtype=torch.bfloat16)
    (fused, unfused, simulated), code = _three_ways(_computed_times_loaded_transposed, x, w)
    torch.testing.assert_close(unfused, simulated, rtol=1e-2, atol=1e-2)  # Inductor's exp: last bits
    _same_sum_rounded(fused, unfused, torch.exp(x.float()), w.T)
    torch.testing.assert_close(fused.float(), (torch.exp(x.double()).T @ w.double().T).float(), rtol=2e-2,
                               atol=2e-1)
    assert _gemms(code) == 1
    assert _reads_argument(code, 1)


@nki.jit
def _computed_times_weight_by_column_tiles(x, w):
    """(2 x).T @ w.T as the LM head computes it: the computed stationary side once ([p, K tiles, M]), the
    weight w [N, K] streamed 512 rows at a time (loaded transposed), each column tile its own PSUM tile,
    rounded to bf16 and stored into its columns of the output."""
    k, m = x.shape
    n, p, f = w.shape[0], 128, 512
    kt = (k + p - 1) // p
    out = nl.ndarray((m, n), dtype=x.dtype, buffer=nl.shared_hbm)
    xs = nl.ndarray((p, kt, m), dtype=x.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(kt):
        k0 = i * p
        nk = min(k, k0 + p) - k0
        nisa.tensor_scalar(dst=xs[0:nk, i, :], data=nl.load(x[k0:k0 + nk, :]), op0=nl.multiply, operand0=2.0)
    for j in nl.affine_range((n + f - 1) // f):
        n0 = j * f
        nn = min(n, n0 + f) - n0
        wt = nl.ndarray((p, kt, nn), dtype=w.dtype, buffer=nl.sbuf)
        for i in nl.affine_range(kt):
            k0 = i * p
            nisa.dma_transpose(dst=wt[0:min(k, k0 + p) - k0, i, :], src=w[n0:n0 + nn, k0:min(k, k0 + p)])
        acc = nl.ndarray((m, nn), dtype=nl.float32, buffer=nl.psum)
        for i in nl.affine_range(kt):
            nk = min(k, i * p + p) - i * p
            nisa.nc_matmul(dst=acc, stationary=xs[0:nk, i, :], moving=wt[0:nk, i, :])
        y = nl.ndarray((m, nn), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y, src=acc)
        nisa.dma_copy(dst=out[:, n0:n0 + nn], src=y)
    return out


@pytest.mark.parametrize("k, m, n", [(200, 1, 1100), (128, 3, 1024)])
def test_column_tiles_of_a_computed_times_a_weight_store_as_one_gemm(k, m, n):
    """Each output column tile is its own PSUM tile against the same computed stacked side: their stores
    merge into one GEMM over the whole weight (read where it is), with a ragged last K tile (200) and a ragged
    last column tile (1100 = 2 x 512 + 76); one- and three-token products."""
    torch.manual_seed(0)
    x, w = torch.randn(k, m, dtype=torch.bfloat16) * 0.5, torch.randn(n, k, dtype=torch.bfloat16)
    (fused, unfused, simulated), code = _three_ways(_computed_times_weight_by_column_tiles, x, w)
    torch.testing.assert_close(unfused, simulated, rtol=0, atol=0)
    _same_sum_rounded(fused, unfused, 2 * x.float(), w.T)  # (2 x is exact in bf16)
    assert _gemms(code) == 1
    assert _reads_argument(code, 1)


@nki.jit
def _probs_times_cached_values(p_row, v, v_new):
    """[2 p, 2 p0] @ [v; v_new] as decode attention computes it: each 128-key block of the probabilities
    transposed on the Tensor Engine (into another PSUM tile) between the matmuls that accumulate into o_ps,
    the cache's tiles loaded from v, and one more product of the new token's row."""
    s, d = v.shape
    p = 128
    out = nl.ndarray((1, d), dtype=v.dtype, buffer=nl.shared_hbm)
    probs = nl.ndarray((1, s), dtype=v.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=probs, data=nl.load(p_row), op0=nl.multiply, operand0=2.0)
    v_tiles = nl.ndarray((p, (s + p - 1) // p, d), dtype=v.dtype, buffer=nl.sbuf)
    for i in nl.affine_range((s + p - 1) // p):
        nisa.dma_copy(dst=v_tiles[0:min(s, i * p + p) - i * p, i, :], src=v[i * p:min(s, i * p + p), :])
    o_ps = nl.ndarray((1, d), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range((s + p - 1) // p):
        ns = min(s, i * p + p) - i * p
        t_ps = nl.ndarray((ns, 1), dtype=v.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=t_ps, data=probs[:, i * p:i * p + ns])
        pt = nl.ndarray((ns, 1), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=pt, src=t_ps)
        nisa.nc_matmul(dst=o_ps, stationary=pt, moving=v_tiles[0:ns, i, :])
    p_new = nl.ndarray((1, 1), dtype=v.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=p_new, data=nl.load(p_row[:, 0:1]), op0=nl.multiply, operand0=2.0)
    v_row = nl.ndarray((1, d), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=v_row, src=v_new)
    nisa.nc_matmul(dst=o_ps, stationary=p_new, moving=v_row)
    o = nl.ndarray((1, d), dtype=v.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o, src=o_ps)
    nl.store(out, o)
    return out


def test_transposes_between_accumulating_matmuls_leave_them_pending():
    """A write into another PSUM tile (the transposes) does not land o_ps's pending products: the cache's
    five tiles (ragged: 600 = 4 x 128 + 88; 600 x 64 is above fusion's tiny products) are one GEMM reading v
    itself, the new token's 1 x 1 x 64 product a fused multiply (no GEMM), all in one fp32 sum rounded once."""
    torch.manual_seed(0)
    p_row = torch.rand(1, 600, dtype=torch.bfloat16)
    v, v_new = torch.randn(600, 64, dtype=torch.bfloat16), torch.randn(1, 64, dtype=torch.bfloat16)
    (fused, unfused, simulated), code = _three_ways(_probs_times_cached_values, p_row, v, v_new)
    torch.testing.assert_close(unfused, simulated, rtol=0, atol=0)
    s = torch.cat([2 * p_row.float().T, 2 * p_row.float()[:, :1]])
    _same_sum_rounded(fused, unfused, s, torch.cat([v, v_new]).float())
    assert _gemms(code) == 1
    assert _reads_argument(code, 1, upcast=True)  # (an fp32 GEMM: a small one-token product, fusion.py)


@nki.jit
def _operand_borrowed_then_its_lender_rewritten(x, w):
    """b is a copy of a (it borrows a's memory); a matmul reading b is pending when a is rewritten in
    place (one row): the matmul must see b as it was."""
    k, m = x.shape
    out = nl.ndarray((m, w.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((k, m), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=a, data=nl.load(x), op0=nl.multiply, operand0=2.0)
    b = nl.ndarray((k, m), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=b, src=a)
    acc = nl.ndarray((m, w.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=b, moving=nl.load(w))
    nisa.memset(dst=a[0:1, :], value=0.0)
    nisa.nc_matmul(dst=acc, stationary=a, moving=nl.load(w))  # accumulates (2 x - its first row zeroed).T @ w
    res = nl.ndarray(acc.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nl.store(out, res)
    return out


def test_a_pending_operand_keeps_its_value_when_the_memory_it_borrows_is_rewritten():
    torch.manual_seed(0)
    x, w = torch.randn(96, 8, dtype=torch.bfloat16), torch.randn(96, 40, dtype=torch.bfloat16)
    (fused, unfused, simulated), _ = _three_ways(_operand_borrowed_then_its_lender_rewritten, x, w)
    torch.testing.assert_close(unfused, simulated, rtol=0, atol=0)
    zeroed = 2 * x.float()
    zeroed[0] = 0
    s = torch.cat([2 * x.float(), zeroed])
    _same_sum_rounded(fused, unfused, s, torch.cat([w, w]).float())
    _same_sum_rounded(fused, simulated, s, torch.cat([w, w]).float())
