"""Running compiled graphs on the device: device subgraphs as queued generated code over host memory,
fallback nodes through the device's eager dispatch."""

from __future__ import annotations

import contextlib

import torch

from ..device import memory, observe, queue, rng, tracking
from ..device.dispatch import device_index
from . import random_ops

DEVICE = memory.DEVICE


class DeviceGraph(torch.nn.Module):
    """A lowered device subgraph. Launching it queues one entry on the device: the generated code runs on
    zero-copy host views of the inputs and writes into outputs allocated at launch, in stream order.
    A graph whose outputs alias its inputs runs at launch instead (after draining the queue), so the aliases
    can point into the inputs' device memory."""

    def __init__(self, name: str, fn, out_specs, aliasing: bool, single: bool, source=None, random=False):
        super().__init__()
        self.name = name
        self.fn = fn
        # The device graph it was lowered from (what the profiler reads its traffic from); kept out of the
        # module tree so it adds no parameters.
        object.__setattr__(self, "source", source)
        self.out_specs = out_specs  # per output: (shape, stride, dtype, on the host) or None for non-tensors
        self.aliasing = aliasing
        self.single = single  # the graph returns one value, not a tuple
        # The code draws random numbers (Inductor seeds them from the default CPU generator): it runs at launch
        # with the core's generator in that place, as eager random ops do (see random_ops.py).
        self.random = random

    def forward(self, *args):
        index = device_index(args)
        if index < 0:
            index = 0
        tracking.count_executed(self.name)  # the one count of what ran (C++), as kernels' launches are
        if self.aliasing:
            with rng.default_generator_drawn_from(index) if self.random else contextlib.nullcontext():
                res = _as_tuple(queue.run_now("graph", self.name, self.run_now, *args))
            outs = [
                _on_host(r, args) if spec is not None and spec[3] else _back_to_device(r, args, index)
                for r, spec in zip(res, self.out_specs)
            ]
        else:
            outs = [
                memory.empty_strided(spec[0], spec[1], spec[2], index) if spec is not None else None
                for spec in self.out_specs
            ]
            # one unit of device work: run later on host views of the inputs and outputs (CPU inputs copied at
            # launch, as in eager ops)
            if self.random:
                random_ops.run_at_call("graph", self.name, self.run, (args, outs), index)
            else:
                queue.launch("graph", self.name, self.run, args, outs)
        return outs[0] if self.single else tuple(outs)

    def run_now(self, *hargs):
        """The launch of a graph whose outputs alias its inputs: run at once, results returned."""
        return self.fn(*hargs)

    def run(self, hargs, houts):
        """The queued launch: the generated code on host views, results written into the outputs."""
        res = _as_tuple(self.fn(*hargs))
        for h, r in zip(houts, res):
            if h is not None:
                h.copy_(r)


def _as_tuple(res):
    return (res,) if isinstance(res, torch.Tensor) or not isinstance(res, (list, tuple)) else res


def _device_input_sharing(r, args):
    """The device input whose memory the host result `r` lies in, or None."""
    ptr = r.untyped_storage().data_ptr()
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == DEVICE:
            if memory.host_storage(a.untyped_storage()).data_ptr() == ptr:
                return a
    return None


def _on_host(r, args):
    """A host output (the graph moved it off the device, as eager `.cpu()` does): a CPU tensor of its own,
    never a view of device memory."""
    if not isinstance(r, torch.Tensor):
        return r
    return r.clone() if _device_input_sharing(r, args) is not None else r


def _back_to_device(r, args, index):
    if not isinstance(r, torch.Tensor):
        return r
    a = _device_input_sharing(r, args)
    if a is not None:
        return memory.wrap(a.untyped_storage(), index, r.dtype, r.size(), r.stride(), r.storage_offset())
    return memory.from_host(r, index)


class FallbackNodes(torch.nn.Module):
    """Graph nodes the device does not implement, run eagerly on device tensors: each op reaches the device's
    CPU fallback, which drains the queue, runs the CPU kernel and records the op (as in eager mode)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__()
        self.gm = gm
        # Where the user wrote these ops (Dynamo's stack trace of the node), for tools watching the device:
        # at run time the Python stack only shows the call of the compiled function.
        self.stack_trace = next((n.meta["stack_trace"] for n in gm.graph.nodes
                                 if n.op == "call_function" and n.meta.get("stack_trace")), None)

    def forward(self, *args):
        if observe.dispatch is None:
            return self.gm(*args)
        observe.compiled_source = self.stack_trace
        try:
            return self.gm(*args)
        finally:
            observe.compiled_source = None
