"""nki.language: NKI's tensors, memories, dtypes, loops and tile sizes, and its higher-level operations
(load/store, elementwise math, matmul, transpose, reductions, softmax, rms_norm), for kernels traced by
@nki.jit. The API follows AWS's NKI 0.5.0 reference (Neuron SDK 2.31); each function says where it differs."""

from __future__ import annotations

import builtins
import contextlib
import enum
import math
import os

import numpy as np
import torch

from . import core, isa, limits, mx, ops, tensor, trace
from .core import ParDim as par_dim  # noqa: F401 - nl.par_dim
from .core import compute, dtype_of, ndarray, on_chip, record, value_of
from .dtypes import kernel_dtype, to_tensor
from .ops import ALL as _OPS
from .ops import Op
from .tensor import (  # noqa: F401 - re-exported as nl.*
    Buffer, NkiTensor, ds, hbm, private_hbm, psum, read, sbuf, shared_hbm, write,
)

# --- dtypes (a kernel's tiles are torch tensors: these name their torch dtypes)
float32 = torch.float32
float16 = torch.float16
bfloat16 = torch.bfloat16
tfloat32 = torch.float32  # TF32 is a Tensor Engine input format; its tiles are stored as fp32
float8_e4m3 = torch.float8_e4m3fn
float8_e4m3fn = torch.float8_e4m3fn
float8_e5m2 = torch.float8_e5m2
int8, int16, int32, int64 = torch.int8, torch.int16, torch.int32, torch.int64
uint8, uint16, uint32, uint64 = torch.uint8, torch.uint16, torch.uint32, torch.uint64
bool_ = torch.bool
bool = torch.bool  # noqa: A001 - NKI's name (nki-library's resolve_dtype_to_nki returns nl.bool)
float8_e8m0fnu = torch.float8_e8m0fnu  # MX scale factors (a power of two per element)


float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4 = mx.PACKED  # MX types: four values an element
core.DTYPES.update({name: v for name, v in dict(globals()).items() if isinstance(v, torch.dtype)})
# as a kernel sees them: under NKI's names (`str(nl.bfloat16) == 'bfloat16'`: nki-library compares those strings),
# equal to the torch dtypes (nki/dtypes.py)
globals().update({name: kernel_dtype(v) for name, v in core.DTYPES.items()})


class tile_size:  # noqa: N801 - NKI's name
    """Hardware tile sizes of NeuronCore-v3 (see nativelab.nki.limits for the sources)."""
    pmax = limits.PMAX
    psum_fmax = limits.PSUM_BANK_FP32
    psum_bank_fmax = limits.PSUM_BANK_FP32
    psum_fmax_bytes = limits.PSUM_BANK_BYTES
    psum_bank_fmax_bytes = limits.PSUM_BANK_BYTES
    psum_num_banks = limits.PSUM_BANKS
    gemm_stationary_fmax = limits.GEMM_STATIONARY_FMAX
    gemm_moving_fmax = limits.GEMM_MOVING_FMAX
    sbuf_size_bytes = limits.SBUF_PARTITION_BYTES * limits.PMAX
    sbuf_fmax_bytes = limits.SBUF_PARTITION_BYTES
    sbuf_fmax = limits.SBUF_PARTITION_BYTES // 4
    total_available_sbuf_size = limits.SBUF_PARTITION_BYTES
    bn_stats_fmax = limits.BN_STATS_FMAX


class MemoryRegion(enum.Enum):  # noqa: D101
    """The memories as names (nl.MemoryRegion.sbuf, ...)."""
    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"


def _buffer(x) -> Buffer:
    return x.buffer if isinstance(x, NkiTensor) else tensor.buffer_of(x.value if isinstance(x, MemoryRegion) else x)


def is_hbm(buffer) -> bool:
    """Whether a buffer (or a tensor's) is one of the HBMs (nl.hbm, nl.private_hbm, nl.shared_hbm)."""
    return not _buffer(buffer).on_chip


def is_on_chip(buffer) -> bool:
    return _buffer(buffer).on_chip


