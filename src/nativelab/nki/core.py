"""What nki.language and nki.isa share: dtypes, allocating tensors (on chip, and the kernel's HBM outputs and
constants), the fp32 compute rule, and the record of issued instructions the cost model reads."""

from __future__ import annotations

import builtins
import functools
import math

import numpy as np
import torch

from . import limits, mx, trace
from .dtypes import torch_dtype
from .tensor import Buffer, NkiTensor, Storage, hbm, read, sbuf
from .tensor import buffer_of as _buffer_of

PACKED_DTYPES = set(mx.PACKED)  # nl's packed MX dtypes: tiles hold their bits (nki/mx.py)
DTYPES: dict = {}  # nl dtype names -> torch dtypes (filled by nki.language)


def dtype_of(dtype):
    dtype = torch_dtype(dtype)
    if dtype is None:
        return torch.float32
    if dtype in PACKED_DTYPES:
        return dtype.carrier
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) or isinstance(dtype, np.dtype) or isinstance(dtype, type):
        name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
        name = {"float8_e4m3": "float8_e4m3fn", "bool": "bool_"}.get(name, name)
        return DTYPES[name]
    raise limits.fail("nl.ndarray", f"unknown dtype {dtype!r}")




class ParDim(int):
    """nl.par_dim(n): a shape's partition dimension, n partitions (a plain integer otherwise)."""

    def __repr__(self):
        return f"nl.par_dim({int(self)})"


def ndarray(shape, dtype=torch.float32, buffer=sbuf, name: str = "", **_ignored) -> NkiTensor:
    """A new tensor in `buffer` (uninitialised: reading it before writing warns). On-chip tensors have the
    partition dimension first (at most 128). HBM tensors a kernel allocates are its outputs."""
    # nl.par_dim(n) marks the partition dimension; dimensions before it are blocks of tiles (the older API's
    # layout: `(blocks, nl.par_dim(128), 512)`, each `t[b]` one tile on the 128 partitions)
    pdim = next((k for k, s in enumerate(shape) if isinstance(s, ParDim)), 0) if not isinstance(shape, int) else 0
    shape = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
    packed = dtype if dtype in PACKED_DTYPES else None
    dtype, buf = dtype_of(dtype), _buffer_of(buffer)
    tr = trace.current()
    if buf.on_chip:
        limits.check_partitions("nl.ndarray", f"{buf} tensor {name or ''}".rstrip(), shape[pdim:])
        t = NkiTensor(*_new(torch.empty(shape, dtype=dtype, device=trace.device()), buf, name))
        if pdim:  # blocks of tiles: what each partition holds is every block's share
            t.storage.bytes_per_partition = math.prod(shape) // shape[pdim] * t.storage.tensor.element_size()
            t.storage.partitions = shape[pdim]
            t.storage.partition_stride = math.prod(shape[pdim + 1:])
    else:
        t = hbm_tensor(tr, shape, dtype, buf, name)
    t.storage.packed = packed
    return t


def _new(t: torch.Tensor, buf: Buffer, name: str):
    return (Storage(t, buf, name),)




def on_chip(instruction: str, *ts) -> None:
    for t in ts:
        if isinstance(t, NkiTensor):
            limits.check(t.buffer.on_chip, instruction,
                         f"reads {t!r}, which is in HBM: compute engines read SBUF/PSUM; load it first "
                         f"(nl.load or nisa.dma_copy)")


def instruction(fn):
    """Decorates an nki.isa / nki.language call: the regions it reads and writes become the dependencies
    of the instruction(s) it records (the first gets the reads, the last the writes)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        tr = trace.active()
        if tr is None or tr.depth:
            return fn(*args, **kwargs)
        tr.step += 1  # what one call reads and writes is live together (trace.Occupancy)
        tr.depth += 1
        if not tr.regions:
            try:
                return fn(*args, **kwargs)
            finally:
                tr.depth -= 1
        first = len(tr.instructions)
        tr.pending_reads, tr.pending_writes = [], []
        try:
            return fn(*args, **kwargs)
        finally:
            tr.depth -= 1
            issued = tr.instructions[first:]
            if issued:
                issued[0].reads.extend(tr.pending_reads)
                issued[-1].writes.extend(tr.pending_writes)
                issued[0].immediates = _immediates(args, kwargs)
                if tr.capture is not None and tr.loop_key[:1] and tr.loop_key[0][0] == trace.GRID_LOOP:
                    issued[-1].written = [_bytes_left(tr, region) for region in issued[-1].writes]
            tr.pending_reads, tr.pending_writes = [], []

    return call


def _immediates(args, kwargs) -> tuple:
    """A call's arguments other than tiles, as plain values: what else makes two iterations' calls differ."""
    def plain(v):
        if isinstance(v, NkiTensor):
            return "tile"
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, (list, tuple)):
            return tuple(plain(x) for x in v)
        if isinstance(v, (np.integer, np.floating)):
            return v.item()
        name = getattr(v, "__name__", None) or getattr(v, "name", None)
        return name if isinstance(name, str) else type(v).__name__
    return tuple(plain(a) for a in args) + tuple((k, plain(v)) for k, v in kwargs.items())


def _bytes_left(tr, region):
    """The bytes [first, last] of a written HBM region's allocation as the write left them (Trace.capture)."""
    sid, lo, hi, view = region
    st = tr.capture.get(sid)
    if st is None or view is None:
        return None
    flat = st.tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return flat[lo * view[3]:(hi + 1) * view[3]].numpy().copy()


