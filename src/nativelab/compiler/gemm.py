"""How compiled code runs bf16 matrix products on this host: as fp32 GEMMs on upcast operands where the
device's GEMM policy (`nativelab.device.gemm_policy`, shared with eager ops) says that is faster here.

The device's matmul unit takes bf16 operands and accumulates in fp32, so an fp32 GEMM on upcast operands,
rounded back to bf16, computes the same thing up to the order of the fp32 additions. Which products are
rewritten depends on the CPU (bf16 instructions, AMX) and the shape: see gemm_policy.
"""

from __future__ import annotations

import copy

import torch
import torch.fx

from ._private import recompute_meta

from ..device import gemm_policy

aten = torch.ops.aten
# op -> positions of its matrix operands (addmm's bias is upcast too: it is added in the fp32 accumulator)
_GEMMS = {aten.mm.default: (0, 1), aten.bmm.default: (0, 1), aten.addmm.default: (0, 1, 2)}


def _big(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.bfloat16:
        return False
    a, b = (node.args[i].meta.get("val") for i in _GEMMS[node.target][-2:])
    if not all(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in (a, b)):
        return False
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    return all(isinstance(d, int) for d in (m, k, n)) and gemm_policy.upcast(m, k, n)


def with_fp32_gemms(gm: torch.fx.GraphModule, example_inputs) -> torch.fx.GraphModule:
    """`gm`, or a copy whose large bf16 mm / bmm / addmm are fp32 products of upcast operands cast back to
    bf16 (node metadata recomputed for `example_inputs`)."""
    if not any(n.op == "call_function" and n.target in _GEMMS and _big(n) for n in gm.graph.nodes):
        return gm
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _GEMMS or not _big(node):
            continue
        with graph.inserting_before(node):
            args = list(node.args)
            for i in _GEMMS[node.target]:
                args[i] = graph.call_function(aten._to_copy.default, (args[i],), {"dtype": torch.float32})
            wide = graph.call_function(node.target, tuple(args), dict(node.kwargs))
        with graph.inserting_after(wide):
            narrow = graph.call_function(aten._to_copy.default, (wide,), {"dtype": torch.bfloat16})
        node.replace_all_uses_with(narrow)
        graph.erase_node(node)
    graph.lint()
    gm.recompile()
    recompute_meta(gm, example_inputs)
    return gm