def is_sbuf(buffer) -> bool:
    return _buffer(buffer) is sbuf


def is_psum(buffer) -> bool:
    return _buffer(buffer) is psum


class NKIObject:
    """Base class of a kernel's configuration objects. Its public class attributes are fields: under
    @dataclass they become keyword arguments of the constructor even without annotations (as nkilib writes
    them: `section_idx = None`).

    Without @dataclass and without an __init__ of its own, a subclass gets the initializer AWS's NKI Language
    Guide ("Class Support") says the compiler creates: "The @dataclass decorator is optional; classes with and
    without the @dataclass decorator will be compiled in the same way", with `__init__(self, x=None, y=False)`
    for `x: int` and `y: bool = False`: each field, in declaration order (base classes' first), positional or by
    keyword, its class default or else None, then `self.__post_init__()` where the class has one."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in cls.__dict__.items():
            if (not name.startswith("_") and name not in annotations and not callable(value)
                    and not isinstance(value, (property, staticmethod, classmethod, list, dict, set))):
                annotations[name] = object
        cls.__annotations__ = annotations

    @classmethod
    def _nki_fields(cls) -> list:
        """The fields of the default initializer: the annotated (or public plain) class attributes of every
        NKIObject class in the MRO, base classes first, each once."""
        names = []
        for klass in reversed(cls.__mro__):
            if klass is not NKIObject and issubclass(klass, NKIObject):
                for name in klass.__dict__.get("__annotations__", {}):
                    if name not in names:
                        names.append(name)
        return names

    def __init__(self, *args, **kwargs):
        cls = type(self)
        if cls is NKIObject:
            if args or kwargs:
                raise TypeError("NKIObject() takes no arguments")
            return
        fields = cls._nki_fields()
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes {len(fields)} positional arguments ({', '.join(fields)}) but "
                            f"{len(args)} were given")
        values = dict(zip(fields, args))
        for name, value in kwargs.items():
            if name not in fields:
                raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {name!r} (its fields: "
                                f"{', '.join(fields) or 'none'})")
            if name in values:
                raise TypeError(f"{cls.__name__}() got multiple values for argument {name!r}")
            values[name] = value
        for name in fields:
            setattr(self, name, values[name] if name in values else getattr(cls, name, None))
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()


# --- allocation


def zeros(shape, dtype=float32, buffer=sbuf, name: str = "", **kw) -> NkiTensor:
    return full(shape, 0, dtype, buffer, name, **kw)


def ones(shape, dtype=float32, buffer=sbuf, name: str = "", **kw) -> NkiTensor:
    return full(shape, 1, dtype, buffer, name, **kw)


def full(shape, fill_value, dtype=float32, buffer=sbuf, name: str = "", **kw) -> NkiTensor:
    t = ndarray(shape, dtype, buffer, name, **kw)
    record("memset", "vector" if t.buffer.on_chip else "dma", t)
    write(t, core.fill(t, fill_value), "memset")
    return t


def empty_like(a: NkiTensor, dtype=None, buffer=None, name: str = "", **kw) -> NkiTensor:
    return ndarray(a.shape, dtype or a.dtype, buffer or a.buffer, name, **kw)


def zeros_like(a: NkiTensor, dtype=None, buffer=None, name: str = "", **kw) -> NkiTensor:
    return zeros(a.shape, dtype or a.dtype, buffer or a.buffer, name, **kw)


def ones_like(a: NkiTensor, dtype=None, buffer=None, name: str = "", **kw) -> NkiTensor:
    return ones(a.shape, dtype or a.dtype, buffer or a.buffer, name, **kw)


def full_like(a: NkiTensor, fill_value, dtype=None, buffer=None, name: str = "", **kw) -> NkiTensor:
    return full(a.shape, fill_value, dtype or a.dtype, buffer or a.buffer, name, **kw)


def shared_constant(constant, dtype=None, **_ignored) -> NkiTensor:
    """A constant HBM tensor with the given values, baked into the trace: a NumPy array (ml_dtypes' bf16 / fp8
    too) or the path of a .npy file, as AWS's page has it, or a torch tensor."""
    if isinstance(constant, (str, os.PathLike)):
        constant = np.load(constant)
    value = constant if isinstance(constant, torch.Tensor) else to_tensor(np.asarray(constant))
    value = value.to(dtype_of(dtype) if dtype is not None else value.dtype)
    return core.constant(trace.current(), value)


