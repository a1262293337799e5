"""nki.isa: NeuronCore-v3 instructions (the NKI 0.5.0 signatures: the destination first), each computed as
torch operations on the tiles' views, with the checks AWS's API pages state for it: which memories it reads
and writes, which engine may run it, tile-size limits. Engines compute in fp32 and round once to the
destination's dtype; the Tensor Engine accumulates in fp32 in PSUM."""

from __future__ import annotations

import math
import struct

import torch

from .. import limits, mx, trace
from ..core import compute, fill, instruction, ndarray, record
from ..ops import as_op
from ..tensor import NkiTensor, VirtualRegister, in_bounds, note_write, psum, read, read_float, sbuf, write, written
from ..tensor import skipping_out_of_bounds
from . import prng
from .constants import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd  # noqa: F401


def get_nc_version():
    """The emulated core is a NeuronCore-v3 (Trainium2); gen4 when NEURON_PLATFORM_TARGET_OVERRIDE=trn3 (its
    MX instructions run, everything else stays NeuronCore-v3's)."""
    return nc_version.gen4 if limits.target_version() >= 4 else nc_version.gen3


def get_nc_sub_version():
    """The silicon revision within the generation: the first (0)."""
    return 0


# the engines as module constants (deprecated in 0.5.0 for nisa.engine.*, still used by kernels)
tensor_engine, vector_engine, scalar_engine = engine.tensor, engine.vector, engine.scalar
gpsimd_engine, unknown_engine = engine.gpsimd, engine.unknown
NkiValidationError = limits.NkiError  # what a broken hardware constraint raises


_FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)


def _engine(instruction: str, chosen, allowed: tuple[str, ...]) -> str:
    """The engine an instruction runs on: the one asked for, if it may run there, else the first allowed."""
    if chosen is None or chosen == engine.unknown:
        return allowed[0]
    limits.check(chosen in allowed, instruction,
                 f"cannot run on the {chosen} engine; it runs on {' or '.join(allowed)}")
    return chosen


def _tile(instruction: str, t, what: str, eng: str, memories=("sbuf", "psum")) -> None:
    limits.check(isinstance(t, NkiTensor), instruction, f"{what} must be an NKI tile, got {type(t).__name__}")
    limits.check(t.buffer.name in memories, instruction,
                 f"{what} is in {t.buffer}; {instruction} on the {eng} engine accesses "
                 f"{' or '.join('nl.' + m for m in memories)}")
    limits.check_partitions(instruction, what, t.partition_shape())


def _memories(eng: str) -> tuple[str, ...]:
    # GpSimd reaches SBUF only; Vector and Scalar read and write SBUF and PSUM (the architecture guides'
    # engine / SRAM connectivity figures).
    return ("sbuf",) if eng == "gpsimd" else ("sbuf", "psum")


def _out(dst, shape, dtype, buffer=sbuf):
    return dst if dst is not None else ndarray(shape, dtype, buffer)


def _free(t: NkiTensor) -> int:
    return t.numel() // (t.shape[0] if t.shape else 1)


def _scalar_or_vector(instruction: str, x, data: NkiTensor, what: str):
    """A scalar operand, or a [P, 1] vector broadcast along the free dimension."""
    if isinstance(x, NkiTensor):
        limits.check(x.shape[0] == data.shape[0] and _free(x) == 1, instruction,
                     f"{what} must be a scalar or a vector of one element per partition ({data.shape[0]}, 1), "
                     f"got {x.shape}")
        v = read(x, instruction).float().reshape((data.shape[0],) + (1,) * (data.ndim - 1))
        return v
    return _f32(x)


_F32_OVERFLOW = 2.0**128 - 2.0**103  # halfway from fp32's largest value to the next power: rounds to inf from here


def _f32(x) -> float:
    """A scalar operand as the engines see it: rounded to fp32 (to nearest, ties to even), so -3.4028235e38, a
    common spelling of fp32's lowest value, is that value, and only what rounds past fp32's range is +-inf."""
    x = float(x)
    if x != x:
        return x
    if abs(x) >= _F32_OVERFLOW:
        return math.copysign(math.inf, x)
    return struct.unpack("f", struct.pack("f", x))[0]


def _binary(op, x, y, reverse: bool):
    """x <op> y, or y <op> x when reversed. A one-input ALU operator of AWS's table (nl.abs, nl.reciprocal,
    nl.rsqrt, nl.logical_not) applies to x (the data) alone: its operand is unused."""
    f = as_op(op)
    if f.arity == 1:
        return f.apply(x)
    return f.apply(y, x) if reverse else f.apply(x, y)


def _emit(ins: str, eng: str, dst, data: NkiTensor, out: torch.Tensor, inputs: int = 1):
    """The common tail of an elementwise instruction: its destination (a new tile of data's shape and dtype
    if none was given), checked, the instruction recorded, the result written."""
    dst = _out(dst, data.shape, data.dtype)
    _tile(ins, dst, "dst", eng, _memories(eng))
    record(ins, eng, data, inputs=inputs)
    write(dst, out, ins)
    return dst


# --- data movement


def _skips(ins: str, mode) -> bool:
    """oob_mode: error (the default: an out-of-bounds runtime offset is an error when interpreted) or skip
    (AWS's nki.isa.oob_mode page: "Silently skip the runtime out-of-bounds access")."""
    name = getattr(mode, "name", mode)
    limits.check(name in (None, "error", "skip"), ins, f"oob_mode must be nisa.oob_mode.error or skip, got {mode!r}")
    return name == "skip"


def _keep_skipped(value: torch.Tensor, dst: NkiTensor, srcs, ins: str) -> torch.Tensor:
    """Under oob_mode.skip, a gathered position whose source row was out of bounds keeps dst's old value."""
    oks = [ok.reshape(dst.shape) for ok in map(in_bounds, srcs) if ok is not None]
    if not oks:
        return value
    ok = oks[0]
    for more in oks[1:]:
        ok = ok & more
    old = read(dst, ins, check_written=False)
    return torch.where(ok, value.reshape(dst.shape).to(dst.dtype), old)


def dma_copy(dst: NkiTensor, src: NkiTensor, dst_rmw_op=None, oob_mode=None, dge_mode=None, name=None, **_kw):
    """Copy src to dst through a DMA queue (HBM <-> SBUF, SBUF <-> SBUF, HBM <-> HBM); dst_rmw_op=nl.add
    accumulates into dst (through runtime offsets every row adds, repeated ones too: the compiler orders
    them, AWS's page says). The element counts must match; PSUM is not reachable by DMA. oob_mode.skip: a
    runtime-offset row out of bounds is skipped (a gathered row leaves dst's row as it was; a scattered row
    is not written), interpreted and compiled."""
    for what, t in (("dst", dst), ("src", src)):
        limits.check(isinstance(t, NkiTensor), "dma_copy", f"{what} must be an NKI tensor")
        limits.check(t.buffer is not psum, "dma_copy",
                     f"{what} is in PSUM; DMA moves data between HBM and SBUF: copy PSUM to SBUF with a compute "
                     f"engine (nisa.tensor_copy) first")
        if t.buffer.on_chip:
            limits.check_partitions("dma_copy", what, t.partition_shape())
    limits.check(dst.numel() == src.numel(), "dma_copy",
                 f"src {src.shape} and dst {dst.shape} must have the same number of elements "
                 f"({src.numel()} vs {dst.numel()})")
    skip = _skips("dma_copy", oob_mode)
    limits.check(not (skip and dst_rmw_op is not None), "dma_copy",
                 "with dst_rmw_op only oob_mode.error is allowed (AWS's dma_copy page)")
    with skipping_out_of_bounds(skip):
        v = read(src, "dma_copy")
        op = as_op(dst_rmw_op) if dst_rmw_op is not None else None
        # dst = dst_rmw_op(dst, src) by the DMA engine: an accumulation into dst (nki/hazards.py)
        record("dma_copy", "dma", dst, accumulates=op.name if op is not None else None)
        if op is not None:
            if op.name == "add" and dst.is_indirect():
                write(dst, v.reshape(dst.shape).float(), "dma_copy", accumulate=True)
            else:
                v, _ = compute(op, [read(dst, "dma_copy"), v.reshape(dst.shape)])
                write(dst, v, "dma_copy")
        elif skip and src.is_indirect():
            write(dst, _keep_skipped(v, dst, [src], "dma_copy"), "dma_copy")
        else:
            write(dst, v.reshape(dst.shape), "dma_copy", source=src)
    return dst


DMA_COMPUTE_MAX_SRCS = 16  # the nki.isa.dma_compute page: "The max number of source tensors in srcs is 16"


