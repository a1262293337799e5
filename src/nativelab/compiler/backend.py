"""`torch.compile(model, backend="neuron")`.

Dynamo captures the graph; AOTAutograd splits forward and backward into ATen graphs (input mutations kept,
so a KV cache written in place stays in place); each graph is partitioned into device subgraphs and CPU
fallback nodes; device subgraphs are lowered to generated code through the persistent cache. Shapes are
static, as on the real device: a graph that Dynamo hands over with symbolic shapes (`dynamic=True`, or
Dynamo's automatic dynamic shapes after a shape change) is compiled again for each concrete shape it sees.
"""

from __future__ import annotations

import copy
import threading
import warnings

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from ..device.config import DEVICE_NAME
from . import kernel_graph, lowering, metrics, partition, random_ops
from ._private import aot_autograd, make_boxed_func, recompute_meta, version
from .freezing import inputs_as_constants
from .runtime import FallbackNodes

# Options the backend understands (torch.compile(..., options={...})).
# freezing (default True): inference graphs take their parameters as constants, so the generated code can
# prepack weights once (Inductor freezing); such graphs are recompiled when a parameter changes in place.
KNOWN_OPTIONS = {"freezing"}


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The Dynamo backend registered as "neuron"."""
    options = dict(kwargs.pop("options", None) or {})
    mode = kwargs.pop("mode", None)
    if mode not in (None, "default"):
        # As the real backend: "Only default applies. Other modes log a warning and fall back to default"
        # (AWS's Neuron torch.compile reference; `nativelab check` reports the call too).
        warnings.warn(f"neuron backend: torch.compile(mode={mode!r}) has no effect; compiling with the default mode",
                      stacklevel=2)
    options.update(kwargs)
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        raise ValueError(f"neuron backend: unsupported options {sorted(unknown)} (known: {sorted(KNOWN_OPTIONS)})")
    freeze = bool(options.get("freezing", True))
    return aot_autograd(
        fw_compiler=_compiler("forward", False),
        bw_compiler=_compiler("backward", False),
        inference_compiler=_compiler("inference", freeze),
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def _compiler(kind: str, freeze: bool):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        metrics.current().graphs += 1
        if _is_symbolic(example_inputs):
            return make_boxed_func(_PerShape(gm, kind, freeze))
        metrics.note_graph(kind, example_inputs)
        call = kernel_graph.direct(gm) if kind == "inference" else None
        if call is not None:  # the graph is one kernel op: run the op itself (kernel_graph.py)
            metrics.current().kernel_graphs += 1
            return make_boxed_func(call)
        if freeze:
            return make_boxed_func(_FrozenParams(gm, kind))
        return make_boxed_func(build(gm, kind, {}))

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
    random_ops.as_device_rng_nodes(gm)
    ids, fallbacks = partition.partition(gm)
    s = metrics.current()
    s.fallback_nodes += sum(1 for n, i in ids.items() if i in fallbacks and n.op == "call_function"
                            and partition.is_fallback(n) and n.target not in random_ops.REPLAY_FUNCTIONS)
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


class _FrozenParams:
    """An inference graph whose parameters are constants of the generated code (compiled at the first call,
    when the parameters themselves are known; compiled again if one changes in place).

    One Dynamo graph can serve several models: two models of one class run the same code, and their
    parameters are graph inputs (Dynamo inlines nn.Modules), so the same graph is called with either set. It
    keeps a compiled variant per parameter set (the newest `MAX_VARIANTS`): with a single variant, two Lab 2
    experimental models built in one process recompiled at every switch between them (3.5 and 6.4 tok/s
    instead of ~150)."""

    MAX_VARIANTS = 8

    def __init__(self, gm: torch.fx.GraphModule, kind: str):
        self.gm, self.kind = gm, kind
        self.variants: dict[tuple, _Variant] = {}
        self.frozen: list[int] | None = None  # positions of the frozen parameters (the same for every set)

    def __call__(self, *args):
        if self.frozen is None:
            self.frozen = self._frozen_positions(args)
        key = tuple(id(args[i]) for i in self.frozen)
        v = self.variants.get(key)
        if v is None or v.stale(args):
            if v is None and len(self.variants) >= self.MAX_VARIANTS:  # each variant holds prepacked weights
                del self.variants[next(iter(self.variants))]
            v = self.variants[key] = self._compile(args)
        keep = v.keep
        return v.fn(*[args[i] for i in keep]) if len(keep) != len(args) else v.fn(*args)

    def _frozen_positions(self, args) -> list[int]:
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        written = {n.args[0] for n in self.gm.graph.nodes if n.op == "call_function" and n.target in _COPY_OPS}
        return [
            i for i, (a, ph) in enumerate(zip(args, placeholders))
            if isinstance(a, torch.nn.Parameter) and a.device.type == DEVICE_NAME and ph not in written
        ]

    def _compile(self, args) -> "_Variant":
        frozen = self.frozen
        if not frozen:
            return _Variant(_in_clean_thread(lambda: build(self.gm, self.kind, {})), list(range(len(args))), [], [])
        gm = inputs_as_constants(self.gm, {i: args[i] for i in frozen})
        fn = _in_clean_thread(lambda: build(gm, self.kind, {"freeze": True}))
        params = [args[i] for i in frozen]
        keep = [i for i in range(len(args)) if i not in set(frozen)]
        return _Variant(fn, keep, frozen, params)


class _Variant:
    """One compiled variant of a _FrozenParams graph: the parameters it baked in and their versions."""

    def __init__(self, fn, keep: list[int], frozen: list[int], params: list[torch.Tensor]):
        self.fn, self.keep, self.frozen, self.params = fn, keep, frozen, params
        self.versions = [(version(p), p.data_ptr()) for p in params]  # in-place writes and .data swaps

    def stale(self, args) -> bool:
        """A frozen parameter was replaced (module.to()), written in place, or had its .data swapped."""
        for i, p, v in zip(self.frozen, self.params, self.versions):
            a = args[i]
            if a is not p or (version(a), a.data_ptr()) != v:
                return True
        return False


_COPY_OPS = (torch.ops.aten.copy_.default,)


class _PerShape:
    """A symbolic-shape graph compiled as one static graph per concrete input shape."""

    def __init__(self, gm, kind, freeze):
        self.gm, self.kind, self.freeze = gm, kind, freeze
        self.compiled: dict = {}

    def __call__(self, *args):
        key = tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                    for a in args)
        fn = self.compiled.get(key)
        if fn is None:
            metrics.note_graph(self.kind, args)
            static = _in_clean_thread(lambda: _specialize(self.gm, args))
            if self.freeze:
                fn = _FrozenParams(static, self.kind)
            else:
                fn = _in_clean_thread(lambda: build(static, self.kind, {}))
            self.compiled[key] = fn
        return fn(*args)


def _in_clean_thread(work):
    """Compile from a fresh thread: we are called from inside AOTAutograd's runtime wrapper, whose
    thread-local dispatch state (functionalization, modes) must not leak into the new compilation."""
    result: list = []

    def run():
        try:
            result.append((True, work()))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            result.append((False, e))

    t = threading.Thread(target=run, name="neuron-compile")
    t.start()
    t.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


def _specialize(gm: torch.fx.GraphModule, args) -> torch.fx.GraphModule:
    """A copy of a symbolic-shape graph whose node metadata is recomputed for concrete inputs."""
    static = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    recompute_meta(static, args)
    # Size arithmetic is now plain numbers: write them into the graph, so the lowering sees a static graph.
    for node in reversed(list(static.graph.nodes)):
        val = node.meta.get("val")
        if node.op in ("call_function", "placeholder") and type(val) in (int, float, bool):
            for user in list(node.users):
                user.args = _substitute(user.args, node, val)
                user.kwargs = _substitute(user.kwargs, node, val)
            if node.op == "call_function":
                static.graph.erase_node(node)
    static.recompile()
    return static


def _substitute(x, node, val):
    if x is node:
        return val
    if isinstance(x, (list, tuple)):
        return type(x)(_substitute(y, node, val) for y in x)
    if isinstance(x, dict):
        return {k: _substitute(v, node, val) for k, v in x.items()}
    return x


def neuron_entry(gm, example_inputs, **kwargs):
    """The `torch_dynamo_backends` entry point: the real Neuron backend when `torch_neuronx` is installed."""
    from ..device import real_neuron_installed

    if real_neuron_installed():
        from importlib.metadata import entry_points

        for ep in entry_points(group="torch_dynamo_backends"):
            if ep.name == DEVICE_NAME and not ep.value.startswith("nativelab."):
                return ep.load()(gm, example_inputs, **kwargs)
        raise RuntimeError("torch_neuronx is installed but registers no 'neuron' torch.compile backend")
    return neuron_backend(gm, example_inputs, **kwargs)