def record(name: str, engine: str, t: NkiTensor, flops_per_element: int = 1, flops: int | None = None,
           inputs: int = 1, accumulates: str | None = None) -> None:
    """Log an issued instruction for the cost model: its engine and size (`t`: the tile it streams), and for
    the hazard checker the loop iterations it is in and whether it accumulates into its destination."""
    tr = trace.active()
    if tr is None:
        return
    shape = t.shape or (1,)
    p = shape[0] if t.buffer.on_chip else 1
    per = t.numel() // builtins.max(p, 1)
    if engine == "dma":
        per = t.numel() * t.data.element_size()
    tr.instructions.append(trace.Instruction(name, engine, per, p,
                                             flops if flops is not None else flops_per_element * t.numel(),
                                             limits.kernel_line(), t.dtype, inputs, loops=tr.loop_key,
                                             epoch=tr.epoch, accumulates=accumulates))




def fill(t: NkiTensor, value) -> torch.Tensor:
    """A constant of t's shape: made in fp32 for float tiles and rounded by the write (a value beyond bf16's
    range saturates to inf, as the engines' output conversion does), in t's dtype for integer tiles."""
    dtype = t.dtype
    if t.dtype.is_floating_point:
        dtype = torch.float64 if abs(float(value)) > torch.finfo(torch.float32).max else torch.float32
    return torch.full(t.shape, value, dtype=dtype, device=t.data.device)


def value_of(x, instruction: str):
    if isinstance(x, NkiTensor):
        return read(x, instruction)
    return x


def compute(op, args, dtype=None):
    """Broadcast numpy-style, compute in fp32 (integers stay integers for bitwise operators)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if op.integer:
        vals = args
    else:
        vals = [a.float() if isinstance(a, torch.Tensor) and a.dtype != torch.float64 else float(a)
                if isinstance(a, (bool, int, float, np.generic)) else a for a in args]
    out = op.apply(*vals)
    if not isinstance(out, torch.Tensor):
        out = torch.tensor(out, device=trace.device())
    if dtype is None:
        dtype = torch.result_type(*tensors) if len(tensors) > 1 else tensors[0].dtype if tensors else out.dtype
    return out, dtype




def hbm_tensor(self, shape, dtype, buf, name):
    """The kernel's j-th HBM allocation. Every program instance of an SPMD launch allocates the same shared
    tensors, in the same order; the second trace pass hands the launch's preallocated outputs in."""
    j = self.hbm_allocs_this_program
    self.hbm_allocs_this_program += 1
    if j < len(self.outputs):
        st = self.outputs[j]
        limits.check(tuple(st.tensor.shape) == tuple(shape) and st.tensor.dtype == dtype, "nl.ndarray",
                     f"program {self.program} allocates HBM tensor #{j} as {tuple(shape)} {dtype}, but program "
                     f"0 allocated {st.describe()}: every program instance allocates the same shared tensors")
        return NkiTensor(st)
    if self.output_examples is not None:
        tensor = self.output_examples[j]
    else:
        tensor = torch.empty(shape, dtype=dtype, device=self.device)
    st = Storage(tensor, buf, name, pinned=True)
    self.outputs.append(st)
    return NkiTensor(st)


def constant(self, value):
    """A constant HBM tensor baked into the trace (compiled, a tensor of the graph: jit's _lift_constants)."""
    value = value.to(self.device)
    st = Storage(value, hbm, "constant", track=False, pinned=True)
    return NkiTensor(st)