def dma_compute(dst: NkiTensor, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=None, name=None, **_kw):
    """dst = srcs[0] + srcs[1] + ... computed inside a DMA engine, in fp32, rounded once to dst's dtype
    (HBM or SBUF; reduce_op nl.add and scales of 1.0 only, as the page says). With a runtime-offset view
    (.ap(vector_offset=...)) as dst and as one source it is a read-modify-write: a scatter-add into HBM rows,
    or with such a source a gather-add of HBM rows into SBUF. unique_indices=False: repeated scatter rows all
    add (index_add: each row's fp32 sum of dst and every update to it, rounded once; AWS's page says the chip
    does not support it yet). oob_mode.skip: rows out of bounds are skipped, as in dma_copy."""
    ins = "dma_compute"
    srcs = list(srcs)
    limits.check(1 <= len(srcs) <= DMA_COMPUTE_MAX_SRCS, ins,
                 f"takes 1 to {DMA_COMPUTE_MAX_SRCS} source tensors, got {len(srcs)}")
    limits.check(as_op(reduce_op).name == "add", ins, f"reduce_op must be nl.add, got {reduce_op!r}")
    limits.check(scales is None or all(float(x) == 1.0 for x in scales), ins,
                 f"scales must all be 1.0 (or None), got {list(scales) if scales is not None else None}")
    for what, t in [("dst", dst)] + [(f"srcs[{i}]", t) for i, t in enumerate(srcs)]:
        limits.check(isinstance(t, NkiTensor), ins, f"{what} must be an NKI tensor, got {type(t).__name__}")
        limits.check(t.buffer is not psum, ins, f"{what} is in PSUM; DMA engines reach HBM and SBUF")
        limits.check(t.numel() == dst.numel(), ins,
                     f"{what} has {t.numel()} elements ({t.shape}); every tensor must have dst's {dst.numel()}")
        if t.buffer.on_chip:
            limits.check_partitions(ins, what, t.partition_shape())
    skip = _skips(ins, oob_mode)
    # a scatter-add with repeated rows: dst's rows are not read once each, so every update adds on its own
    scatter_add = not unique_indices and dst.is_indirect() and any(
        t.storage is dst.storage and t.chain == dst.chain for t in srcs)
    summed = [t for t in srcs if not (scatter_add and t.storage is dst.storage and t.chain == dst.chain)]
    with skipping_out_of_bounds(skip):
        total = None
        for t in summed:
            v = read(t, ins).float().reshape(dst.shape)
            total = v if total is None else total + v
        # dst among the sources: dst += ..., the DMA engine's read-modify-write accumulation (nki/hazards.py)
        into_dst = any(t.storage is dst.storage and t.chain == dst.chain for t in srcs)
        record(ins, "dma", dst, accumulates="add" if into_dst else None)
        tr = trace.active()
        if tr is not None and tr.instructions:  # the engine streams every source through it
            tr.instructions[-1].elements = sum(t.numel() * t.data.element_size() for t in srcs)
        if total is None:  # dst += dst ... only: nothing else to add
            total = torch.zeros(dst.shape, dtype=torch.float32, device=dst.data.device)
        if scatter_add:
            write(dst, total, ins, accumulate=True)
        else:
            if skip and not dst.is_indirect():
                total = _keep_skipped(total, dst, summed, ins)
            write(dst, total, ins)
    return dst


def dma_transpose(dst: NkiTensor, src: NkiTensor, axes=None, dge_mode=None, name=None, **_kw):
    """A DMA that transposes: dst = src with its axes reversed (or permuted by `axes`); 2- and 4-byte types."""
    limits.check(src.data.element_size() in (2, 4), "dma_transpose",
                 f"transposes 2- and 4-byte types, got {src.dtype}")
    perm = tuple(axes) if axes is not None else tuple(reversed(range(src.ndim)))
    v = read(src, "dma_transpose").permute(perm)
    dst = _out(dst, tuple(v.shape), src.dtype)
    limits.check(dst.buffer is sbuf, "dma_transpose", f"writes SBUF, dst is in {dst.buffer}")
    limits.check_partitions("dma_transpose", "dst", dst.shape)
    record("dma_transpose", "dma", dst)
    write(dst, v, "dma_transpose", source=src._derive("permute", perm))  # the value's element order
    return dst


# --- Tensor Engine


def nc_matmul(dst, stationary: NkiTensor, moving: NkiTensor = None, is_stationary_onezero=False,
              is_moving_onezero=False, is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=None, name=None, **_kw):
    """dst[M, N] = stationary[K, M].T @ moving[K, N] on the Tensor Engine, accumulated in fp32 in PSUM.

    K (the partition dimension of both) <= 128, M (stationary's free size) <= 128, N (moving's) <= 512.
    accumulate=True adds into dst, False overwrites it; None (the default) adds into what earlier matmuls
    wrote there and overwrites a region not yet written: a loop over K tiles into one PSUM tile sums them.
    Compiled, such a loop is one GEMM (nki/fusion.py): the same fp32 sum, its additions in another order."""
    if moving is None and isinstance(dst, NkiTensor) and isinstance(stationary, NkiTensor) and dst.buffer is not psum:
        dst, stationary, moving = None, dst, stationary  # nc_matmul(stationary, moving): the result is returned
    ins = "nc_matmul"
    for what, t in (("stationary", stationary), ("moving", moving)):
        _tile(ins, t, what, "tensor", ("sbuf",))
        limits.check(t.dtype in _FLOAT_INPUTS, ins,
                     f"{what} is {t.dtype}; the Tensor Engine takes bf16, fp16, tf32/fp32 and fp8 inputs")
    double = perf_mode is not None and str(perf_mode) != matmul_perf_mode.none
    if double:
        _double_row(ins, stationary, moving, is_transpose, tile_size)
    rows = limits.DOUBLE_ROW_ROWS if double else 1  # contraction rows per partition
    k, m, n = stationary.shape[0], _free(stationary) // rows, _free(moving) // rows
    limits.check(moving.shape[0] == k, ins,
                 f"stationary and moving must share the contraction (partition) size: {k} vs {moving.shape[0]}")
    limits.check(m <= limits.GEMM_STATIONARY_FMAX, ins,
                 f"stationary free size {m} (shape {stationary.shape}) exceeds {limits.GEMM_STATIONARY_FMAX} "
                 f"(nl.tile_size.gemm_stationary_fmax: the Tensor Engine's 128 PE columns)")
    limits.check(n <= limits.GEMM_MOVING_FMAX, ins,
                 f"moving free size {n} (shape {moving.shape}) exceeds {limits.GEMM_MOVING_FMAX} "
                 f"(nl.tile_size.gemm_moving_fmax: one PSUM bank of 512 fp32 per partition)")
    dst = _out(dst, (m, n), torch.float32, psum)
    limits.check(dst.buffer is psum, ins, f"writes its result to PSUM; dst is in {dst.buffer}")
    limits.check(dst.numel() == m * n and dst.shape[0] == m, ins,
                 f"dst has shape {dst.shape}; stationary {stationary.shape} x moving {moving.shape} gives ({m}, {n})")
    add = bool(accumulate) if accumulate is not None else (not is_transpose and written(dst))
    fuser = trace.active().fuser if trace.active() is not None else None
    # matmuls into one PSUM tile are an associative accumulation (AWS's nl.affine_range page): nki/hazards.py
    group = None if is_transpose else "matmul"
    if fuser is not None and dst.dtype == torch.float32 and not double:  # compiled: one GEMM per K loop
        s_value, m_value = read(stationary, ins), read(moving, ins)
        record(ins, "tensor", moving, flops=2 * k * m * n, accumulates=group)
        note_write(dst)
        fuser.defer(dst, stationary, s_value, moving, m_value, k, m, n, add)
        return dst
    # double_row: partition p's two rows are contraction indices (p, 0) and (p, 1), multiplied in one PE [trn2]
    s = read_float(stationary, ins).reshape(k * rows, m)
    mv = read_float(moving, ins).reshape(k * rows, n)
    out = (s.t() @ mv).reshape(dst.shape)
    record(ins, "tensor", moving, flops=2 * k * rows * m * n, accumulates=group)
    tr = trace.active()
    if double and tr is not None and tr.instructions:
        tr.instructions[-1].pairs = rows
    write(dst, out, ins, accumulate=add)
    return dst


def _double_row(ins: str, stationary: NkiTensor, moving: NkiTensor, is_transpose, tile_size) -> None:
    """perf_mode=double_row's operands (the nki.isa.nc_matmul page, the Trainium2 guide's "Double FP8 Matmul
    Performance"): FP8 (K, 2, M) stationary and (K, 2, N) moving; not with transpose or column tiling."""
    limits.check(limits.target_version() >= 3, ins, "perf_mode double_row needs NeuronCore-v3 or newer")
    for what, t in (("stationary", stationary), ("moving", moving)):
        limits.check(t.ndim == 3 and t.shape[1] == limits.DOUBLE_ROW_ROWS, ins,
                     f"perf_mode double_row takes a (K, 2, free) {what}: its second dimension holds the two "
                     f"contraction rows of each partition; got {what} of shape {t.shape}")
        limits.check(str(t.dtype).replace("torch.", "") in limits.DOUBLE_ROW_DTYPES, ins,
                     f"perf_mode double_row is the double FP8 mode: {what} must be float8_e4m3 or float8_e5m2, "
                     f"got {t.dtype}")
    limits.check(not is_transpose, ins, "perf_mode double_row cannot be combined with transpose mode")
    limits.check(not tile_size or int(tile_size[1]) >= limits.GEMM_STATIONARY_FMAX, ins,
                 f"perf_mode double_row cannot be combined with column tiling (tile_size {tuple(tile_size)})")


def nc_transpose(dst, data: NkiTensor = None, engine=None, name=None, **_kw):
    """dst = data.T (partition and free dimension swapped): on the Tensor Engine (the default; into PSUM,
    up to 128 x 128) or the Vector Engine (up to 32 x 32, SBUF or PSUM)."""
    if data is None:
        dst, data = None, dst
    eng = _engine("nc_transpose", engine, ("tensor", "vector"))
    _tile("nc_transpose", data, "data", eng, ("sbuf",) if eng == "tensor" else ("sbuf", "psum"))
    limits.check(data.ndim == 2, "nc_transpose", f"transposes 2-D tiles, got {data.shape}")
    lim = limits.TENSOR_TRANSPOSE_MAX if eng == "tensor" else limits.VECTOR_TRANSPOSE_MAX
    limits.check(data.shape[0] <= lim and data.shape[1] <= lim, "nc_transpose",
                 f"a {data.shape} tile exceeds the {eng} engine's {lim} x {lim} transpose")
    dst = _out(dst, (data.shape[1], data.shape[0]), data.dtype, psum if eng == "tensor" else sbuf)
    if eng == "tensor":
        limits.check(dst.buffer is psum, "nc_transpose", f"on the Tensor Engine writes PSUM; dst is in {dst.buffer}")
    record("nc_transpose", eng, data)
    write(dst, read(data, "nc_transpose").t(), "nc_transpose", source=data._derive("permute", (1, 0)))
    return dst


# --- Scalar Engine

