"""The device's random numbers: one generator per logical core, read when a random op is called.

Random ops run at their call, after the queue has drained, not later with the queue: the state an op draws
from is the one the program set just before it (`torch.manual_seed`, `fork_rng`, or `torch.utils.checkpoint`
replaying a block's dropout in the backward pass), as on CUDA, whose kernels read the generator at launch.
CPU kernels that draw from PyTorch's default CPU generator (`native_dropout` has no generator argument) draw
from the core's generator instead, so the CPU generator and the device's stay apart as they do with CUDA.

The generators themselves are CPU `torch.Generator`s (Mersenne Twister) kept by `guard`: with the same seed,
the device draws the same numbers as the CPU would.
"""

from __future__ import annotations

import contextlib

import torch

from . import guard, queue

_initialized = False  # set at the device's first use; torch.utils.checkpoint saves device RNG state only then


def mark_initialized() -> None:
    global _initialized
    _initialized = True


def is_initialized() -> bool:
    return _initialized


def generator(index: int) -> torch.Generator:
    return guard.generator(index)


def get_state(index: int) -> torch.Tensor:
    queue.drain()  # random ops run at their call; draining keeps the state read in program order anyway
    return guard.generator(index).get_state()


def set_state(index: int, state: torch.Tensor) -> None:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.device.type != "cpu":
        raise TypeError(
            f"neuron: an RNG state is a CPU torch.uint8 tensor (from torch.neuron.get_rng_state()), got "
            f"{type(state).__name__ if not isinstance(state, torch.Tensor) else f'{state.dtype} on {state.device}'}"
        )
    queue.drain()
    guard.generator(index).set_state(state.clone())


def manual_seed(index: int, seed: int) -> None:
    queue.drain()
    guard.manual_seed(index, int(seed))


def seed(index: int) -> None:
    queue.drain()
    guard.seed(index)


def initial_seed(index: int) -> int:
    return guard.initial_seed(index)


def is_random(op) -> bool:
    """A random op (PyTorch tags every one of them `nondeterministic_seeded`)."""
    return torch.Tag.nondeterministic_seeded in op.tags


@contextlib.contextmanager
def default_generator_drawn_from(index: int):
    """Let a CPU kernel that draws from the default CPU generator draw from core `index`'s generator; the
    CPU generator is left as it was."""
    cpu, dev = torch.default_generator, guard.generator(index)
    saved = cpu.get_state()
    cpu.set_state(dev.get_state())
    try:
        yield
    finally:
        dev.set_state(cpu.get_state())
        cpu.set_state(saved)
