"""The private PyTorch API the NKI layer needs (canary: tests/test_private_apis.py)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor


def is_fake(t: torch.Tensor) -> bool:
    """A fake tensor (torch.compile's tracing, a custom op's fake implementation): metadata, no data."""
    return isinstance(t, FakeTensor)


def is_view(t: torch.Tensor) -> bool:
    """`t` is a view of another tensor's memory (writing a copy of it is then not free to skip)."""
    return t._is_view()


# --- the recording pass's graph (nki/rolling.py keeps loops as loops)

def _tracer():
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    mode = get_proxy_mode()
    return mode.tracer if mode is not None else None


def fx_graph():
    """The graph make_fx is recording into, or None outside make_fx."""
    tracer = _tracer()
    return tracer.graph if tracer is not None else None


def proxy_node(t: torch.Tensor):
    """The graph node make_fx holds for tensor `t` now (its latest in-place op's, once written), or None."""
    tracer = _tracer()
    slot = tracer.tensor_tracker.get(t) if tracer is not None else None
    return slot.proxy.node if slot is not None else None


def tracked_tensors() -> list:
    """(tensor, node) for every tensor make_fx tracks now."""
    tracer = _tracer()
    return [(t, slot.proxy.node) for t, slot in list(tracer.tensor_tracker.items())] if tracer is not None else []


def trace_subgraph(fn, *args) -> torch.fx.GraphModule:
    """`fn(*args)` traced into a graph of its own while make_fx records another (the way torch's loop
    higher-order ops trace their bodies): one placeholder per argument, in the recording's fake mode and shape
    environment; nothing is recorded in the outer graph. Give it tensors the outer graph does not track (made
    under `untracked()`) where `fn` writes them in place."""
    from torch._higher_order_ops.utils import reenter_make_fx
    with untracked():  # as while_loop traces its body: the outer tracer must not see the body's integers
        return reenter_make_fx(fn)(*args)


def untracked():
    """A context in which tensor ops under make_fx run on fake tensors without being recorded."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    return disable_proxy_modes_tracing()


def check_range(s, lo: int, stop: int) -> None:
    """Tell the shape environment lo <= s < stop for an unbacked integer (a rolled loop body's .item() of its
    counter), so slices at offsets affine in it need no guard."""
    torch._check(s >= lo)
    torch._check(s < stop)


def is_higher_order(target) -> bool:
    return isinstance(target, torch._ops.HigherOrderOperator)


def written_argument(target) -> int | None:
    """The position of the argument an aten op writes in place and returns (`add_`'s self, `copy_`'s self),
    from its schema's alias annotations; None for a functional op or a non-aten target."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    for j, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only:
            return j
    return None


def is_view_op(target) -> bool:
    """An aten op whose result aliases its first argument without writing it (slice, view, transpose...)."""
    schema = getattr(target, "_schema", None)
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None
                and not schema.returns[0].alias_info.is_write)
