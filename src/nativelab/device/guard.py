"""The current logical core (per OS thread, like CUDA's current device) and each core's generator.

Both live in the C++ runtime, where PyTorch's device guard and hooks read them; this module is their
Python face. A device generator keeps its state in a CPU generator, which the device's CPU kernels draw
from (`host_generator`)."""

from __future__ import annotations

import torch

from . import _private, queue, state

_defaults: list[torch.Generator] = []  # torch.neuron.default_generators
_hosts: list[torch.Generator] = []  # the CPU generators behind them


def init() -> None:
    """Register the runtime's guard and hooks for the device's logical cores."""
    rt, cores = state.device.rt, state.device.num_cores
    rt.init(cores, queue.drain, queue.idle, _record_marker)
    _defaults[:] = [rt.default_generator(i) for i in range(cores)]
    _hosts[:] = [rt.host_generator(g) for g in _defaults]


def _record_marker(event_id: int, version: int) -> None:
    """An event's marker in the queue: the runtime stamps the event when the queue reaches it."""
    queue.launch("marker", "event_record", state.device.rt.event_reached, event_id, version)


def core_count() -> int:
    return state.device.num_cores


def check_index(index: int) -> int:
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"neuron device index must be an int, got {type(index).__name__}")
    num_cores = state.device.num_cores
    if not 0 <= index < num_cores:
        raise RuntimeError(
            f"Invalid device index neuron:{index}: The device index is out of range; this host has {num_cores} "
            f"logical NeuronCores "
            f"(neuron:0..neuron:{num_cores - 1}; set NEURON_RT_NUM_CORES to change it)"
        )
    return index


def current_index() -> int:
    return state.device.rt.current_device()


def set_index(index: int) -> None:
    state.device.rt.set_device(check_index(index))
    _private.run_backward_in_caller_thread()


def index_of(device) -> int:
    """Resolve None / 'neuron' / 'neuron:1' / 1 / torch.device to a checked core index."""
    if device is None:
        return current_index()
    if isinstance(device, int):
        return check_index(device)
    device = torch.device(device)
    if device.type != "neuron":
        raise ValueError(f"Expected a neuron device, got {device}")
    return current_index() if device.index is None else check_index(device.index)


def default_generator(index: int) -> torch.Generator:
    return _defaults[index]


def generator(index: int) -> torch.Generator:
    """The CPU generator holding `neuron:index`'s default generator state."""
    return _hosts[index]


def host_generator(gen: torch.Generator | None, index: int) -> torch.Generator:
    """What a CPU kernel running a device op draws from: the state of `gen` (a neuron generator), or of the
    core's default generator when None. A CPU generator passes through (the CPU kernel accepts it)."""
    if gen is None:
        return _hosts[index]
    if gen.device.type == "neuron":
        return state.device.rt.host_generator(gen)
    return gen


def initial_seed(index: int) -> int:
    return _hosts[index].initial_seed()


def manual_seed(index: int, seed: int) -> None:
    _hosts[index].manual_seed(seed)


def seed(index: int) -> None:
    _hosts[index].seed()


def is_pinned_ptr(ptr: int) -> bool:
    return state.device.rt.is_pinned(ptr)
