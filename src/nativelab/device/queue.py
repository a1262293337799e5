"""The device's execution queue: ops are recorded in program order and run when someone needs a result.

Like a CUDA stream seen from the host: launching an op returns at once; reading a value (`.item()`,
`.cpu()`, printing), a CPU fallback, `synchronize()` or an event wait drains the queue. An op that fails
while queued raises at that drain, naming the op, and the work queued after it is dropped (its inputs
are garbage), so the device stays usable.
"""

from __future__ import annotations

import time

import torch

from . import threads
from ._private import no_python_modes as _no_python_modes

# Each entry is (name, fn, args): fn(*args) runs the op on host memory.
_pending: list[tuple] = []
_MAX_PENDING = 256  # bounded: a deep queue keeps many buffers alive and runs out of cache (measured 2x slower at 4096)
sync_mode = False  # NATIVELAB_SYNC=1
drains = 0  # host-device synchronisations that found work queued, for the profiler
# The profiler (nativelab.profile) while a session is active, else None: it runs each entry itself (timing it,
# counting its bytes). Checked once per entry, so profiling costs nothing when off.
observer = None


class DeviceError(RuntimeError):
    """An op that was queued on the device failed when it ran."""


def submit(name: str, fn, args: tuple) -> None:
    if sync_mode:
        with threads.team():
            _run_one(name, fn, args)
        return
    _pending.append((name, fn, args))
    if len(_pending) >= _MAX_PENDING:
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
    if not _pending:
        return
    drains += 1
    work = _pending[:]
    _pending.clear()
    # Queued work is real computation on host memory, whatever mode the code that asked for it is in: a drain
    # can happen while torch.compile traces with fake tensors, or outside the inference_mode() block that
    # queued the work (host views made there are inference tensors; writing them needs inference mode, and
    # nothing here is ever differentiated).
    # The host thread team is sized to the machine's load for the work (see threads).
    with _no_python_modes(), torch.inference_mode(), threads.team():
        _run_all(work)


def _run_all(work: list) -> None:
    obs = observer
    for i, (name, fn, args) in enumerate(work):
        try:
            if obs is None:
                fn(*args)
            else:
                obs.run(name, fn, args)
        except Exception as e:
            dropped = len(work) - i - 1
            raise DeviceError(
                f"neuron: queued op {name} failed: {type(e).__name__}: {e}"
                + (f" ({dropped} ops queued after it were dropped)" if dropped else "")
            ) from e


def run_now(name: str, fn, args: tuple):
    """Device work the host runs at once (after a drain), seen by the profiler like queued work."""
    with threads.team():
        return fn(*args) if observer is None else observer.run(name, fn, args)


def idle() -> bool:
    return not _pending


def record_time(cell: list) -> None:
    """Queue a marker that stamps the host clock when the device reaches it (for Events)."""
    submit("event_record", _stamp, (cell,))


def _stamp(cell: list) -> None:
    cell[0] = time.perf_counter()
