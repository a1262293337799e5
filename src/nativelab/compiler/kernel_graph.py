"""Graphs that are one kernel op: the backend runs the op's own implementation, with no generated code around it.

A kernel op (`nativelab.kernels.kernel_op`) is opaque to the compiler: its implementation allocates its
outputs and launches its kernels, and in a graph it stays one node that the generated code calls. When a
captured graph is nothing but that call (the experimental tier's decode step: one `transformer_tkg_token` over
66 per-layer tensors), the generated code is pure cost. The graph would be queued as one unit of device work,
its ~70 inputs turned into host views at launch; when it runs, Inductor's wrapper calls the op through the
dispatcher (each tensor boxed and unboxed), and only then does the op launch its kernel; all of it in Python on
the thread that then runs the kernel (~0.25 ms of a 2 ms decode step on a 2-core Xeon).

So such a graph is run as the call itself: a plain Python function calling the op's implementation on the
graph's inputs (device tensors), as eager mode runs it: outputs allocated on the device, kernels queued in
program order. AOTAutograd hands a mutating op over functionalized (`auto_functionalized_v2` plus copies of
the new values back into the mutated inputs); run in place on the inputs themselves it does the same. Anything
more (a second op, a computation, a mutated argument that is a view of an input) keeps the ordinary path.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx

from ..device.schema import op_schema
from ._private import OpOverload, functionalized_call, no_python_modes, python_modes_active

# op overload -> its implementation (the function `kernel_op` registered as the op), for ops that may run as
# themselves: implementations that only allocate outputs and launch kernels on the tensors they are given.
_IMPLS: dict[OpOverload, Callable] = {}


def register(op: OpOverload, impl: Callable) -> None:
    """Let graphs that are one call of `op` run `impl` directly (see the module docstring)."""
    _IMPLS[op] = impl


def direct(gm: torch.fx.GraphModule) -> Callable | None:
    """`gm` as a function that calls its one kernel op's implementation, or None if the graph is anything else."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    found = [(n, c) for n in calls if (c := _kernel_call(n)) is not None]
    if len(found) != 1:
        return None
    node, (op, args, kwargs, bases) = found[0]
    n_results = len(op_schema(op).returns)
    views, written = set(), {}
    for n in calls:
        if n is node:
            continue
        if n.target is operator.getitem and n.args[0] is node:
            if n.args[1] >= n_results and not bases:
                return None
            continue
        if isinstance(n.target, OpOverload) and n.target.is_view and all(
                a.op == "placeholder" or a in views for a in n.all_input_nodes):
            views.add(n)
            continue
        if n.target is torch.ops.aten.copy_.default and _is_write_back(n, node, bases, n_results):
            written[n.args[0]] = n
            continue
        return None
    # every input the op mutates is written back by the graph (run in place, it is), and nothing else reads the
    # new values; the bases are the graph's own inputs
    if len(written) != len(bases) or any(b.op != "placeholder" or b not in written for b in bases):
        return None
    if any(u not in written.values() for n in calls if _base_value(n, node, n_results) for u in n.users):
        return None
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = [out.args[0]] if isinstance(out.args[0], torch.fx.Node) else list(out.args[0])
    if not all(r is node and not bases and n_results == 1 or (
            r.op == "call_function" and r.target is operator.getitem and r.args[0] is node and r.args[1] < n_results)
            for r in results):
        return None

    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr") or n in views:
            env[n] = graph.node_copy(n, env.__getitem__)
    call = graph.call_function(_IMPLS[op], torch.fx.map_arg(args, env.__getitem__),
                               torch.fx.map_arg(kwargs, env.__getitem__))

    def result(r):
        if r is node or n_results == 1:
            return call
        return graph.call_function(operator.getitem, (call, r.args[1]))

    outs = [result(r) for r in results]
    graph.output(outs[0] if isinstance(out.args[0], torch.fx.Node) else tuple(outs))
    fn = torch.fx.GraphModule(gm, graph).forward

    def run(*args):
        # Python dispatch modes never see the ops inside a compiled graph (the queue runs it without them);
        # nor do they here (AOTAutograd's first call of a graph checks custom ops under one).
        if python_modes_active():
            with no_python_modes():
                return fn(*args)
        return fn(*args)

    return run


def _kernel_call(n: torch.fx.Node):
    """(op, args, kwargs, mutated bases) when `n` calls a registered op (functionalized or not), else None."""
    if n.op != "call_function":
        return None
    if n.target in _IMPLS:
        return n.target, n.args, n.kwargs, []
    call = functionalized_call(n)
    if call is None or call[0] not in _IMPLS:
        return None
    op, kwargs, bases = call
    return op, (), kwargs, bases


def _base_value(n: torch.fx.Node, node: torch.fx.Node, n_results: int) -> bool:
    """`n` is the functionalized op's new value of one of its mutated bases."""
    return n.target is operator.getitem and n.args[0] is node and n.args[1] >= n_results


def _is_write_back(n: torch.fx.Node, node: torch.fx.Node, bases: list, n_results: int) -> bool:
    """`n` is `copy_(base, new value of that base)`: AOTAutograd's write-back of a mutated input."""
    dst, value = n.args[0], n.args[1]
    if not isinstance(value, torch.fx.Node) or not _base_value(value, node, n_results):
        return False
    j = value.args[1] - n_results
    return j < len(bases) and bases[j] is dst and not n.kwargs
