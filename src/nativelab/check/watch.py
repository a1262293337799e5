"""The device observer of a check: everything a profiling session records (bytes, time, fallbacks, transfers,
compiles), plus the user's source line of each event, the values of int64 casts and integer fp32 arithmetic,
peak memory with the tensors alive at the peak, compiled shapes and torch.compile options.

It is one of the device's observers (`nativelab.device.observe`), as the session it extends is, and watches every
event: each op at dispatch, each allocation, each kernel run, collective and compiled graph, besides the
session's queued work, host ops and transfers. It also registers its own optimizer step hook (steps), module
registration hook and Dynamo compile callbacks (the torch.compile calls, compile_calls.py: torch.compile itself is
never replaced), and wraps a few device-choosing calls, all undone when the check ends (innermost first, so
checks and profiling sessions nest).
"""

from __future__ import annotations

import collections
import dataclasses
import time
import weakref

import torch
from torch.optim import optimizer as _optimizer

from ..device import memory as _memory
from ..device import observe as _observe
from ..device import policy as _policy
from ..device import queue as _queue
from ..device import schema as _schema
from ..profile.session import Session
from . import _private
from .compile_calls import CompileCalls
from .drift import Shadows
from .graph_values import GraphValues
from .source import Site, compiled_call_sites, library_call, program_site, user_site

INT32_MAX = 2**31 - 1
FP32_EXACT = 2**24
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
# Integer ops the device computes in fp32 (the TensorEngine / vector engine have no integer accumulate).
INT_FP32_OPS = frozenset({
    "aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addmv", "aten::mv", "aten::dot", "aten::matmul",
    "aten::scatter_add", "aten::scatter_add_", "aten::index_add", "aten::index_add_", "aten::scatter_reduce",
    "aten::scatter_reduce_", "aten::index_put_", "aten::_index_put_impl_",
})
_SHAPE_OPS = frozenset({"aten::nonzero", "aten::masked_select", "aten::index", "aten::_unique2", "aten::unique_dim",
                        "aten::unique_consecutive", "aten::repeat_interleave", "aten::bincount"})


_PRIORITY = {"token": 0, "optimizer": 1, "marked": 2}


@dataclasses.dataclass
class Event:
    """Occurrences of one thing at one source line."""

    count: int = 0
    seconds: float = 0.0  # emulator time
    fastest: float = 0.0  # the shortest single occurrence's emulator time (host work: what load cannot inflate)
    to_host: int = 0
    to_device: int = 0
    max_value: int = 0  # int64 casts / integer fp32 results: the largest |value| seen
    dtypes: set = dataclasses.field(default_factory=set)
    code: str = ""
    steps_seen: int = 0  # how many distinct steps it happened in (1 of many: one-time work, not per step)
    last_step: int = -1
    where: dict = dataclasses.field(default_factory=dict)  # (op, Site) -> calls, for a finding grouping several


@dataclasses.dataclass
class Collective:
    """Calls of one collective at one source line."""

    calls: int = 0
    bytes: int = 0  # the buffers' bytes (the largest tensor argument of each call), summed
    world: int = 1  # the group's size (the largest seen)


@dataclasses.dataclass
class Snapshot:
    allocated: int
    tensors: list  # (nbytes, site) of the largest live allocations


