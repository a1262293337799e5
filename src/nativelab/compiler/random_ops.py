"""Random numbers in compiled graphs: drawn from the device's generator when the compiled function is called,
as eager random ops on the device are (device/rng.py) and as compiled code on CPU or CUDA does.

Two kinds of random node reach the backend:
- Random ATen ops in a device subgraph (`native_dropout`, `rand`, ...). Inductor lowers them to its own random
  numbers, seeded by a `randint` on PyTorch's default CPU generator at the start of the generated code. Queued,
  that code would read the generator when the queue drains, and the CPU's generator at that: a reseed, a
  `fork_rng`, checkpoint's state restore or a CPU `torch.randn` between the call and the sync would change the
  numbers, and the device's draws would move the CPU's stream. So a device graph that draws (`draws_random`)
  runs at its launch, after a drain, with the default generator holding the core's generator's state.
- AOTAutograd's replay of a random op inside an activation-checkpointed region: the forward saves the
  generator state before the op (`run_and_save_rng_state`), the backward runs the op again from that state
  (`run_with_rng_state`). PyTorch implements these for CPU/CUDA/XPU/HPU states only; `as_device_rng_nodes`
  rewrites them into the functions below, which save and restore the core's generator and run the op through
  the device's eager dispatch (partition.py makes them fallback nodes), like Inductor's own fallback for them.
"""

from __future__ import annotations

import torch
import torch.fx

from ..device import queue, rng
from ..device.config import DEVICE_NAME
from ._private import rng_state_hops


def _core(args) -> int | None:
    """The core of the first device tensor among `args`, or None (a CPU op)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == DEVICE_NAME:
            return a.device.index or 0
    return None


def run_and_save_device_rng_state(op, *args, **kwargs):
    """(generator state before `op`, `op`'s result); the state of the core `op` runs on."""
    core = _core(args)
    state = torch.get_rng_state() if core is None else rng.get_state(core)
    return state, op(*args, **kwargs)


def run_with_device_rng_state(state, op, *args, **kwargs):
    """`op` run from generator state `state`; the generator is left as it was."""
    core = _core(args)
    get, put = (torch.get_rng_state, torch.set_rng_state) if core is None else (
        lambda: rng.get_state(core), lambda s: rng.set_state(core, s))
    saved = get()
    put(state)
    try:
        return op(*args, **kwargs)
    finally:
        put(saved)


REPLAY_FUNCTIONS = (run_and_save_device_rng_state, run_with_device_rng_state)


def as_device_rng_nodes(gm: torch.fx.GraphModule) -> bool:
    """Rewrite AOTAutograd's RNG-state operators in `gm` into the functions above; whether any were found."""
    save_hop, replay_hop = rng_state_hops()
    found = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is save_hop:
            node.target, found = run_and_save_device_rng_state, True
        elif node.op == "call_function" and node.target is replay_hop:
            node.target, found = run_with_device_rng_state, True
    if found:
        gm.recompile()
    return found


def draws_random(gm: torch.fx.GraphModule) -> bool:
    """Whether a graph's code draws random numbers (PyTorch tags every random op `nondeterministic_seeded`)."""
    return any(
        n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
        for n in gm.graph.nodes
    )


def run_at_call(kind: str, name: str, fn, args, index: int) -> None:
    """Run the device work `fn(*args)` that draws random numbers now, launched as the queue's one unit (same
    modes as queued work), with core `index`'s generator in the default CPU generator's place."""
    queue.drain()
    with rng.default_generator_drawn_from(index):
        queue.launch(kind, name, fn, *args)
        queue.drain()
