"""NKI tensors: an allocation in a memory (HBM, SBUF, PSUM) and views of it (slices, reshapes, access
patterns, broadcasts), each backed by a torch view of the allocation's tensor, so an instruction on a view is
a torch operation on that view; a kernel trace records those operations as a graph."""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import sys

import numpy as np
import torch

import weakref

from . import limits, mx, trace
from .dtypes import kernel_dtype, torch_dtype
from ._private import is_fake, is_view

_bound: dict = {}  # id -> weakref of every tensor that is (or was) some storage's value (cleared per trace)


def _bind(t: torch.Tensor) -> None:
    _bound[id(t)] = weakref.ref(t)


def new_trace() -> None:
    """A trace starts: forget the values of the previous one."""
    _bound.clear()


def _is_bound(t: torch.Tensor) -> bool:
    r = _bound.get(id(t))
    return r is not None and r() is t


_language: dict = {}  # nki.language's functions views call (assignment, .T, operators): see bind_language


def bind_language(**functions) -> None:
    _language.update(functions)


class Buffer:
    """A memory an NKI tensor lives in: nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, nl.private_hbm."""

    def __init__(self, name: str, on_chip: bool):
        self.name, self.on_chip = name, on_chip

    def __repr__(self):
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", True)
psum = Buffer("psum", True)
hbm = Buffer("hbm", False)
shared_hbm = Buffer("shared_hbm", False)
private_hbm = Buffer("private_hbm", False)


def buffer_of(b) -> Buffer:
    if isinstance(b, Buffer):
        return b
    if b is Ellipsis or b is None:  # NKI's default buffer for nl.ndarray is SBUF
        return sbuf
    if isinstance(b, str) and b.split(".")[-1] in ("sbuf", "psum", "hbm", "shared_hbm", "private_hbm"):
        return globals()[b.split(".")[-1]]
    raise limits.NkiError(f"nki: buffer must be nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm or nl.private_hbm, "
                          f"got {b!r}")


_uids = itertools.count()