def activation(dst, op, data: NkiTensor, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, name=None, **_kw):
    """dst = op(data * scale + bias) on the Scalar Engine (scale: scalar or [P, 1]; bias: [P, 1] vector or
    scalar). With reduce_res, also the sum along the free dimension of the result (reduce_op must be nl.add);
    reduce_cmd drives the reduce registers (reset, reduce onto them, reset_reduce); passing reduce_res with
    the default idle command stores this instruction's own sum."""
    ins = "activation"
    _tile(ins, data, "data", "scalar")
    f = as_op(op)
    x = read(data, ins).float()
    x = x * _scalar_or_vector(ins, scale, data, "scale") if not (isinstance(scale, (int, float)) and scale == 1.0) else x
    if bias is not None:
        x = x + _scalar_or_vector(ins, bias, data, "bias")
    y = f.apply(x)
    dst = _out(dst, data.shape, data.dtype)
    _tile(ins, dst, "dst", "scalar")
    record(ins, "scalar", data)
    write(dst, y, ins)
    if reduce_res is not None or reduce_cmd != "idle":
        if reduce_op is not None:
            limits.check(as_op(reduce_op).name == "add", ins,
                         f"reduce_op must be nl.add (the Scalar Engine's registers only sum), got {reduce_op!r}")
        registers = trace.current().registers  # the Scalar Engine's per-partition reduce registers
        p = data.shape[0]
        rowsum = y.reshape(p, -1).sum(dim=1, keepdim=True)
        regs = registers.get("scalar_acc")
        if reduce_cmd == "reset":
            regs = torch.zeros(p, 1, device=data.data.device)
        elif reduce_cmd == "reduce":
            regs = rowsum if regs is None else regs[:p] + rowsum
        elif reduce_cmd == "reset_reduce" or reduce_res is not None:
            regs = rowsum
        registers["scalar_acc"] = regs
        if reduce_res is not None:
            _tile(ins, reduce_res, "reduce_res", "scalar")
            limits.check(reduce_res.shape[0] == p and _free(reduce_res) == 1, ins,
                         f"reduce_res must hold one value per partition ({p}, 1), got {reduce_res.shape}")
            write(reduce_res, regs, ins)
    return dst


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None, **_kw):
    """activation with reduce_cmd=reset_reduce: dst = op(data * scale + bias), reduce_res = its row sums."""
    return activation(dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd.reset_reduce)


# --- Vector / GpSimd / Scalar elementwise


def tensor_tensor(dst, data1: NkiTensor, data2: NkiTensor, op, engine=None, name=None, **_kw):
    """dst = data1 <op> data2, elementwise (same shape), on the Vector (default) or GpSimd engine."""
    ins = "tensor_tensor"
    eng = _engine(ins, engine, ("vector", "gpsimd"))
    for what, t in (("data1", data1), ("data2", data2)):
        _tile(ins, t, what, eng, _memories(eng))
    limits.check(data1.shape == data2.shape or data1.numel() == data2.numel(), ins,
                 f"data1 {data1.shape} and data2 {data2.shape} must have the same shape")
    limits.check(not (data1.buffer is psum and data2.buffer is psum), ins,
                 "at most one of data1 and data2 may be in PSUM")
    out, dtype = compute(as_op(op), [read(data1, ins), read(data2, ins).reshape(data1.shape)])
    dst = _out(dst, data1.shape, dtype)
    _tile(ins, dst, "dst", eng, _memories(eng))
    # its page's cost (SDK 2.26, nki/cost.py's [isa226]): on the Vector Engine, N cycles when one input tile is in
    # PSUM and the other in SBUF, otherwise 2N (the bf16 row: the Vector performance mode, nki/cost.py)
    record(ins, eng, data1, inputs=1 if eng == "vector" and psum in (data1.buffer, data2.buffer) else 2)
    write(dst, out, ins)
    return dst


def tensor_scalar(dst, data: NkiTensor, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=None, name=None, **_kw):
    """dst = (data <op0> operand0) <op1> operand1, each operand a scalar or a [P, 1] vector broadcast along
    the free dimension; reverseN swaps the operands of opN. Vector (default), Scalar or GpSimd engine."""
    ins = "tensor_scalar"
    eng = _engine(ins, engine, ("vector", "scalar", "gpsimd"))
    _tile(ins, data, "data", eng, _memories(eng))
    x = read(data, ins)
    x = x if as_op(op0).integer else x.float()
    out = _binary(op0, x, _scalar_or_vector(ins, operand0, data, "operand0"), reverse0)
    if op1 is not None:
        out = _binary(op1, out, _scalar_or_vector(ins, operand1, data, "operand1"), reverse1)
    return _emit(ins, eng, dst, data, out)


def tensor_scalar_reduce(dst, data: NkiTensor, op0, operand0, reduce_op, reduce_res: NkiTensor, reverse0=False,
                         name=None, **_kw):
    """dst = data <op0> operand0 (a scalar or [P, 1] vector), and reduce_res = reduce_op of it along the
    free dimension, one value per partition (Vector Engine)."""
    ins = "tensor_scalar_reduce"
    _tile(ins, data, "data", "vector")
    out = _binary(op0, read(data, ins).float(), _scalar_or_vector(ins, operand0, data, "operand0"), reverse0)
    f = as_op(reduce_op)
    limits.check(f.reduce_fn is not None, ins, f"{f!r} is not a reduction operator")
    _tile(ins, reduce_res, "reduce_res", "vector")
    limits.check(reduce_res.shape[0] == data.shape[0] and _free(reduce_res) == 1, ins,
                 f"reduce_res must hold one value per partition ({data.shape[0]}, 1), got {reduce_res.shape}")
    dst = _emit(ins, "vector", dst, data, out)
    write(reduce_res, f.reduce_fn(out.reshape(data.shape[0], -1), dim=1, keepdim=True), ins)
    return dst


def scalar_tensor_tensor(dst, data: NkiTensor, op0, operand0, op1, operand1: NkiTensor, reverse0=False,
                         reverse1=False, engine=None, name=None, **_kw):
    """dst = (data <op0> operand0) <op1> operand1: operand0 a scalar or [P, 1] vector, operand1 a tile of
    data's shape. Vector Engine (GpSimd also accepted)."""
    ins = "scalar_tensor_tensor"
    eng = _engine(ins, engine, ("vector", "gpsimd"))
    _tile(ins, data, "data", eng, _memories(eng))
    _tile(ins, operand1, "operand1", eng, _memories(eng))
    x = read(data, ins).float()
    out = _binary(op0, x, _scalar_or_vector(ins, operand0, data, "operand0"), reverse0)
    out = _binary(op1, out, read(operand1, ins).float().reshape(data.shape), reverse1)
    return _emit(ins, eng, dst, data, out, inputs=2)


def tensor_copy(dst, src: NkiTensor = None, engine=None, name=None, **_kw):
    """dst = src, converting to dst's dtype (Vector default, Scalar or GpSimd)."""
    if src is None:
        dst, src = None, dst
    ins = "tensor_copy"
    eng = _engine(ins, engine, ("vector", "scalar", "gpsimd"))
    _tile(ins, src, "src", eng, _memories(eng))
    dst = _out(dst, src.shape, src.dtype)
    _tile(ins, dst, "dst", eng, _memories(eng))
    limits.check(dst.numel() == src.numel(), ins, f"src {src.shape} and dst {dst.shape} differ in size")
    record(ins, eng, src)
    write(dst, read(src, ins), ins, source=src)
    return dst


def tensor_copy_predicated(dst: NkiTensor, src, predicate: NkiTensor, reverse_pred=False, name=None, **_kw):
    """dst = src where predicate is non-zero (zero, with reverse_pred), else dst unchanged (Vector Engine)."""
    ins = "tensor_copy_predicated"
    _tile(ins, dst, "dst", "vector")
    _tile(ins, predicate, "predicate", "vector")
    keep = read(predicate, ins).reshape(dst.shape) != 0
    if reverse_pred:
        keep = ~keep
    s = read(src, ins).reshape(dst.shape) if isinstance(src, NkiTensor) else torch.full(dst.shape, float(src), device=dst.data.device)
    record(ins, "vector", dst)
    write(dst, torch.where(keep, s.to(dst.dtype), read(dst, ins)), ins)
    return dst


def reciprocal(dst, data: NkiTensor = None, engine=None, name=None, **_kw):
    """dst = 1 / data, elementwise (Vector Engine)."""
    if data is None:
        dst, data = None, dst
    ins = "reciprocal"
    eng = _engine(ins, engine, ("vector", "gpsimd"))
    _tile(ins, data, "data", eng, _memories(eng))
    dst = _out(dst, data.shape, data.dtype)
    record(ins, eng, data)
    write(dst, torch.reciprocal(read(data, ins).float()), ins)
    return dst


def exponential(dst, data: NkiTensor, max_value=0.0, reduce_res=None, name=None, **_kw):
    """dst = exp(data - max_value) (max_value a scalar or [P, 1] vector); with reduce_res, also its row sums
    (the softmax numerator and denominator in one Scalar Engine pass)."""
    ins = "exponential"
    _tile(ins, data, "data", "scalar")
    y = torch.exp(read(data, ins).float() - _scalar_or_vector(ins, max_value, data, "max_value"))
    dst = _out(dst, data.shape, data.dtype)
    record(ins, "scalar", data)
    write(dst, y, ins)
    if reduce_res is not None:
        write(reduce_res, y.reshape(data.shape[0], -1).sum(dim=1, keepdim=True), ins)
    return dst


def tensor_reduce(dst, op, data: NkiTensor, axis, negate=False, keepdims=False, name=None, **_kw):
    """dst = reduce(op, data, free axes `axis`) (negated if asked), on the Vector Engine."""
    ins = "tensor_reduce"
    if isinstance(op, NkiTensor) and not isinstance(data, NkiTensor):  # (dst, data, op): older NKI's order
        op, data = data, op
    _tile(ins, data, "data", "vector")
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a % data.ndim for a in axes)
    limits.check(0 not in axes, ins, "reduces along free axes; axis 0 is the partition dimension")
    f = as_op(op)
    limits.check(f.reduce_fn is not None or f.integer, ins, f"{f!r} is not a reduction operator")
    x = read(data, ins)
    x = x if f.integer else x.float()
    if f.reduce_fn in (torch.amax, torch.amin, torch.sum, torch.mean):
        out = f.reduce_fn(x, dim=axes, keepdim=keepdims)
    else:
        out = x
        for a in sorted(axes, reverse=True):
            out = _fold(f, out, a, keepdims)
    if negate:
        out = -out
    dst = _out(dst, tuple(out.shape), data.dtype)
    _tile(ins, dst, "dst", "vector")
    record(ins, "vector", data)
    write(dst, out, ins)
    return dst