def shared_identity_matrix(n: int, dtype=bfloat16, **_ignored) -> NkiTensor:
    """An n x n identity matrix in SBUF, as AWS's page has it (what nc_transpose on the Tensor Engine multiplies
    by): engines read it in place, no load. The compiler loads it from the binary's constants: one DMA."""
    t = ndarray((int(n), int(n)), dtype, sbuf, "identity")
    record("shared_identity_matrix", "dma", t)
    write(t, torch.eye(int(n), dtype=t.dtype, device=t.data.device), "shared_identity_matrix")
    return t


# --- loops and programs (a trace unrolls loops: Python runs their bodies with plain ints)


def _loop(start, stop, step, kind: str):
    """The iterations (a tile allocated in the body is one tile per iteration, live from its first access to its
    last: trace.Occupancy, as the NKI compiler reuses a body's SBUF/PSUM space). Each iteration is noted on the
    instructions it issues (the hazard checker's, nki/hazards.py), and an order check (nki.simulate(kernel,
    order=...)) runs an affine_range's iterations in its order."""
    tr = trace.active()
    values = range(start, stop, step) if stop is not None else range(start)
    if tr is None:
        yield from values
        return
    # the loop's line: for the hazard checker (a recording pass) and the order check; the compile pass needs none
    line = limits.kernel_line() if not tr.quiet or tr.order is not None else ""
    loop = tr.enter_loop(kind, line)
    if tr.order is not None and kind == "affine":
        values = tr.order.iterations(line, values)
    outer = tr.loop_key
    if tr.roller is not None and kind in ("affine", "sequential"):  # the recording pass may keep it a loop
        values = tr.roller.iterations(tr, loop, values)
    for k, i in enumerate(values):
        tr.loop_starts[(loop, k)] = len(tr.loops)
        tr.loop_key = outer + ((loop, i),)
        try:
            yield i
        finally:
            tr.loop_key = outer
    tr.loop_ends[loop] = len(tr.loops)


def affine_range(start, stop=None, step=1, **_hints):
    """Iterations without loop-carried dependencies (the compiler may reorder or pipeline them)."""
    return _loop(start, stop, step, "affine")


def sequential_range(start, stop=None, step=1, **_hints):
    """Iterations that depend on each other, run in order."""
    return _loop(start, stop, step, "sequential")


def static_range(start, stop=None, step=1, **_hints):
    """Fully unrolled at trace time."""
    return _loop(start, stop, step, "static")


def dynamic_range(start, stop=None, step=1):
    """A loop the hardware runs with bounds known at run time (integers or VirtualRegisters; step a
    positive compile-time integer). It yields the iteration's integer, as AWS's page says (usable as an
    index, and as .ap's scalar_offset). A bound loaded at run time (nisa.register_load) makes the kernel's
    signature run interpreted (tensor.VirtualRegister): the checking pass runs no iterations, each launch
    as many as the register holds."""
    limits.check(not isinstance(step, tensor.VirtualRegister), "nl.dynamic_range",
                 "step must be a compile-time positive integer, not a register")
    start, stop = (b.static("nl.dynamic_range") if isinstance(b, tensor.VirtualRegister) else b for b in (start, stop))
    for b in (start, stop, step):
        if b is not None and not isinstance(b, (int, np.integer)):
            raise limits.fail("nl.dynamic_range", f"bounds must be integers or registers, got {b!r}")
    limits.check(int(step) > 0, "nl.dynamic_range", f"step must be a positive compile-time integer, got {step}")
    return _loop(int(start), None if stop is None else int(stop), int(step), "dynamic")


@contextlib.contextmanager
def no_reorder():
    """`with nl.no_reorder():` keeps the block in program order. A trace already runs in program order and
    the cost model keeps each engine's instructions in it, so the block changes nothing here."""
    yield


