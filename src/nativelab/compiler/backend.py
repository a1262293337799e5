"""`torch.compile(model, backend="neuron")`.

Dynamo captures the graph; AOTAutograd splits forward and backward into ATen graphs (input mutations kept,
so a KV cache written in place stays in place); each graph is partitioned into device subgraphs and CPU
fallback nodes; device subgraphs are lowered to generated code through the persistent cache. Shapes are
static, as on the real device: a graph that Dynamo hands over with symbolic shapes (`dynamic=True`, or
Dynamo's automatic dynamic shapes after a shape change) is compiled again for each concrete shape it sees.
"""

from __future__ import annotations

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.split_module import split_module

from . import lowering, metrics, partition
from .runtime import FallbackNodes

# Options the backend understands (torch.compile(..., options={...})).
KNOWN_OPTIONS = {"freezing"}


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The Dynamo backend registered as "neuron"."""
    options = dict(kwargs.pop("options", None) or {})
    options.update(kwargs)
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        raise ValueError(f"neuron backend: unsupported options {sorted(unknown)} (known: {sorted(KNOWN_OPTIONS)})")
    inductor_options = {}
    return aot_autograd(
        fw_compiler=_compiler("forward", inductor_options),
        bw_compiler=_compiler("backward", inductor_options),
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def _compiler(kind: str, options: dict):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        metrics.current().graphs += 1
        if _is_symbolic(example_inputs):
            return make_boxed_func(_PerShape(gm, kind, options))
        return make_boxed_func(build(gm, kind, options))

    return compile_graph


def _is_symbolic(example_inputs) -> bool:
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride())):
            return True
    return False


_counter = [0]


def build(gm: torch.fx.GraphModule, kind: str, options: dict):
    """Partition one static ATen graph and lower its device subgraphs."""
    _counter[0] += 1
    base = f"{kind}_{_counter[0]}"
    ids, fallbacks = partition.partition(gm)
    s = metrics.current()
    s.fallback_nodes += sum(1 for n, i in ids.items() if i in fallbacks and n.op == "call_function"
                            and partition.is_fallback(n))
    if not fallbacks:
        return lowering.lower(gm, base, options)
    split = split_module(gm, None, lambda n: ids.get(n, 0), keep_original_order=True)
    for name, sub in list(split.named_children()):
        i = int(name.rsplit("_", 1)[1])
        if i in fallbacks:
            setattr(split, name, FallbackNodes(sub))
        else:
            setattr(split, name, lowering.lower(sub, f"{base}_part{i}", options))
    return split


class _PerShape:
    """A symbolic-shape graph compiled as one static graph per concrete input shape."""

    def __init__(self, gm, kind, options):
        self.gm, self.kind, self.options = gm, kind, options
        self.compiled: dict = {}

    def __call__(self, *args):
        key = tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                    for a in args)
        fn = self.compiled.get(key)
        if fn is None:
            static = make_fx(self.gm, tracing_mode="fake")(*args)
            fn = self.compiled[key] = build(static, self.kind, self.options)
        return fn(*args)


def neuron_entry(gm, example_inputs, **kwargs):
    """The `torch_dynamo_backends` entry point: the real Neuron backend when `torch_neuronx` is installed."""
    from ..device import real_neuron_installed

    if real_neuron_installed():
        from importlib.metadata import entry_points

        for ep in entry_points(group="torch_dynamo_backends"):
            if ep.name == "neuron" and not ep.value.startswith("nativelab."):
                return ep.load()(gm, example_inputs, **kwargs)
        raise RuntimeError("torch_neuronx is installed but registers no 'neuron' torch.compile backend")
    return neuron_backend(gm, example_inputs, **kwargs)
