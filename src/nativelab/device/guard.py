"""The current logical core (per OS thread, like CUDA's current device) and each core's RNG."""

from __future__ import annotations

import threading

import torch

from . import _private

num_cores = 4
_tls = threading.local()
_generators: list[torch.Generator] = []
_initial_seeds: list[int] = []


def init(cores: int) -> None:
    global num_cores
    num_cores = cores
    _generators[:] = [torch.Generator() for _ in range(cores)]
    _initial_seeds[:] = [g.initial_seed() for g in _generators]


def check_index(index: int) -> int:
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"neuron device index must be an int, got {type(index).__name__}")
    if not 0 <= index < num_cores:
        raise RuntimeError(
            f"Invalid device index neuron:{index}: this host has {num_cores} logical NeuronCores "
            f"(neuron:0..neuron:{num_cores - 1}; set NEURON_RT_NUM_CORES to change it)"
        )
    return index


def current_index() -> int:
    return getattr(_tls, "index", 0)


def set_index(index: int) -> None:
    _tls.index = check_index(index)
    if not getattr(_tls, "backward_here", False):
        _private.run_backward_in_caller_thread()
        _tls.backward_here = True


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


def generator(index: int) -> torch.Generator:
    return _generators[index]


def initial_seed(index: int) -> int:
    return _initial_seeds[index]


def manual_seed(index: int, seed: int) -> None:
    _generators[index].manual_seed(seed)
    _initial_seeds[index] = _generators[index].initial_seed()


def seed(index: int) -> None:
    _initial_seeds[index] = _generators[index].seed()


class Hooks(_private.hooks_base()):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, device_index) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class Guard(_private.guard_base()):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1
