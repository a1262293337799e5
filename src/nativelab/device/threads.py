"""How many host threads the device's work uses: all the cores this process may run on, minus the cores other
processes are keeping busy right now.

The device computes on the host CPU: ATen kernels on host views and the generated code of compiled graphs
and kernels, all parallelised by one OpenMP runtime (libgomp, loaded by torch). Inductor's generated loops
open `#pragma omp parallel` regions without a fixed `num_threads`, so they follow the calling thread's
OpenMP thread count, as ATen does; `torch.set_num_threads` sets both. With one team thread per core, a
second busy process on a 2-core machine leaves one of the two threads sharing its core: every parallel
region then waits at its barrier for that thread's turn on the core (scheduler time slices are
milliseconds, a decode step's regions are microseconds), so a decode step ran at 0.30-0.38x of its quiet
speed where losing one core of two should cost 0.5x. So the policy: every `INTERVAL` seconds (checked where
the device runs queued work, which costs a clock read) it reads the CPU time the whole machine and this
process have used since the last look (/proc/stat, /proc/self/stat) and sizes the team to the cores the
other processes left idle, never below one, for the device work it runs (`team()`); the thread count the
user's code sees is left as it was.

Knobs: `NATIVELAB_THREADS=N` fixes the team at N threads (no adaptation); `NATIVELAB_THREADS=auto` (default)
adapts. It is read at registration into `state.device.threads`; `state.device.mode(threads=N)` changes it for
a block. `torch.set_num_threads(n)` called by the user sets the most the policy will use. OpenMP's own
settings (OMP_WAIT_POLICY, GOMP_SPINCOUNT) are read by libgomp when torch is imported, before nativelab
runs: set them in the environment if wanted (see the README).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from . import state

INTERVAL = 0.25  # seconds between looks at the machine's load
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# the machine as last seen: the cores this process may run on ("most"), other processes' load ("others")
_state = {"most": None, "next": 0.0, "last": None, "others": 0.0}


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_sample() -> tuple[float, int, int] | None:
    """(monotonic time, busy ticks of the whole machine, ticks this process and its reaped children used); None
    where /proc is absent.

    The children count as this process once reaped: the C++ compilers a compile runs (Inductor's, an
    extension build's) are our own load. Counted as others', the window spanning a compile read ~1 core busy
    after it ended, and the first 0.25 s of device work after each compile ran on one thread of two."""
    try:
        with open("/proc/stat", "rb") as f:
            vals = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        with open("/proc/self/stat", "rb") as f:
            s = f.read()
    except OSError:
        return None
    fields = s[s.rfind(b")") + 2:].split()
    return time.monotonic(), sum(vals) - vals[3] - vals[4], sum(int(v) for v in fields[11:15])  # u/s + cu/cs


def others(prev, now) -> float:
    """Cores' worth of CPU time other processes used between two samples (steal time included)."""
    dt = now[0] - prev[0]
    if dt <= 0:
        return 0.0
    return max(0.0, ((now[1] - prev[1]) - (now[2] - prev[2])) / _TICK / dt)


def target(most: int, others: float) -> int:
    """Threads to use: the cores other processes leave idle (a busy core counts from half its time on)."""
    return max(1, min(most, most - int(others + 0.5)))


def ceiling() -> int:
    """The most threads the policy uses (part of the compile cache key)."""
    mode = state.device.threads
    if isinstance(mode, int):
        return mode
    if _state["most"] is None:
        _state["most"] = _cores()
    return min(_state["most"], torch.get_num_threads())


def size() -> int:
    """The team size for device work now: the machine's load refreshed every INTERVAL seconds (a clock read in
    between), capped at each call by the calling thread's own `torch.get_num_threads()`. That count is per
    thread and the user may change it at any time; ATen's reductions split their partial sums by it, so a team
    of another size computes other bits than CPU would. Cached for 0.25 s, a `torch.set_num_threads(1)` left
    device work on 2 threads while CPU ops ran on 1, and a count read in another thread (a DataLoader's
    pin-memory thread sets its own to 1) sized the main thread's team."""
    now = time.monotonic()
    mode = state.device.threads  # NATIVELAB_THREADS
    if isinstance(mode, int):
        return mode
    if now >= _state["next"]:
        _state["next"] = now + INTERVAL
        _state["most"] = _cores()
        sample = cpu_sample()
        if sample is not None:
            prev, _state["last"] = _state["last"], sample
            if prev is not None:
                _state["others"] = others(prev, sample)
    return target(min(_state["most"], torch.get_num_threads()), _state["others"])  # the user's count caps it


@contextlib.contextmanager
def team():
    """Run the block (device work) with `size()` threads, on the calling thread (OpenMP thread counts are per
    thread), and restore the count after it: the user's code sees its own setting, and TorchDynamo, whose
    guards include the thread count, does not recompile when the load changes."""
    n, user = size(), torch.get_num_threads()
    if n == user:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(user)


def describe() -> str:
    """The CPU, the vector ISA PyTorch's kernels use on it, and the thread policy, for benchmark headers."""
    from . import cpu_info

    mode = state.device.threads
    policy = f"{mode} threads" if isinstance(mode, int) else f"threads adapt to load (up to {_cores()})"
    return f"{cpu_info.describe()}; {policy}"
