"""The device's events for `torch.profiler` (ProfilerActivity.PrivateUse1), collected for the Kineto plugin.

The plugin (csrc/profiler_plugin.cpp) calls `_start` when a trace starts and `_stop` when it ends. In between,
an observer on the device queue times each entry as it runs (the device's work happens at drains, long after
the op that queued it returned), and each entry launched through `queue.submit` carries the Kineto
correlation id of the op that launched it, so PyTorch attributes the entry's time to that op (as it does a
CUDA kernel to its launching op). Work the host runs at once (`queue.run_now`) takes the correlation of the
op running at that moment. The host's run of an entry is the device's work, not the program's: the ATen ops
it calls are kept out of the CPU events (as a CUDA kernel's are), so `aten::mm` counts the program's calls
and the op that drained the queue (`.cpu()`, `.item()`) shows the wait as its own CPU time. Another observer already installed (a `nativelab.profile` session) still sees
every entry: this one wraps it.

Costs nothing when not profiling: the observer and the submit wrapper exist only during a trace.
"""

from __future__ import annotations

import time

from . import queue

# Zero-work markers (event records) are not device work.
_MARKERS = frozenset({"event_record"})
_active = None  # the _Observer of the running trace


class _Launch(str):
    """A queue entry's name that also carries the launching op's correlation id and device."""

    __slots__ = ("correlation", "device")


class _Observer:
    def __init__(self, inner, correlation, record_functions, submit):
        self.inner = inner  # the observer that was installed before the trace, if any
        self.correlation = correlation  # the current thread's Kineto correlation id (0: none)
        self.record_functions = record_functions  # (enable) -> previous: this thread's RecordFunction switch
        self.submit = submit  # queue.submit before the trace
        self.events: list[tuple] = []

    def tagged_submit(self, name, fn, args):
        launch = _Launch(name)
        launch.correlation = self.correlation()
        launch.device = _current_device()
        return self.submit(launch, fn, args)

    # -- the queue observer's interface ----------------------------------------------------------------

    def run(self, name, fn, args):
        corr = getattr(name, "correlation", None)
        dev = getattr(name, "device", None)
        if corr is None:
            corr, dev = self.correlation(), _current_device()
        was = self.record_functions(False)
        t0 = time.time_ns()  # Unix ns: the clock PyTorch puts its CPU events on
        try:
            res = fn(*args) if self.inner is None else self.inner.run(name, fn, args)
        finally:
            t1 = time.time_ns()
            self.record_functions(was)
        if str(name) not in _MARKERS:
            self.events.append((_kernel_name(str(name)), dev, t0, max(t1, t0 + 1), corr))
        return res

    def host_op(self, name, fallback, fn, fargs, dev_args):
        # A CPU fallback is host work (its CPU events stay); a device op that had to run at once (its output's
        # shape unknown until it runs) is device work, timed as a queued entry is.
        if self.inner is None:
            run = fn
        else:
            def run(*a):
                return self.inner.host_op(name, fallback, fn, a, dev_args)
        return run(*fargs) if fallback else self.run(name, run, fargs)

    def transfer(self, kind, nbytes, seconds):
        # A copy between host and device memory that just ended (kind: "device_to_host", "host_to_device").
        t1 = time.time_ns()
        self.events.append((f"neuron::memcpy_{kind}", _current_device(), t1 - max(int(seconds * 1e9), 1), t1,
                            self.correlation()))
        if self.inner is not None:
            self.inner.transfer(kind, nbytes, seconds)


def _kernel_name(name: str) -> str:
    # Distinct from the CPU op's name (as a CUDA kernel's is): key_averages() keeps them in separate rows.
    return "neuron::" + (name[len("aten::"):] if name.startswith("aten::") else name)


def _current_device() -> int:
    from . import guard

    return guard.current_index()


def _start(correlation, record_functions) -> None:
    global _active
    if _active is not None:
        raise RuntimeError("a torch.profiler trace with the neuron activity is already running")
    queue.drain()  # earlier work belongs to no trace
    _active = _Observer(queue.observer, correlation, record_functions, queue.submit)
    queue.submit = _active.tagged_submit
    queue.observer = _active


def _stop() -> list[tuple]:
    """The trace's device events: (name, device, start_ns, end_ns, correlation id)."""
    global _active
    obs = _active
    if obs is None:
        return []
    try:
        queue.drain()  # work queued inside the trace is part of it
    finally:
        if queue.observer is obs:
            queue.observer = obs.inner
        queue.submit = obs.submit
        _active = None
    return obs.events


def trace_observer():
    """The running trace's queue observer, or None."""
    return _active


def adopt(observer) -> bool:
    """Run `observer` (a nativelab.profile session) inside the running trace's observer; False if none runs."""
    if _active is None or _active.inner is not None or queue.observer is not _active:
        return False
    _active.inner = observer
    return True


def release(observer) -> bool:
    """Undo `adopt`, also when the session started before the trace (the trace wraps it); False otherwise."""
    if _active is None or _active.inner is not observer:
        return False
    _active.inner = None
    return True
