"""A profiling session: everything the device does while it is active, timed and measured.

    with nativelab.profile.Session("base") as s:
        tokens = gen.generate(prompt, 50)
    s.tokens = len(tokens)
    print_report(s.summary())

While active, the session is one of the device's observers (`nativelab.device.observe`): it runs each queued
entry itself (timing it on the thread that drains the queue and counting the bytes it reads and writes), each
CPU fallback and each host <-> device copy, and each NKI kernel launch with its estimated NeuronCore-v3 time
and engine timeline (nki/cost.py). Sessions nest (and run inside `nativelab check`): each sees every
event while it is active. Dynamo compilations are timed through Dynamo's compile callbacks, graph breaks read
from its counters. Inside a `torch.profiler.profile` every entry is also a `neuron::<name>` event.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import NamedTuple

import torch

from .. import device as _device
from ..compiler import metrics as _compile_metrics
from ..device import memory as _memory
from ..device import observe as _observe
from ..device import queue as _queue
from . import _private
from .categories import CATEGORIES, categorize
from .traffic import GraphIO, op_traffic, tensor_bytes

_perf_ns = time.perf_counter_ns
_record_function = torch.autograd.profiler.record_function


@dataclasses.dataclass
class OpStat:
    """Totals for one name of device work (or one fallback op)."""

    category: str
    kind: str  # "op", "graph", "kernel", "fallback", "transfer"
    calls: int = 0
    seconds: float = 0.0
    read: int = 0  # bytes read from device memory
    written: int = 0  # bytes written to device memory
    to_host: int = 0  # fallbacks: device bytes copied to the host
    to_device: int = 0  # fallbacks: result bytes copied back to the device
    fastest: float = 0.0  # fallbacks: the shortest single call, seconds (what load on the host cannot inflate)


@dataclasses.dataclass
class NkiStat:
    """The launches of one NKI kernel and their estimated time on one NeuronCore-v3 (nki/cost.py), summed."""

    calls: int = 0
    est_seconds: float = 0.0
    busy: dict = dataclasses.field(default_factory=dict)  # engine -> estimated busy seconds, summed
    instructions: int = 0  # of the latest launch

    def per_launch(self) -> dict:
        n = self.calls or 1
        busy = {e: b / n for e, b in self.busy.items()}
        return {"calls": self.calls, "est_trn2_us": 1e6 * self.est_seconds / n,
                "bound": max(busy, key=busy.get) if busy else "none",
                "busy_us": {e: 1e6 * b for e, b in busy.items()}, "instructions": self.instructions,
                "est_trn2_seconds_total": self.est_seconds}


class Event(NamedTuple):
    """One unit of work on the timeline (the trace's events)."""
    track: str  # "device", "host", ...: the trace's thread
    name: str
    category: str
    start_ns: int
    dur_ns: int
    read: int  # bytes read from device memory
    written: int  # bytes written to device memory


class Session(_observe.Observer):
    """Context manager recording device work, fallbacks, transfers, compiles and Dynamo graph breaks."""

    def __init__(self, name: str = "profile", timeline: bool = True, max_events: int = 200_000):
        self.name = name
        self.timeline = timeline  # keep per-entry events for the trace (totals are always kept)
        self.max_events = max_events
        self.tokens = 0  # decoded tokens, for per-token figures (set by whoever knows)
        self.ops: dict[str, OpStat] = {}
        self.events: list[Event] = []
        self.dropped_events = 0
        self.nki: dict[str, NkiStat] = {}  # NKI kernel -> its launches' estimate on a NeuronCore-v3
        self.nki_launches: list = []  # (perf_ns at the launch, cost.Estimate): the trace's engine lanes
        self.transfers = collections.Counter()  # "host_to_device"/"device_to_host" -> bytes
        self.transfer_calls = collections.Counter()
        self.compiles: list[tuple[str, float]] = []  # (Dynamo compile id, seconds)
        self.wall_seconds = 0.0
        self.start_ns = 0
        self._graph_io: dict = {}
        # what each unit of device work runs, for the Trainium2 estimate's kernel counts (check/estimate.py):
        self.sources: dict[str, tuple] = {}  # queue entry name -> (FX graph it runs or None, is a kernel)
        self.kernel_runs: dict = {}  # library kernel traced graph -> calls (run inside graphs or queued alone)
        self.kernel_names: dict = {}  # library kernel traced graph -> the kernel's name (NKI's are priced apart)
        self._compile_open: dict = {}
        self._dynamo0: dict = {}
        self.dynamo: dict = {}
        self.drains = 0
        self.backend_compile_seconds = 0.0
        self._backend_inside_dynamo = 0.0

    # -- the session's lifetime --------------------------------------------------------------------------

    def __enter__(self) -> "Session":
        if not _device.is_registered():
            raise RuntimeError("nativelab.profile measures nativelab's emulated device, which is not registered "
                               "here (the real torch_neuronx serves 'neuron': use the Neuron profiler)")
        _queue.drain()  # earlier work belongs to no session (or to the ones already active)
        self._dynamo0 = _private.dynamo_counters()
        self._compile0 = _compile_metrics.current().compile_seconds
        self._drains0 = _queue.drains
        _private.add_compile_callbacks(self._compile_start, self._compile_end)
        self.start_ns = _perf_ns()
        _observe.push(self)  # (inside a torch.profiler trace too: the queue times the work for the trace)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                _queue.drain()  # work queued inside the session is part of it
        finally:
            _observe.pop(self)
            _private.remove_compile_callbacks(self._compile_start, self._compile_end)
        self.wall_seconds = (_perf_ns() - self.start_ns) / 1e9
        self.drains = _queue.drains - self._drains0
        self.backend_compile_seconds = _compile_metrics.current().compile_seconds - self._compile0
        self.dynamo = _dynamo_delta(self._dynamo0, _private.dynamo_counters())

    # -- observer events (called by the device) ----------------------------------------------------------

    def run(self, kind: str, name: str, fn, args):
        """Run one unit of device work (queued, or run at once by the host): `kind` says what it is (the
        device runtime's `WORK_KINDS`), `name` names it."""
        if name not in self.sources:  # a compiled graph's launch is its bound method; a kernel knows its graph
            owner = getattr(fn, "__self__", None) if kind == "graph" else fn if kind == "kernel" else None
            self.sources[name] = (getattr(owner, "source", None), kind == "kernel")
        # Counted before it runs: the dtype policy rewrites an op's host arguments (int64 -> int32) as it runs.
        counted = self._traffic(kind, name, fn, args)
        t0 = _perf_ns()
        if _private.torch_profiler_enabled():
            with _record_function("neuron::" + name):
                res = fn(*args)
        else:
            res = fn(*args)
        t1 = _perf_ns()
        kind, read, written = counted if counted is not None else self._traffic_of_result(fn, args, res)
        if kind == "marker":
            return res
        if kind == "transfer":
            self._count_transfer("host_to_device", written)
            self._add(name, "host sync", "transfer", t0, t1, 0, written)
        else:  # a collective is the host waiting for its peers
            self._add(name, "host sync" if kind == "collective" else categorize(name), kind, t0, t1, read, written)
        return res

    def kernel_run(self, name: str, gm) -> None:
        """A library kernel ran its traced graph (inside a compiled graph or queued alone)."""
        self.kernel_runs[gm] = self.kernel_runs.get(gm, 0) + 1
        self.kernel_names[gm] = name

    def host_op(self, name: str, fallback: bool, fn, fargs, dev_args):
        """A CPU fallback (or a device op that had to run at once): its host time and the bytes it moved."""
        t0 = _perf_ns()
        res = fn(*fargs)
        t1 = _perf_ns()
        rec = fargs[0]
        outs = {i for i in rec.mutable if i >= rec.npos}  # out= arguments: only written
        to_host = sum(tensor_bytes(a) for i, a in enumerate(dev_args) if i not in outs and _on_device(a))
        if rec.mutable:  # results are the arguments written
            back = sum(tensor_bytes(dev_args[i]) for i in rec.mutable if i < len(dev_args) and _on_device(dev_args[i]))
        else:
            back = tensor_bytes(res) if isinstance(res, (torch.Tensor, list, tuple)) else 0
        if fallback:
            st = self._add(name, "fallback", "fallback", t0, t1, to_host, back, track="host")
            d = (t1 - t0) / 1e9
            st.fastest = d if st.calls == 1 else min(st.fastest, d)
            st.to_host += to_host
            st.to_device += back
            self._count_transfer("device_to_host", to_host)
            self._count_transfer("host_to_device", back)
        else:
            self._add(name, categorize(name), "op", t0, t1, to_host, back)
        return res

    def transfer(self, kind: str, nbytes: int, seconds: float) -> None:
        """A copy between host and device memory (`.to('neuron')`, `.cpu()`, `.item()`)."""
        t1 = _perf_ns()
        self._count_transfer(kind, nbytes)
        name = "device -> host" if kind == "device_to_host" else "host -> device"
        self._add(name, "host sync", "transfer", t1 - int(seconds * 1e9), t1, 0, 0, track="host")

    def nki_launch(self, name: str, estimate) -> None:
        """An NKI kernel launch: its estimated NeuronCore-v3 time and engine timeline (nki/cost.py)."""
        st = self.nki.get(name)
        if st is None:
            st = self.nki[name] = NkiStat()
        st.calls += 1
        st.est_seconds += estimate.seconds
        for engine, b in estimate.busy.items():
            st.busy[engine] = st.busy.get(engine, 0.0) + b
        st.instructions = len(estimate.events)
        if self.timeline and len(self.nki_launches) < self.max_events:
            self.nki_launches.append((_perf_ns(), estimate))

    # -- bookkeeping -------------------------------------------------------------------------------------

    def _count_transfer(self, kind: str, nbytes: int) -> None:
        self.transfers[kind] += nbytes
        self.transfer_calls[kind] += 1

    def _add(self, name, category, kind, t0, t1, read, written, track="device") -> OpStat:
        st = self.ops.get(name)
        if st is None:
            st = self.ops[name] = OpStat(category, kind)
        st.calls += 1
        st.seconds += (t1 - t0) / 1e9
        st.read += read
        st.written += written
        if self.timeline:
            if len(self.events) < self.max_events:
                self.events.append(Event(track, name, category, t0, t1 - t0, read, written))
            else:
                self.dropped_events += 1
        return st

    def _traffic(self, kind: str, name: str, fn, args) -> tuple[str, int, int] | None:
        """(kind, read, written) of one unit of device work, from what it says it is and the host views it runs
        on; None for a graph run at launch, whose outputs are known only after it ran."""
        if kind == "op":  # (op record, host arguments[, host outputs]); a C++ kernel's op has none here
            if not args:
                return "op", 0, 0
            rec, hargs, *houts = args
            return "op", *op_traffic(rec, hargs, houts[0] if houts else None)
        if kind == "copy":  # (destination, source)
            if name == _queue.work_name("host_to_device_queued"):
                return "transfer", 0, tensor_bytes(args[0])
            return "op", tensor_bytes(args[1]), tensor_bytes(args[0])
        if kind == "graph":  # a compiled graph's bound launch method: queued (inputs, outputs), or at launch
            owner = fn.__self__
            if fn.__name__ == "run":
                hargs, houts = args
                return "graph", *self._io(owner.source, False).traffic(hargs, houts)
            return None
        if kind == "kernel":  # a traced kernel knows its graph; hand-written host code may give its own account
            source = getattr(fn, "source", None)
            if source is not None:
                return "kernel", *self._io(source, True).traffic(args)
            account = getattr(fn, "traffic", None)  # fn.traffic(*args) -> (bytes read, bytes written)
            return ("kernel", *account(*args)) if account is not None else ("kernel", 0, 0)
        if kind == "collective":
            return "collective", 0, 0
        return "marker", 0, 0  # event records: no work

    def _traffic_of_result(self, fn, args, res) -> tuple[str, int, int]:
        io = self._io(fn.__self__.source, False)
        return "graph", *io.traffic(args, _fresh_outputs(res, args))

    def _io(self, source, kernel: bool) -> GraphIO:
        hit = self._graph_io.get(id(source))
        if hit is None:  # keyed by id, so the graph is kept alive with its entry (an id is never reused)
            hit = self._graph_io[id(source)] = (source, GraphIO(source, outputs_are_inputs=kernel))
        return hit[1]

    def _compile_start(self, args) -> None:
        self._compile_open[args.compile_id] = (_perf_ns(), _compile_metrics.current().compile_seconds)

    def _compile_end(self, args) -> None:
        opened = self._compile_open.pop(args.compile_id, None)
        if opened is None:
            return
        t0, backend0 = opened
        t1 = _perf_ns()
        self._backend_inside_dynamo += _compile_metrics.current().compile_seconds - backend0
        self.compiles.append((str(args.compile_id), (t1 - t0) / 1e9))
        self._add(f"dynamo compile {args.compile_id}", "compile", "compile", t0, t1, 0, 0, track="host")

    # -- results -----------------------------------------------------------------------------------------

    def fallback_ops(self) -> list[str]:
        return [n for n, st in self.ops.items() if st.kind == "fallback"]

    def traffic(self) -> tuple[int, int]:
        """(read, written) device-memory bytes of all device work (fallbacks and transfers excluded)."""
        device = [st for st in self.ops.values() if st.kind in ("op", "graph", "kernel")]
        return sum(st.read for st in device), sum(st.written for st in device)

    def seconds_by_category(self) -> dict[str, float]:
        out = dict.fromkeys(CATEGORIES, 0.0)
        for st in self.ops.values():
            if st.kind != "compile":
                out[st.category] = out.get(st.category, 0.0) + st.seconds
        out["compile"] = self.compile_seconds()
        return out

    def compile_seconds(self) -> float:
        """Dynamo's compilations (which include the backend's work they trigger) plus backend compiles that
        happen outside them (graphs with frozen weights and kernels compile at their first launch)."""
        dynamo = sum(s for _, s in self.compiles)
        return dynamo + max(self.backend_compile_seconds - self._backend_inside_dynamo, 0.0)

    def recompiles(self) -> int:
        return sum(1 for cid, _ in self.compiles if _private.compile_id_of_str(cid)[1] > 0)

    def graph_breaks(self) -> dict[str, int]:
        return dict(self.dynamo.get("graph_break", {}))

    def nki_kernels(self) -> dict:
        """Per NKI kernel launched: calls, and per launch the estimated NeuronCore-v3 time (est_trn2_us), the
        bounding engine and each engine's busy time (busy_us)."""
        return {name: st.per_launch() for name, st in self.nki.items()}

    def host_syncs(self) -> int:
        """Times the host waited for device data: device-to-host reads and CPU fallbacks."""
        return self.transfer_calls["device_to_host"]

    def summary(self) -> dict:
        """Everything measured, as plain data (the JSON output)."""
        read, written = self.traffic()
        tok = self.tokens or None
        per = (lambda x: x / tok) if tok else (lambda x: None)
        return {
            "name": self.name,
            "wall_seconds": self.wall_seconds,
            "tokens": self.tokens,
            "device_bytes": {"read": read, "written": written, "total": read + written},
            "device_bytes_per_token": per(read + written),
            "seconds_by_category": self.seconds_by_category(),
            "seconds_per_token_by_category": {
                k: per(v) for k, v in self.seconds_by_category().items() if k != "compile"  # compile: paid once
            },
            "fallback_ops": self.fallback_ops(),
            "fallbacks": {n: dataclasses.asdict(st) for n, st in self.ops.items() if st.kind == "fallback"},
            "executed_ops": [n for n, st in self.ops.items() if st.kind in ("op", "graph", "kernel")],
            "ops": {n: dataclasses.asdict(st) for n, st in self.ops.items()},
            "transfers": {"bytes": dict(self.transfers), "calls": dict(self.transfer_calls)},
            "host_syncs": self.host_syncs(),
            "nki_kernels": self.nki_kernels(),
            "queue_drains": self.drains,
            "compile_seconds": self.compile_seconds(),
            "dynamo": {
                "compiles": len(self.compiles), "recompiles": self.recompiles(),
                "graph_breaks": sum(self.graph_breaks().values()), "graph_break_reasons": self.graph_breaks(),
                "unique_graphs": self.dynamo.get("stats", {}).get("unique_graphs", 0),
            },
            "dropped_events": self.dropped_events,
        }


def session_active() -> bool:
    """A profiling session (or a `nativelab check`, whose watch is one) is recording the device now."""
    return any(isinstance(o, Session) for o in _observe.observers())


def traffic_per_token(generate) -> float | None:
    """Device-memory bytes (read + written) per token of one `generate()` call (which returns the tokens);
    None where the emulator stepped aside, or while a session already records: the extra generation would be
    part of what it measures (`nativelab profile -- run ...`)."""
    if not _device.is_registered() or session_active():
        return None
    with Session("traffic", timeline=False) as s:
        tokens = generate()
    read, written = s.traffic()
    return (read + written) / max(len(tokens), 1)


def _on_device(a) -> bool:
    if isinstance(a, torch.Tensor):
        return a.device.type == _memory.DEVICE
    if isinstance(a, (list, tuple)):
        return any(isinstance(t, torch.Tensor) and t.device.type == _memory.DEVICE for t in a)
    return False


def _fresh_outputs(res, inputs) -> list:
    """Outputs of a graph run at launch that are not views of its inputs (those are written)."""
    res = res if isinstance(res, (list, tuple)) else (res,)
    ptrs = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    return [r for r in res if isinstance(r, torch.Tensor) and r.untyped_storage().data_ptr() not in ptrs]


def _dynamo_delta(before: dict, after: dict) -> dict:
    out = {}
    for group, counts in after.items():
        prev = before.get(group, {})
        diff = {k: v - prev.get(k, 0) for k, v in counts.items() if v - prev.get(k, 0)}
        if diff:
            out[group] = diff
    return out
