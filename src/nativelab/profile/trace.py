"""Chrome / Perfetto trace JSON (chrome://tracing, ui.perfetto.dev): device work on its own track.

Each session is a process with two threads: the device queue (every executed op, compiled graph and kernel
launch, with the bytes it read and wrote) and the host (CPU fallbacks, host <-> device copies, compiles);
a session that saw NKI launches has one more thread per NeuronCore-v3 engine (tensor, vector, scalar, gpsimd,
dma), the view neuron-profile gives on a chip: each launch's estimated instructions (nki/cost.py), laid out
from the moment the emulator launched it (or from the end of the previous launch's estimate, if later).
Given a `torch.profiler` trace recorded over the same session, its CPU events are kept and the device
tracks are placed on its clock (matched through the `neuron::<name>` events the session emitted into it).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile

import torch

from ..nki.cost import ENGINES
from ._files import write_atomic

_THREADS = {"device": (1, "neuron device queue"), "host": (2, "host: fallbacks, transfers, compiles")}
_ENGINE_TID0 = 10  # the NeuronCore-v3 engine lanes of NKI launches
_PID0 = 1_000_000  # far from torch.profiler's real process ids


@contextlib.contextmanager
def torch_profiler():
    """A CPU `torch.profiler.profile` whose Chrome trace can be merged with the sessions recorded inside it."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with prof:
        yield prof


def torch_trace(prof) -> dict:
    """The Chrome trace of a finished `torch.profiler.profile`, as JSON data."""
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp) as f:
            return json.load(f)
    finally:
        os.unlink(tmp)


def chrome_trace(sessions, torch_data: dict | None = None) -> dict:
    """One trace of the sessions (in order), on torch.profiler's clock when its trace is given."""
    events = list(torch_data.get("traceEvents", [])) if torch_data else []
    offset_us = _clock_offset(sessions, events) if torch_data else None
    origin = min((s.start_ns for s in sessions), default=0)
    for k, s in enumerate(sessions):
        pid = _PID0 + k
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"nativelab: {s.name}"}})
        events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": k}})
        for tid, label in _THREADS.values():
            events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": label}})
        for e in s.events:
            ts = e.start_ns / 1e3 + offset_us if offset_us is not None else (e.start_ns - origin) / 1e3
            args = {"bytes read": e.read, "bytes written": e.written} if e.track == "device" else {}
            events.append({"ph": "X", "pid": pid, "tid": _THREADS[e.track][0], "name": e.name, "cat": e.category,
                           "ts": ts, "dur": e.dur_ns / 1e3, "args": args})
        if s.nki_launches:
            events += _engine_lanes(s, pid, lambda ns: ns / 1e3 + offset_us if offset_us is not None else (ns - origin) / 1e3)
    out = dict(torch_data or {})
    out["traceEvents"] = events
    out.setdefault("displayTimeUnit", "ms")
    return out


def _engine_lanes(session, pid: int, us_of) -> list:
    """The engine threads of a session's NKI launches (at most session.max_events instructions)."""
    out = [{"ph": "M", "pid": pid, "tid": _ENGINE_TID0 + i, "name": "thread_name",
            "args": {"name": f"NeuronCore-v3 {e} (NKI, estimated)"}} for i, e in enumerate(ENGINES)]
    lane = {e: _ENGINE_TID0 + i for i, e in enumerate(ENGINES)}
    cursor, budget = float("-inf"), session.max_events
    for launched_ns, est in session.nki_launches:
        start = max(us_of(launched_ns), cursor)
        for name, engine, t0, t1, line in est.events[:budget]:
            out.append({"ph": "X", "pid": pid, "tid": lane[engine], "name": name, "cat": "nki",
                        "ts": start + t0 * 1e6, "dur": max(t1 - t0, 0.0) * 1e6,
                        "args": {"kernel": est.kernel, "line": line}})
        budget -= min(len(est.events), budget)
        cursor = start + est.seconds * 1e6
        if budget <= 0:
            break
    return out


def write_trace(path, sessions, torch_data: dict | None = None):
    return write_atomic(path, json.dumps(chrome_trace(sessions, torch_data)).encode())


def _clock_offset(sessions, torch_events: list) -> float | None:
    """torch.profiler's microseconds minus ours, from device entries seen by both (in the same order)."""
    theirs = sorted(e["ts"] for e in torch_events if e.get("ph") == "X" and str(e.get("name", "")).startswith("neuron::"))
    ours = sorted(e.start_ns / 1e3 for s in sessions for e in s.events if e.track == "device")
    if not theirs or not ours:
        return None
    return statistics.median(t - o for t, o in zip(theirs, ours))
