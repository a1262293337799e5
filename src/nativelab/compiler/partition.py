"""Split an ATen graph into device subgraphs and CPU-fallback nodes.

A node runs on the device when its op is one the device implements (any overload of a base op in the real
device's list: the graph compiler, unlike eager dispatch, lowers every overload of an op it knows), or when
it only reshapes, views, copies or creates tensors. Everything else (`argmax`, `sort`, `multinomial`, ...)
becomes a CPU fallback between device subgraphs, run through the device's eager dispatch so that it is
tracked exactly like an eager fallback.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from ..device.schema import NATIVE_OPS, op_base_name
from . import random_ops
from ._private import OpOverload

_NATIVE_BASES = frozenset(n.split(".", 1)[0] for n in NATIVE_OPS)

# Ops that move or make memory rather than compute: every device has them, the compiler lowers them.
_DATA_MOVEMENT = frozenset(
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


def is_fallback(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return False
    if target in random_ops.REPLAY_FUNCTIONS:
        return True  # a random op replayed from a saved generator state: run eagerly (random_ops.py)
    if not isinstance(target, OpOverload):
        return False  # Python scalar arithmetic and prims: part of the device graph
    if target.namespace != "aten":
        return False  # custom ops (kernels) and prims stay in the graph that calls them
    if target.is_view:
        return False
    base = op_base_name(target)
    return base not in _NATIVE_BASES and base not in _DATA_MOVEMENT


def partition(gm: torch.fx.GraphModule) -> tuple[dict[torch.fx.Node, int], set[int]]:
    """Partition ids in topological order: runs of device nodes share an id, each fallback gets its own.
    Returns (node -> id, ids that are fallbacks)."""
    ids: dict[torch.fx.Node, int] = {}
    fallbacks: set[int] = set()
    current = 0
    current_is_fallback = False
    started = False
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op == "call_function" and node.target is operator.getitem:
            ids[node] = ids.get(node.args[0], current)  # stays with the node it unpacks
            continue
        fb = is_fallback(node)
        if not started:
            started, current_is_fallback = True, fb
        elif fb or current_is_fallback:
            current += 1
            current_is_fallback = fb
        ids[node] = current
        if fb:
            fallbacks.add(current)
    return ids, fallbacks