def _fold(f, x, dim, keepdims):
    if f.reduce_fn is torch.prod:
        return torch.prod(x, dim=dim, keepdim=keepdims)
    parts = x.unbind(dim)
    acc = parts[0]
    for p in parts[1:]:
        acc = f.apply(acc, p)
    return acc.unsqueeze(dim) if keepdims else acc


def tensor_partition_reduce(dst, op, data: NkiTensor, name=None, **_kw):
    """dst[1, ...] = reduce(op, data) across partitions, on the GpSimd engine."""
    ins = "tensor_partition_reduce"
    _tile(ins, data, "data", "gpsimd", ("sbuf",))
    f = as_op(op)
    x = read(data, ins)
    x = x if f.integer else x.float()
    out = f.reduce_fn(x, dim=0, keepdim=True) if f.reduce_fn is not None else _fold(f, x, 0, True)
    dst = _out(dst, tuple(out.shape), data.dtype)
    record(ins, "gpsimd", data)
    write(dst, out, ins)
    return dst


def memset(dst: NkiTensor, value, engine=None, name=None, **_kw):
    """Fill dst with a constant (Vector default, GpSimd)."""
    ins = "memset"
    eng = _engine(ins, engine, ("vector", "gpsimd", "scalar"))
    _tile(ins, dst, "dst", eng, _memories(eng))
    record(ins, eng, dst)
    write(dst, fill(dst, value), ins)
    return dst


def iota(dst, pattern=None, offset=0, channel_multiplier=0, name=None, **_kw):
    """dst[p, i0, i1, ...] = offset + p * channel_multiplier + sum(i_k * step_k) for pattern [[step, num], ...]
    over the free dimensions (GpSimd engine). A pattern of None counts 0, 1, 2, ... along the free axes."""
    ins = "iota"
    limits.check(isinstance(dst, NkiTensor), ins,
                 "needs a destination tile (the nl.arange expression form is not emulated)")
    _tile(ins, dst, "dst", "gpsimd", ("sbuf",))
    record(ins, "gpsimd", dst)
    write(dst, _affine(ins, dst, pattern, offset, channel_multiplier), ins)
    return dst


def _affine(ins: str, dst: NkiTensor, pattern, offset, channel_multiplier) -> torch.Tensor:
    """offset + p * channel_multiplier + sum(i_k * step_k) for pattern [[step, num], ...] over dst's free
    elements (a pattern of None counts 0, 1, 2, ... along them), in float64, shaped like dst."""
    p, free = dst.shape[0], dst.shape[1:]
    if pattern is None:
        steps, nums = [math.prod(free[i + 1:]) for i in range(len(free))], list(free)
    else:
        steps, nums = [int(s) for s, _ in pattern], [int(n) for _, n in pattern]
        limits.check(math.prod(nums) == math.prod(free), ins,
                     f"pattern {pattern} covers {math.prod(nums)} elements per partition; dst has {math.prod(free)}")
    dev = dst.data.device
    v = torch.arange(p, dtype=torch.float64, device=dev) * channel_multiplier + float(offset)
    v = v.reshape((p,) + (1,) * len(nums))
    for k, (s, n) in enumerate(zip(steps, nums)):
        shape_k = [1] * (len(nums) + 1)
        shape_k[k + 1] = n
        v = v + (torch.arange(n, dtype=torch.float64, device=dev) * s).reshape(shape_k)
    return v.reshape(dst.shape)


def affine_select(dst, pattern, offset=0, channel_multiplier=0, on_true_tile: NkiTensor = None, on_false_value=0.0,
                  cmp_op=None, name=None, **_kw):
    """dst = on_true_tile where cmp_op(affine value, 0), else on_false_value; the affine value as in iota
    (cmp_op defaults to nl.equal). GpSimd engine: the causal mask of attention in one instruction."""
    ins = "affine_select"
    _tile(ins, on_true_tile, "on_true_tile", "gpsimd", ("sbuf",))
    dst = _out(dst, on_true_tile.shape, on_true_tile.dtype)
    _tile(ins, dst, "dst", "gpsimd", ("sbuf",))
    cmp = as_op(cmp_op if cmp_op is not None else "equal")
    keep = cmp.apply(_affine(ins, dst, pattern, offset, channel_multiplier), 0.0) != 0
    x = read(on_true_tile, ins).float().reshape(dst.shape)
    record(ins, "gpsimd", dst)
    write(dst, torch.where(keep, x, _f32(on_false_value)), ins)
    return dst


def select_reduce(dst, predicate: NkiTensor, on_true: NkiTensor, on_false, reduce_res=None,
                  reduce_cmd=reduce_cmd.idle, reduce_op=None, reverse_pred=False, name=None, **_kw):
    """dst = where(predicate, on_true, on_false) (on_false a scalar or [P, 1] vector), and with reduce_res
    the row maximum of the result (reduce_op must be nl.maximum). Vector Engine."""
    ins = "select_reduce"
    _tile(ins, predicate, "predicate", "vector")
    _tile(ins, on_true, "on_true", "vector")
    limits.check(not (predicate.buffer is psum and on_true.buffer is psum), ins,
                 "at most one of predicate and on_true may be in PSUM")
    keep = read(predicate, ins).reshape(on_true.shape) != 0
    if reverse_pred:
        keep = ~keep
    out = torch.where(keep, read(on_true, ins).float(), _scalar_or_vector(ins, on_false, on_true, "on_false"))
    dst = _out(dst, on_true.shape, on_true.dtype)
    _tile(ins, dst, "dst", "vector")
    record(ins, "vector", on_true, inputs=2)
    write(dst, out, ins)
    _max_accumulate(ins, out, reduce_cmd, reduce_op, reduce_res)
    return dst


def _max_accumulate(ins: str, out: torch.Tensor, cmd, reduce_op, reduce_res) -> None:
    """The Vector Engine's accumulator registers (one per partition, shared by its accumulating
    instructions), driven by reduce_cmd: reset_reduce starts them at this instruction's row maxima, reduce
    takes the maximum with them, reset sets them to -inf, idle leaves them. reduce_res receives the
    registers (with idle: this instruction's own row maxima)."""
    if reduce_op is not None:
        limits.check(as_op(reduce_op).name == "maximum", ins, f"reduce_op must be nl.maximum, got {reduce_op!r}")
    if reduce_res is None and cmd in ("idle", None):
        return
    p = out.shape[0]
    rowmax = out.reshape(p, -1).amax(dim=1, keepdim=True)
    registers = trace.current().registers
    acc = registers.get("vector_acc")
    if cmd == "reset":
        acc = torch.full((limits.PMAX, 1), -math.inf, device=out.device)
    elif cmd == "reduce" and acc is not None:
        acc = torch.cat([torch.maximum(acc[:p], rowmax), acc[p:]])
    elif cmd in ("reset_reduce", "reduce"):
        acc = torch.cat([rowmax, torch.full((limits.PMAX - p, 1), -math.inf, device=out.device)])
    registers["vector_acc"] = acc
    if reduce_res is not None:
        _tile(ins, reduce_res, "reduce_res", "vector")
        limits.check(reduce_res.shape[0] == p and _free(reduce_res) == 1, ins,
                     f"reduce_res must hold one value per partition ({p}, 1), got {reduce_res.shape}")
        write(reduce_res, rowmax if cmd in ("idle", None) or acc is None else acc[:p], ins)


def tensor_tensor_scan(dst, data0: NkiTensor, data1: NkiTensor, initial, op0, op1, reverse0=False,
                       reverse1=False, name=None, **_kw):
    """Along the free dimension of each partition: r[0] = (data0[0] <op0> initial) <op1> data1[0],
    r[i] = (data0[i] <op0> r[i-1]) <op1> data1[i] (initial: a scalar or [P, 1] vector). Vector Engine."""
    ins = "tensor_tensor_scan"
    for what, t in (("data0", data0), ("data1", data1)):
        _tile(ins, t, what, "vector")
    limits.check(data0.numel() == data1.numel() and data0.shape[0] == data1.shape[0], ins,
                 f"data0 {data0.shape} and data1 {data1.shape} must match")
    limits.check(not (data0.buffer is psum and data1.buffer is psum), ins, "data0 and data1 cannot both be in PSUM")
    p = data0.shape[0]
    a = read(data0, ins).float().reshape(p, -1)
    b = read(data1, ins).float().reshape(p, -1)
    prev = _scalar_or_vector(ins, initial, data0, "initial")
    prev = prev.reshape(p, 1) if isinstance(prev, torch.Tensor) else torch.full((p, 1), prev, device=a.device)
    steps = _affine_steps(op0, reverse0, op1, reverse1, a, b)
    if steps is not None:  # r[i] = alpha[i] * r[i-1] + beta[i]: composed in log2(n) vector steps
        result = _compose_affine(*steps, prev)
    else:
        cols = []
        for i in range(a.shape[1]):  # a recurrence: one step per free element (unrolled in the trace)
            prev = _binary(op1, _binary(op0, a[:, i:i + 1], prev, reverse0), b[:, i:i + 1], reverse1)
            cols.append(prev)
        result = torch.cat(cols, dim=1)
    dst = _out(dst, data0.shape, data0.dtype)
    _tile(ins, dst, "dst", "vector")
    record(ins, "vector", data0, inputs=2)
    write(dst, result.reshape(dst.shape), ins)
    return dst


def _affine_steps(op0, reverse0, op1, reverse1, a, b):
    """The scan's step r -> (a[i] <op0> r) <op1> b[i] as alpha[i] * r + beta[i], where op0 and op1 are add,
    subtract or multiply (an affine map of r); None for any other operator (max, min, ...)."""
    names = (as_op(op0).name, as_op(op1).name)
    if not all(n in ("add", "subtract", "multiply") for n in names):
        return None
    one, zero = torch.ones_like(a), torch.zeros_like(a)
    if names[0] == "add":
        alpha, beta = one, a
    elif names[0] == "multiply":
        alpha, beta = a, zero
    else:  # a - r, or r - a reversed
        alpha, beta = (one, -a) if reverse0 else (-one, a)
    if names[1] == "add":
        return alpha, beta + b
    if names[1] == "multiply":
        return alpha * b, beta * b
    return (-alpha, b - beta) if reverse1 else (alpha, beta - b)  # b - r reversed, else r - b


