"""How compiled code runs bf16 matrix products on this host: as fp32 GEMMs on upcast operands.

The device's matmul unit takes bf16 operands and accumulates in fp32. A product of two bf16 numbers is exact in
fp32 (8-bit significands), so an fp32 GEMM on upcast operands, rounded back to bf16, computes the same thing up
to the order of the fp32 additions. On a CPU without AMX that is the faster path: oneDNN's bf16 GEMM
(avx512_core_bf16) ran a 512x576x1536 product in 5.5 ms, MKL's fp32 GEMM in 3.1 ms plus the casts (1.65x).
Small products (a decode step's matrix-vector products) are bandwidth-bound: upcasting their weights would
double the bytes read, so only products with at least MIN_ROWS rows on each side are rewritten.
"""

from __future__ import annotations

import copy

import torch
import torch.fx

from ._private import recompute_meta

aten = torch.ops.aten
MIN_ROWS = 64
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
    return all(isinstance(d, int) and d >= MIN_ROWS for d in (m, k, n))


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