class Storage:
    """One allocation: its current value (a torch tensor of the allocation's shape), where it lives, what of
    it has been written (on-chip tensors and the kernel's own HBM tensors), its share of on-chip capacity
    while live.

    The value is an SSA value as far as possible: an instruction that writes the whole allocation rebinds it
    to its result (no copy; a copy instruction's result may be a view of its source: then this storage
    *borrows* the source's memory), and only a partial write updates it in place (copying a borrowed value
    first, and first giving every borrower of this memory its own copy). Kernel arguments and outputs are
    `pinned`: always written in place (the compiled graph mutates them)."""

    def __init__(self, tensor: torch.Tensor, buffer: Buffer, name: str = "", input_index: int | None = None,
                 track: bool = True, pinned: bool = False):
        self.tensor = tensor
        _bind(tensor)
        # which allocation, for the cost model's dependencies: id() of a dropped tile is reused by the next,
        # which made later tiles depend on unrelated earlier ones (estimates varied from trace to trace)
        self.uid = next(_uids)
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype
        self.meta = torch.empty(self.shape, dtype=self.dtype, device="meta")  # the layout views are taken of
        self.buffer = buffer
        self.name = name
        self.input_index = input_index  # a kernel argument (already initialised) or None
        self.pinned = pinned or input_index is not None
        self.owned = True  # the value is this storage's own memory (in-place writes are safe)
        self.lender = None  # the storage whose memory the value borrows
        self.borrowers: list = []  # (storage, the value it borrowed) pairs of storages borrowing our memory
        self.site = limits.kernel_line()
        tr = trace.active()
        self.born = tr.loop_key if tr is not None else ()  # the loop iterations it was allocated in
        if tr is not None and tr.roller is not None:
            tr.roller.storages.append(weakref.ref(self))
        self.written = np.zeros(tensor.numel(), dtype=bool) if track and input_index is None else None
        p = tensor.shape[0] if tensor.dim() else 1
        self.partitions = p
        self.partition_stride = tensor.numel() // max(p, 1)  # elements from one partition to the next
        self.bytes_per_partition = (tensor.numel() // max(p, 1)) * tensor.element_size()
        self.live = None  # on chip: where its range starts and ends (trace.Occupancy)
        self.float_value = None  # (value, its fp32 upcast): upcast once, however many matmuls read it
        self.rounded = None  # (value, value.to(bf16) computed more cheaply): see fusion.py
        self.origin = None  # (argument storage, flat index in it or -1 per element): which are copies, fusion.py
        self.gemm = None  # (value, operand descriptors) when the value is a bf16 GEMM of argument views
        self.packed = None  # the MX type (nki/mx.py) of an allocation made in one: `tensor` holds its bits

    def describe(self) -> str:
        return f"{self.name + ' ' if self.name else ''}{self.shape} {_dtype_name(self.dtype)}"

    def lend(self, borrower: "Storage") -> None:
        if borrower is self:  # a view of our own previous value: copy it before writing it in place
            self.owned, self.lender = False, None
            return
        root = self
        while root.lender is not None:
            root = root.lender
        borrower.lender, borrower.owned = root, False
        root.borrowers.append((weakref.ref(borrower), borrower.tensor))  # weak: a dropped tile is collected

    def before_in_place_write(self) -> None:
        """Make an in-place write safe: own the value, and give borrowers of it their own copies first."""
        self.float_value = self.rounded = self.gemm = None
        if not self.owned and not self.pinned:
            self.tensor = self.tensor.clone()
            _bind(self.tensor)
            self.owned, self.lender = True, None
        for ref, value in self.borrowers:
            b = ref()
            if b is not None and b.tensor is value:  # still borrowing this memory
                b.tensor = value.clone()
                _bind(b.tensor)
                b.owned, b.lender = True, None
        self.borrowers = []


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


class ds:
    """nl.ds(start, size): a dynamic slice, start:start + size."""

    __slots__ = ("start", "size", "step")

    def __init__(self, start, size, step: int = 1):
        self.start, self.size, self.step = int(start), int(size), int(step)

    def slice(self) -> slice:
        return slice(self.start, self.start + self.size * self.step, self.step)


class NkiTensor:
    """A view of an allocation: the storage and the chain of view operations from its value to this view.
    `data` is the torch view of the storage's current value; instructions read and write through it."""

    __slots__ = ("storage", "chain", "indexed", "_cache", "__weakref__")

    def __init__(self, storage: Storage, chain: tuple = (), indexed: bool = False):
        self.storage, self.chain, self.indexed, self._cache = storage, chain, indexed, None

    @property
    def data(self) -> torch.Tensor:
        value = self.storage.tensor
        if _indirect(self.chain) is not None:  # depends on the offsets' current values too: not cached
            return _apply(value, self.chain)
        c = self._cache
        if c is not None and c[0] is value:
            return c[1]
        view = _apply(value, self.chain) if self.chain else value
        self._cache = (value, view)
        return view

    def layout(self) -> torch.Tensor:
        """This view taken of a contiguous tensor of the allocation's shape (meta: sizes, strides, offset)."""
        return _apply(self.storage.meta, self.chain) if self.chain else self.storage.meta

    def _derive(self, *op) -> "NkiTensor":
        return NkiTensor(self.storage, self.chain + (op,), True)

    # --- what it is
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.layout().shape)

    @property
    def dtype(self):
        """The element type: to nativelab's own code the torch dtype, to a kernel's source the same dtype
        under its NKI name (nki/dtypes.py: `str(t.dtype) == 'bfloat16'`, still equal to nl.bfloat16)."""
        packed = self.packed
        if packed is not None:
            return packed
        d = self.layout().dtype
        return d if sys._getframe(1).f_globals.get("__name__", "").startswith("nativelab.") else kernel_dtype(d)

    @property
    def packed(self):
        """The view's MX element type (nki/mx.py), or None: the last reinterpretation says, else the
        allocation's."""
        for op in reversed(self.chain):
            if op[0] == "packed":
                return op[1]
            if op[0] == "dtype" or (op[0] == "ap" and op[4] is not None):
                return None
        return self.storage.packed

    @property
    def buffer(self) -> Buffer:
        return self.storage.buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return self.layout().numel()

    @property
    def name(self) -> str:
        return self.storage.name

    def __len__(self):
        return self.shape[0]

    def spans_partitions(self) -> bool:
        """On chip: whether the view's first dimension runs across partitions. Not when an integer index took
        the partition dimension (`t[0, :]`, `t[0, ...]`): the view lies in one partition and every dimension it
        has is free (the NKI Language Guide's "Tensor Indexing": `t[0, 0, 10]` is "10th element in partition 0";
        AWS's access-pattern page: an access is a number of partitions and one free pattern repeated on each)."""
        if not self.buffer.on_chip or not self.shape:
            return bool(self.shape)
        lay = self.layout()
        step = lay.stride(0) * lay.element_size()
        return not 0 < step < self.storage.partition_stride * self.storage.tensor.element_size()

    def partition_shape(self) -> tuple:
        """The view's shape with its partition dimension first: a view inside one partition is (1, *shape)."""
        return self.shape if self.spans_partitions() else (1,) + self.shape

    def __repr__(self):
        return f"NkiTensor({self.shape}, {_dtype_name(self.dtype)}, {self.buffer})"

    # --- views
    def __getitem__(self, index) -> "NkiTensor":
        index = index if isinstance(index, tuple) else (index,)
        out, dim = [], 0
        n_explicit = sum(1 for i in index if i is not None and i is not Ellipsis)
        for i in index:
            if i is Ellipsis:
                for _ in range(self.ndim - n_explicit):
                    out.append(slice(None))
                    dim += 1
                continue
            if i is None:
                out.append(None)
                continue
            size = self.shape[dim] if dim < self.ndim else 0
            if dim == self.ndim == 1 and self.buffer.on_chip and self.spans_partitions():
                # an on-chip view of the partition dimension alone (`t[:p, k]`) holds one element per partition:
                # its free pattern is that one element, which a second index may address (`t[:p, k][:p, :1]`,
                # nki-library's attention_cte), 0 or a slice of it giving (p, 1)
                k = i.slice() if isinstance(i, ds) else i
                if isinstance(k, slice):
                    lo, hi, _ = k.indices(1)
                    limits.check(lo == 0 and hi == 1, "indexing",
                                 f"slice {k.start}:{k.stop} of the one element per partition of {self!r} is empty")
                    out.append(None)
                else:
                    limits.check(operator.index(k) == 0, "indexing",
                                 f"index {k} is out of bounds for the one element per partition of {self!r}")
                dim += 1
                continue
            if dim >= self.ndim:
                raise limits.fail("indexing", f"too many indices for {self!r}")
            if isinstance(i, ds):
                i = i.slice()
            if isinstance(i, slice):
                start, stop, step = i.start, i.stop, i.step
                start = 0 if start is None else operator.index(start)
                stop = size if stop is None else operator.index(stop)
                step = 1 if step is None else operator.index(step)
                limits.check(0 <= start <= size and 0 <= stop <= size and step > 0, "indexing",
                             f"slice {start}:{stop}{':' + str(step) if step != 1 else ''} is out of bounds for "
                             f"dimension {dim} of size {size} of {self.storage.describe()} ({self.buffer})")
                out.append(slice(start, stop, step))
            else:
                try:
                    k = operator.index(i)
                except TypeError:
                    raise limits.fail("indexing", f"index {i!r} is not an integer, slice or nl.ds") from None
                limits.check(0 <= k < size, "indexing",
                             f"index {k} is out of bounds for dimension {dim} of size {size} of "
                             f"{self.storage.describe()} ({self.buffer})")
                out.append(k)
            dim += 1
        return self._derive("index", tuple(out))

    def __setitem__(self, index, value) -> None:
        _language["copy_into"](self[index], value)

    def reshape(self, *shape) -> "NkiTensor":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        shape = tuple(int(s) for s in shape)
        limits.check(math.prod(shape) == self.numel() or -1 in shape, "reshape",
                     f"cannot reshape {self.shape} ({self.numel()} elements) into {shape}")
        try:
            self.layout().view(shape)
        except RuntimeError:
            raise limits.fail("reshape", f"{self!r} is not contiguous: a reshape of it is not a view") from None
        return NkiTensor(self.storage, self.chain + (("view", shape),), self.indexed)

    def ap(self, pattern, offset: int = 0, dtype=None, scalar_offset=None, vector_offset=None, indirect_dim=0,
           **_unused) -> "NkiTensor":
        """The hardware access pattern [[step, num], ...] (outermost first) from `offset`, in elements of the
        flattened allocation: element [i0, i1, ...] is flat[offset + sum(i_k * step_k)]. With a runtime
        offset (an SBUF tile of integers), the pattern moves by it along `indirect_dim` of the allocation
        (times the elements to that dimension's right): scalar_offset, one (1, 1) value for the whole
        pattern; vector_offset, one value per index of the pattern's first dimension (a gather / scatter
        of rows: its own step is the allocation's row size; indirect_dim 0 only)."""
        base = self.storage
        dtype = torch_dtype(dtype)
        packed, dtype = (dtype, dtype.carrier) if isinstance(dtype, mx.PackedDtype) else (None, dtype)
        numel = math.prod(base.shape) * base.meta.element_size() // (
            torch.empty((), dtype=dtype).element_size() if dtype is not None else base.meta.element_size())
        steps = [int(p[0]) for p in pattern]
        nums = [int(p[1]) for p in pattern]
        offset = int(offset or 0) + (self.layout().storage_offset() if dtype is None else 0)
        runtime = None
        if scalar_offset is not None or vector_offset is not None:
            runtime = _runtime_offsets(base, self.layout(), nums, dtype, scalar_offset, vector_offset, int(indirect_dim))
            dtype = dtype if dtype is not None else base.dtype  # (marks the view's elements as not the tile's)
        elif dtype == base.dtype and base.packed is None:
            # the allocation's own dtype (nki-library's TensorView always passes one) reinterprets nothing: the
            # view's elements stay the tile's, so what it writes and reads is tracked element by element
            dtype = None
        static = list(zip(steps, nums))[1:] if runtime is not None and runtime.vector else list(zip(steps, nums))
        last = offset + sum((n - 1) * s for s, n in static if n > 0 and s > 0)
        first = offset + sum((n - 1) * s for s, n in static if n > 0 and s < 0)
        # a view past the tile is no error until an instruction accesses it (a kernel may build one and skip it):
        # the access raises, at its own line (_check_in_bounds)
        outside = None if first >= 0 and last < numel else (
            f"access pattern {[[s, n] for s, n in zip(steps, nums)]} from offset {offset} (made at "
            f"{limits.kernel_line()}) reaches element {last if last >= numel else first} of {base.describe()} "
            f"({base.buffer}), which has {numel} elements")
        if base.buffer.on_chip and len(steps) > 1:
            # counted in the view's elements: an fp32 (P, 1) tile read as fp8 steps 4 per partition (nki-library's
            # rmsnorm_quant stores its fp32 dequantization scales so)
            per_partition = numel // base.shape[0]
            limits.check(steps[0] == per_partition, "ap",
                         f"the partition step of an {base.buffer} access pattern must be the tensor's free size "
                         f"{per_partition}{'' if dtype is None else f' in {dtype} elements'} (partitions are read "
                         f"contiguously), got {steps[0]}")
        ap = ("ap", tuple(nums), tuple(steps), offset, dtype) + ((runtime,) if runtime is not None else ())
        chain = (ap,) + ((("packed", packed),) if packed else ()) + ((("outside", outside),) if outside else ())
        return NkiTensor(base, chain, True)

    def is_indirect(self) -> bool:
        """The view moves by offsets read at run time (.ap's scalar_offset / vector_offset, select with a
        tile, vector_select)."""
        return _indirect(self.chain) is not None

    def select(self, dim: int, index) -> "NkiTensor":
        """One index along `dim`, that dimension removed: a Python integer, or a (1, 1) SBUF tile of one
        read at run time (not the partition dimension on chip; one runtime selection per view)."""
        dim = dim % self.ndim
        if not isinstance(index, NkiTensor):
            index = int(index)
            limits.check(0 <= index < self.shape[dim], "select",
                         f"index {index} is outside dimension {dim} of {self.shape}")
            key = (slice(None),) * dim + (index,)
            return NkiTensor(self.storage, self.chain + (("index", key),), True)
        limits.check(not (self.buffer.on_chip and dim == 0), "select",
                     f"on {self.buffer} a runtime select cannot take the partition dimension (dim 0)")
        return self._runtime_view("select", dim, index, vector=False)

    def vector_select(self, dim: int, vector_offset: "NkiTensor") -> "NkiTensor":
        """Row vector_offset[p] of an HBM view for each p (a gather / scatter of rows): dimension 0 becomes
        vector_offset's partitions."""
        limits.check(dim == 0, "vector_select", f"selects along dimension 0 only, got {dim}")
        return self._runtime_view("vector_select", 0, vector_offset, vector=True)

    def _runtime_view(self, what: str, dim: int, tile, vector: bool) -> "NkiTensor":
        limits.check(not self.is_indirect(), what, f"{self!r} already moves by runtime offsets (one per view)")
        v = self.layout()
        nums = [tile.shape[0] if vector and k == 0 else n for k, n in enumerate(v.shape) if vector or k != dim]
        steps = [st for k, st in enumerate(v.stride()) if vector or k != dim]
        runtime = _check_offsets(what, self.storage, nums, tile, vector, dim == 0)
        runtime.stride = v.stride()[dim]
        return NkiTensor(self.storage, (("ap", tuple(nums), tuple(steps), v.storage_offset(), v.dtype, runtime),)
                         + ((("packed", self.packed),) if self.packed is not None else ()), True)

    def view(self, dtype) -> "NkiTensor":
        dtype = torch_dtype(dtype)
        if dtype == self.dtype and self.packed is None:  # its own dtype: nothing reinterpreted
            return self
        if isinstance(dtype, mx.PackedDtype):  # the bits reinterpreted as packed MX elements
            return NkiTensor(self.storage, self.chain + (("dtype", dtype.carrier), ("packed", dtype)), self.indexed)
        return NkiTensor(self.storage, self.chain + (("dtype", dtype),), self.indexed)

    bitcast = view

    def broadcast_to(self, shape) -> "NkiTensor":
        return self._derive("expand", tuple(int(s) for s in shape))

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        shape = list(self.shape)
        shape[dim] = size
        return self.broadcast_to(shape)

    def expand_dims(self, dim: int) -> "NkiTensor":
        return NkiTensor(self.storage, self.chain + (("unsqueeze", dim),), self.indexed)

    expand_dim = expand_dims

    def permute(self, *dims) -> "NkiTensor":
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        if self.buffer.on_chip:
            limits.check(dims[0] == 0, "permute", "the partition dimension of an on-chip tensor stays first")
        return self._derive("permute", tuple(dims))

    def flatten_dims(self, start: int, end: int) -> "NkiTensor":
        return NkiTensor(self.storage, self.chain + (("flatten", start, end),), self.indexed)

    def get_pattern(self):
        v = self.layout()
        return [[s, n] for s, n in zip(v.stride(), v.shape)]

    def is_contiguous(self) -> bool:
        return self.layout().is_contiguous()

    @property
    def T(self):
        return _language["transpose"](self)

    # --- arithmetic (nl ops, new SBUF tiles)
    def _op(name, reverse=False):  # noqa: N805 - builds methods
        def method(self, other):
            fn = _language["ops"][name]
            return fn(other, self) if reverse else fn(self, other)

        return method

    __add__, __radd__ = _op("add"), _op("add", True)

    def __iadd__(self, other):  # `t += x`: accumulates into t's own elements (nki.language.accumulate_into)
        return _language["accumulate_into"](self, other)

    __sub__, __rsub__ = _op("subtract"), _op("subtract", True)
    __mul__, __rmul__ = _op("multiply"), _op("multiply", True)
    __truediv__, __rtruediv__ = _op("divide"), _op("divide", True)
    __pow__ = _op("power")
    __lt__, __le__ = _op("less"), _op("less_equal")
    __gt__, __ge__ = _op("greater"), _op("greater_equal")
    __and__, __or__, __xor__ = _op("bitwise_and"), _op("bitwise_or"), _op("bitwise_xor")
    def __eq__(self, other):  # a tile against a tile or a number: elementwise; `t == None`: plain Python
        if isinstance(other, (NkiTensor, int, float)):
            return _language["ops"]["equal"](self, other)
        return self is other

    def __ne__(self, other):
        if isinstance(other, (NkiTensor, int, float)):
            return _language["ops"]["not_equal"](self, other)
        return self is not other

    __hash__ = object.__hash__
    del _op

    def __neg__(self):
        return _language["ops"]["negative"](self)


