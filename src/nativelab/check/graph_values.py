"""int64 and integer-fp32 values inside compiled graphs, read at each launch.

The real device holds every int64 value of a compiled graph as int32 and computes integer matmul / scatter-add
in fp32, but the generated code the emulator runs keeps int64 (its values are right where the chip's would
wrap). So at each launch of a device graph the check reads, from the host memory the launch ran on:
- the graph's int64 inputs and its int64 outputs;
- every integer value the graph computes from integers only (index arithmetic, positions, counts), by running
  that slice of the graph (a few small integer ops, no float work) on the host inputs.
Integer values computed from floats (argmax, topk indices) are seen where they are graph outputs.
Each value is reported at the line Dynamo recorded for the node that produced it (for an input: its first use).
"""

from __future__ import annotations

import dataclasses

import torch

from ..device.schema import op_base_name
from . import _private
from .source import Site, parse_stack_trace

_INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
CPU = torch.device("cpu")


def _val(n):
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _site(n: torch.fx.Node) -> Site | None:
    trace = n.meta.get("stack_trace")
    return parse_stack_trace(trace) if trace else None


def _to_cpu(a):
    if isinstance(a, torch.device) and a.type != "cpu":
        return CPU
    if isinstance(a, (list, tuple)):
        return type(a)(_to_cpu(x) for x in a)
    if isinstance(a, dict):
        return {k: _to_cpu(v) for k, v in a.items()}
    return a


@dataclasses.dataclass
class Probe:
    """One value to read at each launch: where it comes from, what the report calls it, and its line."""

    kind: str  # "int64": held as int32 on the device; "int-fp32": an integer matmul / scatter-add result
    name: str  # "aten::add.Tensor", "compiled graph input"
    site: Site | None
    where: str  # "input", "output" or "slice"
    index: int  # position in the inputs, outputs or the slice's outputs


class GraphValues:
    """The probes of one device graph (built once per graph) and the integer slice that computes the ones inside."""

    def __init__(self, gm: torch.fx.GraphModule, int_fp32_ops: frozenset):
        nodes = list(gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        out_node = next(n for n in nodes if n.op == "output")
        outputs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else (out_node.args[0],)
        self.probes: list[Probe] = []
        # integer nodes computable from integer inputs alone, without side effects
        integer: set = {p for p in placeholders if _is_int(p)}
        for n in nodes:
            if n.op != "call_function" or not isinstance(n.target, _private.OpOverload) or not _is_int(n):
                continue
            if _private.is_mutating(n.target) or torch.Tag.nondeterministic_seeded in n.target.tags:
                continue  # the host copy must not write the inputs or draw from the user's generator
            if all(a in integer for a in n.all_input_nodes):
                integer.add(n)
        targets = []
        for n in nodes:
            if n not in integer or n.op == "placeholder" or n.target.is_view:
                continue  # a view holds its base's values, read where the base is
            v = _val(n)
            if op_base_name(n.target) in int_fp32_ops and v.dtype in _INTS:
                targets.append(("int-fp32", n))
            elif v.dtype is torch.int64:
                targets.append(("int64", n))
        for i, p in enumerate(placeholders):
            v = _val(p)
            if v is not None and v.dtype is torch.int64:
                use = next((u for u in p.users if u.meta.get("stack_trace")), None)
                self.probes.append(Probe("int64", "compiled graph input", _site(use) if use else None, "input", i))
        sliced = {n for _, n in targets}
        for i, o in enumerate(outputs):
            v = _val(o)
            if v is not None and v.dtype is torch.int64 and o not in sliced and o.op != "placeholder":
                self.probes.append(Probe("int64", o.target.name() if isinstance(o.target, _private.OpOverload)
                                         else str(o.target), _site(o), "output", i))
        self.slice = None
        if targets:
            self.slice = _slice(gm, placeholders, [n for _, n in targets])
            for j, (kind, n) in enumerate(targets):
                self.probes.append(Probe(kind, n.target.name(), _site(n), "slice", j))

    def values(self, inputs, outputs) -> list[tuple[Probe, torch.Tensor]]:
        """(probe, host value) of one launch, from its host inputs and outputs."""
        sliced = None
        if self.slice is not None:
            with torch.inference_mode():
                sliced = self.slice(*inputs)
        out = []
        for p in self.probes:
            src = inputs if p.where == "input" else outputs if p.where == "output" else sliced
            v = src[p.index] if src is not None and p.index < len(src) else None
            if isinstance(v, torch.Tensor) and v.device.type == "cpu":
                out.append((p, v))
        return out


def _is_int(p) -> bool:
    v = _val(p)
    return v is not None and (v.dtype in _INTS or v.dtype is torch.bool)


def _slice(gm, placeholders, targets) -> torch.fx.GraphModule:
    """A graph of the same inputs that computes `targets` (and what they need) on the host."""
    need: set = set()
    stack = list(targets)
    while stack:
        n = stack.pop()
        if n in need:
            continue
        need.add(n)
        stack.extend(n.all_input_nodes)
    g = torch.fx.Graph()
    env: dict = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = g.placeholder(n.name)
        elif n in need:
            env[n] = g.create_node("call_function", n.target, _to_cpu(torch.fx.map_arg(n.args, env.__getitem__)),
                                   _to_cpu(torch.fx.map_arg(n.kwargs, env.__getitem__)), n.name)
    g.output(tuple(env[n] for n in targets))
    return torch.fx.GraphModule(torch.nn.Module(), g)