class Watch(Session):
    def __init__(self, name: str = "check", alloc_threshold: int = 1 << 20, top_tensors: int = 8,
                 drift: bool = False):
        super().__init__(name, timeline=False)
        # bf16 results against float32 shadows (drift.py): off by default, it runs every bf16 op twice
        self.shadows = Shadows(_memory.host_view, _queue.drain, _memory.DEVICE) if drift else None
        self.alloc_threshold = alloc_threshold
        self.top_tensors = top_tensors
        self.steps = 0
        self.step_kind = None  # "optimizer", "marked", "token"
        self.fallback_sites: dict[tuple[str, Site | None], Event] = collections.defaultdict(Event)
        self.sync_sites: dict[tuple[str, Site | None], Event] = collections.defaultdict(Event)
        self.cast_sites: dict[tuple[str, Site | None], Event] = collections.defaultdict(Event)
        self.graph_int64_sites: dict[tuple[str, Site | None], Event] = collections.defaultdict(Event)
        self.int_fp32_sites: dict[tuple[str, Site | None], Event] = collections.defaultdict(Event)
        # ops the device computes in float32 on float64 inputs, by op and line; each event's `where` counts the
        # lines that made its float64 inputs (a `.double()`, a dtype=, a copy to the device), which group the
        # ops into causes (collect.dtypes)
        self.wide_sites: dict[tuple[str, Site | None], Event] = collections.defaultdict(Event)
        # id(float64 device tensor) -> (weakref, the Site that made its values, made empty: values still to come)
        self._wide_origin: dict[int, tuple] = {}
        self._wide_storage: dict[int, Site] = {}  # storage address -> that line, for views (`p.grad.view(-1)`)
        # Site -> float64 tensors made there; the lines that converted a model (`.double()`) apart
        self.wide_made: collections.Counter = collections.Counter()
        self.wide_models: collections.Counter = collections.Counter()
        self.dispatched = 0  # device ops seen (a run with none and no allocation never reached the device)
        self.allocations = 0
        self.launch_sites: collections.Counter = collections.Counter()  # Site -> eager device ops it issued
        self.failed: tuple | None = None  # (op, Site, exception) of the last device op that raised
        self.device_choices: dict = {}  # Site -> (what the program asked, its answer), e.g. torch.cuda.is_available()
        self.module_moves: dict = {}  # (caller "file:line", Site) -> device: nn.Module.to(a CPU device) calls
        self.safetensors_failures: list = []  # (Site, device, error) of safetensors loads onto the device
        self._unpatch: list = []
        self.collective_sites: dict[tuple[str, Site | None], Collective] = collections.defaultdict(Collective)
        self.compiled_shapes: dict[Site | None, dict] = collections.defaultdict(dict)  # site -> {shapes: seconds}
        self.compiled_calls: dict[Site | None, dict] = collections.defaultdict(dict)  # function -> {call site: n}
        self.compile_sites: dict[str, tuple] = {}  # Dynamo compile id -> (def, call site) of the compiled function
        self.compile_calls: list[dict] = []  # torch.compile(...) calls: site, backend, dynamic, mode, options
        self._compile_calls = CompileCalls(self.compile_calls)
        self.dynamo_metrics: dict[str, object] = {}  # compile id -> CompilationMetrics
        self.blocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.peak: dict[int, int] = {}
        self.peak_snapshot: dict[int, Snapshot] = {}
        self.base_allocated: dict[int, int] = {}
        self.capacity: dict[int, int] = {}
        self._last_snapshot: dict[int, int] = {}
        self._step_hook = None
        self._optimizer_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> its steps
        self._op_info: dict = {}  # op overload -> (name, runs on the device, out= names, integer-fp32 op)
        self.probe_errors: list[str] = []  # graphs whose values could not be read (reported, not raised)
        self._graph_values: dict = {}  # id(device graph) -> (graph, GraphValues): kept alive with its entry
        self.start_wall = 0.0

    # -- lifetime ------------------------------------------------------------------------------------------

    def __enter__(self) -> "Watch":
        self.start_wall = time.time()
        super().__enter__()
        for i in range(torch.neuron.device_count()):
            s = _memory.stats(i)
            self.base_allocated[i] = self.peak[i] = self._last_snapshot[i] = s.allocated
            self.capacity[i] = s.capacity
        self._step_hook = _optimizer.register_optimizer_step_post_hook(self._optimizer_step)
        self._compile_calls.start()
        self._unpatch = [_patch(torch.cuda, "is_available", _asking(self.device_choices, "torch.cuda.is_available()")),
                         _patch(torch.nn.Module, "to", _moving_modules(torch.nn.Module.to, self.module_moves)),
                         _patch(torch.nn.Module, _private.MODULE_APPLY,
                                self._converting_modules(getattr(torch.nn.Module, _private.MODULE_APPLY)))]
        safetensors_torch = _safetensors_torch()
        if safetensors_torch is not None:
            self._unpatch.append(_patch(safetensors_torch, "load_file",
                                        _loading_safetensors(safetensors_torch.load_file, self.safetensors_failures)))
        return self

    def __exit__(self, *exc) -> None:
        try:
            super().__exit__(*exc)
        finally:
            if _observe.dispatch is None:  # nobody else watches compiled fallback nodes
                _observe.compiled_source = None
            self._step_hook.remove()
            self._compile_calls.stop()
            for undo in reversed(self._unpatch):
                undo()
            self._read_dynamo()

    def step(self, kind: str = "marked") -> None:
        """One step of the user's program: marked steps win over optimizer steps, which win over tokens."""
        cur = self.step_kind
        if cur is not None and _PRIORITY[kind] < _PRIORITY[cur]:
            return
        if cur != kind:
            self.step_kind, self.steps = kind, 0
        self.steps += 1

    def _optimizer_step(self, optimizer, args, kwargs) -> None:
        """A step is one step of the optimizer that has stepped most: a GAN's two optimizers (or a model's
        several) stepping once each per iteration make one step, not two."""
        n = self._optimizer_steps.get(optimizer, 0) + 1
        self._optimizer_steps[optimizer] = n
        if self.step_kind != "optimizer" or n > self.steps:
            self.step("optimizer")

    def one_time(self, ev: Event) -> bool:
        """It happened in fewer than half the steps of a run of three or more: one-time or periodic work (a
        checkpoint, an evaluation every N steps), not a cost of every step. (Half is not fewer: a program with
        two optimizers steps twice per iteration.) Tokens are counted after each generate() call, not as each
        is made: no token-level answer."""
        return self.step_kind != "token" and self.steps >= 3 and ev.steps_seen * 2 < self.steps

    def _seen(self, ev: Event) -> Event:
        """Count one occurrence, and the step it happened in."""
        ev.count += 1
        if ev.last_step != self.steps:
            ev.last_step = self.steps
            ev.steps_seen += 1
        return ev

    # -- what the profiling session sees, with the user's line ----------------------------------------------

    def host_op(self, name, fallback, fn, fargs, dev_args):
        site = user_site()
        st0 = self.ops.get(name)
        before = (st0.seconds, st0.to_host, st0.to_device, st0.read, st0.written) if st0 else (0.0, 0, 0, 0, 0)
        res = super().host_op(name, fallback, fn, fargs, dev_args)
        st = self.ops[name]
        if fallback:
            ev = self.fallback_sites[(name, site)]
            ev.to_host += st.to_host - before[1]
            ev.to_device += st.to_device - before[2]
        else:
            base = name.split(".", 1)[0]
            if base not in _SHAPE_OPS or (base == "aten::index" and not _bool_index(dev_args)):
                return res  # the emulator ran it at once (no shape function); the device would queue it
            # a device op whose output shape depends on values: the host waits for it
            ev = self.sync_sites[("shape:" + name, site)]
            ev.to_host += st.read - before[3]
        self._seen(ev)
        d = st.seconds - before[0]
        ev.seconds += d
        ev.fastest = d if ev.count == 1 else min(ev.fastest, d)
        return res

    def transfer(self, kind, nbytes, seconds):
        super().transfer(kind, nbytes, seconds)
        if kind != "device_to_host":
            return
        site = user_site()
        lib = library_call()
        # a sync inside torch.save or an optimizer's step is that library's, reported as such at the user's call
        kind = _sync_kind(site) if lib is None else f"{lib[0]}:{lib[1]}"
        ev = self._seen(self.sync_sites[(kind, site)])
        ev.seconds += seconds
        ev.to_host += nbytes

    # -- the device's other events ---------------------------------------------------------------------------

    def dispatch(self, op, args, kwargs, run):
        info = self._op_info.get(op)
        if info is None:
            rec = _schema.record_for(op)
            # Written arguments (in place, out=) are not cast by the device's policy, only read inputs are.
            outs = {rec.kwnames[i - rec.npos] for i in rec.mutable if i >= rec.npos}
            written = frozenset(i for i in rec.mutable if i < rec.npos)
            info = self._op_info[op] = (rec, rec.name, rec.route == "native", outs, written,
                                        _schema.op_base_name(op) in INT_FP32_OPS, _private.scalar_args(op))
        rec, name, native, outs, written, int_fp32, (scalar_pos, scalar_names) = info
        self.dispatched += 1
        site = user_site() if native else None
        if native:
            self.launch_sites[site] += 1
        origin = None
        full = rec.normalise(args, kwargs) if native else None
        plan = _policy.plan(rec, full) if native else None  # the inputs the device narrows (none in a fallback)
        if plan is not None and (plan.narrow or plan.indices):
            # the values it computes with: its Scalar arguments (not its int ones: dims, ignore_index=-100)
            scalars = [abs(args[i]) for i in scalar_pos if i < len(args) and type(args[i]) is int]
            scalars += [abs(v) for k, v in kwargs.items() if k in scalar_names and type(v) is int]
            origin = self._inputs(name, native, [full[i] for i in plan.narrow + plan.indices], {}, scalars, site)
        elif self._wide_origin:  # float64 computed as it is (a CPU fallback, 0-d): its results keep its line
            origin = next((m for t in _tensors([a for j, a in enumerate(args) if j not in written])
                           if _narrowed_float(t.dtype) and (m := self._made(t)) is not None), None)
        try:
            res = run()
        except Exception as e:
            if self.failed is None or self.failed[2] is not e:  # the innermost op that raised it
                self.failed = (name, site or user_site(), e)
            raise
        self._track_wide(res, origin)
        if int_fp32:
            self._int_fp32(name, op, args, res)
        if self.shadows is not None:
            self.shadows.after(name, op, args, kwargs, res, user_site(),
                               [a for i, a in enumerate(args) if i in written] + [kwargs[k] for k in outs if k in kwargs])
        return res

    def _inputs(self, name, native, args, kwargs, scalars, site) -> Site | None:
        """Record the int64 and float64 device inputs of one op; the line that made its first float64 input."""
        site = site or user_site()
        cast = origin = None
        wide = []
        for t in _tensors((*args, *kwargs.values())):
            if t.device.type != _memory.DEVICE:
                continue
            if t.dtype is torch.int64 and t.dim() != 0:
                if not native:  # a CPU fallback computes in int64: nothing is cast
                    continue
                if cast is None:  # one per call, however many int64 inputs
                    cast = self.cast_sites[(name, site)]
                    cast.count += 1
                if t.numel():
                    _queue.drain()  # its value is needed now
                    h = _memory.host_view(t)
                    cast.max_value = max(cast.max_value, abs(int(h.max())), abs(int(h.min())))
            elif t.dim() != 0 and _narrowed_float(t.dtype):
                wide.append(t)
        if wide:  # counted once per call, with the lines that made its float64 inputs (where the hook saw them)
            ev = self.wide_sites[(name, site)]
            ev.count += 1
            for t in wide:
                made = self._made(t)
                if made is not None:
                    origin = origin or made
                    ev.where[made] = ev.where.get(made, 0) + 1
                ev.dtypes.add(str(t.dtype).replace("torch.", ""))
            if origin is None:  # made where the check could not see (a copy, an autograd buffer): this line
                origin = site
                ev.where[site] = ev.where.get(site, 0) + 1
        if cast is not None:  # Python ints and 0-d int64 tensors combined with cast inputs compute in int32 too
            scalars = scalars + [abs(int(a.item())) for a in args if isinstance(a, torch.Tensor) and a.dim() == 0
                                 and a.dtype is torch.int64 and a.device.type == "cpu"]
            if scalars:
                cast.max_value = max(cast.max_value, *scalars)
        return origin

    def _track_wide(self, res, origin) -> None:
        """Float64 device results remember the line that made their values: their first float64
        input's, or (made from none: a cast, a dtype=, a copy to the device) the line that ran this op. A
        tensor made empty (`empty_like` in a clone, an out= buffer) takes the line of the values first written
        into it."""
        for t in _tensors(res if isinstance(res, (list, tuple)) else (res,)):
            if not _narrowed_float(t.dtype) or t.device.type != _memory.DEVICE:
                continue
            key = id(t)
            hit = self._wide_origin.get(key)
            if hit is not None and hit[0]() is t and not (hit[2] and origin is not None):
                continue  # written in place: it keeps the line that made its values
            site = origin if origin is not None else user_site()
            if origin is None and hit is None:
                seen = self._wide_storage.get(_storage(t))
                if seen is not None:  # a view of a tensor made elsewhere: its base's line
                    site, origin = seen, seen
                else:
                    self.wide_made[site] += 1
            ref = hit[0] if hit is not None and hit[0]() is t else \
                weakref.ref(t, lambda _, key=key, table=self._wide_origin: table.pop(key, None))
            self._wide_origin[key] = (ref, site, origin is None)
            self._wide_storage[_storage(t)] = site

    def _made(self, t) -> Site | None:
        """The line that made a float64 device tensor's values: its own, or its storage's (a view)."""
        hit = self._wide_origin.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        return self._wide_storage.get(_storage(t))

    def _converting_modules(self, real):
        """nn.Module's conversion (`.double()`, `.to(...)`) that marks the float64 parameters and buffers it
        leaves with the user's line that made them float64 (the copies it makes do not all pass the dispatch
        hook); a parameter already marked keeps its line when the model moves to the device."""
        depth = [0]

        def _apply(module, fn, *args, **kwargs):
            if depth[0]:
                return real(module, fn, *args, **kwargs)
            before = {n: self._wide_origin.get(id(t)) for n, t in _named_tensors(module)}
            depth[0] += 1
            try:
                res = real(module, fn, *args, **kwargs)
            finally:
                depth[0] -= 1
            site = None
            for n, t in _named_tensors(module):
                if not _narrowed_float(t.dtype):
                    continue
                hit = before.get(n)
                made = hit[1] if hit is not None and not hit[2] else (site := site or user_site())
                if hit is None or hit[2]:
                    self.wide_models[made] += 1
                key = id(t)
                ref = weakref.ref(t, lambda _, key=key, table=self._wide_origin: table.pop(key, None))
                self._wide_origin[key] = (ref, made, False)
                if t.device.type == _memory.DEVICE:
                    self._wide_storage[_storage(t)] = made
            return res

        _apply.__wrapped__ = real
        return _apply

    def _int_fp32(self, name, op, args, res) -> None:
        out = res if isinstance(res, torch.Tensor) else (args[0] if args and isinstance(args[0], torch.Tensor) else None)
        if out is None or out.dtype not in _INT_DTYPES or out.device.type != _memory.DEVICE or not out.numel():
            return
        _queue.drain()
        h = _memory.host_view(out)
        ev = self.int_fp32_sites[(name, user_site())]
        ev.count += 1
        ev.max_value = max(ev.max_value, abs(int(h.max())), abs(int(h.min())))
        ev.dtypes.add(str(out.dtype).replace("torch.", ""))

    def alloc(self, block) -> None:
        self.allocations += 1
        i = block.index
        if block.nbytes >= self.alloc_threshold:
            self.blocks[block] = user_site()
        allocated = _memory.stats(i).allocated
        if allocated > self.peak.get(i, 0):
            self.peak[i] = allocated
            # A snapshot of the largest live tensors at each 2% of growth: the last one is the peak's.
            if allocated >= self._last_snapshot.get(i, 0) * 1.02 or i not in self.peak_snapshot:
                self._last_snapshot[i] = allocated
                live = sorted(((b.nbytes, s) for b, s in list(self.blocks.items()) if b.index == i),
                              key=lambda x: -x[0])[: self.top_tensors]
                self.peak_snapshot[i] = Snapshot(allocated, live)

    def collective(self, kind, tensors, world) -> None:
        c = self.collective_sites[(kind, user_site())]
        c.calls += 1
        c.bytes += max((sum(t.numel() * t.element_size() for t in _tensors([a])) for a in tensors), default=0)
        c.world = max(c.world, world)

    def graph(self, kind, shapes) -> None:
        def_site, call = compiled_call_sites()
        site = def_site or call  # shapes are counted per compiled function
        seen = self.compiled_shapes[site]
        seen[(kind, shapes)] = seen.get((kind, shapes), 0) + 1
        if call is not None and kind != "backward":
            calls = self.compiled_calls[site]
            calls[call] = calls.get(call, 0) + 1


    # -- Dynamo's own record (graph breaks, recompiles, compile time per frame) ------------------------------

    def _compile_start(self, args) -> None:
        cid = getattr(args, "compile_id", None)  # Dynamo's CallbackArgs: the frame compile starting now
        sites = compiled_call_sites()
        if cid is not None:
            self.compile_sites[str(cid)] = sites
        self._compile_calls.frame_compiling(sites[1])  # a compiled function's torch.compile call, at its first frame
        self._read_dynamo()
        super()._compile_start(args)

    def _read_dynamo(self) -> None:
        for m in _private.dynamo_compilation_metrics():
            if m.compile_id and m.start_time_us and m.start_time_us / 1e6 >= self.start_wall - 1.0:
                self.dynamo_metrics[m.compile_id] = m

    # -- which compiled graph / kernel each queue entry runs (for the estimate's kernel count and FLOPs) ------

    def run(self, kind, name, fn, args):
        res = super().run(kind, name, fn, args)
        src, is_kernel = self.sources[name]
        if src is not None and not is_kernel:
            try:
                self._graph_launch(src, fn, args, res)
            except Exception as e:  # noqa: BLE001 - a probe must never fail the user's program
                self._graph_values[id(src)] = (src, None)
                self.probe_errors.append(f"{name}: {type(e).__name__}: {e}")
        return res

    def _graph_launch(self, gm, fn, args, res) -> None:
        """A compiled graph ran (on the device's queue): read its int64 / integer-fp32 values (graph_values)."""
        hit = self._graph_values.get(id(gm))
        if hit is None:
            hit = self._graph_values[id(gm)] = (gm, GraphValues(gm, INT_FP32_OPS))
        gv = hit[1]
        if gv is None or not gv.probes:
            return
        if fn.__name__ == "run":  # a queued launch: (host inputs, host outputs it wrote)
            inputs, outputs = args
        else:  # a launch run at once: its results
            inputs, outputs = args, res if isinstance(res, (list, tuple)) else (res,)
        for probe, v in gv.values(inputs, outputs):
            if probe.kind == "int64":
                ev = self.graph_int64_sites[(probe.name, probe.site)]
            else:
                ev = self.int_fp32_sites[(probe.name + " (compiled)", probe.site)]
                ev.dtypes.add(str(v.dtype).replace("torch.", ""))
            ev.count += 1
            if v.numel():
                ev.max_value = max(ev.max_value, abs(int(v.max())), abs(int(v.min())))