# --- reading and writing through views (every instruction goes through these)


def _apply(t: torch.Tensor, chain) -> torch.Tensor:
    """The view `chain` describes, taken of `t` (the storage's value, or its meta layout)."""
    for op in chain:
        kind = op[0]
        if kind == "index":
            t = t[op[1]]
        elif kind == "view":
            t = t.reshape(op[1]) if not t.is_contiguous() else t.view(op[1])
        elif kind == "ap":
            nums, steps, offset, dtype = op[1:5]
            flat = t.contiguous().view(-1)
            if dtype is not None and dtype != flat.dtype:
                flat = flat.view(dtype)
            if len(op) > 5 and flat.device.type != "meta":  # runtime offsets: a gather
                idx = _indirect_index(op, flat)
                t = flat[idx.clamp(0, max(flat.numel() - 1, 0)) if _oob["skip"] else idx]
            elif len(op) > 5:  # the layout: the static part (a vector offset's rows all at `offset`)
                t = torch.as_strided(flat, nums, (0,) + tuple(steps[1:]) if op[5].vector else steps,
                                     flat.storage_offset() + offset)
            else:
                t = torch.as_strided(flat, nums, steps, flat.storage_offset() + offset)
        elif kind == "dtype":
            t = t.view(op[1])
        elif kind == "expand":
            t = t.expand(op[1])
        elif kind == "unsqueeze":
            t = t.unsqueeze(op[1])
        elif kind == "permute":
            t = t.permute(op[1])
        elif kind == "flatten":
            t = t.flatten(op[1], op[2])
    return t


