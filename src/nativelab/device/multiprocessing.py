"""Device tensors and other processes: `torch.multiprocessing` shares them as it shares CPU tensors, and `fork`
gives CUDA's clear error, never a hang.

Sending. CUDA shares a device tensor with another process through an IPC handle; OpenReg (PyTorch's reference
PrivateUse1 backend) through POSIX shared memory. The emulated device's memory is host memory, so it shares the
way torch.multiprocessing shares a CPU tensor: the first time a device storage is sent, it moves (in place, every
tensor viewing it follows) into a CPU storage in shared memory (`share_memory_()`'s memory, by the current
sharing strategy: a file descriptor or a file name), and that CPU storage travels by PyTorch's own CPU reducer.
The receiver's device storage is the same memory, on the same core index, so writes on either side are seen on
the other, as with CUDA. A shared device storage, like a shared CPU one, can no longer be resized. An error
while pickling cannot always raise to the caller: `multiprocessing.Queue.put` pickles in a background feeder
thread that prints the error and drops the item, so the receiver would wait forever; there the item travels as
a marker whose unpickling raises the same error in the receiver's `get()`.

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

from . import _private, memory, observe, queue, rng, state

DEVICE = "neuron"

# CUDA's sentence with the device's name (code that matches CUDA's text, OpenReg's test, matches it), then why.
FORK_ERROR = (
    "Cannot re-initialize neuron in forked subprocess. To use neuron with multiprocessing, you must use the "
    "'spawn' start method (the parent used the device before it forked; multiprocessing.get_context('spawn'), "
    "or torch.multiprocessing.start_processes(..., start_method='spawn'))."
)

_installed = False
_bad_fork = False


class SharingError(RuntimeError):
    """A device tensor or storage could not be sent to another process."""


def in_bad_fork() -> bool:
    """True in a child forked after the parent used the device (its device ops raise)."""
    return _bad_fork


def _refuse(message: str):  # the receiver's unpickling of an item whose pickling failed in a Queue's feeder thread
    raise SharingError(message)


def _on_device(obj) -> bool:
    with warnings.catch_warnings():  # TypedStorage.device warns that TypedStorage is deprecated
        warnings.simplefilter("ignore", UserWarning)
        device = getattr(obj, "device", None)
    return device is not None and device.type == DEVICE


def shared_host_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """The CPU storage in shared memory that a device storage's memory is (moved there on first use)."""
    host = getattr(storage, "_nl_shared", None)
    if host is not None and host.data_ptr() == storage.data_ptr() and host.nbytes() == storage.nbytes():
        return host
    host = torch.UntypedStorage(storage.nbytes())
    if storage.nbytes():  # (CPU's reducer sends an empty storage without shared memory)
        queue.drain()  # queued work may still write the memory that moves
        host.share_memory_()
        state.device.rt.mem_move_to(storage, host)
    storage._nl_shared = host
    return host


def rebuild_device_storage(host: torch.UntypedStorage, index: int) -> torch.UntypedStorage:
    """The receiver's device storage: the sender's shared memory, adopted on the same core index."""
    storage = memory.adopt(host, index, resizable=False)
    storage._nl_shared = host  # sending it on shares the same memory again
    return storage


def rebuild_device_tensor(cls, host, index, dtype, size, stride, offset, requires_grad):
    t = memory.wrap(rebuild_device_storage(host, index), index, dtype, size, stride, offset, inference=False)
    if cls is torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad_(requires_grad)
    return t


def _reduce_device_tensor(t: torch.Tensor):
    if t.requires_grad and not t.is_leaf:  # CPU's and CUDA's own refusal, with their text
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not support "
            "crossing process boundaries.  If you just want to transfer the data, call detach() on the tensor "
            "before serializing (e.g., putting it on the queue).")
    if t.layout != torch.strided or t.is_conj() or t.is_neg() or _private.is_zero_tensor(t):
        raise SharingError(
            f"neuron: this device tensor ({t.layout}{', lazily conjugated' if t.is_conj() else ''}"
            f"{', lazily negated' if t.is_neg() else ''}{', a zero tensor' if _private.is_zero_tensor(t) else ''}) "
            "cannot be sent to another process; send t.resolve_conj().resolve_neg().clone() (a plain strided "
            "tensor) instead")
    host = shared_host_storage(t.untyped_storage())
    return rebuild_device_tensor, (type(t), host, t.device.index, t.dtype, tuple(t.size()), tuple(t.stride()),
                                   t.storage_offset(), t.requires_grad)


def _reduce_device_storage(storage: torch.UntypedStorage):
    return rebuild_device_storage, (shared_host_storage(storage), storage.device.index)


def _wrap(reduce, reduce_on_device):
    def reduce_checked(obj):
        if not _on_device(obj):
            return reduce(obj)
        try:
            return reduce_on_device(obj)
        except Exception as e:
            if threading.current_thread().name == "QueueFeederThread":  # an error here would be swallowed
                return _refuse, (str(e),)
            raise

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
    """Share device tensors and storages through PyTorch's reducers, and watch forks (once per process).
    A TypedStorage keeps PyTorch's reducer, which sends its untyped storage through ours."""
    global _installed
    if _installed:
        return
    _installed = True
    pairs = [
        (torch.Tensor, _torch_reductions.reduce_tensor, _reduce_device_tensor),
        (torch.nn.parameter.Parameter, _torch_reductions.reduce_tensor, _reduce_device_tensor),
        (torch.UntypedStorage, _torch_reductions.reduce_storage, _reduce_device_storage),
    ]
    for cls, reduce, reduce_on_device in pairs:
        ForkingPickler.register(cls, _wrap(reduce, reduce_on_device))
    os.register_at_fork(after_in_child=_after_fork_in_child)
