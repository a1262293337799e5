"""Device tensors and other processes: `torch.multiprocessing` and `fork`, with CUDA's clear errors, never a hang.

Sending. CUDA shares a device tensor with another process through an IPC handle. The emulated device's memory
is the runtime's host memory, not shared memory, so a device tensor cannot be shared; sending one raises at once
in the sender, naming the fix (send `t.cpu()`, which torch.multiprocessing puts in shared memory, and move it
to the device in the receiver). One place cannot raise to the caller: `multiprocessing.Queue.put` pickles in a
background feeder thread that prints the error and drops the item, so the receiver would wait forever; there
the item travels as a marker whose unpickling raises the same error in the receiver's `get()`.

Forking. A child forked after the parent used the device inherits a copy of a runtime whose threads did not
survive the fork (the host thread team, a drain in progress): like CUDA ("Cannot re-initialize CUDA in forked
subprocess"), its first device op raises. A child forked before any device use may use the device.
"""

from __future__ import annotations

import os
import threading
import warnings

import torch
import torch.multiprocessing  # registers PyTorch's reducers, which install() wraps
from multiprocessing.reduction import ForkingPickler
from torch.multiprocessing import reductions as _torch_reductions

from . import observe, rng

DEVICE = "neuron"

SEND_ERROR = (
    "neuron: a device tensor cannot be sent to another process: the emulated device's memory is not shared "
    "memory (CUDA shares through IPC handles). Send a CPU tensor instead (`t.cpu()`: torch.multiprocessing "
    "puts it in shared memory) and move it to the device in the receiving process."
)
# CUDA's sentence with the device's name (code that matches CUDA's text, OpenReg's test, matches it), then why.
FORK_ERROR = (
    "Cannot re-initialize neuron in forked subprocess. To use neuron with multiprocessing, you must use the "
    "'spawn' start method (the parent used the device before it forked; multiprocessing.get_context('spawn'), "
    "or torch.multiprocessing.start_processes(..., start_method='spawn'))."
)

_installed = False
_bad_fork = False


class SharingError(RuntimeError):
    """A device tensor or storage was sent to another process."""


def in_bad_fork() -> bool:
    """True in a child forked after the parent used the device (its device ops raise)."""
    return _bad_fork


def _refuse(message: str):  # the receiver's unpickling of a device tensor sent through multiprocessing.Queue
    raise SharingError(message)


def _on_device(obj) -> bool:
    with warnings.catch_warnings():  # TypedStorage.device warns that TypedStorage is deprecated
        warnings.simplefilter("ignore", UserWarning)
        device = getattr(obj, "device", None)
    return device is not None and device.type == DEVICE


def _wrap(reduce):
    def reduce_checked(obj):
        if not _on_device(obj):
            return reduce(obj)
        if threading.current_thread().name == "QueueFeederThread":  # an error here would be swallowed
            return _refuse, (SEND_ERROR,)
        raise SharingError(SEND_ERROR)

    reduce_checked.__wrapped__ = reduce
    return reduce_checked


class _RefuseInForkedChild(observe.Observer):
    def dispatch(self, op, args, kwargs, run):
        raise RuntimeError(FORK_ERROR)


def _after_fork_in_child() -> None:
    global _bad_fork
    if rng.is_initialized():
        _bad_fork = True
        observe.push(_RefuseInForkedChild())  # every op reaching the device (before a watching tool's hook too)


def install() -> None:
    """Wrap PyTorch's reducers for tensors and storages and watch forks (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    pairs = [
        (torch.Tensor, _torch_reductions.reduce_tensor),
        (torch.nn.parameter.Parameter, _torch_reductions.reduce_tensor),
        (torch.UntypedStorage, _torch_reductions.reduce_storage),
        (torch.storage.TypedStorage, _torch_reductions.reduce_typed_storage),
    ]
    for cls, reduce in pairs:
        ForkingPickler.register(cls, _wrap(reduce))
    os.register_at_fork(after_in_child=_after_fork_in_child)