class VirtualRegister:
    """An engine sequencer's 32-bit register (nisa.register_alloc): a compile-time integer (from an
    immediate or another such register) or a value read from memory at run time (nisa.register_load),
    which a trace holds as a tensor. Usable as .ap's scalar_offset, and as a loop bound (nl.dynamic_range)
    or a condition (`while reg:`, `if reg:`).

    A loaded value used as control flow cannot be traced into one graph (its trip count is data): the
    checking pass (meta tensors) notes the first such use and goes on as if the register held 0 (no
    iterations, the condition false), and that signature then runs interpreted, on real values, at every
    launch (jit.py)."""

    __slots__ = ("value",)

    def __init__(self, value=None):
        self.value = value

    @property
    def data(self) -> torch.Tensor:
        v = self.value
        return v if isinstance(v, torch.Tensor) else torch.tensor([[0 if v is None else int(v)]], dtype=torch.int32)

    def static(self, what: str) -> int:
        """The value as a Python integer: an immediate, or (interpreted) the value read at run time. In
        the checking pass a value read at run time is 0, and the trace is marked to run interpreted."""
        limits.check(self.value is not None, what, "reads a register that was never given a value")
        v = self.value
        if not isinstance(v, torch.Tensor):
            return int(v)
        if v.device.type != "meta" and not is_fake(v):
            return int(v.reshape(-1)[0])
        tr = trace.active()
        limits.check(tr is not None and tr.device == "meta", what,
                     "a register loaded from memory (nisa.register_load) is known only at run time: a loop or a "
                     "condition on it cannot be recorded into a graph")
        if tr.runtime_control is None:
            tr.runtime_control = (f"{what} at {limits.kernel_line()} depends on a value read at run time, and a graph "
                                  f"cannot hold a data-dependent trip count or branch")
        return 0

    def __bool__(self):
        return self.static("while / if on a register") != 0

    def __index__(self):
        return self.static("a register used as an integer")

    __int__ = __index__

    def __repr__(self):
        return f"VirtualRegister({self.value if not isinstance(self.value, torch.Tensor) else 'runtime'})"


