"""What AWS's public kernels (nki-library, nki-samples) rely on beyond the instructions: a tensor's dtype printed
as its NKI name, a kernel called from inside a kernel running inline, lists of tensors as arguments,
nki.collectives on one rank, nki.typing annotations and nl.par_dim shapes; nisa.nc_version as an enum, NKI dtypes as
NumPy dtypes, nki.simulate on NumPy arrays of ml_dtypes' bf16 / fp8, nl.shared_identity_matrix in SBUF,
a unary operator (nl.abs) as tensor_scalar_reduce's op0, nl.shared_constant from a .npy file; an .ap() view past
its tile an error only where accessed, nc_matmul's double_row perf mode, LNC-2 writes of equal values; an NKIObject
class without @dataclass or __init__ built by keyword; an integer index on the partition dimension (one
partition) and a second index on a column taken by an integer (its element per partition)."""

import enum
import sys

import ml_dtypes
import numpy as np
import pytest
import torch

import nki  # nativelab's stand-in (tests/conftest.py imports nativelab, which installs it)
import nki.collectives as ncc
import nki.isa as nisa
import nki.language as nl
import nki.typing as nt

sim = nki.simulate  # interpreted: no compile


def _load(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def _stored(*tiles):
    """Each tile copied to a new HBM tensor of its shape and dtype."""
    outs = tuple(nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm) for t in tiles)
    for out, t in zip(outs, tiles):
        nisa.dma_copy(dst=out, src=t)
    return outs


@nki.jit
def _nkilib_style_dtype(x):
    # nki-library's resolve_dtype_to_nki: the dtype's string against NKI's names
    name = str(x.dtype)
    assert name == "bfloat16", name
    assert str(x.dtype) == str(nl.bfloat16) and str(nl.float32) == "float32"  # nkilib's sizeinbytes compares these
    assert x.dtype == nl.bfloat16 and x.dtype == torch.bfloat16 and x.dtype != nl.float32
    assert {nl.bfloat16: "ok"}[x.dtype] == "ok" and x.dtype in (nl.float16, nl.bfloat16)
    t = _load(x)
    assert str(t.dtype) == "bfloat16" and t.dtype == nl.bfloat16
    y = nl.ndarray(x.shape, dtype=t.dtype, buffer=nl.sbuf)  # a dtype read off a tile allocates as nl.bfloat16
    nisa.activation(dst=y, op=nl.exp, data=t)
    out = nl.ndarray(x.shape, dtype=y.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=y.ap([[x.shape[1], x.shape[0]], [1, x.shape[1]]], dtype=y.dtype))
    return out


@pytest.mark.parametrize("run", [sim, lambda k: k], ids=["interpreted", "compiled"])
def test_a_tensor_dtype_prints_its_nki_name_and_equals_nl_dtypes(run):
    x = torch.randn(8, 16).to(torch.bfloat16)
    out = run(_nkilib_style_dtype)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, torch.exp(x.float()).to(torch.bfloat16))


@nki.jit
def _scale_tile(x, factor):  # a kernel of its own, also called from another kernel on an SBUF tile
    t = x if x.buffer == nl.sbuf else _load(x)
    y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=factor)
    return y


@nki.jit
def _calls_a_kernel(x):
    y = _scale_tile(_load(x), 3.0)  # returns an SBUF tile: only possible inline
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_a_kernel_called_inside_a_kernel_runs_inline():
    x = torch.randn(4, 32)
    torch.testing.assert_close(sim(_calls_a_kernel)(x), 3 * x)
    torch.testing.assert_close(_calls_a_kernel(x), 3 * x)


@nki.jit
def _sum_of_list(xs, scales):
    acc = nl.ndarray(xs[0].shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    for x, s in zip(xs, scales):
        assert isinstance(x, nl.NkiTensor) and x.buffer == nl.hbm  # arrives as an NKI tensor in HBM
        t = _load(x)
        nisa.scalar_tensor_tensor(dst=acc, data=t, op0=nl.multiply, operand0=s, op1=nl.add, operand1=acc)
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_a_list_of_tensors_is_a_list_of_kernel_tensors_and_part_of_the_signature():
    xs = [torch.randn(4, 8) for _ in range(3)]
    torch.testing.assert_close(_sum_of_list(xs, [1.0, 2.0, 3.0]), xs[0] + 2 * xs[1] + 3 * xs[2])
    # other values in the list, other shapes: other traces, not the first one's
    torch.testing.assert_close(_sum_of_list(xs[:2], [1.0, -1.0]), xs[0] - xs[1])
    ys = [torch.randn(2, 16) for _ in range(2)]
    torch.testing.assert_close(sim(_sum_of_list)(ys, (0.5, 0.5)), 0.5 * (ys[0] + ys[1]))


@nki.jit
def _one_rank_collectives(x: nt.tensor, out_rows: nt.mutable_tensor):
    rg = ncc.ReplicaGroup([[0]])
    gathered = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_gather(srcs=[x], dsts=[gathered], replica_group=rg, collective_dim=0)
    reduced = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_reduce(srcs=[gathered], dsts=[reduced], replica_group=rg, op=nl.add)
    rank = ncc.rank_id()  # a register holding 0: selects the first row
    t = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=reduced.reshape((x.shape[0], 1, x.shape[1])).select(0, rank))
    nisa.dma_copy(dst=out_rows, src=t)
    return reduced