def program_id(axis: int = 0) -> int:
    tr = trace.current()
    limits.check(0 <= axis < builtins.max(len(tr.grid), 1), "nl.program_id",
                 f"axis {axis} is outside the launch grid {tr.grid or '(1,)'}")
    return tr.program[axis] if tr.program else 0


def num_programs(axes: int | None = None, axis: int | None = None) -> int:
    """Programs in the launch (along `axes`; all of them for None). NKI's keyword is `axes` (nkilib's
    get_program_sharding_info calls nl.num_programs(axes=0)); `axis` is accepted too."""
    axis = axes if axes is not None else axis
    tr = trace.current()
    grid = tr.grid or (1,)
    if axis is None:
        return math.prod(grid)
    limits.check(0 <= axis < len(grid), "nl.num_programs", f"axis {axis} is outside the launch grid {grid}")
    return grid[axis]


def program_ndim() -> int:
    return len(trace.current().grid)


def device_print(prefix: str, x, **_kw) -> None:
    """Values are not known while a kernel is traced; says so once instead of printing."""
    trace.current().warn_once(("device_print", limits.kernel_line()), "nl.device_print",
                              "device_print prints nothing in a traced kernel (it runs compiled)")


# --- data movement


def load(src: NkiTensor, dtype=None, **_kw) -> NkiTensor:
    """Copy an HBM view into a new SBUF tile of the same shape (the first dimension becomes partitions)."""
    limits.check_partitions("nl.load", f"the loaded tile {src.shape}", src.shape)
    dst = ndarray(src.shape, dtype or src.dtype, sbuf)
    record("nl.load", "dma", dst)
    write(dst, read(src, "nl.load"), "nl.load", source=src)
    return dst


def store(dst: NkiTensor, value, **_kw) -> None:
    """Copy an on-chip tile (or a scalar) into an HBM view."""
    v = read(value, "nl.store") if isinstance(value, NkiTensor) else torch.full(dst.shape, value, device=dst.data.device)
    if tuple(v.shape) != dst.shape and v.numel() != dst.numel():
        v = v.expand(dst.shape)
    record("nl.store", "dma", dst)
    write(dst, v, "nl.store", source=value if isinstance(value, NkiTensor) else None)


def load_transpose2d(src: NkiTensor, dtype=None, **_kw) -> NkiTensor:
    """Load a 2-D HBM tensor into a new SBUF tile transposed ([a, b] -> [b, a]), by one DMA transpose."""
    limits.check(src.ndim == 2, "nl.load_transpose2d", f"transposes 2-D tensors, got shape {src.shape}")
    dst = ndarray((src.shape[1], src.shape[0]), dtype or src.dtype, sbuf)
    isa.dma_transpose(dst, src)
    return dst


def copy_into(dst: NkiTensor, value) -> None:
    """`dst[...] = value`: an on-chip copy, a load (HBM -> on chip) or a store (on chip -> HBM)."""
    if isinstance(value, NkiTensor) and value.storage is dst.storage and value.chain == dst.chain:
        return  # `t[i] += x` assigns t[i] its own view back (accumulate_into wrote it): nothing to copy
    if isinstance(value, NkiTensor):
        v = read(value, "assignment")
        if v.shape != dst.data.shape and v.numel() != dst.numel():
            v = v.expand(dst.shape)
        record("tensor_copy" if dst.buffer.on_chip and value.buffer.on_chip else "dma_copy",
                "vector" if dst.buffer.on_chip and value.buffer.on_chip else "dma", dst)
        write(dst, v, "assignment", source=value)
    else:
        write(dst, core.fill(dst, value), "assignment")