class _RuntimeOffsets:
    """An access pattern's runtime offsets: the SBUF tile holding them, whether one per index of the
    pattern's first dimension (vector) or one for all (scalar), and the elements one offset unit moves.
    Compared by identity: a view's chain holds it."""

    __slots__ = ("tile", "vector", "stride")

    def __init__(self, tile, vector: bool, stride: int):
        self.tile, self.vector, self.stride = tile, vector, stride


def _runtime_offsets(base: Storage, view: torch.Tensor, nums, dtype, scalar_offset, vector_offset,
                     dim: int) -> _RuntimeOffsets:
    """Checks .ap's runtime offsets (AWS's "NKI Access Patterns" guide) and describes them. indirect_dim is a
    dimension of the tensor .ap() is called on (`view`'s layout: a reshape of the allocation has its own), and
    one offset unit is that dimension's stride."""
    limits.check(scalar_offset is None or vector_offset is None, "ap",
                 "takes at most one of scalar_offset and vector_offset")
    limits.check(0 <= dim < view.dim(), "ap", f"indirect_dim {dim} is not a dimension of {tuple(view.shape)} "
                                              f"(a view of {base.describe()})")
    vector = vector_offset is not None
    limits.check(not vector or dim == 0, "ap", f"a vector_offset moves along indirect_dim 0 only, got {dim}")
    runtime = _check_offsets("ap", base, nums, vector_offset if vector else scalar_offset, vector, dim == 0)
    units = view.stride()[dim] * base.meta.element_size()
    size = torch.empty((), dtype=dtype).element_size() if dtype is not None else base.meta.element_size()
    runtime.stride = units // size
    return runtime