def _compose_affine(alpha, beta, initial):
    """r[i] for r[i] = alpha[i] * r[i-1] + beta[i], r[-1] = initial ([P, 1]): the prefix compositions of the
    maps by doubling (Hillis-Steele), so a trace holds log2(n) steps, not n. The chip runs the recurrence in
    order; the composed form rounds its fp32 products and sums in another order."""
    n, d = alpha.shape[1], 1
    while d < n:
        alpha, beta = (torch.cat([alpha[:, :d], alpha[:, d:] * alpha[:, :-d]], dim=1),
                       torch.cat([beta[:, :d], alpha[:, d:] * beta[:, :-d] + beta[:, d:]], dim=1))
        d *= 2
    return alpha * initial + beta


def nc_stream_shuffle(dst: NkiTensor, src: NkiTensor, shuffle_mask, name=None, **_kw):
    """Within each quadrant of 32 partitions: dst partition i = src partition shuffle_mask[i] (255: dst's
    partition i unchanged); the same mask for every quadrant (Vector Engine)."""
    ins = "nc_stream_shuffle"
    _tile(ins, src, "src", "vector")
    _tile(ins, dst, "dst", "vector")
    mask = [int(m) for m in shuffle_mask]
    limits.check(len(mask) == 32, ins, f"shuffle_mask has 32 entries (one per partition of a quadrant), got {len(mask)}")
    limits.check(src.dtype == dst.dtype and _free(src) == _free(dst), ins,
                 f"src {src.shape} {src.dtype} and dst {dst.shape} {dst.dtype} must match in dtype and free size")
    ps, pd = src.shape[0], dst.shape[0]
    rows = []
    for r in range(pd):
        m = mask[r % 32]
        if m == 255:
            rows.append(ps + r)  # dst's own row
            continue
        row = (r // 32) * 32 + m if ps > 32 else m
        limits.check(row < ps, ins, f"dst partition {r} reads src partition {row}; src has {ps}")
        rows.append(row)
    both = torch.cat([read(src, ins).reshape(ps, -1), read(dst, ins).reshape(pd, -1)]) if 255 in mask else \
        read(src, ins).reshape(ps, -1)
    out = both[torch.tensor(rows, device=both.device)]
    record(ins, "vector", dst)
    write(dst, out.reshape(dst.shape), ins)
    return dst


def max8(dst, src: NkiTensor = None, name=None, **_kw):
    """dst[P, 8] = the 8 largest values of each partition of src, in descending order (Vector Engine)."""
    if src is None:
        dst, src = None, dst
    ins = "max8"
    _tile(ins, src, "src", "vector")
    n = _free(src)
    limits.check(8 <= n <= 16384, ins, f"reads 8 to 16384 elements per partition, got {n}")
    top = torch.topk(read(src, ins).float().reshape(src.shape[0], n), 8, dim=1).values
    dst = _out(dst, (src.shape[0], 8), src.dtype)
    _tile(ins, dst, "dst", "vector")
    record(ins, "vector", src)
    write(dst, top, ins)
    return dst


def nc_find_index8(dst, data: NkiTensor, vals: NkiTensor, name=None, **_kw):
    """dst[P, 8] (uint32) = for each of the 8 values per partition in vals, the index of its first
    occurrence in that partition of data (Vector Engine; vals is what max8 gives)."""
    ins = "nc_find_index8"
    _tile(ins, data, "data", "vector")
    _tile(ins, vals, "vals", "vector")
    p, n = data.shape[0], _free(data)
    limits.check(vals.shape[0] == p and _free(vals) == 8, ins, f"vals must be ({p}, 8), got {vals.shape}")
    x = read(data, ins).float().reshape(p, 1, n)
    v = read(vals, ins).float().reshape(p, 8, 1)
    # the least index where equal, by one fp32 min (indices < 2^24 are exact; n where none): one reduction
    # the compiler vectorises, where any() + argmax() of the [p, 8, n] hits took two and twice the time
    at = torch.arange(n, dtype=torch.float32, device=x.device)
    first = torch.where(x == v, at, float(n)).amin(dim=2)
    idx = torch.where(first == n, -1, first.to(torch.int64))
    dst = _out(dst, (p, 8), torch.uint32)
    _tile(ins, dst, "dst", "vector")
    record(ins, "vector", data)
    write(dst, idx.to(torch.int64).to(dst.dtype), ins)
    return dst


def nc_match_replace8(dst, data: NkiTensor, vals: NkiTensor, imm, dst_idx: NkiTensor = None, name=None, **_kw):
    """For each of the 8 values per partition in vals, in order: the first element of that partition of data
    equal to it becomes imm (so a value that occurs twice in vals replaces two occurrences); dst = the
    result, and dst_idx (uint16/uint32, optional) the indices replaced (Vector Engine; with max8 it is one
    step of a top-k)."""
    ins = "nc_match_replace8"
    _tile(ins, data, "data", "vector")
    _tile(ins, vals, "vals", "vector")
    p, n = data.shape[0], _free(data)
    limits.check(8 <= n <= 16384, ins, f"reads 8 to 16384 elements per partition, got {n}")
    limits.check(vals.shape[0] == p and _free(vals) == 8, ins, f"vals must be ({p}, 8), got {vals.shape}")
    x = read(data, ins).float().reshape(p, n)
    v = read(vals, ins).float().reshape(p, 8)
    fill_value = _f32(imm)
    idx = []
    for j in range(8):  # in order: each match sees the replacements before it
        hit = x == v[:, j:j + 1]
        first = hit & (torch.cumsum(hit.to(torch.int32), dim=1) == 1)
        idx.append(first.to(torch.int32).argmax(dim=1, keepdim=True))
        x = torch.where(first, fill_value, x)
    dst = _out(dst, data.shape, data.dtype)
    _tile(ins, dst, "dst", "vector")
    limits.check(dst.shape[0] == p and _free(dst) == n, ins, f"dst must be the shape of data {data.shape}, got {dst.shape}")
    record(ins, "vector", data)
    write(dst, x.reshape(dst.shape), ins)
    if dst_idx is not None:
        _tile(ins, dst_idx, "dst_idx", "vector")
        limits.check(dst_idx.dtype in (torch.uint16, torch.uint32), ins,
                     f"dst_idx holds uint16 or uint32 indices, got {dst_idx.dtype}")
        limits.check(dst_idx.shape[0] == p and _free(dst_idx) == 8, ins, f"dst_idx must be ({p}, 8), got {dst_idx.shape}")
        write(dst_idx, torch.cat(idx, dim=1).to(torch.int64), ins)
    return dst


# --- statistics (Vector Engine, fp32)


def bn_stats(dst, data: NkiTensor, name=None, **_kw):
    """Per partition, 6 values: count, mean and count * variance of the even-indexed free elements, then the
    same of the odd-indexed ones (up to 512 elements per partition: nl.tile_size.bn_stats_fmax); bn_aggr
    combines one or more of these into a mean and a variance."""
    ins = "bn_stats"
    _tile(ins, data, "data", "vector")
    p, n = data.shape[0], _free(data)
    limits.check(n <= limits.BN_STATS_FMAX, ins,
                 f"data has {n} elements per partition (shape {data.shape}); bn_stats reads at most "
                 f"{limits.BN_STATS_FMAX} (nl.tile_size.bn_stats_fmax): run it per 512-element slice and "
                 f"combine the outputs with one bn_aggr")
    x = read(data, ins).float().reshape(p, n)
    cols = []
    for half in (x[:, 0::2], x[:, 1::2]):
        count = half.shape[1]
        if count == 0:  # a single element per partition: no odd elements
            cols += [torch.zeros(p, 1, device=x.device)] * 3
            continue
        mean = half.mean(dim=1, keepdim=True)
        cols += [torch.full((p, 1), float(count), device=x.device), mean,
                 ((half - mean) ** 2).sum(dim=1, keepdim=True)]
    dst = _out(dst, (p, 6), data.dtype)
    _tile(ins, dst, "dst", "vector")
    limits.check(dst.shape[0] == p and _free(dst) == 6, ins, f"dst holds 6 values per partition ({p}, 6), got {dst.shape}")
    record(ins, "vector", data)
    write(dst, torch.cat(cols, dim=1), ins)
    return dst


def bn_aggr(dst, data: NkiTensor, name=None, **_kw):
    """dst[P, 2] = the mean and the (population) variance per partition from the (count, mean,
    count * variance) triples of one or more bn_stats outputs (Chan et al.'s pairwise combination)."""
    ins = "bn_aggr"
    _tile(ins, data, "data", "vector")
    p, n = data.shape[0], _free(data)
    limits.check(n % 3 == 0 and n > 0, ins,
                 f"data holds (count, mean, count * variance) triples: its {n} elements per partition are not a "
                 f"multiple of 3")
    t = read(data, ins).float().reshape(p, n // 3, 3)
    count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    total = count.sum(dim=1, keepdim=True)
    mu = (count * mean).sum(dim=1, keepdim=True) / total
    var = (m2 + count * (mean - mu) ** 2).sum(dim=1, keepdim=True) / total
    dst = _out(dst, (p, 2), data.dtype)
    _tile(ins, dst, "dst", "vector")
    limits.check(dst.shape[0] == p and _free(dst) == 2, ins, f"dst holds a mean and a variance per partition ({p}, 2), got {dst.shape}")
    record(ins, "vector", data)
    write(dst, torch.cat([mu, var], dim=1), ins)
    return dst


# --- selection by index range


_RANGE_CMP = ("equal", "less", "less_equal", "greater", "greater_equal")
FP32_MIN = -torch.finfo(torch.float32).max


def range_select(dst, on_true_tile: NkiTensor, comp_op0, comp_op1, bound0: NkiTensor, bound1: NkiTensor,
                 reduce_cmd=reduce_cmd.reset_reduce, reduce_res=None, reduce_op=None, range_start=0,
                 on_false_value=FP32_MIN, name=None, **_kw):
    """dst = on_true_tile where comp_op0(i, bound0) and comp_op1(i, bound1) for the free index
    i = range_start + 0, 1, ... (compared in fp32; bounds fp32 [P, 1]), else FP32_MIN (which a bf16/fp16
    dst rounds to -inf); the row maxima go to the Vector Engine's accumulators and reduce_res (reduce_cmd).
    NeuronCore-v3 and newer."""
    ins = "range_select"
    _tile(ins, on_true_tile, "on_true_tile", "vector")
    limits.check(on_true_tile.dtype.is_floating_point, ins, f"on_true_tile must be a float tile, got {on_true_tile.dtype}")
    p, n = on_true_tile.shape[0], _free(on_true_tile)
    ops = []
    for what, op in (("comp_op0", comp_op0), ("comp_op1", comp_op1)):
        f = as_op(op)
        limits.check(f.name in _RANGE_CMP, ins,
                     f"{what} must be one of {', '.join('nl.' + c for c in _RANGE_CMP)}, got {f!r}")
        ops.append(f)
    bounds = []
    for what, b in (("bound0", bound0), ("bound1", bound1)):
        _tile(ins, b, what, "vector")
        limits.check(b.shape[0] == p and _free(b) == 1, ins,
                     f"{what} must hold one value per partition ({p}, 1), got {b.shape}")
        limits.check(b.dtype == torch.float32, ins, f"{what} must be float32, got {b.dtype}")
        bounds.append(read(b, ins).float().reshape(p, 1))
    limits.check(isinstance(range_start, int), ins, f"range_start must be a compile-time integer, got {range_start!r}")
    limits.check(0 <= range_start and range_start + n <= 2**24, ins,
                 f"range_start + the free index ({range_start} + {n}) must stay within 2**24 (compared in fp32)")
    limits.check(_f32(on_false_value) == FP32_MIN, ins,
                 f"on_false_value must be FP32_MIN ({FP32_MIN}) on the hardware, got {on_false_value!r}")
    index = (torch.arange(n, dtype=torch.float32, device=on_true_tile.data.device) + range_start).reshape(1, n)
    keep = (ops[0].apply(index, bounds[0]) != 0) & (ops[1].apply(index, bounds[1]) != 0)
    out = torch.where(keep, read(on_true_tile, ins).float().reshape(p, n), FP32_MIN)
    dst = _out(dst, on_true_tile.shape, on_true_tile.dtype)
    _tile(ins, dst, "dst", "vector")
    record(ins, "vector", on_true_tile)
    write(dst, out.reshape(dst.shape), ins)
    _max_accumulate(ins, out, reduce_cmd, reduce_op, reduce_res)
    return dst


# --- random numbers (see prng.py for the generator)

_RNG_DTYPES = (torch.int8, torch.int16, torch.int32, torch.uint8, torch.uint16, torch.uint32)


def rng(dst: NkiTensor, engine=engine.vector, name=None, **_kw):
    """Fill dst (int8/16/32, uint8/16/32) with pseudo-random values: 32 random bits per element, truncated
    to dst's width (its least significant bits). Vector Engine (SBUF or PSUM) or GpSimd (SBUF)."""
    ins = "rng"
    eng = _engine(ins, engine, ("vector", "gpsimd"))
    _tile(ins, dst, "dst", eng, _memories(eng))
    limits.check(dst.dtype in _RNG_DTYPES, ins,
                 f"writes integer tiles (int8, int16, int32, uint8, uint16, uint32), dst is {dst.dtype}")
    b = prng.bits(eng, dst.shape[0], _free(dst))
    record(ins, eng, dst)
    write(dst, prng.truncate(b, dst.dtype).reshape(dst.shape), ins)
    return dst


def set_rng_seed(src_seeds: NkiTensor, name=None, **_kw):
    """Seed the Vector Engine's generator from a [1, 1] 32-bit tile in SBUF or PSUM: the same seed, the same
    values from the rng, dropout and nl.rand that follow."""
    ins = "set_rng_seed"
    _tile(ins, src_seeds, "src_seeds", "vector")
    limits.check(src_seeds.numel() == 1, ins, f"src_seeds must be a [1, 1] tile, got {src_seeds.shape}")
    limits.check(src_seeds.data.element_size() == 4, ins, f"src_seeds must be a 32-bit value, got {src_seeds.dtype}")
    x = read(src_seeds, ins)
    record(ins, "vector", src_seeds)
    prng.seed("vector", x.view(torch.int32) if x.dtype == torch.float32 else x)


def _state_tile(ins: str, chosen, t: NkiTensor, what: str) -> str:
    """The engine of a PRNG state load/store (GpSimd on NeuronCore-v3), with its tile checked: uint32 in
    SBUF, the 6-word state per lane."""
    if chosen is not None and chosen != engine.unknown and chosen == "vector":
        raise limits.needs_v4(ins, "the Vector Engine's loadable PRNG state")
    eng = _engine(ins, chosen, ("gpsimd",))
    _tile(ins, t, what, eng, ("sbuf",))
    limits.check(t.dtype == torch.uint32, ins, f"{what} must be uint32, got {t.dtype}")
    limits.check(_free(t) == prng.WORDS, ins,
                 f"{what} holds the {prng.WORDS}-word XORWOW state per lane, got shape {t.shape}")
    record(ins, eng, t)
    return eng


def rand_set_state(src_seeds: NkiTensor, engine=engine.gpsimd, name=None, **_kw):
    """Load the GpSimd Engine's generator state: partition p of src_seeds (uint32, 6 words, SBUF) is compute
    lane p's state (rand_get_state stores it back)."""
    ins = "rand_set_state"
    eng = _state_tile(ins, engine, src_seeds, "src_seeds")
    prng.set_state(eng, read(src_seeds, ins).reshape(src_seeds.shape[0], prng.WORDS).to(torch.int64))


def rand_get_state(dst: NkiTensor, engine=engine.gpsimd, name=None, **_kw):
    """Store the GpSimd Engine's generator state of lanes 0..P-1 into dst (uint32, 6 words, SBUF)."""
    ins = "rand_get_state"
    eng = _state_tile(ins, engine, dst, "dst")
    write(dst, prng.state(eng)[:dst.shape[0]].reshape(dst.shape), ins)
    return dst


def rand2(dst, min, max, name=None, **_kw):  # noqa: A002 - NKI's names
    """Uniform random values in [min, max]: NeuronCore-v4's Vector Engine only (an error here)."""
    raise limits.needs_v4("rand2", "rand2")


def dropout(dst, data: NkiTensor, prob, name=None, **_kw):
    """dst = data with each element replaced by zero with probability prob (a scalar, or a [P, 1] tile of
    one probability per partition), from the Vector Engine's generator; kept elements are not rescaled.
    dst has data's dtype; an integer data tile takes float32 probabilities."""
    ins = "dropout"
    _tile(ins, data, "data", "vector")
    p, n = data.shape[0], _free(data)
    if isinstance(prob, NkiTensor):
        _tile(ins, prob, "prob", "vector")
        limits.check(prob.dtype.is_floating_point, ins, f"prob must be a float tile, got {prob.dtype}")
        limits.check(data.dtype.is_floating_point or prob.dtype == torch.float32, ins,
                     f"with {data.dtype} data, prob must be float32, got {prob.dtype}")
    else:
        limits.check(0.0 <= float(prob) <= 1.0, ins, f"prob is a probability in [0, 1], got {prob!r}")
    threshold = _scalar_or_vector(ins, prob, data, "prob")
    threshold = threshold.reshape(p, 1) if isinstance(threshold, torch.Tensor) else threshold
    drop = prng.uniform("vector", p, n) < threshold
    x = read(data, ins).reshape(p, n)
    out = torch.where(drop, torch.zeros((), dtype=x.dtype, device=x.device), x)
    dst = _out(dst, data.shape, data.dtype)
    _tile(ins, dst, "dst", "vector")
    limits.check(dst.dtype == data.dtype, ins, f"dst must have data's dtype {data.dtype}, got {dst.dtype}")
    record(ins, "vector", data)
    write(dst, out.reshape(dst.shape), ins)
    return dst


# --- cumulative, gathers, nonzero indices, segment bounds


_CUMULATIVE = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -math.inf, "minimum": math.inf}


def tensor_scalar_cumulative(dst, src: NkiTensor, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce,
                             name=None, **_kw):
    """Along each partition's free elements: reg = op1(src[i] <op0> imm0, reg), dst[i] = reg (Vector Engine).
    reg starts at op1's identity (reset_reduce), at imm1 (load_reduce), or where the Vector Engine's
    accumulator registers were left (reduce); it is left there. op1: add, subtract, multiply, maximum,
    minimum; imm0 / imm1 scalars or [P, 1] fp32 vectors; no 32-bit integer tiles."""
    ins = "tensor_scalar_cumulative"
    _tile(ins, src, "src", "vector")
    f0, f1 = as_op(op0), as_op(op1)
    limits.check(f1.name in _CUMULATIVE, ins,
                 f"op1 must be one of nl.add, nl.subtract, nl.multiply, nl.maximum, nl.minimum, got {f1!r}")
    p, n = src.shape[0], _free(src)
    x = _binary(f0, read(src, ins).float().reshape(p, n), _scalar_or_vector(ins, imm0, src, "imm0"), False)
    x = x.reshape(p, n) if isinstance(x, torch.Tensor) and x.numel() == p * n else torch.broadcast_to(x, (p, n))
    registers = trace.current().registers
    if reduce_cmd == "load_reduce":
        limits.check(imm1 is not None, ins, "reduce_cmd=load_reduce starts the accumulators at imm1: give imm1")
        v = _scalar_or_vector(ins, imm1, src, "imm1")
        start = v.reshape(p, 1) if isinstance(v, torch.Tensor) else torch.full((p, 1), v, device=x.device)
    elif reduce_cmd == "reduce" and registers.get("vector_acc") is not None:
        start = registers["vector_acc"][:p]
    else:
        start = torch.full((p, 1), _CUMULATIVE[f1.name], device=x.device)
    if f1.name == "add":
        out = torch.cumsum(x, dim=1) + start
    elif f1.name == "multiply":
        out = torch.cumprod(x, dim=1) * start
    elif f1.name in ("maximum", "minimum"):
        scan = torch.cummax if f1.name == "maximum" else torch.cummin
        out = f1.apply(scan(x, dim=1).values, start)
    else:  # reg_i = x_i - reg_(i-1): an alternating sum
        sign = 1.0 - 2.0 * (torch.arange(n, device=x.device) % 2).float()
        out = sign * torch.cumsum(sign * x, dim=1) - sign * start
    acc = registers.get("vector_acc")
    last = out[:, n - 1:]
    registers["vector_acc"] = last if p == limits.PMAX else torch.cat(
        [last, acc[p:] if acc is not None else torch.full((limits.PMAX - p, 1), -math.inf, device=x.device)])
    for what, t in (("src", src), ("dst", dst)):
        limits.check(t.dtype not in (torch.int32, torch.uint32), ins, f"{what} is {t.dtype}: 32-bit integer tiles are not supported")
    return _emit(ins, "vector", dst, src, out.reshape(src.shape))


def nc_n_gather(dst, data: NkiTensor, indices: NkiTensor, name=None, **_kw):
    """dst[p, ...] = data[p].flatten()[indices[p, ...]]: each partition gathers from its own free elements
    (GpSimd Engine, SBUF; indices uint32, dst in data's dtype and indices' shape)."""
    ins = "nc_n_gather"
    for what, t in (("data", data), ("indices", indices)):
        _tile(ins, t, what, "gpsimd", ("sbuf",))
    limits.check(indices.dtype == torch.uint32, ins, f"indices must be uint32, got {indices.dtype}")
    dst = _out(dst, indices.shape, data.dtype)
    _gather(ins, dst, data, indices)
    return dst


_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _take(x: torch.Tensor, dim: int, idx: torch.Tensor) -> torch.Tensor:
    """torch.gather of any element type: a gather moves bits, but torch on CPU has no gather kernel for
    uint16 / uint32 / uint64 or the fp8 types (nki-library's rotational top-k gathers its uint32 index tile with
    nc_n_gather), so those are gathered through a signed integer view of the same width and viewed back."""
    try:
        return torch.gather(x, dim, idx)
    except NotImplementedError:
        return torch.gather(x.view(_SIGNED[x.element_size()]), dim, idx).view(x.dtype)


def _gather(ins: str, dst: NkiTensor, data: NkiTensor, indices: NkiTensor) -> None:
    """nc_n_gather's computation (nl.gather_flattened's too): per partition, data's free elements at indices."""
    _tile(ins, dst, "dst", "gpsimd", ("sbuf",))
    p = data.shape[0]
    limits.check(indices.shape[0] == p and dst.shape[0] == p, ins,
                 f"data {data.shape}, indices {indices.shape} and dst {dst.shape} must have the same partitions")
    limits.check(_free(dst) == _free(indices), ins, f"dst {dst.shape} must hold one element per index {indices.shape}")
    limits.check(dst.dtype == data.dtype, ins, f"dst must have data's dtype {data.dtype}, got {dst.dtype}")
    idx = read(indices, ins).to(torch.int64).reshape(p, -1)
    out = _take(read(data, ins).reshape(p, -1), 1, idx)
    record(ins, "gpsimd", dst)
    write(dst, out.reshape(dst.shape), ins)


def local_gather(dst, src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx=1, num_valid_indices=None,
                 name=None, **_kw):
    """Per GpSimd core (16 partitions): its index slice flattened partition-first (the first
    num_valid_indices), each index a free-element offset of src_buffer from which num_elem_per_idx contiguous
    elements are gathered, the same for the core's 16 partitions: dst[p] = [num_valid_indices x
    num_elem_per_idx] elements of src_buffer[p]. index uint16; no dtype conversion."""
    ins = "local_gather"
    for what, t in (("src_buffer", src_buffer), ("index", index)):
        _tile(ins, t, what, "gpsimd", ("sbuf",))
    p = src_buffer.shape[0]
    limits.check(index.shape[0] == p and p % 16 == 0, ins,
                 f"src_buffer {src_buffer.shape} and index {index.shape} must share a partition size that is a "
                 f"multiple of 16 (one GpSimd core per 16 partitions)")
    limits.check(index.dtype == torch.uint16, ins, f"index must be uint16, got {index.dtype}")
    e = int(num_elem_per_idx)
    limits.check(e in (1, 2, 4, 8, 16, 32), ins, f"num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got {e}")
    per_core = 16 * _free(index)
    nv = per_core if num_valid_indices is None else int(num_valid_indices)
    limits.check(0 < nv <= per_core and nv <= 4096, ins,
                 f"num_valid_indices {nv} must be at most the {per_core} indices of a core's 16 partitions and 4096")
    idx = read(index, ins).to(torch.int64).reshape(p // 16, 16, -1).transpose(1, 2).reshape(p // 16, -1)[:, :nv]
    pos = (idx.unsqueeze(2) + torch.arange(e, device=idx.device)).reshape(p // 16, 1, nv * e).expand(p // 16, 16, nv * e)
    flat = read(src_buffer, ins).reshape(p // 16, 16, -1)
    out = _take(flat, 2, pos).reshape(p, nv * e)
    dst = _out(dst, (p, nv, e), src_buffer.dtype)
    _tile(ins, dst, "dst", "gpsimd", ("sbuf",))
    limits.check(dst.dtype == src_buffer.dtype, ins, f"dst must have src_buffer's dtype {src_buffer.dtype}, got {dst.dtype}")
    limits.check(dst.shape[0] == p and _free(dst) == nv * e, ins,
                 f"dst {dst.shape} must hold {nv} x {e} elements per partition")
    record(ins, "gpsimd", dst)
    write(dst, out.reshape(dst.shape), ins)
    return dst


def nonzero_with_count(dst: NkiTensor, src: NkiTensor, index_offset=0, padding_val=-1, name=None, **_kw):
    """On partitions 0, 16, ..., 112 only (each GpSimd core's first): dst[p] = the indices (+ index_offset) of
    src[p]'s nonzero elements in order, then padding_val, then their count in the last of its T + 1 elements.
    src float32 / int32, dst int32, both in SBUF; dst's other partitions are left as they are."""
    ins = "nonzero_with_count"
    _tile(ins, src, "src", "gpsimd", ("sbuf",))
    _tile(ins, dst, "dst", "gpsimd", ("sbuf",))
    limits.check(src.dtype in (torch.float32, torch.int32), ins, f"src must be float32 or int32, got {src.dtype}")
    limits.check(dst.dtype == torch.int32, ins, f"dst must be int32, got {dst.dtype}")
    p, t = src.shape[0], _free(src)
    limits.check(dst.shape[0] == p and _free(dst) == t + 1, ins,
                 f"dst must be ({p}, {t + 1}): src's {t} elements plus the count, got {dst.shape}")
    rows = read(src, ins).reshape(p, t)[0::16]
    nonzero = rows != 0
    j = torch.arange(t, device=rows.device)
    order = torch.sort(torch.where(nonzero, j, j + t), dim=1).values  # nonzero positions first, in order
    count = nonzero.sum(dim=1, keepdim=True)
    out = torch.where(j < count, order + int(index_offset), int(padding_val))
    record(ins, "gpsimd", src)
    write(dst.reshape(p, t + 1)[0:p:16], torch.cat([out, count], dim=1), ins)
    return dst


def sequence_bounds(dst, segment_ids: NkiTensor, name=None, **_kw):
    """For segment_ids (1, n) (float32 or int32; 0 is padding): dst (1, 2, n) = per element the start and the
    end (exclusive) of the run of equal ids it is in; padding elements get start n and end -1 (GpSimd)."""
    ins = "sequence_bounds"
    _tile(ins, segment_ids, "segment_ids", "gpsimd", ("sbuf",))
    limits.check(segment_ids.shape[0] == 1, ins, f"the partition dimension must be 1, got {segment_ids.shape}")
    for what, t in (("segment_ids", segment_ids),) + ((("dst", dst),) if dst is not None else ()):
        limits.check(t.dtype in (torch.float32, torch.int32), ins, f"{what} must be float32 or int32, got {t.dtype}")
    n = _free(segment_ids)
    s = read(segment_ids, ins).float().reshape(n)
    j = torch.arange(n, device=s.device)
    starts = torch.ones(n, dtype=torch.bool, device=s.device)
    starts[1:] = s[1:] != s[:-1]
    ends = torch.ones(n, dtype=torch.bool, device=s.device)
    ends[:-1] = s[:-1] != s[1:]
    lo = torch.cummax(torch.where(starts, j, 0), dim=0).values
    hi = torch.flip(torch.cummin(torch.flip(torch.where(ends, j + 1, n), [0]), dim=0).values, [0])
    pad = s == 0
    out = torch.stack([torch.where(pad, n, lo), torch.where(pad, -1, hi)]).reshape(1, 2, n)
    dst = _out(dst, (1, 2, n), segment_ids.dtype)
    _tile(ins, dst, "dst", "gpsimd", ("sbuf",))
    limits.check(dst.numel() == 2 * n, ins, f"dst must be (1, 2, {n}), got {dst.shape}")
    record(ins, "gpsimd", segment_ids)
    write(dst, out, ins)
    return dst


# --- MX (NeuronCore-v4): the packed types and their scales are nki/mx.py's


def _mx_tile(ins: str, t, what: str, eng: str, types) -> None:
    _tile(ins, t, what, eng, ("sbuf",))
    limits.check(t.dtype in types, ins, f"{what} is {t.dtype}; it must be {' or '.join(map(repr, types))}")


def _mx_scale(ins: str, scale, what: str, partitions: int, free: int, eng: str) -> None:
    """A scale tile: uint8 or float8_e8m0fnu in SBUF, one code per 8 x 4 group, each quadrant's scales in its
    first partitions (nki.isa.quantize_mx's layout)."""
    _tile(ins, scale, what, eng, ("sbuf",))
    limits.check(scale.dtype in (torch.uint8, torch.float8_e8m0fnu), ins,
                 f"{what} is {scale.dtype}; MX scales are float8_e8m0fnu or uint8")
    need = mx.scale_partitions_needed(partitions)
    limits.check(scale.ndim == 2 and scale.shape[0] >= need and scale.shape[1] == free, ins,
                 f"{what} has shape {scale.shape}; {partitions} data partitions x {free} elements need "
                 f"({need}, {free}) at least: one scale per 8 partitions x 4 values, quadrant q's in partitions "
                 f"32q .. 32q+3")


def _mx_partitions(ins: str, what: str, p: int) -> None:
    limits.check(p % limits.MX_PARTITION_MULTIPLE == 0, ins,
                 f"{what} has {p} partitions; MX tiles span whole quadrants: a multiple of "
                 f"{limits.MX_PARTITION_MULTIPLE}, at most {limits.PMAX}")


def quantize_mx(dst: NkiTensor, src: NkiTensor, dst_scale: NkiTensor, name=None, **_kw):
    """dst, dst_scale = MXFP8 of src (bf16/fp16, [P, F]) on the Vector Engine (NeuronCore-v4): per group of
    8 partitions x 4 elements one E8M0 scale 2^(floor(log2 amax) - (Emax - 1)) (AWS's scale, twice OCP's
    sample one), the values divided by it, saturated and rounded to nearest even into dst's packed fp8
    type ([P, F / 4]); the scales in dst_scale, quadrant q's in its partitions 32q .. 32q+3."""
    ins = "quantize_mx"
    limits.check_v4(ins)
    _tile(ins, src, "src", "vector", ("sbuf",))
    limits.check(src.dtype in (torch.bfloat16, torch.float16), ins, f"src is {src.dtype}; it must be bf16 or fp16")
    _mx_tile(ins, dst, "dst", "vector", mx.QUANTIZED)
    p, f = src.shape[0], _free(src)
    _mx_partitions(ins, "src", p)
    limits.check(f % 4 == 0, ins, f"src's free size {f} must be a multiple of 4 (four values an element)")
    limits.check(dst.shape[0] == p and _free(dst) == f // 4, ins,
                 f"dst has shape {dst.shape}; src {src.shape} quantizes to ({p}, {f // 4}) packed elements")
    _mx_scale(ins, dst_scale, "dst_scale", p, f // 4, "vector")
    bits, codes = mx.quantize(read(src, ins).float().reshape(p, f), dst.dtype)
    record(ins, "vector", src)
    write(dst, bits.reshape(dst.shape), ins)
    per = mx.QUADRANT // mx.GROUP_PARTITIONS
    codes = codes if dst_scale.dtype == torch.uint8 else codes.view(torch.float8_e8m0fnu)
    for q in range((p + mx.QUADRANT - 1) // mx.QUADRANT):  # each quadrant's groups in its first partitions
        rows = codes[q * per:(q + 1) * per]
        write(dst_scale[q * mx.QUADRANT:q * mx.QUADRANT + rows.shape[0]], rows, ins)
    return dst


def _mx_values(t: NkiTensor, scale: NkiTensor, ins: str) -> torch.Tensor:
    """A packed tile's values times their group's scale: [K, F, 4] fp32."""
    k, f = t.shape[0], _free(t)
    values = mx.unpack(read(t, ins).reshape(k, f), t.dtype)
    codes = mx.gather_scales(scale, k, lambda part: read(part, ins))  # only the partitions holding scales
    codes = codes.view(torch.uint8) if codes.dtype == torch.float8_e8m0fnu else codes
    factor = mx.scale_factor(codes[:, :f])  # [K / 8, F]
    factor = factor.repeat_interleave(mx.GROUP_PARTITIONS, dim=0)
    return values * factor[:, :, None]


def nc_matmul_mx(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, stationary_scale: NkiTensor,
                 moving_scale: NkiTensor, tile_position=None, tile_size=None, accumulate=None, name=None, **_kw):
    """dst[M, N] = sum over partitions k and the 4 values j of each element of stationary[k, m, j] *
    moving[k, n, j], each dequantized by its group's E8M0 scale, on the Tensor Engine (NeuronCore-v4):
    MXFP8 / MXFP4 packed inputs in SBUF, fp32 accumulation into dst (fp32 or bf16) in PSUM; `accumulate`
    as nc_matmul's. K a multiple of 32 up to 128, M even up to 128, N up to 4096 (fp32) or 8192 (bf16)."""
    ins = "nc_matmul_mx"
    limits.check_v4(ins)
    for what, t in (("stationary", stationary), ("moving", moving)):
        _mx_tile(ins, t, what, "tensor", mx.PACKED)
    k, m, n = stationary.shape[0], _free(stationary), _free(moving)
    limits.check(moving.shape[0] == k, ins,
                 f"stationary and moving must share the contraction (partition) size: {k} vs {moving.shape[0]}")
    _mx_partitions(ins, "stationary", k)
    limits.check(m % 2 == 0 and m <= limits.GEMM_STATIONARY_FMAX, ins,
                 f"stationary free size {m} (shape {stationary.shape}) must be even and at most "
                 f"{limits.GEMM_STATIONARY_FMAX}")
    _mx_scale(ins, stationary_scale, "stationary_scale", k, m, "tensor")
    _mx_scale(ins, moving_scale, "moving_scale", k, n, "tensor")
    limits.check(isinstance(dst, NkiTensor) and dst.buffer is psum, ins,
                 f"writes its result to PSUM; dst is {dst!r}")
    limits.check(dst.dtype in (torch.float32, torch.bfloat16), ins, f"dst is {dst.dtype}; it must be fp32 or bf16")
    fmax = limits.MX_MOVING_FMAX_FP32 if dst.dtype == torch.float32 else limits.MX_MOVING_FMAX_BF16
    limits.check(n <= fmax, ins, f"moving free size {n} (shape {moving.shape}) exceeds {fmax} for a {dst.dtype} "
                                 f"dst (8 PSUM banks)")
    limits.check(dst.numel() == m * n and dst.shape[0] == m, ins,
                 f"dst has shape {dst.shape}; stationary {stationary.shape} x moving {moving.shape} gives ({m}, {n})")
    if tile_position or tile_size:
        limits.check(bool(tile_position) and bool(tile_size), ins, "tile_position and tile_size are set together")
        (row0, col0), (rows, cols) = tile_position, tile_size
        limits.check(rows in limits.MX_ROW_TILES and cols == 128 and col0 == 0, ins,
                     f"tile_size {tuple(tile_size)} / tile_position {tuple(tile_position)}: row tiling only, "
                     f"(32, 64 or 128 rows, 128 columns) from column 0")
        limits.check(row0 % rows == 0 and row0 + rows <= limits.PMAX and k <= rows, ins,
                     f"a {k}-partition stationary in the {rows}-row tile at row {row0}: the start is a multiple of "
                     f"the tile's rows, the tile within the 128 rows, and the stationary fits it")
    s = _mx_values(stationary, stationary_scale, ins).permute(0, 2, 1).reshape(k * 4, m)
    mv = _mx_values(moving, moving_scale, ins).permute(0, 2, 1).reshape(k * 4, n)
    add = bool(accumulate) if accumulate is not None else written(dst)
    record(ins, "tensor", moving, flops=2 * 4 * k * m * n, accumulates="matmul")
    write(dst, (s.t() @ mv).reshape(dst.shape), ins, accumulate=add)
    return dst


# --- engine sequencer registers


def register_alloc(x=None) -> VirtualRegister:
    """A virtual register, uninitialised or holding the integer x (or a one-element tile's value)."""
    reg = VirtualRegister()
    if isinstance(x, NkiTensor):
        register_load(reg, x)
    elif x is not None:
        reg.value = int(x)
    return reg


def register_move(dst: VirtualRegister, src) -> VirtualRegister:
    """dst = src: a compile-time integer or another register's value."""
    limits.check(isinstance(dst, VirtualRegister), "register_move", f"dst must be a register, got {dst!r}")
    dst.value = src.value if isinstance(src, VirtualRegister) else int(src)
    return dst


def _register_and_element(ins: str, reg, t, reg_what: str, t_what: str) -> None:
    """A register and the one 32-bit element in HBM or SBUF it is loaded from or stored to."""
    limits.check(isinstance(reg, VirtualRegister), ins, f"{reg_what} must be a register, got {reg!r}")
    limits.check(isinstance(t, NkiTensor) and t.numel() == 1 and t.buffer is not psum, ins,
                 f"{t_what} must be one element in HBM or SBUF, got {t!r}")
    limits.check(isinstance(t.dtype, torch.dtype) and t.data.element_size() <= 4, ins,
                 f"a register holds up to 32 bits; {t_what} is {t.dtype}")


def register_load(dst: VirtualRegister, src: NkiTensor) -> VirtualRegister:
    """dst = the one (32-bit) value of src (HBM or SBUF), known at run time."""
    _register_and_element("register_load", dst, src, "dst", "src")
    dst.value = read(src, "register_load").reshape(1, 1).to(torch.int32)
    return dst


def register_store(dst: NkiTensor, src: VirtualRegister) -> NkiTensor:
    """dst (one element, HBM or SBUF) = the register's value."""
    ins = "register_store"
    _register_and_element(ins, src, dst, "src", "dst")
    limits.check(src.value is not None, ins, "stores a register that was never given a value")
    write(dst, src.data.to(dst.data.device).reshape(dst.shape), ins)
    return dst


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, **_kw):
    """NeuronCore-v4's Scalar Engine activation with two tensor-scalar stages (an error here)."""
    raise limits.needs_v4("activate2", "activate2")


for _name in ("dma_copy", "dma_transpose", "nc_matmul", "nc_transpose", "activation", "activation_reduce",
              "tensor_tensor", "tensor_scalar", "tensor_scalar_reduce", "scalar_tensor_tensor", "tensor_copy", "tensor_copy_predicated",
              "reciprocal", "exponential", "tensor_reduce", "tensor_partition_reduce", "memset", "iota",
              "affine_select", "select_reduce", "tensor_tensor_scan", "max8", "nc_find_index8", "nc_stream_shuffle",
              "nc_match_replace8", "bn_stats", "bn_aggr", "range_select", "rng", "set_rng_seed", "rand_set_state",
              "rand_get_state", "dropout", "tensor_scalar_cumulative", "nc_n_gather", "local_gather",
              "nonzero_with_count", "sequence_bounds", "quantize_mx", "nc_matmul_mx", "dma_compute", "register_load",
              "register_store"):
    globals()[_name] = instruction(globals()[_name])
del _name

from . import constants  # noqa: E402,F401 - nki.isa.constants.<enum>, as nkilib imports it
from .collectives import core_barrier, sendrecv  # noqa: E402,F401 - LNC-2: they switch programs (no decorator)
