"""The device's execution queue: ops are recorded in program order and run when someone needs a result.

Like a CUDA stream seen from the host: launching an op returns at once; reading a value (`.item()`,
`.cpu()`, printing), a CPU fallback, `synchronize()` or an event wait drains the queue. An op that fails
while queued raises at that drain, naming the op, and the work queued after it is dropped (its inputs
are garbage), so the device stays usable.

The queue itself is the C++ runtime's (csrc/queue.cpp): the ATen ops its kernel queues and the Python work
submitted here (graphs, kernels, copies, event markers) share one program order. This module drives it.
"""

from __future__ import annotations

import torch

from . import observe, threads
from ._private import no_python_modes as _no_python_modes

_MAX_PENDING = 256  # bounded: a deep queue keeps many buffers alive and runs out of cache (measured 2x slower at 4096)
sync_mode = False  # NATIVELAB_SYNC=1
drains = 0  # host-device synchronisations that found work queued, for the profiler
# The profiler (nativelab.profile) while a session is active, else None: it runs each entry itself (timing it,
# counting its bytes). Checked once per entry, so profiling costs nothing when off.
observer = None
_rt = None  # the runtime (bind)
_listeners: list = []  # called when sync_mode or observer changes (the C++ fast path turns off for either)


class DeviceError(RuntimeError):
    """An op that was queued on the device failed when it ran."""


def bind(rt) -> None:
    global _rt
    _rt = rt


def submit(name: str, fn, args: tuple) -> None:
    if sync_mode:
        with threads.team():
            _run_one(name, fn, args)
        return
    if _rt.queue_submit(name, fn, tuple(args)) >= _MAX_PENDING:
        drain()


def _run_one(name, fn, args):
    try:
        if observer is None:
            fn(*args)
        else:
            observer.run(name, fn, args)
    except Exception as e:
        raise DeviceError(f"neuron: queued op {name} failed: {type(e).__name__}: {e}") from e


def drain() -> None:
    global drains
    if not _rt.queue_size():
        return
    drains += 1
    # Queued work is real computation on host memory, whatever mode the code that asked for it is in: a drain
    # can happen while torch.compile traces with fake tensors, or outside the inference_mode() block that
    # queued the work (host views made there are inference tensors; writing them needs inference mode, and
    # nothing here is ever differentiated).
    # The host thread team is sized to the machine's load for the work (see threads).
    with _no_python_modes(), torch.inference_mode(), threads.team():
        failure = _rt.queue_run(observer)
    if failure is not None:
        name, e, dropped = failure
        raise DeviceError(
            f"neuron: queued op {name} failed: {type(e).__name__}: {e}"
            + (f" ({dropped} ops queued after it were dropped)" if dropped else "")
        ) from e


def run_now(name: str, fn, args: tuple):
    """Device work the host runs at once (after a drain), seen by the profiler like queued work."""
    with threads.team():
        return fn(*args) if observer is None else observer.run(name, fn, args)


def idle() -> bool:
    return not _rt.queue_size()


def pending() -> int:
    """Entries queued and not yet run."""
    return _rt.queue_size()


observe.notify_on_set(__name__, ("sync_mode", "observer"))