def _check_offsets(what: str, base: Storage, nums, tile, vector: bool, partition_dim: bool) -> _RuntimeOffsets:
    """A runtime offsets' tile: SBUF integers, one per row of a gather from HBM (vector) or one in all."""
    name = "vector_offset" if vector else "scalar_offset"
    if isinstance(tile, (int, np.integer)) and not isinstance(tile, bool):  # a loop variable: an integer
        tile = VirtualRegister(int(tile))
    if isinstance(tile, VirtualRegister):  # a register (nisa.register_load): one value
        limits.check(not vector, what, "a vector offset is a tile of one offset per row, not a register")
        return _RuntimeOffsets(tile, False, 0)
    limits.check(isinstance(tile, NkiTensor) and tile.buffer.on_chip and tile.buffer.name == "sbuf", what,
                 f"{name} must be an SBUF tile of integers, got {tile!r}")
    limits.check(isinstance(tile.dtype, torch.dtype) and not tile.dtype.is_floating_point, what,
                 f"{name} must hold integers, got {tile.dtype}")
    if vector:
        limits.check(not base.buffer.on_chip, what, f"a vector offset gathers rows of an HBM tensor; "
                                                    f"{base.describe()} is in {base.buffer}")
        limits.check(tile.shape[0] == nums[0] and tile.numel() == nums[0], what,
                     f"vector_offset {tile.shape} must hold one offset per index of the pattern's first "
                     f"dimension ({nums[0]}, 1)")
    else:
        limits.check(tile.numel() == 1, what, f"scalar_offset must be one value (1, 1), got {tile.shape}")
        limits.check(not (base.buffer.on_chip and partition_dim), what,
                     f"on {base.buffer} a scalar_offset cannot move along the partition dimension (dim 0)")
    return _RuntimeOffsets(tile, vector, 0)


def _indirect(chain):
    for op in chain:
        if op[0] == "ap" and len(op) > 5:
            return op[5]
    return None


def _indirect_index(op, flat: torch.Tensor) -> torch.Tensor:
    """The flat element each position of an access pattern with runtime offsets reads: the static pattern
    plus offset * stride (per index of the first dimension for a vector offset)."""
    nums, steps, offset, runtime = op[1], op[2], op[3], op[5]
    dev = flat.device
    idx = torch.full((1,) * len(nums), offset, dtype=torch.int64, device=dev)
    for k, (s, n) in enumerate(zip(steps, nums)):
        if k == 0 and runtime.vector:
            continue
        shape = [1] * len(nums)
        shape[k] = n
        idx = idx + (torch.arange(n, dtype=torch.int64, device=dev) * s).reshape(shape)
    moved = runtime.tile.data.to(device=dev, dtype=torch.int64)
    moved = moved.reshape([nums[0]] + [1] * (len(nums) - 1)) if runtime.vector else moved.reshape((1,) * len(nums))
    idx = (idx + moved * runtime.stride).expand(nums)
    if idx.device.type != "meta" and not is_fake(idx) and idx.numel() and not _oob["skip"]:
        lo, hi = int(idx.min()), int(idx.max())  # interpreted: the offsets' values are known here
        limits.check(lo >= 0 and hi < flat.numel(), "ap",
                     f"runtime offsets {moved.reshape(-1).tolist()[:8]} move the access pattern to element "
                     f"{hi if hi >= flat.numel() else lo} of a tensor of {flat.numel()} elements (out of bounds; "
                     f"oob_mode=nisa.oob_mode.skip on the DMA skips such accesses)")
    return idx


_oob = {"skip": False}  # the running DMA's oob_mode is skip (set by dma_copy / dma_compute around their accesses)


@contextlib.contextmanager
def skipping_out_of_bounds(skip: bool = True):
    """oob_mode.skip for the accesses inside: a runtime-offset access out of bounds is skipped, not an error
    (a gather's row reads a clamped row, which the instruction then discards: `in_bounds`; a scatter's row
    goes to a scratch element past the tensor's end, dropped)."""
    before, _oob["skip"] = _oob["skip"], bool(skip)
    try:
        yield
    finally:
        _oob["skip"] = before


def _valid(op, idx: torch.Tensor, numel: int) -> torch.Tensor:
    """Which positions of a runtime-offset access happen under oob_mode.skip: a vector offset's row, or a
    scalar offset's whole pattern, is skipped when any element of it is out of bounds (one DMA descriptor)."""
    nums = op[1]
    ok = (idx >= 0) & (idx < numel)
    if op[5].vector:
        return ok.reshape(nums[0], -1).all(1).reshape([nums[0]] + [1] * (len(nums) - 1)).expand(nums)
    return ok.all().expand(nums)


def in_bounds(t: NkiTensor) -> torch.Tensor | None:
    """For a view that moves by runtime offsets: a bool tensor of its shape, True where the access is in
    bounds (oob_mode.skip keeps the destination's old values elsewhere); None for any other view."""
    k = next((i for i, op in enumerate(t.chain) if op[0] == "ap" and len(op) > 5), None)
    if k is None:
        return None
    op = t.chain[k]
    flat = _apply(t.storage.tensor, t.chain[:k]).contiguous().view(-1)
    if op[4] is not None and op[4] != flat.dtype:
        flat = flat.view(op[4])
    with skipping_out_of_bounds():
        ok = _valid(op, _indirect_index(op, flat), flat.numel())
    return _apply(ok, t.chain[k + 1:]) if t.chain[k + 1:] else ok


def view_of(t: torch.Tensor, chain) -> torch.Tensor:
    """The view `chain` (a kernel's view of an HBM tensor) taken of the real tensor a launch passes."""
    return _apply(t, chain)


def flat_indices(t: NkiTensor) -> np.ndarray | None:
    """The allocation's elements (row-major) the view covers; None when its dtype was reinterpreted."""
    if any(op[0] == "dtype" or (op[0] == "ap" and op[4] is not None) for op in t.chain):
        return None
    v = t.layout()
    idx = np.asarray(v.storage_offset(), dtype=np.int64)
    for size, stride in zip(v.shape, v.stride()):
        idx = idx[..., None] + np.arange(size, dtype=np.int64) * stride
    return idx.reshape(-1)


def covers_all(t: NkiTensor) -> bool:
    if not t.chain:
        return True
    v = t.layout()
    return v.storage_offset() == 0 and v.numel() == t.storage.meta.numel() and v.is_contiguous()


