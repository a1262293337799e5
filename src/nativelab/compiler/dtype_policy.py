"""The device's dtype policy inside compiled graphs: a device subgraph computes int64 as int32 and float64 as
float32 wherever eager ops on the same device tensors would, so that compiled and eager code agree.

Eager, each op the device computes narrows its inputs (`device/policy.py`'s `plan`: tensors of a narrowed
dtype that are not 0-d and that the op reads) and writes its result into an output of the dtype the call
reports (float64 memory holding float32 values). Before lowering, this pass asks the same plan of every
node (`policy.graph_plan`, the node's fake values standing in for the call's arguments), casts the inputs it
narrows, and casts the node's result back to the dtype the graph says, so outputs, and the values between
graphs and eager ops, keep their dtypes. A value that is narrowed again by its next consumer is taken in its
narrow form (float32 -> float64 -> float32 is exact, so nothing changes but the cast).
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from ..device import policy, schema
from . import metrics
from ._private import OpOverload

_convert = torch.ops.prims.convert_element_type.default


def follow_policy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm`, or a copy of it whose nodes compute narrowed dtypes as eager ops do (see the module's docstring).
    Graphs without a narrowed dtype (bf16 and fp32 models) come back as they are, after one walk."""
    if not any(_narrowed_val(n.meta.get("val")) for n in gm.graph.nodes):
        return gm
    graph = torch.fx.Graph()
    env: dict = {}  # old node -> new node holding its value in the graph's dtype
    narrow: dict = {}  # new node (graph dtype) -> a new node holding the same value in the narrow dtype
    changed = False
    for node in gm.graph.nodes:
        new = graph.node_copy(node, lambda n: env[n])
        env[node] = new
        if node.op != "call_function":
            continue
        source = new.args[0] if node.target is operator.getitem else None
        if isinstance(source, torch.fx.Node) and source.meta.get("narrowed"):
            new.meta["val"] = source.meta["val"][new.args[1]]  # an element of a retyped tuple
            env[node] = _cast_back(graph, new, node.meta.get("val"), narrow)
            continue
        if not isinstance(node.target, OpOverload) or node.target.namespace != "aten":
            continue
        plan = _plan(node)
        if plan is None or not plan.narrow:
            continue
        names = [a.name for a in schema.op_schema(node.target).arguments]
        args, kwargs = list(new.args), dict(new.kwargs)
        with graph.inserting_before(new):
            for i in plan.narrow + plan.follow:  # the inputs narrowed (not 0-d), the 0-d operands that follow
                where, at = (args, i) if i < len(args) else (kwargs, names[i])
                value = where[at]  # a tensor argument (the plan names no default)
                if isinstance(value, (list, tuple)):
                    where[at] = type(value)(_narrowed(graph, v, narrow) for v in value)
                else:
                    where[at] = _narrowed(graph, value, narrow, zero_dim=i in plan.follow)
        for i, number in plan.numbers:  # Scalars beyond the narrow dtype's range, saturated as eager does
            where, at = (args, i) if i < len(args) else (kwargs, names[i])
            where[at] = number
        try:
            val = node.target(*_vals(tuple(args)), **_vals(kwargs))  # fake tensors: shapes and dtypes only
        except Exception:  # noqa: BLE001 - the op refuses narrowed inputs: computed as the graph says
            metrics.log.debug("neuron: %s kept in its wide dtypes", node.target, exc_info=True)
            continue
        new.args, new.kwargs = tuple(args), kwargs
        new.meta["val"] = val
        new.meta["narrowed"] = True
        changed = True
        env[node] = _cast_back(graph, new, node.meta.get("val"), narrow)
    if not changed:
        return gm
    for n in reversed(list(graph.nodes)):
        if n.meta.get("policy_cast") and not n.users:
            graph.erase_node(n)  # a cast back that every consumer took narrow, or a cast for a node kept wide
    out = torch.fx.GraphModule(gm, graph)
    out.graph.lint()
    return out


def _narrowed_val(v) -> bool:
    if isinstance(v, torch.Tensor):
        return policy.is_narrowed(v.dtype)
    return isinstance(v, (list, tuple)) and any(_narrowed_val(x) for x in v)


def _plan(node: torch.fx.Node):
    """The device's plan for this node (None without a narrowed input)."""
    if not any(isinstance(a, torch.fx.Node) and _narrowed_val(a.meta.get("val")) for a in node.all_input_nodes):
        return None
    rec = schema.record_for(node.target)
    return policy.graph_plan(rec, rec.normalise(_vals(node.args), _vals(node.kwargs)))


def _vals(x):
    if isinstance(x, torch.fx.Node):
        return x.meta.get("val")
    if isinstance(x, (list, tuple)):
        return type(x)(_vals(y) for y in x)
    if isinstance(x, dict):
        return {k: _vals(v) for k, v in x.items()}
    return x


def _narrowed(graph: torch.fx.Graph, value, narrow: dict, zero_dim: bool = False):
    """`value` (an argument of a node the plan narrows) in its narrow dtype: a tensor of a narrowed dtype
    that is not 0-d (`zero_dim`: a 0-d operand that follows), as the eager policy narrows."""
    if not isinstance(value, torch.fx.Node):
        return value
    v = value.meta.get("val")
    if not (isinstance(v, torch.Tensor) and policy.is_narrowed(v.dtype) and (zero_dim or v.dim() != 0)):
        return value
    found = narrow.get(value)
    if found is None:
        dtype = policy.NARROW[v.dtype]
        policy.warn_narrowed(v.dtype)
        found = graph.call_function(_convert, (value, dtype))
        found.meta.update(val=_convert(v, dtype), policy_cast=True)
        narrow[value] = found
    return found


def _cast_back(graph: torch.fx.Graph, new: torch.fx.Node, want, narrow: dict) -> torch.fx.Node:
    """`new` in the dtype the graph reports for it (`want`, the original node's value), as eager ops write a
    narrowed result into an output of the call's dtype."""
    got = new.meta.get("val")
    if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)) or got.dtype == want.dtype:
        return new
    with graph.inserting_after(new):
        back = graph.call_function(_convert, (new, want.dtype))
    back.meta.update(val=want, policy_cast=True)
    if policy.NARROW.get(want.dtype) == got.dtype:
        narrow[back] = new  # the next op that narrows it takes the narrow value itself
    return back