def accumulate_into(dst: NkiTensor, value) -> NkiTensor:
    """`dst += value` (and `t[i] += value`): the sum written back into dst's own elements, as NKI's compiler
    treats an accumulation buffer: AWS's nl.affine_range page names `result_psum += nl.matmul(...)` into a
    buffer defined outside the loop an associative reduction, not a loop-carried dependency, and so does
    the hazard checker (nki/hazards.py)."""
    on_chip("+=", dst, value)
    out, _ = compute(_OPS["add"], [read(dst, "+="), value_of(value, "+=")])
    if tuple(out.shape) != dst.shape:
        limits.check(out.numel() == dst.numel(), "+=", f"adds a {tuple(out.shape)} value into {dst!r}")
    record("nl.add", "vector", dst, inputs=_tiles_read((dst, value)), accumulates="add")
    write(dst, out, "+=")
    return dst


# --- elementwise math


def apply_op(op: Op, *args, dtype=None, **_kw) -> NkiTensor:
    """nl.<op>(x[, y], dtype=None): a new SBUF tile of the broadcast shape."""
    name = f"nl.{op.name}"
    if len(args) != op.arity:
        raise limits.fail(name, f"takes {op.arity} operand(s), got {len(args)}")
    on_chip(name, *args)
    if op.integer:
        for a in args:
            limits.check(not isinstance(a, NkiTensor) or not a.dtype.is_floating_point, name,
                         f"takes integer tiles, got {a.dtype}")
    out, dtype = compute(op, [value_of(a, name) for a in args], None if dtype is None else dtype_of(dtype))
    limits.check_partitions(name, "the result", tuple(out.shape))
    t = ndarray(tuple(out.shape), dtype, sbuf)
    record(name, "scalar" if op.arity == 1 else "vector", t, inputs=_tiles_read(args))
    write(t, out, name)
    return t


def _tiles_read(args) -> int:
    """The input tiles an elementwise op streams: a binary op of two tiles is a tensor_tensor, which reads
    both ("roughly 2N cycles", the Vector Engine's cost model in AWS's Trainium/Inferentia2 architecture
    guide); a scalar or a [P, 1] vector operand is a tensor_scalar's broadcast operand (roughly N)."""
    full = builtins.sum(1 for a in args if isinstance(a, NkiTensor) and a.numel() > (a.shape[0] if a.shape else 1))
    return builtins.max(full, 1)


globals().update({name: op for name, op in _OPS.items() if name not in ("max", "min", "mult")})


# --- reductions


def _axes(x: NkiTensor, axis, instruction: str):
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a % x.ndim for a in axes)
    if x.buffer.on_chip:
        limits.check(0 not in axes, instruction,
                     "reduces along the partition dimension (axis 0); engines reduce along free axes "
                     "(use nisa.tensor_partition_reduce or a matmul against ones)")
    return axes


def _reduce(op_name: str, x: NkiTensor, axis, dtype=None, keepdims: bool = False, **_kw) -> NkiTensor:
    name = f"nl.{op_name}"
    on_chip(name, x)
    axes = _axes(x, axis, name)
    v = read(x, name).float()
    fns = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "mean": torch.mean, "prod": torch.prod,
           "all": lambda t, dim, keepdim: torch.all(t != 0, dim=dim, keepdim=keepdim).float(),
           "any": lambda t, dim, keepdim: torch.any(t != 0, dim=dim, keepdim=keepdim).float()}
    if op_name == "prod":
        out = v
        for a in sorted(axes, reverse=True):
            out = torch.prod(out, dim=a, keepdim=keepdims)
    else:
        out = fns[op_name](v, dim=axes, keepdim=keepdims)
    t = ndarray(tuple(out.shape), dtype_of(dtype) if dtype is not None else x.dtype, sbuf)
    record(name, "vector", x)
    write(t, out, name)
    return t


def sum(x, axis, dtype=None, keepdims=False, **kw):  # noqa: A001 - NKI's name
    return _reduce("sum", x, axis, dtype, keepdims)


def max(x, axis, dtype=None, keepdims=False, **kw):  # noqa: A001
    return _reduce("max", x, axis, dtype, keepdims)


def min(x, axis, dtype=None, keepdims=False, **kw):  # noqa: A001
    return _reduce("min", x, axis, dtype, keepdims)


def mean(x, axis, dtype=None, keepdims=False, **kw):
    return _reduce("mean", x, axis, dtype, keepdims)


def prod(x, axis, dtype=None, keepdims=False, **kw):
    return _reduce("prod", x, axis, dtype, keepdims)