def test_collectives_on_one_rank_and_a_group_that_needs_more_ranks():
    x = torch.randn(4, 8)
    rows = torch.zeros(1, 8)
    torch.testing.assert_close(sim(_one_rank_collectives)(x, rows), x)
    torch.testing.assert_close(rows, x[:1])

    @nki.jit
    def two_ranks(x):
        out = nl.ndarray((2 * x.shape[0], x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
        ncc.all_gather(srcs=[x], dsts=[out], replica_group=ncc.ReplicaGroup([[0, 1]]), collective_dim=0)
        return out

    with pytest.raises(nki.NkiError, match=r"runs on one rank.*nki.multi_rank_simulate"):
        sim(two_ranks)(x)


@nki.jit
def _blocks_of_tiles(x):
    n = x.shape[0] // 128
    blocks = nl.ndarray((n, nl.par_dim(128), x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(n):
        nisa.dma_copy(dst=blocks[b], src=x[b * 128:(b + 1) * 128, :])
    for b in nl.affine_range(n):
        nisa.dma_copy(dst=out[b * 128:(b + 1) * 128, :], src=blocks[n - 1 - b])
    return out


def test_par_dim_marks_the_partition_dimension_after_blocks():
    x = torch.randn(384, 16)
    torch.testing.assert_close(sim(_blocks_of_tiles)(x), torch.cat([x[256:], x[128:256], x[:128]]))
    assert int(nl.par_dim(128)) == 128
    assert nt.tensor[128, 512] is nt.tensor and issubclass(nt.mutable_tensor, nt.tensor)


@nki.jit
def _scaled_by_generation(x):
    # nki-library's test framework keys its goldens by the generation's name (`nc_version.gen3.name`)
    factor = {"gen2": 2.0, "gen3": 3.0, "gen4": 4.0}[nisa.get_nc_version().name]
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=_scale_tile(_load(x), factor))
    return out


def test_nc_version_is_an_enum_with_names():
    # https://awsdocs-neuron.readthedocs-hosted.com/general/nki/api/generated/nki.isa.nc_version.html:
    # `class nki.isa.nc_version(value)`, "NeuronCore version", attributes gen2 (Trn1/Inf2), gen3 (Trn2), gen4 (Trn3)
    assert issubclass(nisa.nc_version, enum.Enum)
    assert [v.name for v in nisa.nc_version] == ["gen2", "gen3", "gen4"]
    assert nisa.nc_version.gen3.name == "gen3" and nisa.nc_version(3) is nisa.nc_version.gen3
    assert nisa.get_nc_version() is nisa.nc_version.gen3  # the emulated core: a NeuronCore-v3 (Trn2)
    x = torch.randn(4, 16)
    torch.testing.assert_close(sim(_scaled_by_generation)(x), 3 * x)


@nki.jit
def _cast_copy(x, dtype):
    t = _load(x)
    y = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=y, src=t)
    out = nl.ndarray(x.shape, dtype=dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_nki_dtypes_are_numpy_dtypes_where_numpy_asks():
    # https://awsdocs-neuron.readthedocs-hosted.com/en/v2.28.0/_modules/nki/language.html: AWS's nki.language
    # imports ml_dtypes for its bfloat16 / float8 types; nki.simulate "executes every nki.isa and nki.language
    # operation using Python and NumPy" (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/guides/
    # nki_simulator.html), so a test builds its inputs with `.astype(nl.<dtype>)`
    assert np.ones(4).astype(nl.float32).dtype == np.float32
    assert np.zeros(4, dtype=nl.bfloat16).dtype == ml_dtypes.bfloat16
    assert np.dtype(nl.float8_e4m3fn) == ml_dtypes.float8_e4m3fn and np.dtype(nl.float8_e5m2) == ml_dtypes.float8_e5m2
    assert np.dtype(nl.int32) == np.int32 and np.dtype(nl.uint8) == np.uint8 and np.dtype(nl.bool) == np.bool_
    # still NKI's names, still equal to the torch dtypes, and now to the NumPy ones too, both ways round
    assert str(nl.bfloat16) == "bfloat16" and nl.bfloat16 == torch.bfloat16 and {torch.bfloat16: 1}[nl.bfloat16] == 1
    assert nl.bfloat16 == ml_dtypes.bfloat16 and np.dtype(ml_dtypes.bfloat16) == nl.bfloat16
    assert nl.float32 == np.float32 and nl.float32 != np.float16 and nl.float32 != nl.bfloat16
    x = np.linspace(-3, 3, 64, dtype=np.float64).reshape(4, 16)
    got = sim(_cast_copy)(x.astype(nl.float32), nl.float16)  # the kernel rounds to fp16, as NumPy does
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, x.astype(nl.float32).astype(nl.float16))


@nki.jit
def _exp_halves_to_bf16_and_fp8(x):
    # each program of the launch grid (LNC-2: one a core) takes its half of the rows
    rows = x.shape[0] // nl.num_programs(0)
    lo = nl.program_id(0) * rows
    t = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[lo:lo + rows, :])
    e = nl.ndarray(t.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=t)
    f = nl.ndarray(t.shape, dtype=nl.float8_e4m3fn, buffer=nl.sbuf)
    nisa.tensor_copy(dst=f, src=t)
    out_e = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    out_f = nl.ndarray(x.shape, dtype=nl.float8_e4m3fn, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_e[lo:lo + rows, :], src=e)
    nisa.dma_copy(dst=out_f[lo:lo + rows, :], src=f)
    return out_e, out_f


@pytest.mark.parametrize("launch", [lambda k: sim(k), lambda k: sim(k)[2], lambda k: sim(k[2])],
                         ids=["lnc1", "simulate(k)[2]", "simulate(k[2])"])
def test_simulate_takes_and_returns_ml_dtypes_arrays(launch):
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.simulate.html: "A callable that,
    # when invoked with NumPy arrays, executes the kernel on CPU and returns NumPy array results"; with LNC2:
    # `nki.simulate(my_kernel[2])(a_np, b_np)`. AWS's bf16 / fp8 NumPy arrays are ml_dtypes' types
    x = np.random.default_rng(0).uniform(-2, 2, (128, 64)).astype(ml_dtypes.bfloat16)
    e, f = launch(_exp_halves_to_bf16_and_fp8)(x=x)  # by keyword, as nki-library's tests call kernels
    assert type(e) is np.ndarray and e.dtype == ml_dtypes.bfloat16 and e.shape == x.shape
    assert type(f) is np.ndarray and f.dtype == ml_dtypes.float8_e4m3fn
    xf = x.astype(np.float32)
    np.testing.assert_allclose(e.astype(np.float32), np.exp(xf), rtol=1e-2)  # one bf16 rounding of exp
    np.testing.assert_array_equal(f.astype(np.float32), xf.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))


