"""The device's execution queue: device work is recorded in program order and runs when someone needs a result.

Like a CUDA stream seen from the host: launching work returns at once; reading a value (`.item()`,
`.cpu()`, printing), a CPU fallback, `synchronize()` or an event wait drains the queue. Work that fails
while queued raises at that drain, naming it, and the work queued after it is dropped (its inputs are
garbage), so the device stays usable.

The queue itself is the C++ runtime's (csrc/queue.cpp). Every unit of device work reaches it through one
launch, which records what the work is: its kind (the runtime's `WORK_KINDS`), its name, the core and stream it runs on. The C++
op kernel launches ATen ops and copies itself; everything else launches with `launch` (queued) or `run_now`
(work the host must run at once: collectives, graphs whose outputs alias their inputs). Profilers read the
kind and name from the work. This module drives the queue.
"""

from __future__ import annotations

import torch

from . import observe, state, threads
from ._private import no_python_modes as _no_python_modes

drains = 0  # host-device synchronisations that found work queued, for the profiler
# Each unit runs through `observe.run` while an observer watches (a nativelab.profile session times it and counts
# its bytes), else by itself: the C++ queue tests one pointer per unit. (torch.profiler needs no observer: the C++
# queue times the work itself during a trace.)


class DeviceError(RuntimeError):
    """An op that was queued on the device failed when it ran."""


# What a unit of device work is (an eager ATen op, a copy, a compiled graph, a kernel, a collective, or an event's
# marker: no work), the queue's bound and the names of the runtime's copies are the C++ runtime's, said once in
# csrc/queue.h: `state.device.rt.WORK_KINDS`, `MAX_PENDING` (a launch that fills the queue drains it, in C++),
# `WORK_NAMES` (`work_name`).


def work_name(what: str) -> str:
    """The name of one of the runtime's copies as a unit of device work: `what` is "copy" (device to device),
    "host_to_device_queued" (queued in program order), "host_to_device" or "device_to_host" (run at once)."""
    return state.device.rt.WORK_NAMES[what]


def launch(kind: str, name: str, fn, *args) -> None:
    """Queue device work `fn(*args)`, in program order, as a unit of `kind` named `name` (what profilers show).

    It runs later on host views: device tensors in `args` (also inside lists and tuples) reach `fn` as CPU
    tensors over their memory, other CPU tensors as copies taken now (the caller may write them before the
    queue runs; CUDA copies a CPU operand at launch), `device='neuron'` as cpu. It runs on the core of its first
    device tensor (the current core if none), on that core's current stream."""
    dev = state.device
    if dev.sync:  # NATIVELAB_SYNC=1: each unit runs at its launch (the queue stays empty)
        drain()
        with threads.team():
            try:
                dev.rt.run_now(kind, name, fn, args, observe.run)
            except Exception as e:
                raise DeviceError(f"neuron: queued op {name} failed: {type(e).__name__}: {e}") from e
        return
    dev.rt.launch(kind, name, fn, args)  # drains the queue itself when it reaches MAX_PENDING


def run_now(kind: str, name: str, fn, *args, observed: bool = True):
    """Device work the host runs at once, after draining the queue: `fn(*args)` on host views as `launch`
    gives them (CPU tensors not copied), its result returned. Seen by profilers like queued work (`observed`
    False: by torch.profiler only, for a caller that reports it to the session itself)."""
    drain()
    with threads.team():
        return state.device.rt.run_now(kind, name, fn, args, observe.run if observed else None)


def drain() -> None:
    global drains
    if not state.device.rt.queue_size():
        return
    drains += 1
    # Queued work is real computation on host memory, whatever mode the code that asked for it is in: a drain
    # can happen while torch.compile traces with fake tensors, or outside the inference_mode() block that
    # queued the work (host views made there are inference tensors; writing them needs inference mode, and
    # nothing here is ever differentiated).
    # The host thread team is sized to the machine's load for the work (see threads).
    with _no_python_modes(), torch.inference_mode(), threads.team():
        failure = state.device.rt.queue_run(observe.run)
    if failure is not None:
        name, e, dropped = failure
        raise DeviceError(
            f"neuron: queued op {name} failed: {type(e).__name__}: {e}"
            + (f" ({dropped} ops queued after it were dropped)" if dropped else "")
        ) from e


def idle() -> bool:
    return not state.device.rt.queue_size()


def pending() -> int:
    """Entries queued and not yet run."""
    return state.device.rt.queue_size()

