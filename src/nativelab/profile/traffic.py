"""Device-memory traffic: the bytes each piece of device work reads and writes.

The model is the one the guide explains the tiers with (HBM round trips): a unit of device work reads its
inputs from device memory and writes its outputs back; what happens inside it stays on chip.
- an eager op reads each tensor argument and writes each output (an in-place op also reads what it
  overwrites; an `out=` argument is only written; a scatter into a buffer, like the KV-cache
  `index_copy_`, writes only the values it scatters);
- a compiled graph or a kernel is one unit: it reads each input it uses and each weight baked into it
  (once per launch), and writes its outputs and what it updates in place; its intermediates are free; a
  hand-written host kernel counts what it says it moves (`fn.traffic(*args)`), else nothing;
- a CPU fallback reads its device inputs to the host and writes its results back (host transfers).
A tensor counts its viewed bytes (`numel * element size`), not its whole storage. Python scalars and the
device's cached scalar constants are immediates, not traffic.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from ..device import dispatch as _dispatch
from ..device import schema as _schema
from ._private import OpOverload

_Tensor = torch.Tensor

# Scatter-like ops that write into a buffer: the bytes written are those of the values argument.
_SCATTER_VALUES = {
    "index_copy": "source", "index_put": "values", "index_add": "source", "scatter": "src",
    "scatter_add": "src", "scatter_reduce": "src", "slice_scatter": "src", "select_scatter": "src",
    "masked_scatter": "source", "put": "source",
}


# Lookups into a table (the embedding, RoPE tables indexed by position): the table's bytes read are the
# rows looked up, i.e. the output's bytes.
_GATHER_SOURCE = {"embedding": "weight", "index_select": "self", "index": "self", "gather": "self", "take": "self"}

# In-place ops that overwrite their destination without reading it.
_OVERWRITES = (torch.ops.aten.copy_.default,)


def nbytes(t: _Tensor) -> int:
    return t.numel() * t.element_size()


def _immediate(t: _Tensor) -> bool:
    """A 0-d CPU constant the device made for a Python scalar (`t * 2`): an immediate, not memory traffic."""
    return t.dim() == 0 and _dispatch.is_immediate(t)


def tensor_bytes(x) -> int:
    """Bytes of the tensors in `x` (a tensor, or a list/tuple of them), immediates excluded."""
    if isinstance(x, _Tensor):
        return 0 if _immediate(x) else nbytes(x)
    if isinstance(x, (list, tuple)):
        return sum(tensor_bytes(t) for t in x if isinstance(t, _Tensor))
    return 0


def _scatter_base(schema_name: str) -> str | None:
    short = schema_name.split("::", 1)[-1].split(".", 1)[0].rstrip("_")
    return short if short in _SCATTER_VALUES else None


def _gather_source(schema_name: str) -> str | None:
    """The table argument of a lookup (embedding, index_select, ...): it reads only the rows it returns."""
    return _GATHER_SOURCE.get(schema_name.split("::", 1)[-1].split(".", 1)[0])


def op_traffic(rec, hargs: list, houts: list | None) -> tuple[int, int]:
    """(read, written) bytes of one eager op (its record and host arguments; `houts` for functional ops)."""
    if houts is not None:
        written = sum(tensor_bytes(o) for o in houts)
        source = _gather_source(rec.name)
        skip = rec.arg_pos.get(source) if source is not None else None
        read = sum(tensor_bytes(a) for i, a in enumerate(hargs) if i != skip)
        return read + (written if skip is not None else 0), written
    read = written = 0
    scatter = _scatter_base(rec.name)
    for i, a in enumerate(hargs):
        if i in rec.mutable:
            kwarg_only = i >= rec.npos  # an out= argument is only written
            if scatter is not None and not kwarg_only:
                continue  # counted through its values argument below
            written += tensor_bytes(a)
            if not kwarg_only:
                read += tensor_bytes(a)
        else:
            read += tensor_bytes(a)
    if scatter is not None:
        pos = rec.arg_pos.get(_SCATTER_VALUES[scatter])
        if pos is not None and pos < len(hargs):
            written += tensor_bytes(hargs[pos])
    return read, written


class GraphIO:
    """What one launch of a traced or lowered graph moves, worked out once from the graph:
    per input whether it is read and how many bytes are written into it, and the bytes of baked weights."""

    __slots__ = ("reads", "writes", "constant_bytes", "outputs_are_inputs")

    def __init__(self, gm: torch.fx.GraphModule, outputs_are_inputs: bool):
        self.outputs_are_inputs = outputs_are_inputs  # kernels: output i is the final value of input i
        nodes = list(gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        base_of = {p: p for p in placeholders}  # view chains back to the input they view
        for n in nodes:
            if n.op == "get_attr":
                base_of[n] = n
        read_roots: set = set()
        partial: dict = {}  # inputs only looked up into -> bytes of the rows looked up
        written: dict = {}
        for n in nodes:
            if n.op != "call_function":
                continue
            target = n.target
            if isinstance(target, OpOverload) and target.is_view and n.args:
                src = n.args[0]
                if isinstance(src, torch.fx.Node) and src in base_of:
                    base_of[n] = base_of[src]
                continue
            if target is operator.getitem:
                continue
            mutated = _mutated_args(n)
            for pos, a in _tensor_args(n):
                root = base_of.get(a)
                if root is None:
                    continue
                if pos in mutated:
                    written[root] = written.get(root, 0) + _write_bytes(n, a)
                    if not mutated[pos] and n.target not in _OVERWRITES:  # in-place (self): also read
                        read_roots.add(root)
                elif pos == _gather_pos(n):  # a lookup: only the rows it returns
                    partial[root] = partial.get(root, 0) + _val_bytes(n)
                else:  # a functional update of an input (AOTAutograd's KV-cache write) reads it too
                    read_roots.add(root)
        out_node = next(n for n in nodes if n.op == "output")
        outs = out_node.args[0]
        outs = outs if isinstance(outs, (list, tuple)) else (outs,)
        if outputs_are_inputs:
            for p, o in zip(placeholders, outs):
                if o is not p and isinstance(o, torch.fx.Node) and p not in written and base_of.get(o) is not p:
                    written[p] = _val_bytes(p)  # a new value copied back into the argument
        # per input: True (read whole) or the bytes looked up in it
        self.reads = tuple(True if p in read_roots else partial.get(p, 0) for p in placeholders)
        self.writes = tuple(written.get(p, 0) for p in placeholders)
        self.constant_bytes = sum(
            tensor_bytes(_get_attr(gm, n.target)) if n in read_roots else partial.get(n, 0)
            for n in nodes if n.op == "get_attr"
        )

    def traffic(self, inputs, outputs=None) -> tuple[int, int]:
        """(read, written) bytes of one launch on these input tensors (and these output tensors)."""
        read = self.constant_bytes + sum(
            (tensor_bytes(t) if r is True else r) for t, r in zip(inputs, self.reads) if r
        )
        written = sum(self.writes)
        if outputs is not None and not self.outputs_are_inputs:
            written += sum(tensor_bytes(o) for o in outputs if o is not None)
        return read, written


def _tensor_args(n: torch.fx.Node):
    """(schema position or kwarg name, node) for each node argument, lists flattened."""
    schema = _schema.op_schema(n.target)
    names = [a.name for a in schema.arguments] if schema is not None else []
    for i, a in enumerate(n.args):
        for x in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(x, torch.fx.Node):
                yield i, x
    for k, a in n.kwargs.items():
        pos = names.index(k) if k in names else k
        for x in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(x, torch.fx.Node):
                yield pos, x


def _gather_pos(n: torch.fx.Node) -> int | None:
    """Schema position of the table argument when `n` is a lookup, else None."""
    if not isinstance(n.target, OpOverload):
        return None
    source = _gather_source(n.target.name())
    if source is None:
        return None
    return next((i for i, a in enumerate(_schema.op_schema(n.target).arguments) if a.name == source), None)


def _mutated_args(n: torch.fx.Node) -> dict:
    """Schema positions this node writes -> whether the argument is keyword-only (an out=)."""
    schema = _schema.op_schema(n.target)
    if schema is None:
        return {}
    return {
        i: a.kwarg_only for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    }


def _write_bytes(n: torch.fx.Node, target: torch.fx.Node) -> int:
    """Bytes a mutating node writes into `target`: the scattered values for a scatter, else the target;
    for `copy_(dst, scatter(dst, ..., values))`, the values."""
    scatter = _scatter_base(n.target.name())
    if scatter is not None:
        return _values_bytes(n, scatter)
    if n.target.name() == "aten::copy_" and len(n.args) > 1 and isinstance(n.args[1], torch.fx.Node):
        src = n.args[1]
        s = _scatter_base(src.target.name()) if isinstance(src.target, OpOverload) else None
        if s is not None:
            return _values_bytes(src, s)
    return _val_bytes(target)


def _values_bytes(n: torch.fx.Node, scatter: str) -> int:
    schema = _schema.op_schema(n.target)
    name = _SCATTER_VALUES[scatter]
    pos = next((i for i, a in enumerate(schema.arguments) if a.name == name), None)
    v = n.kwargs.get(name) if pos is None or pos >= len(n.args) else n.args[pos]
    return _val_bytes(v) if isinstance(v, torch.fx.Node) else 0


def _val_bytes(n: torch.fx.Node) -> int:
    v = n.meta.get("val")
    if v is None:
        v = n.meta.get("example_value")
    return tensor_bytes(v) if isinstance(v, _Tensor) else 0


def _get_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