@nki.jit
def _identity_in_sbuf(x):
    ident = nl.shared_identity_matrix(n=128, dtype=nl.bfloat16)
    assert ident.buffer == nl.sbuf
    as_fp32 = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=as_fp32, src=ident)  # an engine reads it where it is
    t = _load(x)
    xt = nl.ndarray((x.shape[1], 128), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=xt, stationary=t, moving=ident)  # x.T @ I: the Tensor Engine's transpose
    out_i = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_i, src=as_fp32)
    xt_sb = nl.ndarray(xt.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=xt_sb, src=xt)
    out_t = nl.ndarray(xt.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_t, src=xt_sb)
    return out_i, out_t


@pytest.mark.parametrize("run", [sim, lambda k: k], ids=["interpreted", "compiled"])
def test_shared_identity_matrix_is_in_sbuf(run):
    # https://awsdocs-neuron.readthedocs-hosted.com/general/nki/api/generated/nki.language.shared_identity_matrix.html:
    # "Create an identity matrix in SBUF with the specified data type"; its example stores it with nl.store
    x = torch.randn(128, 64).to(torch.bfloat16)
    ident, xt = run(_identity_in_sbuf)(x)
    torch.testing.assert_close(ident, torch.eye(128))
    torch.testing.assert_close(xt, x.float().T)


@nki.jit
def _row_absmax(x):
    t = _load(x)
    a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    m = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=a, data=t, op0=nl.abs, operand0=0.0, reduce_op=nl.maximum, reduce_res=m)
    return _stored(a, m)