def _region(tr, t: NkiTensor):
    """(storage, first element, last element, view) of the view: the first three for the cost model's
    dependencies (all of it for a view that moves by runtime offsets), the view's exact elements (offset,
    shape, strides, element bytes; None through runtime offsets) for the hazard checker (nki/hazards.py)."""
    st = t.storage
    if st.uid not in tr.storages:
        tr.storages[st.uid] = (st.describe(), st.buffer.name, st.site, st.born, st.shape, st.meta.element_size())
    if tr.capture is not None and not st.buffer.on_chip:
        tr.capture[st.uid] = st
    if _indirect(t.chain) is not None:
        return st.uid, 0, st.meta.numel() - 1, None
    v = t.layout()
    shape, strides, offset = tuple(v.shape), v.stride(), v.storage_offset()
    lo = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0 and n > 0)
    hi = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0 and n > 0)
    return st.uid, lo, hi, (offset, shape, strides, v.element_size())


def read(t: NkiTensor, instruction: str, check_written: bool = True) -> torch.Tensor:
    """The torch view an instruction reads; warns (once per allocation and line) if part of it was never
    written (unless check_written is False: a destination's old values an instruction may keep)."""
    _check_in_bounds(t, instruction)
    st = t.storage
    tr = trace.active()
    runtime = _indirect(t.chain)
    if runtime is not None and isinstance(runtime.tile, NkiTensor):
        read(runtime.tile, instruction)  # the offsets are read too
    if tr is not None:
        if tr.fuser is not None:
            tr.fuser.before_read(st)  # deferred matmuls and stores into it land first
        tr.account(st, write=False)
        if tr.regions:
            tr.pending_reads.append(_region(tr, t))
        if check_written:
            _warn_unwritten(tr, t, instruction, "reads")
    return t.data


def _check_in_bounds(t: NkiTensor, instruction: str) -> None:
    """An access through a view made by .ap() past its tile is an error at the accessing line (the view itself
    was not: _outside); indexed back inside the tile, the view is fine."""
    made = next((op[1] for op in t.chain if op[0] == "outside"), None)
    if made is None:
        return
    v = t.layout()
    lo = v.storage_offset() + sum((n - 1) * s for n, s in zip(v.shape, v.stride()) if s < 0 and n > 0)
    hi = v.storage_offset() + sum((n - 1) * s for n, s in zip(v.shape, v.stride()) if s > 0 and n > 0)
    limits.check(v.numel() == 0 or (lo >= 0 and (hi + 1) * v.element_size() <= t.storage.meta.numel()
                                    * t.storage.meta.element_size()), instruction,
                 f"accesses a view outside its tile: {made}")


def _warn_unwritten(tr, t: NkiTensor, instruction: str, what: str) -> None:
    """Warn (once per allocation and line) if part of the view was never written."""
    st = t.storage
    # after a loop on a runtime value (run no times here) what was written is not known: the launches,
    # interpreted on real values, warn instead
    if st.written is not None and tr.runtime_control is None:
        idx = flat_indices(t)
        if idx is not None and not st.written[idx].all():
            tr.warn_once((id(st), limits.kernel_line()), instruction,
                         f"{what} {st.describe()} ({st.buffer}, allocated at {st.site}) where it was never "
                         f"written: those values are undefined on the device")


def write(t: NkiTensor, value: torch.Tensor, instruction: str, accumulate: bool = False,
          source: NkiTensor | None = None) -> None:
    """Write `value` (rounded to the destination's dtype) through the view `t`. `source`: the value is a view
    of that tensor (a copy instruction), not a fresh result, its elements in the view's row-major order."""
    _check_in_bounds(t, instruction)
    tr = trace.active()
    if accumulate and tr is not None:  # adds to what the destination holds: that is read
        _warn_unwritten(tr, t, instruction, "accumulates into")
    if tr is not None and tr.fuser is not None:
        if tr.fuser.store(t, value, source):  # a GEMM's tile stored: one GEMM for all tiles, later
            note_write(t)
            return
        tr.fuser.before_write(t.storage)  # deferred work this write may change or overwrite lands first
    note_write(t)
    assign(t, value, instruction, accumulate, source)


def note_write(t: NkiTensor) -> None:
    """What a write records besides its value: capacity, written arguments, the cost model's region, and
    which elements are now defined (a deferred matmul notes its write when issued, assigns it later)."""
    st = t.storage
    tr = trace.active()
    if tr is not None:
        tr.account(st, write=True)
        if st.input_index is not None:
            tr.written_inputs.add(st.input_index)
        if tr.regions:
            tr.pending_writes.append(_region(tr, t))
    if st.written is not None:
        idx = flat_indices(t)
        if idx is None:
            st.written[:] = True
        else:
            st.written[idx] = True


