"""Graph inputs that are weights, made constants of the graph: Inductor's freezing then prepacks them once
for the generated code (as the real device keeps an inference model's weights resident). The backend freezes
an inference graph's parameters; the kernel interface freezes the arguments a kernel marks as weights."""

from __future__ import annotations

import copy

import torch
import torch.fx


def inputs_as_constants(gm: torch.fx.GraphModule, constants: dict[int, torch.Tensor]) -> torch.fx.GraphModule:
    """A copy of `gm` whose placeholders at the positions in `constants` are replaced by those tensors, held
    as parameters without grad (`get_attr` nodes carrying the placeholders' metadata). The copy takes the
    remaining inputs, in their order."""
    graph = copy.deepcopy(gm.graph)
    frozen = torch.fx.GraphModule(gm, graph)  # keeps whatever else `gm` holds that the graph reads
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for j, (i, t) in enumerate(sorted(constants.items())):
        name = f"frozen_param_{j}"
        frozen.register_parameter(name, torch.nn.Parameter(t.detach(), requires_grad=False))
        with graph.inserting_before(first):
            attr = graph.get_attr(name)
        attr.meta = dict(placeholders[i].meta)
        placeholders[i].replace_all_uses_with(attr)
        graph.erase_node(placeholders[i])
    frozen.recompile()
    return frozen
