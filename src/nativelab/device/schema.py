"""What the device knows about one ATen op overload, worked out once from its schema (`OpRecord`).

Its route, chosen once per overload: a view (metadata only), an op the real device implements
(`native_ops.txt`: queued), or a CPU fallback. Also the arguments it writes and the ones its returns alias,
its `out=` and functional forms, its generator and index arguments, and how to call it with schema-ordered
arguments. What the device then does with a call is `policy.py` (dtypes) and `dispatch.py` (the routes).
"""

from __future__ import annotations

from importlib import resources

import torch

from . import _private, policy, rng

# Arguments that may be CPU tensors of any size, as on CUDA: the `Tensor?[] indices` of advanced indexing
# (`index`, `index_put_` and their unsafe/impl forms), which PyTorch moves to `self`'s device itself
# (`device_check: NoCheck` in native_functions.yaml, then `make_info`). Every other CPU operand must be a 0-d
# scalar, which is what TensorIterator allows; `index_select`, `gather`, `take` ... reject CPU indices on CUDA.
_CPU_INDEX_ARGS = ("indices",)


_MISSING = object()


def _load_native_names() -> frozenset[str]:
    text = resources.files(__package__).joinpath("native_ops.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


NATIVE_OPS = _load_native_names()
NATIVE_BASES = frozenset(n.split(".", 1)[0] for n in NATIVE_OPS)

# Ops that move or make memory rather than compute: every device has them. Eager, the device answers them
# itself (runtime_ops.py: allocation, copies) or PyTorch's composite kernels make them of its own ops; inside a
# compiled graph they reach the device's graph compiler as they are, which lowers them.
DATA_MOVEMENT = frozenset(
    {
        "aten::clone", "aten::_to_copy", "aten::copy", "aten::copy_", "aten::empty", "aten::empty_strided",
        "aten::empty_like", "aten::full_like", "aten::zeros_like", "aten::iota", "aten::resize_",
        "aten::lift_fresh_copy", "aten::_unsafe_index", "aten::_unsafe_index_put", "aten::index_put",
        "aten::index_put_", "aten::slice_scatter", "aten::select_scatter", "aten::as_strided_scatter",
        "aten::diagonal_scatter", "aten::expand_copy", "aten::permute_copy", "aten::view_copy",
        "aten::constant_pad_nd", "aten::split_with_sizes_copy", "aten::alias_copy", "aten::scalar_tensor",
        "aten::_unsafe_view", "aten::new_zeros", "aten::new_empty", "aten::new_ones", "aten::new_full",
        "aten::fill", "aten::masked_fill", "aten::detach", "aten::squeeze_copy", "aten::unsqueeze_copy",
        "aten::full", "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset",
        "aten::_assert_tensor_metadata", "aten::_assert_scalar", "aten::empty_permuted",
    }
)


def op_schema(op):
    """An ATen operator overload's schema (arguments, returns, their aliasing), None for anything else: what the
    layers above read of an op (a graph node's target)."""
    return _private.op_schema(op)


def op_base_name(op) -> str:
    """An overload's operator name without the overload (`aten::add` for `aten.add.Tensor`), which is how
    `native_ops.txt` and the layers above name ops."""
    return op.name().partition(".")[0]


def _is_tensor(t) -> bool:
    return t.kind() == "TensorType"


def _is_tensors(t) -> bool:
    """A schema type that is a tensor or a list of them (`Tensor`, `Tensor[]`), read from the type object: its
    text is not one spelling (a list prints as "List[Tensor]")."""
    return _is_tensor(t) or (t.kind() == "ListType" and _is_tensor(t.getElementType()))


def _is_number(t) -> bool:
    """`Scalar` or `Scalar?` (a Python number the caller passes)."""
    if t.kind() == "OptionalType":
        t = t.getElementType()
    return t.kind() == "NumberType"


def _is_index_list(t) -> bool:
    """`Tensor?[]`, advanced indexing's indices."""
    if t.kind() != "ListType" or t.getElementType().kind() != "OptionalType":
        return False
    return _is_tensor(t.getElementType().getElementType())


def route(op, graph: bool = False) -> str:
    """Where an ATen op overload runs: "view" (metadata only, on the same device memory), "native" (the device
    computes it: queued) or "fallback" (the CPU computes it, the queue drained, recorded for
    `get_fallback_ops()`). The one decision eager dispatch (`OpRecord.route`) and compiled graphs
    (`compiler/partition.py`) ask.

    Eager (the real device's op registrations): an overload in `native_ops.txt` (an entry without an overload
    covers them all) that returns tensors, or only writes its arguments. In a compiled graph (`graph=True`)
    the device's graph compiler lowers every overload of an op it knows, and the data movement (`DATA_MOVEMENT`) that eager dispatch
    answers with the runtime's own kernels or composites."""
    schema = _private.op_schema(op)
    mutable = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    if not mutable and any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return "view"
    base = schema.name
    if graph:
        if op.is_view:
            return "view"
        return "native" if base in NATIVE_BASES or base in DATA_MOVEMENT else "fallback"
    name = base if schema.overload_name == "" else f"{base}.{schema.overload_name}"
    if (name in NATIVE_OPS or base in NATIVE_OPS) and not op.is_view and (schema.returns or mutable) and all(
        _is_tensors(r.type) for r in schema.returns
    ):  # (an op that only writes its arguments, `_foreach_add_`, `_fused_adamw_`, returns nothing)
        return "native"
    return "fallback"


class OpRecord:
    """What the device needs to know about one op overload, worked out once from its schema."""

    __slots__ = (
        "op", "name", "route", "arg_pos", "mutable", "returns_alias", "int64_args", "gen_pos", "meta_cache",
        "npos", "kwnames", "defaults", "out_op", "out_names", "tensor_pos", "number_pos", "cpu_ok", "functional",
        "random", "out_args", "out_call",
    )

    def __init__(self, op: _private.OpOverload):
        schema = _private.op_schema(op)
        self.op = op
        base = schema.name  # 'aten::add'
        self.name = base if schema.overload_name == "" else f"{base}.{schema.overload_name}"
        args = schema.arguments
        self.arg_pos = {a.name: i for i, a in enumerate(args)}
        self.mutable = tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
        self.out_args = any(args[i].kwarg_only for i in self.mutable)  # out= arguments the op may resize
        # For each return: the argument it aliases, if any.
        sets = {}
        for i, a in enumerate(args):
            if a.alias_info is not None:
                for s in a.alias_info.before_set:
                    sets.setdefault(s, i)
        self.returns_alias = tuple(
            (sets.get(next(iter(r.alias_info.before_set))) if r.alias_info is not None else None)
            for r in schema.returns
        )
        short = base.split("::", 1)[1]
        self.int64_args = tuple(self.arg_pos[n] for n in policy.INT64_INDEX_ARGS.get(short, ()) if n in self.arg_pos)
        self.gen_pos = self.arg_pos.get("generator")
        self.random = self.gen_pos is not None or rng.is_random(op)
        self.cpu_ok = tuple(
            i for i, a in enumerate(args) if a.name in _CPU_INDEX_ARGS and _is_index_list(a.type)
        )
        self.functional = _MISSING  # an out= op's functional form, looked up when the dtype policy needs it
        # Tensor arguments the dispatcher may hand us as Python numbers (wrapped scalars)
        self.tensor_pos = tuple(i for i, a in enumerate(args) if _is_tensor(a.type))
        self.number_pos = tuple(i for i, a in enumerate(args) if _is_number(a.type))  # Scalar arguments
        self.npos = sum(1 for a in args if not a.kwarg_only)
        self.kwnames = tuple(a.name for a in args if a.kwarg_only)
        self.defaults = tuple(a.default_value if a.has_default_value() else None for a in args)
        self.route = route(op)
        self.meta_cache: dict = {}
        self.out_op, self.out_names = _out_variant(op) if self.route == "native" else (None, ())
        self.out_call = _private.op_callable(self.out_op) if self.out_op is not None else None

    # Argument walking. Schema arguments arrive positionally in `args` and by name in `kwargs`; we normalise to
    # one positional list so schema positions (mutable args, index args, generator) can be used directly.

    def normalise(self, args: tuple, kwargs: dict) -> list:
        if not kwargs and (self.gen_pos is None or len(args) > self.gen_pos):
            return list(args)
        full = list(args) + list(self.defaults[len(args):])
        for k, v in kwargs.items():
            full[self.arg_pos[k]] = v
        return full

    def call(self, full: list):
        """Call the op with schema-ordered arguments (keyword-only ones by name)."""
        if len(full) <= self.npos:
            return self.op(*full)
        return self.op(*full[: self.npos], **dict(zip(self.kwnames, full[self.npos:])))

    def alias_returns(self, args: list):
        """What an op that writes its arguments returns: the arguments its returns alias."""
        if not self.returns_alias:  # (`_fused_adamw_`: nothing)
            return None
        rets = [args[i] for i in self.returns_alias]
        return rets[0] if len(rets) == 1 else tuple(rets)

    def functional_form(self):
        """The functional overload of an out= op (scatter.value_out -> scatter.value), or None."""
        if self.functional is _MISSING:
            want = [(a.name, str(a.type)) for a in _private.op_schema(self.op).arguments
                    if not (a.alias_info and a.alias_info.is_write)]
            self.functional = None
            packet = self.op.overloadpacket
            for name in packet.overloads():
                cand = getattr(packet, name)
                args = _private.op_schema(cand).arguments
                if any(a.alias_info is not None and a.alias_info.is_write for a in args):
                    continue
                if [(a.name, str(a.type)) for a in args] == want:
                    self.functional = cand
                    break
        return self.functional


def _out_variant(op):
    """The `out=` overload of a functional op (mul.Tensor -> mul.out), so queued work writes its result
    straight into the device output instead of into a temporary that is then copied."""
    schema = _private.op_schema(op)
    if not all(_is_tensor(r.type) for r in schema.returns):
        # A list result (`_foreach_add.List`) has one out= list for all of it: the queued op computes it and the
        # results are copied into the outputs
        return None, ()
    want = [(a.name, str(a.type)) for a in schema.arguments]
    for name in op.overloadpacket.overloads():
        cand = _private.op_schema(getattr(op.overloadpacket, name))
        outs = [a for a in cand.arguments if a.alias_info is not None and a.alias_info.is_write]
        if not outs or len(outs) != len(schema.returns) or not all(a.kwarg_only for a in outs):
            continue
        rest = [(a.name, str(a.type)) for a in cand.arguments if not (a.alias_info and a.alias_info.is_write)]
        if rest == want:
            return getattr(op.overloadpacket, name), tuple(a.name for a in outs)
    return None, ()


records: dict = {}  # OpOverload -> OpRecord


def record_for(op) -> OpRecord:
    rec = records.get(op)
    if rec is None:
        rec = records[op] = OpRecord(op)
    return rec