def assign(t: NkiTensor, value: torch.Tensor, instruction: str, accumulate: bool = False,
           source: NkiTensor | None = None) -> None:
    """The value half of `write`: `value`, rounded to the allocation's dtype, becomes what the view holds."""
    st = t.storage
    shape = t.shape
    copied_from = source if not accumulate else None
    r = source.storage.rounded if source is not None and not accumulate else None
    rounded = r is not None and r[0] is value and st.dtype == torch.bfloat16
    if rounded:
        value, source = r[1], None  # a fused GEMM's result, rounded by a bf16 GEMM (fusion.py)
    written_value = value
    if tuple(value.shape) != shape:
        limits.check(value.numel() == math.prod(shape), instruction,
                     f"the result has shape {tuple(value.shape)} but the destination {t!r} has shape {shape}")
        value = value.reshape(shape)
    scatter_add = accumulate and _indirect(t.chain) is not None  # every row adds, repeated ones too
    if accumulate:
        value, source = (value if scatter_add else t.data.float() + value.float()), None
    if value.dtype != st.dtype and not scatter_add:
        value, source = value.to(st.dtype), None
    limits.check(not any(op[0] == "expand" for op in t.chain), instruction,
                 f"writes through a broadcast view of {st.describe()}")
    fresh = source is None and not is_view(value) and not _is_bound(value)
    if scatter_add:
        _write_through_access_pattern(t, value, accumulate=True)
    elif not st.pinned and covers_all(t) and (fresh or source is not None):
        st.tensor = value.reshape(st.shape)  # a new SSA value: no copy
        _bind(st.tensor)
        st.owned, st.lender = True, None
        if source is not None:
            source.storage.lend(st)
    elif any(op[0] == "ap" for op in t.chain):
        _write_through_access_pattern(t, value)
    else:
        st.before_in_place_write()
        t.data.copy_(value)
    tr = trace.active()
    if tr is not None and tr.fuser is not None and st.buffer.on_chip:
        tr.fuser.copied(t, source if source is not None and value.numel() == source.numel() else None)
        tr.fuser.copied_gemm(t, written_value, copied_from, rounded)


def read_float(t: NkiTensor, instruction: str) -> torch.Tensor:
    """`read(t).float()`, the upcast taken once per value of the whole allocation and viewed (a Tensor
    Engine operand read by many matmuls, each K tile of a resident block, is converted once)."""
    v = read(t, instruction)
    if v.dtype == torch.float32:
        return v
    st = t.storage
    if any(op[0] == "dtype" or (op[0] == "ap" and op[4] is not None) for op in t.chain):
        return v.float()
    cached = st.float_value
    if cached is None or cached[0] is not st.tensor:
        cached = st.float_value = (st.tensor, st.tensor.float())
    return _apply(cached[1], t.chain) if t.chain else cached[1]


def _write_through_access_pattern(t: NkiTensor, value: torch.Tensor, accumulate: bool = False) -> None:
    """A partial write through an .ap() view, computed as a new value of the whole allocation
    (as_strided_scatter): PyTorch cannot trace an in-place write through an as_strided view. Through runtime
    offsets it is a scatter (index_put); `accumulate`: each position adds its value in fp32 (repeated
    offsets add up, index_add's semantics), rounded once to the allocation's dtype; under oob_mode.skip a
    position out of bounds writes a scratch element past the end, dropped."""
    st = t.storage
    k = next(i for i, op in enumerate(t.chain) if op[0] == "ap")
    nums, steps, offset, dtype = t.chain[k][1:5]
    flat = _apply(st.tensor, t.chain[:k]).contiguous().view(-1)
    if flat.storage_offset():
        flat = flat.clone()
    if dtype is not None and dtype != flat.dtype:
        flat = flat.view(dtype)
    idx = _indirect_index(t.chain[k], flat) if len(t.chain[k]) > 5 else None  # runtime offsets: a scatter
    numel, skip = flat.numel(), idx is not None and _oob["skip"]
    if skip:  # out-of-bounds rows go to one scratch element at the end
        idx = torch.where(_valid(t.chain[k], idx, numel), idx, numel)
        flat = torch.cat([flat, flat.new_zeros(1)])
    region = value
    after = tuple(op for op in t.chain[k + 1:] if op[0] != "outside")  # (a mark, not a view)
    if after:  # indexed further after the access pattern: update that part of the region
        limits.check(not accumulate, "dma", "a scatter-add through a view indexed after its access pattern")
        region = (flat[idx] if idx is not None else torch.as_strided(flat, nums, steps, offset)).clone()
        _apply(region, after).copy_(value)
    if idx is not None and accumulate:
        wide = torch.float32 if flat.dtype.is_floating_point else flat.dtype
        new = flat.to(wide).index_put((idx.reshape(-1),), region.reshape(-1).to(wide), accumulate=True)
        new = new.to(flat.dtype)
    elif idx is not None:
        new = flat.index_put((idx.reshape(-1),), region.reshape(-1).to(flat.dtype))
    else:
        # a dimension of step 0 writes its elements to one place, in the pattern's order: the last stays (nki-library's
        # qkv_cte gives activation_reduce a dst of pattern [[1, S], [0, H]] to keep only its reduction)
        region, nums = region.reshape(nums), list(nums)
        for d, (step, num) in enumerate(zip(steps, nums)):
            if step == 0 and num > 1:
                region, nums[d] = region.narrow(d, num - 1, 1), 1
        new = torch.as_strided_scatter(flat, region.to(flat.dtype), nums, steps, offset)
    if skip:
        new = new[:numel]
    if dtype is not None and dtype != st.dtype:
        new = new.view(st.dtype)
    new = new.view(st.shape)
    st.before_in_place_write()
    if st.pinned:
        st.tensor.copy_(new)
    else:
        st.tensor = new
        _bind(new)
        st.owned, st.lender = True, None


def written(t: NkiTensor) -> bool:
    """Every element of the view has been written (inputs count as written)."""
    st = t.storage
    if st.written is None:
        return True
    idx = flat_indices(t)
    return bool(st.written.all() if idx is None else st.written[idx].all())