def _bool_index(args) -> bool:
    """`x[mask]`: an index with a boolean tensor in it."""
    idx = args[1] if len(args) > 1 else None
    return isinstance(idx, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.dtype is torch.bool for t in idx)


def _narrowed_float(dtype) -> bool:
    """A floating dtype the device computes narrower (float64 as float32: `policy.is_narrowed`; int64 is
    followed apart, by its values). Complex tensors it computes as they are."""
    return dtype.is_floating_point and _policy.is_narrowed(dtype)


def _tensors(items):
    for a in items:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)


def _sync_kind(site: Site | None) -> str:
    """What made the host wait, from the user's line (and the stack, for printing)."""
    import sys

    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.endswith("_tensor_str.py") or f.f_code.co_name in ("__repr__", "__format__"):
            return "print"
        f = f.f_back
    text = site.code() if site is not None else ""
    stripped = text.lstrip()
    if ".item()" in text:
        return "item"
    if ".tolist()" in text:
        return "tolist"
    if stripped.startswith(("if ", "elif ", "while ", "assert ")) or " if " in text:
        return "branch"
    if "print(" in text:
        return "print"
    return "copy"


def _storage(t) -> int:
    return t.untyped_storage().data_ptr()


def _named_tensors(module):
    yield from module.named_parameters()
    yield from module.named_buffers()


