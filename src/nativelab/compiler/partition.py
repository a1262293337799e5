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

from ..device import schema as device_schema
from . import random_ops
from ._private import OpOverload


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
    return device_schema.route(target, graph=True) == "fallback"  # the decision eager dispatch asks too


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