def all(x, axis, dtype=None, keepdims=False, **kw):  # noqa: A001
    return _reduce("all", x, axis, dtype, keepdims)


def any(x, axis, dtype=None, keepdims=False, **kw):  # noqa: A001
    return _reduce("any", x, axis, dtype, keepdims)


def var(x: NkiTensor, axis, dtype=None, keepdims=False, **_kw) -> NkiTensor:
    """The population variance along free axes (as np.var); the result keeps the reduced axes (NKI 0.5.0
    ignores keepdims). On the Vector Engine (bn_stats + bn_aggr)."""
    on_chip("nl.var", x)
    axes = _axes(x, axis, "nl.var")
    v = read(x, "nl.var").float()
    out = torch.var(v, dim=axes, correction=0, keepdim=True)
    t = ndarray(tuple(out.shape), dtype_of(dtype) if dtype is not None else x.dtype, sbuf)
    record("nl.var", "vector", x)
    write(t, out, "nl.var")
    return t


def gather_flattened(data: NkiTensor, indices: NkiTensor, axis: int = 0, dtype=None, **_kw) -> NkiTensor:
    """out[p, ...] = data[p].flatten()[indices[p, ...]]: each partition gathers from its own free elements
    (GpSimd Engine, as nisa.nc_n_gather; any integer indices). The result has indices' shape."""
    on_chip("nl.gather_flattened", data, indices)
    limits.check(not indices.dtype.is_floating_point, "nl.gather_flattened", f"indices must be integers, got {indices.dtype}")
    t = ndarray(indices.shape, data.dtype, sbuf)
    isa._gather("nl.gather_flattened", t, data, indices)
    if dtype is not None and dtype_of(dtype) != data.dtype:
        cast = ndarray(indices.shape, dtype_of(dtype), sbuf)
        isa.tensor_copy(cast, t)
        return cast
    return t


# --- random numbers (the Vector Engine's generator: nki/isa/prng.py)


def rand(shape, dtype=float32, buffer=sbuf, name: str = "", **kw) -> NkiTensor:
    """A new tile of values uniform in [0, 1) (24 random bits each, rounded to dtype)."""
    t = ndarray(shape, dtype, buffer, name, **kw)
    limits.check(t.buffer.on_chip, "nl.rand", f"fills an on-chip tile (SBUF or PSUM), got {t.buffer}")
    p = t.shape[0] if t.shape else 1
    u = isa.prng.uniform("vector", p, t.numel() // builtins.max(p, 1))
    record("nl.rand", "vector", t)
    write(t, u.reshape(t.shape), "nl.rand")
    return t


def random_seed(seed: NkiTensor) -> None:
    """Seed the generator nl.rand and nl.dropout draw from (a [1, 1] 32-bit tile): nisa.set_rng_seed."""
    isa.set_rng_seed(seed)


def dropout(x: NkiTensor, rate, dtype=None, **_kw) -> NkiTensor:
    """x with each element zeroed with probability rate (a scalar or a [P, 1] tile): nisa.dropout."""
    on_chip("nl.dropout", x)
    out = ndarray(x.shape, x.dtype, sbuf)
    isa.dropout(out, x, rate)
    if dtype is not None and dtype_of(dtype) != x.dtype:
        cast = ndarray(x.shape, dtype_of(dtype), sbuf)
        isa.tensor_copy(cast, out)
        return cast
    return out


def abs_max(x, y, dtype=None, **_kw):
    """NeuronCore-v4's |x| vs |y| maximum (an error on the emulated NeuronCore-v3)."""
    raise limits.needs_v4("nl.abs_max", "nl.abs_max")


def abs_min(x, y, dtype=None, **_kw):
    """NeuronCore-v4's |x| vs |y| minimum (an error on the emulated NeuronCore-v3)."""
    raise limits.needs_v4("nl.abs_min", "nl.abs_min")


# --- matmul, transpose, softmax, norms


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False, **_kw) -> NkiTensor:
    """x @ y on the Tensor Engine, as nc_matmul: with transpose_x, x is already [K, M] (the stationary
    operand); otherwise x is [M, K] and is transposed first. The result is an fp32 PSUM tile [M, N]."""
    stationary = x if transpose_x else transpose(x)
    out = ndarray((stationary.shape[1], y.shape[1]), float32, psum)
    isa.nc_matmul(out, stationary, y)
    return out