def _patch(owner, name: str, replacement):
    """Set `owner.name` for the check's lifetime; the function that undoes it."""
    real = getattr(owner, name)
    setattr(owner, name, replacement)

    def undo():
        if getattr(owner, name) is replacement:
            setattr(owner, name, real)

    return undo


def _asking(answers: dict, what: str):
    """A wrapper of a device-selection question (`torch.cuda.is_available`) that records each user line that
    asks it and the answer: why a program stayed on the CPU. PyTorch's own calls are not recorded."""
    import sys

    from .source import _is_internal

    real = torch.cuda.is_available

    def asked(*args, **kwargs):
        answer = real(*args, **kwargs)
        f = sys._getframe(1)
        if not _is_internal(f.f_code) and len(answers) < 20:
            asker = f"{f.f_code.co_filename}:{f.f_lineno}"
            answers.setdefault(program_site(), (what, answer, asker))
        return answer

    asked.__wrapped__ = real
    return asked


def _safetensors_torch():
    import importlib.util

    if importlib.util.find_spec("safetensors") is None:
        return None
    import safetensors.torch

    return safetensors.torch


def _loading_safetensors(real, failures: list):
    """`safetensors.torch.load_file` that records a load onto the device failing inside safetensors (it knows
    cpu / cuda / mps / xpu / npu, not `neuron`, which the real device's name is too)."""

    def load_file(filename, device="cpu"):
        try:
            return real(filename, device=device)
        except Exception as e:
            if str(device).startswith(_memory.DEVICE):
                failures.append((user_site(), str(device), f"{type(e).__name__}: {e}"))
            raise

    load_file.__wrapped__ = real
    load_file.__doc__ = real.__doc__
    return load_file


def _moving_modules(real, moves: dict):
    """`nn.Module.to` that records each move of a model to the CPU, with the line that asked (a library's, such
    as the Hugging Face Trainer placing the model on `TrainingArguments.device`) and the user's line under it."""
    import sys

    def to(self, *args, **kwargs):
        device = kwargs.get("device", args[0] if args else None)
        if isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu" and len(moves) < 20:
            f = sys._getframe(1)
            moves.setdefault((f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})", program_site()),
                             str(device))
        return real(self, *args, **kwargs)

    to.__wrapped__ = real
    to.__doc__ = real.__doc__
    return to