@pytest.mark.parametrize("run", [sim, lambda k: k], ids=["interpreted", "compiled"])
def test_a_unary_operator_in_op0_applies_to_the_data(run):
    # https://awsdocs-neuron.readthedocs-hosted.com/en/v2.26.1/nki/api/nki.api.shared.html, "Supported Math Operators
    # for NKI ISA": Absolute (nki.language.abs) is an arithmetic `op` of the Vector Engine, like add, taking one
    # input: `data <op0> operand0` is abs(data), operand0 unused (a row's absmax in one instruction)
    x = torch.randn(16, 40)
    a, m = run(_row_absmax)(x)
    torch.testing.assert_close(a, x.abs())
    torch.testing.assert_close(m, x.abs().amax(1, keepdim=True))



def _plus_constant(constant):
    @nki.jit
    def kernel(x):
        c = nl.shared_constant(constant, dtype=nl.float32)
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=c)
        nisa.tensor_tensor(dst=t, data1=t, data2=_load(x), op=nl.add)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    return kernel


def test_shared_constant_takes_an_array_or_a_npy_file(tmp_path):
    # https://awsdocs-neuron.readthedocs-hosted.com/en/v2.32.0/nki/api/generated/nki.language.shared_constant.html:
    # "constant – the constant data. Can be a numpy array or a file path to a .npy file"
    x = torch.randn(8, 16)
    c = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 7
    path = tmp_path / "table.npy"
    np.save(path, c)
    c16 = c.astype(ml_dtypes.bfloat16)  # a bf16 array, as AWS's NumPy has it
    for constant, values in ((str(path), c), (path, c), (c, c), (c16, c16.astype(np.float32))):
        torch.testing.assert_close(sim(_plus_constant(constant))(x), x + torch.from_numpy(values))


def test_a_compiled_shared_constant_loads_again_from_the_disk_cache(tmp_path, monkeypatch):
    """Compiled (traced under fake tensors), a kernel's constant is baked in; a second kernel of the same code
    and constant compiles to the same cache key and loads the first one's artifact from disk, which must take
    the constant as the fresh one did (it failed with 'IndexError: list index out of range' at launch, as
    nki-library's transformer_tkg did on every second run)."""
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    monkeypatch.setenv("NATIVELAB_NKI_FIRST_CALL", "compile")  # each kernel's first launch compiled
    from nativelab.compiler import metrics

    x = torch.randn(8, 16).to("neuron")
    c = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 7
    expected = x.cpu() + torch.from_numpy(c)
    hits = metrics.current().cache_hits
    torch.testing.assert_close(_plus_constant(c)(x).cpu(), expected)  # compiled, written to the cache
    torch.testing.assert_close(_plus_constant(c)(x).cpu(), expected)  # a new kernel: loaded from the cache
    assert metrics.current().cache_hits == hits + 1
    other = c + 1  # another constant is another kernel
    torch.testing.assert_close(_plus_constant(other)(x).cpu(), x.cpu() + torch.from_numpy(other))
    assert metrics.current().cache_hits == hits + 1


_ACCESS_LINE = {}


@nki.jit
def _column_blocks(x, touch_the_last):
    # three 8-column views of a (4, 16) tile; the third reaches past it and is skipped unless asked for
    t = _load(x)
    out = nl.ndarray((4, 24), dtype=x.dtype, buffer=nl.shared_hbm)
    out_sb = nl.ndarray((4, 24), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=out_sb, value=-1.0)
    for j in range(3):
        block = t.ap(pattern=[[16, 4], [1, 8]], offset=j * 8)  # j == 2 reaches element 71 of 64
        if j < 2 or touch_the_last:
            _ACCESS_LINE["line"] = sys._getframe().f_lineno + 1
            nisa.tensor_copy(dst=out_sb[:, j * 8:(j + 1) * 8], src=block)
    nisa.dma_copy(dst=out, src=out_sb)
    return out


@pytest.mark.parametrize("run", [sim, lambda k: k], ids=["interpreted", "compiled"])
def test_a_view_past_the_tile_is_an_error_where_it_is_accessed_not_where_it_is_made(run):
    # https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/nki/api/generated/nki.language.NkiTensor.html: view
    # operations, .ap() among them ("low-level access pattern override"), "return new NkiTensor objects that share
    # the same underlying storage - no data is copied. Views are consumed by NKI ISA instructions"; the access
    # patterns page (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki-aps.html) says what
    # an instruction reads through one. Neither page says when a pattern past the tile is refused: making a view
    # reads nothing, so a view that no instruction uses is no error; the instruction that reads through it is one
    x = torch.randn(4, 16)
    got = run(_column_blocks)(x, False)
    torch.testing.assert_close(got, torch.cat([x, torch.full((4, 8), -1.0)], dim=1))
    with pytest.raises(nki.NkiError) as err:
        run(_column_blocks)(x, True)
    line = _ACCESS_LINE["line"]
    made = line - 3
    assert str(err.value) == (
        f"tensor_copy at tests/test_nki_compat.py:{line}: accesses a view outside its tile: access pattern "
        f"[[16, 4], [1, 8]] from offset 16 (made at tests/test_nki_compat.py:{made}) reaches element 71 of "
        f"(4, 16) float32 (nl.sbuf), which has 64 elements")