def transpose(x: NkiTensor, dtype=None, **_kw) -> NkiTensor:
    """Swap the partition and free dimension of a 2-D tile (on the Tensor Engine)."""
    on_chip("nl.transpose", x)
    limits.check(x.ndim == 2, "nl.transpose", f"transposes 2-D tiles, got shape {x.shape}")
    limits.check_partitions("nl.transpose", "the result", (x.shape[1], x.shape[0]))
    t = ndarray((x.shape[1], x.shape[0]), dtype or x.dtype, sbuf)
    record("nl.transpose", "tensor", x)
    write(t, read(x, "nl.transpose").t(), "nl.transpose", source=x._derive("permute", (1, 0)))
    return t


def softmax(x: NkiTensor, axis, dtype=None, **_kw) -> NkiTensor:
    on_chip("nl.softmax", x)
    axes = _axes(x, axis, "nl.softmax")
    v = read(x, "nl.softmax").float()
    m = torch.amax(v, dim=axes, keepdim=True)
    e = torch.exp(v - m)
    out = e / torch.sum(e, dim=axes, keepdim=True)
    t = ndarray(x.shape, dtype or x.dtype, sbuf)
    record("nl.softmax", "scalar", x, 4)
    write(t, out, "nl.softmax")
    return t


def rms_norm(x: NkiTensor, w: NkiTensor, axis, n, epsilon: float = 1e-6, dtype=None, **_kw) -> NkiTensor:
    """x * rsqrt(sum(x^2, axis) / n + epsilon) * w."""
    on_chip("nl.rms_norm", x, w)
    axes = _axes(x, axis, "nl.rms_norm")
    v = read(x, "nl.rms_norm").float()
    out = v * torch.rsqrt(torch.sum(v * v, dim=axes, keepdim=True) / n + epsilon) * read(w, "nl.rms_norm").float()
    t = ndarray(x.shape, dtype or x.dtype, sbuf)
    record("nl.rms_norm", "vector", x, 4)
    write(t, out, "nl.rms_norm")
    return t


def where(condition: NkiTensor, x, y, dtype=None, **_kw) -> NkiTensor:
    on_chip("nl.where", condition, x, y)
    c = read(condition, "nl.where") != 0
    xv, yv = value_of(x, "nl.where"), value_of(y, "nl.where")
    ref = xv if isinstance(xv, torch.Tensor) else yv if isinstance(yv, torch.Tensor) else c.float()
    out = torch.where(c, xv if isinstance(xv, torch.Tensor) else float(xv),
                      yv if isinstance(yv, torch.Tensor) else float(yv))
    t = ndarray(tuple(out.shape), dtype or ref.dtype, sbuf)
    # the Vector Engine streams the condition and each tile operand (a scalar operand is an immediate)
    record("nl.where", "vector", t, inputs=1 + builtins.sum(isinstance(v, NkiTensor) for v in (x, y)))
    write(t, out, "nl.where")
    return t


def broadcast_to(x: NkiTensor, shape) -> NkiTensor:
    return x.broadcast_to(shape)


def expand_dims(x: NkiTensor, axis: int) -> NkiTensor:
    return x.expand_dims(axis)


for _name in ("full", "load", "store", "copy_into", "accumulate_into", "apply_op", "_reduce", "matmul", "transpose", "softmax",
              "rms_norm", "where", "load_transpose2d", "var", "gather_flattened", "rand", "random_seed", "dropout"):
    globals()[_name] = core.instruction(globals()[_name])
del _name

# what tensor views and operators call (bound here: tensor.py and ops.py sit below this module)
tensor.bind_language(copy_into=copy_into, accumulate_into=accumulate_into, transpose=transpose, ops=globals())
ops.bind_call(apply_op)