@nki.jit
def _double_fp8_matmul(x, y, mode):
    # x (256, M), y (256, N): the contraction's halves are the two rows of each partition
    k2 = x.shape[0] // 2
    st = nl.ndarray((k2, 2, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    mv = nl.ndarray((k2, 2, y.shape[1]), dtype=y.dtype, buffer=nl.sbuf)
    for t, src in ((st, x), (mv, y)):  # row r of partition p: src[r * k2 + p]
        nisa.dma_copy(dst=t, src=src.ap(pattern=[[src.shape[1], k2], [k2 * src.shape[1], 2], [1, src.shape[1]]]))
    acc = nl.ndarray((x.shape[1], y.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv, perf_mode=mode)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


@pytest.mark.parametrize("run", [sim, lambda k: k], ids=["interpreted", "compiled"])
def test_nc_matmul_double_row_contracts_two_rows_per_partition(run):
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.matmul_perf_mode.html:
    # double_row, "Double FP8 mode, 2x matmul throughput by packing two FP8 weight/ifmap element pairs"; the
    # Trainium2 guide (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.29.0/_sources/nki/guides/architecture/
    # trainium2_arch.rst, "Double FP8 Matmul Performance"): stationary [128, 2, 128], moving [128, 2, 512],
    # dst [128, 512]; "the first and second tile correspond to first and second halves of the contraction
    # dimension"; "Mixing FP8_E4 in one input matrix and FP8_E5 in the other is also allowed"; the sequence
    # "takes the same amount of time as the regular BF16/FP16 ... with a 128 contraction dimension"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=g).to(torch.float8_e4m3fn)
    y = torch.randn(256, 96, generator=g).to(torch.float8_e5m2)
    double = nisa.matmul_perf_mode.double_row
    torch.testing.assert_close(run(_double_fp8_matmul)(x, y, double), x.float().T @ y.float())
    # one MultiplyMoving of 96 columns: max(96, 64) cycles at 2.4 GHz, as a bf16 matmul of a 128 contraction
    tensor_s = _double_fp8_matmul.estimate(x, y, double).busy["tensor"]
    assert tensor_s == pytest.approx(96 / 2.4e9)
    # the nc_matmul page: "Tensor Engine supports FP8 double performance mode"; a bf16 operand is not FP8
    with pytest.raises(nki.NkiError, match=r"perf_mode double_row is the double FP8 mode: moving must be "
                                           r"float8_e4m3 or float8_e5m2, got torch.bfloat16"):
        run(_double_fp8_matmul)(x, y.to(torch.bfloat16), double)


@nki.jit
def _both_programs_store_all(x, skew):
    # no sharding: each program of an LNC-2 launch computes and stores the whole output
    t = _load(x)
    if skew:  # the programs' values differ by their rank
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(nl.program_id(0)))
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    _ACCESS_LINE["store"] = sys._getframe().f_lineno + 1
    nisa.dma_copy(dst=out, src=t)
    return out


def test_lnc2_programs_writing_equal_values_are_duplicated_work_not_a_race_on_values():
    # https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/get-started/about/lnc.html: "A NEFF compiled for
    # LNC=2 contains PNC-specific instructions for each of the two PNCs ... the two PNCs have access to shared HBM
    # memory"; nl.shared_hbm is "Visible to all kernel instances in the SPMD grid" (https://awsdocs-neuron.
    # readthedocs-hosted.com/en/v2.31.0/nki/api/generated/nki.language.shared_hbm.html). The pages are silent on two
    # cores storing the same elements: stored with equal values either order leaves the same bytes (no race on
    # values), but each core does the other's work, which is still worth a warning
    x = torch.randn(8, 16)
    with pytest.warns(nki.HazardWarning) as caught:
        got = sim(_both_programs_store_all[2])(x, False)
    torch.testing.assert_close(got, x)
    line = f"tests/test_nki_compat.py:{_ACCESS_LINE['store']}"
    (w,) = [str(c.message) for c in caught if c.category is nki.HazardWarning]
    site = _both_programs_store_all[2].hazards(x, False)[0].site
    assert w == (f"nki: WAW hazard (write after write) between the programs of the launch grid (2,): program 0's "
                 f"dma_copy at {line} and program 1's dma_copy at {line} write the same elements of the tensor "
                 f"(8, 16) float32 (shared_hbm, allocated at {site}) with equal values: either order leaves the "
                 f"same result, so this is no race on values, but both programs do the same work: give each program "
                 f"its own part of the tensor")
    (h,) = _both_programs_store_all[2].hazards(x, True)  # unequal values: a race on values, as before
    assert h.kind == "WAW" and not h.equal and "with equal values" not in h.message()
    assert "the result depends on which comes first" in h.message()


# Item 9: SBUF and PSUM held as AWS's compiler allocates them. AWS's NKI Block Dimension Migration Guide
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/migration/nki_block_dimension_migration_guide.html):
# "The compiler analyzes the memory dependency and allocates a physical address to each tile. This means that
# the physical tiles may not be alive in the memory simultaneously"; a Python list of tiles, each used in turn,
# compiles as the block dimension did. nki.compiler.Allocation
# (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.compiler.Allocation.html): the
# address is held from a tile's first write to its last read. Our kernels: a plain Python loop over a list of
# tiles, each written, read and done with in its iteration (fits), and the same tiles all read after all are
# written (does not fit: an error naming the numbers).
_TILE_COLS = 20 * 1024  # 80 KiB of fp32 per partition: three exceed SBUF's 224 KiB, one at a time fits


@nki.jit
def _sbuf_list(x, together):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tiles = [nl.ndarray(x.shape[1:], dtype=x.dtype, buffer=nl.sbuf) for _ in range(x.shape[0])]
    for i, t in enumerate(tiles):
        nisa.dma_copy(dst=t, src=x[i])
        nisa.activation(dst=t, op=nl.exp, data=t)  # OVERFLOW
        if not together:
            nisa.dma_copy(dst=out[i], src=t)
    for i, t in enumerate(tiles):
        if together:
            nisa.dma_copy(dst=out[i], src=t)
    return out


@nki.jit
def _psum_list(x, together):
    out = nl.ndarray((9,) + x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    s = _load(x)
    o = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    banks = []
    for i in range(9):  # one PSUM bank each: nine in a list, PSUM has eight
        p = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=p, stationary=s[:, 0:128], moving=s)  # OVERFLOW
        banks.append(p)
        if not together:
            nisa.tensor_scalar(dst=o, data=p, op0=nl.multiply, operand0=float(i + 1))
            nisa.dma_copy(dst=out[i], src=o)
    for i, p in enumerate(banks):
        if together:
            nisa.tensor_scalar(dst=o, data=p, op0=nl.multiply, operand0=float(i + 1))
            nisa.dma_copy(dst=out[i], src=o)
    return out


def _overflow_line(kernel):
    import inspect
    lines, start = inspect.getsourcelines(kernel.fn if hasattr(kernel, "fn") else kernel)
    return start + next(i for i, line in enumerate(lines) if "# OVERFLOW" in line)


def test_tiles_in_a_python_list_are_live_from_first_to_last_use_not_while_the_list_holds_them():
    x = torch.randn(3, 128, _TILE_COLS) / 4
    torch.testing.assert_close(sim(_sbuf_list)(x, False), torch.exp(x), rtol=1e-6, atol=1e-6)
    m = torch.randn(128, 512)
    want = torch.stack([(m[:, 0:128].T @ m) * (i + 1) for i in range(9)])
    torch.testing.assert_close(sim(_psum_list)(m, False), want, rtol=1e-4, atol=1e-4)


def test_tiles_live_together_past_the_memory_are_an_error_with_the_numbers():
    here = "tests/test_nki_compat.py"
    with pytest.raises(nki.NkiError) as e:
        sim(_sbuf_list)(torch.zeros(3, 128, _TILE_COLS), True)
    assert str(e.value) == (
        f"SBUF allocation at {here}:{_overflow_line(_sbuf_list)}: the tile (128, 20480) float32 allocated at "
        f"{here}:{_overflow_line(_sbuf_list) - 3} needs 10485760 B (128 partitions x 81920 B) with 20971520 B "
        f"already live in 2 tile(s) (the largest: (128, 20480) float32 allocated at "
        f"{here}:{_overflow_line(_sbuf_list) - 3}, 10485760 B; (128, 20480) float32 allocated at "
        f"{here}:{_overflow_line(_sbuf_list) - 3}, 10485760 B); SBUF holds 29360128 B (28 MiB = 128 partitions x "
        f"229376 B)")
    with pytest.raises(nki.NkiError) as e:
        sim(_psum_list)(torch.zeros(128, 512), True)
    msg = str(e.value)
    assert msg.startswith(f"PSUM allocation at {here}:{_overflow_line(_psum_list)}: the tile (128, 512) float32 "
                          f"allocated at {here}:{_overflow_line(_psum_list) - 1} needs 262144 B (128 partitions x "
                          f"2048 B) with 2097152 B already live in 8 tile(s)"), msg
    assert msg.endswith("PSUM holds 2097152 B (2 MiB = 128 partitions x 8 banks of 2048 B)"), msg


@nki.jit
def _gather_index_tile(data, idx):
    # nki-library's rotational top-k (core/topk/rotational_topk.py) gathers its uint32 index tile with
    # nc_n_gather: data uint32, dst in data's dtype
    t = _load(data)
    dst = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.nc_n_gather(dst=dst, data=t, indices=_load(idx))
    out = nl.ndarray(idx.shape, dtype=data.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_nc_n_gather_moves_uint32_data():
    # a gather moves elements, whatever their type (no AWS page found lists nc_n_gather's data dtypes; nki-library's
    # top-k gathers uint32 on the chip); torch on CPU has no gather for uint32, which was an error here
    rng = np.random.default_rng(0)
    data = rng.integers(0, 2**32, (16, 40), dtype=np.uint32) | np.uint32(2**31)  # top bit set: the bits survive
    idx = rng.integers(0, 40, (16, 9), dtype=np.uint32)
    out = sim(_gather_index_tile)(torch.from_numpy(data), torch.from_numpy(idx))
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(data, idx.astype(np.int64), axis=1))


@nki.jit
def _scales_as_fp8_bytes(scales):
    # nki-library's rmsnorm_quant (core/rmsnorm/rmsnorm_quant.py) stores its fp32 (P, 1) dequantization scales
    # into 4 fp8 columns of its fp8 output: the tile read as fp8 through .ap, partition step 4
    p = scales.shape[0]
    out = nl.ndarray((p, 4), dtype=nl.float8_e4m3, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=_load(scales).ap(pattern=[[4, p], [1, 4]], dtype=nl.float8_e4m3))
    return out


@pytest.mark.parametrize("run", [sim, lambda k: k], ids=["interpreted", "compiled"])
def test_an_access_pattern_with_a_dtype_steps_partitions_in_that_dtype(run):
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki-aps.html: .ap(pattern, offset, ...,
    # dtype); the pattern is the same on every partition, the partition dimension giving the number of partitions.
    # The page does not say in which elements the partition step counts under `dtype`; nki-library's rmsnorm_quant
    # reads an fp32 (P, 1) tile as fp8 with step 4, one partition's 4 bytes: the view's elements, as here
    p = 16
    scales = torch.arange(1, p + 1, dtype=torch.float32).reshape(p, 1) / 8  # no byte is one of fp8's NaN codes
    raw = scales.numpy().view(np.uint8).reshape(p, 4)
    assert not ((raw & 0x7F) == 0x7F).any()
    out = run(_scales_as_fp8_bytes)(scales)
    np.testing.assert_array_equal(out.view(torch.uint8).numpy(), raw)


@nki.jit
def _sum_of_squares_into_one_column(x):
    # nki-library's qkv_cte (core/qkv/qkv_cte.py, its RMSNorm): activation_reduce wants a dst of data's shape, but
    # only the reduction is kept, so the dst is a (P, 1) tile seen through pattern [[1, P], [0, H]]
    p, h = x.shape
    act = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    ssq = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=act.ap(pattern=[[1, p], [0, h]]), op=nl.square, data=_load(x), reduce_op=nl.add,
                           reduce_res=ssq)
    return _stored(act, ssq)


@pytest.mark.parametrize("run", [sim, lambda k: k], ids=["interpreted", "compiled"])
def test_a_dst_pattern_of_step_0_writes_one_element_the_last_value_staying(run):
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki-aps.html: a pattern is [step, num]
    # per dimension; the page does not say what a write through a step of 0 leaves. nki-library's qkv_cte writes
    # so (above) and keeps only the reduction; here the elements land in the pattern's order, the last staying
    x = torch.randn(16, 40)
    act, ssq = run(_sum_of_squares_into_one_column)(x)
    torch.testing.assert_close(ssq, (x * x).sum(1, keepdim=True))
    torch.testing.assert_close(act, x[:, -1:] ** 2)


class _Dims(nl.NKIObject):
    # nki-library's moe_cte (core/moe/moe_cte/bwmm_shard_on_I.py, moe_cte_utils.py) declares its dimension and
    # config classes so, no @dataclass and no __init__, and builds them with keywords, leaving derived fields out
    rows: int
    cols: int
    tiles: int
    scale: float = 2.0

    def derive(self):
        self.tiles = self.rows // 4


class _Checked(nl.NKIObject):
    n: int

    def __post_init__(self):
        self.twice = None if self.n is None else 2 * self.n


@nki.jit
def _scaled_by_a_config(x):
    dims = _Dims(rows=x.shape[0], cols=x.shape[1])
    dims.derive()
    out = nl.ndarray((dims.rows, dims.cols), dtype=x.dtype, buffer=nl.shared_hbm)
    t = _load(x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=dims.scale * dims.tiles)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_an_nki_object_without_dataclass_or_init_takes_its_fields_by_keyword():
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/get-started/nki-language-guide.html, "Class
    # Support": "The @dataclass decorator is optional; classes with and without the @dataclass decorator will be
    # compiled in the same way"; the compiler creates __init__ and __post_init__ where the user does not, for
    # `x : int` and `y : bool = False`: `def __init__(self, x = None, y = False)` setting each, then __post_init__()
    d = _Dims(rows=8, cols=3)
    assert (d.rows, d.cols, d.tiles, d.scale) == (8, 3, None, 2.0)  # no default: None
    d = _Dims(8, 3, 1, 0.5)  # positional, in declaration order
    assert (d.rows, d.cols, d.tiles, d.scale) == (8, 3, 1, 0.5)
    assert _Checked(n=5).twice == 10 and _Checked().twice is None
    with pytest.raises(TypeError, match="unexpected keyword argument 'depth'"):
        _Dims(rows=1, depth=2)
    with pytest.raises(TypeError, match="takes 4 positional arguments"):
        _Dims(1, 2, 3, 4, 5)
    x = torch.randn(16, 8)
    torch.testing.assert_close(sim(_scaled_by_a_config)(x), x * (2.0 * 4))


@nki.jit
def _row_through_partition_0(x):
    # nki-library's find_nonzero_indices_with_count (experimental/benchmark/): a (1, T) HBM row into partition 0 of
    # a (128, T) tile, and partition 0 of a (128, T + 1) tile out to a (1, T + 1) HBM row, both through [0, :]
    t = x.shape[-1]
    sb = nl.ndarray((128, t), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb[0, :], src=x[...])
    wide = nl.ndarray((128, t + 1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=wide, value=7.0)
    nisa.tensor_copy(dst=wide[0, 1:], src=sb[0, :])
    out = nl.ndarray((1, t + 1), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[0, :], src=wide[0, :])
    return out


@nki.jit
def _column_then_its_element(x, k):
    # nki-library's attention_cte (core/attention/attention_cte.py:2744): a column taken with an integer free index,
    # `lbs[:p, k]`, then its element per partition as a (p, 1) operand, `[:p, :1]`
    p = x.shape[0]
    col = _load(x)[:p, k]
    out = nl.ndarray((p, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=col[:p, :1])
    return out, col.shape, col[:p, :1].shape, col[:p, 0].shape


@pytest.mark.parametrize("t", [128, 512])
def test_an_integer_index_on_the_partition_dimension_is_one_partition(t):
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/get-started/nki-language-guide.html, "Tensor
    # Indexing": "the first dimension of a tensor always corresponds to the partition dimension", `t[0,0,10]` is the
    # "10th element in partition 0", and an integer index drops its dimension (`t[0,...]` of (64, 64, 64) has shape
    # (64, 64)); https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki-aps.html: an access is
    # a number of partitions and a free pattern repeated on each. So `t[0, :]` of an on-chip tile is 1 partition of
    # T elements, whatever T, where it was refused as T partitions; an HBM row `x[0, :]` has no partitions at all
    x = torch.arange(t, dtype=torch.float32).reshape(1, t)
    out = sim(_row_through_partition_0)(x)
    torch.testing.assert_close(out, torch.cat([torch.full((1, 1), 7.0), x], dim=1))


def test_a_column_taken_by_an_integer_index_is_addressed_per_partition():
    # the same pages: `lbs[:p, k]` keeps the partition dimension and drops the free one, shape (p,), one element on
    # each partition; that element is the access's free pattern, so `[:p, :1]` addresses it: (p, 1), as AWS's
    # attention_cte uses it on the chip; a second index past it stays an error
    x = torch.randn(16, 4)
    out, col, sliced, picked = sim(_column_then_its_element)(x, 2)
    assert (col, sliced, picked) == ((16,), (16, 1), (16,))
    torch.testing.assert_close(out, x[:, 2:3])
    with pytest.raises(nki.NkiError, match="slice 1:2 of the one element per partition"):
        sim(_column_past_its_element)(x)


@nki.jit
def _column_past_its_element(x):
    return _load(x)[:, 1][:, 1:2]
