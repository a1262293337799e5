"""@nki.jit: an NKI kernel traced once per input signature into a graph of torch operations over its tiles,
compiled by Inductor through the compiled-graph cache on disk (the guide's NKI trace cache), and launched on
the emulated device like any kernel. A launch runs the compiled code; no Python interprets instructions.

Tracing runs the kernel's Python twice per signature: first on meta tensors, where every limit is checked
(one NkiError naming the instruction, the kernel's line, the value and the limit) and the outputs' shapes are
learnt; then under make_fx with the outputs as inputs, which records the graph that is compiled.

A kernel whose control flow depends on a value read at run time (a loop bounded by, or a `while` / `if` on, a
register filled by nisa.register_load) has no one graph: the checking pass notes it (and runs such loops no
times), and that signature runs interpreted instead, instruction by instruction on each launch's values (the
nki.simulate path), its limits checked there, with one NkiWarning per signature. Its outputs' shapes are the
checking pass's (allocated outside such loops: torch.compile's fake tensors still get them)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import sys
import time
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from .. import settings
from ..compiler import cache, metrics
from ..compiler.lowering import COMPILER_VERSION, compile_cached
from ..device import memory, observe, queue, tracking
from . import cost, fusion, hazards, limits, order, programs, rolling, trace
from ._private import fx_graph, is_fake
from .dtypes import to_numpy, to_tensor
from .tensor import NkiTensor, Storage, hbm, new_trace, view_of

NKI_VERSION = "nativelab-nki 2"  # bump when tracing changes the graphs it records
DEVICE = memory.DEVICE
_CPU = torch.device("cpu")


@functools.lru_cache(maxsize=None)
def _parameters(fn) -> inspect.Signature:
    return inspect.signature(fn)  # ~10 us each time: once per kernel function


class _Signature:
    """What a trace depends on: the grid, each tensor argument's shape and dtype (a list or tuple of tensors,
    nkilib's per-layer weights, counts each element), every other value."""

    def __init__(self, fn, grid, args, kwargs):
        self.fn = fn
        self.bound = _parameters(fn).bind(*args, **kwargs)
        self.names = list(self.bound.arguments)
        self.values = list(self.bound.arguments.values())
        # where each tensor is: (argument, None) for a tensor argument, (argument, j) for element j of a list
        self.tensor_pos = []
        statics = []
        for i, (n, v) in enumerate(zip(self.names, self.values)):
            if isinstance(v, torch.Tensor):
                self.tensor_pos.append((i, None))
            elif isinstance(v, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in v):
                self.tensor_pos += [(i, j) for j, e in enumerate(v) if isinstance(e, torch.Tensor)]
                statics.append((n, type(v).__name__, tuple(None if isinstance(e, torch.Tensor) else repr(e) for e in v)))
            else:
                statics.append((n, repr(v)))
        self.tensors = [self.values[i] if j is None else self.values[i][j] for i, j in self.tensor_pos]
        # int(): under torch.compile with dynamic shapes, specialise (a kernel is traced per concrete shape)
        self.shapes = [tuple(int(d) for d in t.shape) for t in self.tensors]
        # the target core (NEURON_PLATFORM_TARGET_OVERRIDE) decides which instructions exist: a trace per target
        self.key = (tuple(grid), tuple(zip(self.shapes, (t.dtype for t in self.tensors))), tuple(statics),
                    limits.target_version())

    def tensor_name(self, k: int) -> str:
        """The k-th tensor's argument name (`weights[2]` for an element of a list)."""
        i, j = self.tensor_pos[k]
        return self.names[i] if j is None else f"{self.names[i]}[{j}]"

    def call(self, fn, hbm_inputs):
        """fn(*arguments) with the tensors replaced by `hbm_inputs` (keywords stay keywords, lists lists)."""
        bound = inspect.BoundArguments(self.bound.signature, dict(self.bound.arguments))
        lists = {}
        for (i, j), t in zip(self.tensor_pos, hbm_inputs):
            if j is None:
                bound.arguments[self.names[i]] = t
            else:
                lists.setdefault(i, list(self.values[i]))[j] = t
        for i, items in lists.items():
            bound.arguments[self.names[i]] = type(self.values[i])(items)
        return fn(*bound.args, **bound.kwargs)


class _Traced:
    """One signature's compiled kernel: output specs, which arguments it writes, how to build the result."""

    def __init__(self, out_specs, written_inputs, result_spec, instructions, peak, interpreted=None, loops=(),
                 storages=None):
        self.out_specs = out_specs  # [(shape, dtype)] of the kernel's HBM allocations
        self.interpreted = interpreted  # why every launch runs interpreted (control flow on runtime data), or None
        self.runs = 0  # interpreted launches so far (the first one warns)
        self.written_inputs = written_inputs  # positions (among tensor arguments) the kernel writes
        self.result_spec = result_spec
        self.instructions = instructions
        self.peak = peak  # peak SBUF / PSUM bytes live at once on a core, over all partitions (trace.Occupancy)
        self.loops, self.storages = loops, storages or {}  # what the hazard checker reads besides instructions
        self.hazards: list | None = None  # the races found when traced (nki/hazards.py), None if not checked
        self.launch = None
        self.source = None
        self.launched = False  # launched once already (interpreted: NATIVELAB_NKI_FIRST_CALL)
        self.lowering_checked = False  # a lowering's result matched the kernel's once (then only copied)
        self._estimates: dict = {}  # cost.Target -> its Estimate
    def estimate(self, name: str, target: cost.Target = cost.NEURONCORE_V3) -> cost.Estimate:
        """This signature's estimate on `target`, computed once per target."""
        if target not in self._estimates:
            self._estimates[target] = cost.estimate(name, self.instructions, target, self.storages)
        return self._estimates[target]


def _run(fn, sig: _Signature, tensors, tr: trace.Trace):
    """Run every program instance of the grid (SPMD) inside trace `tr`: one after another, or, for an
    LNC-2 launch whose programs wait for each other (sendrecv, core_barrier), switching between them at
    each rendezvous (nki/programs.py)."""
    new_trace()
    inputs = [NkiTensor(Storage(t, hbm, sig.tensor_name(k), input_index=k)) for k, t in enumerate(tensors)]
    tr.launch = programs.Launch(tr)
    trace._current.append(tr)
    try:
        result = tr.launch.run(lambda pid: sig.call(fn, inputs))
    finally:
        trace._current.pop()
    if tr.fuser is None and tr.order is None:  # in program order (the compile pass defers matmuls; an order check
        tr.check_capacity()  # reorders iterations): the tiles fit the memories they are live in together
    return result, inputs


def _result_spec(result, tr: trace.Trace, inputs):
    """How the kernel's return value maps to its HBM allocations (("out", j)) or arguments (("in", k))."""
    if result is None:
        return None
    if isinstance(result, (tuple, list)):
        return type(result).__name__, [_result_spec(r, tr, inputs) for r in result]
    if isinstance(result, dict):
        return "dict", {k: _result_spec(v, tr, inputs) for k, v in result.items()}
    if isinstance(result, NkiTensor):
        for j, st in enumerate(tr.outputs):
            if result.storage is st:  # the tensor, or a view of it (a reshape): the caller gets that view
                return "out", (j, result.chain)
        for k, t in enumerate(inputs):
            if result.storage is t.storage:
                return "in", (k, result.chain)
        raise limits.NkiError(f"nki: the kernel returns {result!r}, which is not in HBM: store it into an "
                              f"nl.shared_hbm tensor and return that")
    return "value", result


def _build_result(spec, outs, ins):
    if spec is None:
        return None
    kind, v = spec
    if kind in ("out", "in"):
        index, chain = v
        t = (outs if kind == "out" else ins)[index]
        return view_of(t, chain) if chain else t
    if kind == "value":
        return v
    if kind == "dict":
        return {k: _build_result(s, outs, ins) for k, s in v.items()}
    seq = [_build_result(s, outs, ins) for s in v]
    return tuple(seq) if kind == "tuple" else seq


_PLAIN = (int, float, bool, str, type(None))


def _launch_key(args, kwargs) -> tuple | None:
    """A launch's arguments as a key (each tensor's shape, dtype, device and contiguity; each plain value
    with its type; a list or tuple of them item by item; keywords by name, in the order given): what the full
    signature (`_Signature`, ~10 us plus ~1 us a tensor) depends on, for real tensors; None when the arguments
    need the full one (NumPy arrays, fake tensors, other objects)."""
    key = []
    for a in itertools.chain(args, kwargs.values()):
        k = _value_key(a)
        if k is None:
            if type(a) not in (list, tuple):
                return None
            items = []
            for e in a:  # the step kernel's lists: ~70 tensors at every launch, so written out, not mapped
                if type(e) is _TENSOR and not is_fake(e):
                    items.append((e.shape, e.dtype, e.device, e.is_contiguous()))
                else:
                    ek = _value_key(e)
                    if ek is None:
                        return None
                    items.append(ek)
            k = (type(a), tuple(items))
        key.append(k)
    return (tuple(key), tuple(kwargs)) if kwargs else tuple(key)


_TENSOR = torch.Tensor


def _value_key(a) -> tuple | None:
    if isinstance(a, torch.Tensor):
        return None if is_fake(a) else (a.shape, a.dtype, a.device, a.is_contiguous())
    if type(a) in _PLAIN:
        return (type(a), a)
    return None


def _tensor_places(sig: _Signature, n_args: int, kwargs) -> list | None:
    """Where each of the signature's tensors is in a launch's (args, kwargs): (a position, or a keyword's
    name; None, or its index in that list argument); None if one is inside *args / **kwargs (the full
    signature then)."""
    params = list(_parameters(sig.fn).parameters.values())
    places = []
    for i, item in sig.tensor_pos:
        name = sig.names[i]
        if name in kwargs:
            places.append((name, item))
            continue
        j = next((j for j, q in enumerate(params) if q.name == name), None)
        if j is None or j >= n_args or params[j].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                               inspect.Parameter.POSITIONAL_OR_KEYWORD):
            return None
        places.append((j, item))
    return places


def _placed(args, kwargs, places) -> list:
    """The tensors at `places` (_tensor_places) in a launch's (args, kwargs)."""
    out = []
    for w, j in places:
        a = kwargs[w] if type(w) is str else args[w]
        out.append(a if j is None else a[j])
    return out


class Lowering(NamedTuple):
    """A kernel's declared lowering (JitKernel.lowering): what runs, which launches it takes, where it runs."""
    fn: Callable
    accepts: Callable | None
    on: str  # "host" or "device"


class JitKernel:
    """An @nki.jit kernel; `kernel[grid]` launches it over an SPMD grid (`nl.program_id(axis)`)."""

    def __init__(self, fn, grid=(), traces=None, launches=None, lowerings=None, **options):
        self.fn = fn
        self.grid = grid
        self.options = options
        self.name = getattr(fn, "__qualname__", repr(fn))
        self._traces = traces if traces is not None else {}
        # (grid, target core, lowering on, _launch_key) -> (traced, where its tensors are, its lowering or None):
        # a known launch skips the rest
        self._launches = launches if launches is not None else {}
        self._lowerings = lowerings if lowerings is not None else {}  # "host" -> its Lowering: see lowering()
        self._grids: dict = {}  # kernel[grid] objects, made once per grid (`kernel[g](...)` at every launch)
        self._label = f"kernel:{self.name}"
        if options.get("first_call") not in (None, "interpret", "compile"):
            raise ValueError(f"nki: kernel {self.name}: first_call must be 'interpret' or 'compile', "
                             f"got {options['first_call']!r}")
        self.last_estimate = None  # the latest launch's estimate, once computed (NATIVELAB_NKI_PROFILE=1, estimate())
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid) -> "JitKernel":
        k = self._grids.get(grid) if isinstance(grid, (int, tuple)) else None
        if k is not None:
            return k
        key = grid
        grid = (grid,) if isinstance(grid, int) else tuple(int(g) for g in grid)
        for g in grid:
            if g < 1:
                raise ValueError(f"nki: kernel {self.name}: grid sizes must be >= 1, got {grid}")
        k = JitKernel(self.fn, grid, self._traces, self._launches, self._lowerings, **self.options)
        if isinstance(key, (int, tuple)):
            self._grids[key] = k
        return k

    @torch.compiler.disable  # Dynamo does not trace into a kernel: it is one opaque call (use @nki_op)
    def __call__(self, *args, **kwargs):
        if trace.active() is not None:  # called from inside a kernel: its body runs inline, as on the chip
            return self.fn(*args, **kwargs)
        key = _launch_key(args, kwargs)
        lowering_on = settings.NKI_LOWER.get()
        known = self._launches.get((self.grid, limits.target_version(), lowering_on, key)) if key is not None else None
        if known is not None:
            traced, places, lowering = known
            tensors = _placed(args, kwargs, places)
            if lowering is not None:  # on the device: its tensors are the arguments themselves (all contiguous)
                call = _direct_call(args, kwargs) if lowering.on == "device" else _host_call(args, kwargs, places)
                return self._launch_lowered(traced, lowering, call, tensors, False)
            return self._launch(traced, tensors, False)
        numpy_mode, args, kwargs = _from_numpy(args, kwargs)
        sig = _Signature(self.fn, self.grid, args, kwargs)
        tensors = sig.tensors
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"nki: kernel {self.name}: all tensors must be on one device, got "
                             f"{sorted(map(str, devices))}")
        device = next(iter(devices)) if devices else torch.device("cpu")
        traced = self._traces.get(sig.key)
        if traced is None:
            traced = self._traces[sig.key] = self._trace(sig)
        if any(is_fake(t) for t in tensors) or device.type == "meta":
            outs = [torch.empty(s, dtype=d, device=device) for s, d in traced.out_specs]
            return _result(traced, outs, tensors, numpy_mode)
        if device.type not in (DEVICE, "cpu"):
            raise NotImplementedError(f"nki: kernel {self.name} runs on {DEVICE} and CPU tensors, got {device}")
        for k in traced.written_inputs:
            if not tensors[k].is_contiguous():
                raise ValueError(f"nki: kernel {self.name} writes argument {sig.tensor_name(k)!r}, "
                                 f"which is not contiguous: pass a contiguous tensor")
        contiguous = all(t.is_contiguous() for t in tensors)
        tensors = [t if t.is_contiguous() else t.contiguous() for t in tensors]
        if self.options.get("order") is not None:
            return _result(traced, self._order_check(sig, tensors, traced), tensors, numpy_mode)
        places = _tensor_places(sig, len(args), kwargs) if key is not None and contiguous and not numpy_mode else None
        lowering = self._lowering_for(traced, args, kwargs) if lowering_on else None
        if lowering is not None:
            if places is not None:  # the next launch like this one goes straight in
                self._launches[(self.grid, limits.target_version(), lowering_on, key)] = (traced, places, lowering)
            return self._launch_lowered(traced, lowering, sig.call, tensors, numpy_mode)
        if self.options.get("simulate") or traced.interpreted is not None or self._interprets_first(sig, traced):
            outs, est = self._simulate(sig, tensors, traced)
            if est is not None:
                self.last_estimate = est
            if observe.nki_launch is not None:
                observe.nki_launch(self.name, est if est is not None else traced.estimate(self.name))
            if device.type == DEVICE:
                tracking.count_executed(self._label)
            return _result(traced, outs, tensors, numpy_mode)
        if traced.launch is None:
            self._compile(sig, traced)
            if settings.NKI_PROFILE.get():
                print(traced.estimate(self.name).summary(), file=sys.stderr)
        if places is not None:  # the next launch like this one goes straight in
            self._launches[(self.grid, limits.target_version(), lowering_on, key)] = (traced, places, None)
        return self._launch(traced, tensors, numpy_mode)

    def lowering(self, fn=None, *, accepts=None, on: str = "host"):
        """Declare what this kernel runs on the host: `@kernel.lowering` over a function taking the kernel's own
        arguments and returning what the kernel returns (the same structure, shapes and dtypes), writing the
        arguments the kernel writes and no others. A launch on `neuron` or CPU tensors then checks the kernel
        as always (its trace: limits, hazards, the estimate every tool reads) and runs `fn` instead of the
        trace's compiled graph. It is how a library kernel runs at the speed of the tuned C++ it lowers to; its
        equality with the kernel is a test (tests/test_nki_lowering.py), and NATIVELAB_NKI_LOWER=0,
        nki.simulate, or nki.jit(lower=False) run the kernel's own code.

        `on="host"`: `fn` runs as one unit of the device's queue, on CPU tensors (host views of the device's
        memory), its result copied into the kernel's outputs. `on="device"`: `fn` runs at the launch, on the
        launch's own tensors, and returns tensors on their device; it may only launch library kernels
        (nativelab.kernels' wrap_kernel: each queues its own work, under this kernel's name) and take views, no
        other device op, so that what runs is this kernel's launch alone, and the Python of the next launch
        overlaps the work of this one. `accepts(*args, **kwargs)`: whether `fn` takes this launch, decided on
        shapes, dtypes and plain values only (a launch like an accepted one is accepted); one it refuses runs
        the traced code."""
        if on not in ("host", "device"):
            raise ValueError(f"nki: kernel {self.name}: a lowering runs on 'host' or 'device', got {on!r}")
        if fn is None:
            return lambda f: self.lowering(f, accepts=accepts, on=on)
        self._lowerings["host"] = Lowering(fn, accepts, on)
        return fn

    def _lowering_for(self, traced: _Traced, args, kwargs) -> Lowering | None:
        """The declared host lowering that runs this launch, or None (none declared, refused, or the kernel's
        own code asked for)."""
        lowering = self._lowerings.get("host")
        if lowering is None or traced.interpreted is not None or self.options.get("simulate"):
            return None
        if self.options.get("lower", True) is False:
            return None
        return lowering if lowering.accepts is None or lowering.accepts(*args, **kwargs) else None

    def _launch_lowered(self, traced: _Traced, lowering: Lowering, call, tensors, numpy_mode: bool):
        """Run the lowering into new outputs: `call(fn, host_tensors)` calls it with the launch's arguments,
        its tensors replaced by `host_tensors`; its result is copied into the outputs the kernel's result names
        (on="device": called with the launch's own tensors, its result is the launch's)."""
        self.last_estimate = traced._estimates.get(cost.NEURONCORE_V3)
        device = tensors[0].device if tensors else _CPU
        if lowering.on == "device":
            if observe.nki_launch is not None:  # the estimate is the kernel's, whatever computes its values
                observe.nki_launch(self.name, traced.estimate(self.name))
            with observe.launching_as(self._label):
                result = call(lowering.fn, tensors)
            if not traced.lowering_checked:  # its result's structure, shapes and dtypes, checked once
                metas = [torch.empty(s, dtype=d, device="meta") for s, d in traced.out_specs]
                _copy_result(self.name, _build_result(traced.result_spec, metas, tensors), result, copy=False)
                traced.lowering_checked = True
            return _to_numpy(result) if numpy_mode else result
        outs = [torch.empty(s, dtype=d, device=device) for s, d in traced.out_specs]
        n, name = len(tensors), self.name

        def run(*ts):
            if observe.nki_launch is not None:  # the estimate is the kernel's, whatever computes its values
                observe.nki_launch(name, traced.estimate(name))
            ins = ts[:n]
            with observe.launching_as(self._label):
                result = call(lowering.fn, ins)
            # its result's structure, shapes and dtypes checked once per signature, then only copied
            _copy_result(name, _build_result(traced.result_spec, ts[n:], ins), result,
                         check=not traced.lowering_checked)
            traced.lowering_checked = True

        if device.type == DEVICE:
            queue.launch("kernel", self._label, run, *tensors, *outs)
            tracking.count_executed(self._label)
        else:
            run(*tensors, *outs)
        return _result(traced, outs, tensors, numpy_mode)

    def _interprets_first(self, sig: _Signature, traced: _Traced) -> bool:
        """Whether this launch of a signature not yet compiled runs interpreted: its first launch does
        (NATIVELAB_NKI_FIRST_CALL=interpret, or jit(first_call="interpret")), unless the disk cache holds
        its compiled graph from an earlier process; the second launch compiles."""
        if traced.launch is not None or traced.launched:
            return False
        traced.launched = True
        if (self.options.get("first_call") or settings.NKI_FIRST_CALL.get()) == "compile":
            return False
        graph_key = cache.read(self._index_key(sig))
        return graph_key is None or not cache.entry_path(graph_key.decode()).exists()

    def _index_key(self, sig: _Signature) -> str:
        """Where the disk cache notes the graph this signature compiled to (read before tracing it again)."""
        h = hashlib.sha256(b"nki launch index")
        for part in (NKI_VERSION, COMPILER_VERSION, torch.__version__, self.name, repr(sig.key), _source_id(self.fn),
                     repr(sorted((k, repr(v)) for k, v in self.options.items() if k != "first_call"))):
            h.update(part.encode())
        return h.hexdigest()

    def _launch(self, traced: _Traced, tensors, numpy_mode: bool):
        """Run the compiled kernel on these (contiguous, same-device) tensors into new outputs."""
        self.last_estimate = traced._estimates.get(cost.NEURONCORE_V3)  # the default target's, once computed
        device = tensors[0].device if tensors else _CPU
        outs = [torch.empty(s, dtype=d, device=device) for s, d in traced.out_specs]
        if device.type == DEVICE:
            queue.launch("kernel", self._label, traced.launch, *tensors, *outs)
            tracking.count_executed(self._label)
        else:
            traced.launch(*tensors, *outs)
        return _result(traced, outs, tensors, numpy_mode)

    def estimate(self, *args, **kwargs) -> cost.Estimate:
        """The estimated NeuronCore-v3 time and engine timeline of a launch with these arguments (traced,
        not run): `.summary()`, `.busy`, `.bound`, `.save_trace(path)` (Chrome / Perfetto). `target=
        nki.cost.NEURONCORE_V2` (a keyword argument holding a cost.Target) times it on a NeuronCore-v2 (trn1)."""
        target = kwargs.pop("target") if isinstance(kwargs.get("target"), cost.Target) else cost.NEURONCORE_V3
        _, args, kwargs = _from_numpy(args, kwargs)  # the arguments a launch takes, NumPy arrays too
        sig = _Signature(self.fn, self.grid, args, kwargs)
        traced = self._traces.get(sig.key)
        if traced is None:
            traced = self._traces[sig.key] = self._trace(sig)
        if traced.interpreted is not None:  # its instructions depend on the values: run it on copies of them
            if any(is_fake(t) or t.device.type == "meta" for t in sig.tensors):
                raise limits.NkiError(f"nki: kernel {self.name} runs interpreted ({traced.interpreted}): its "
                                      f"estimate needs tensors with values")
            return self._simulate(sig, [t.detach().cpu().clone() for t in sig.tensors], traced, estimate=True,
                                  target=target)[1]
        return traced.estimate(self.name, target)

    def _trace(self, sig: _Signature) -> _Traced:
        """Pass 1, on meta tensors: check the kernel against the hardware's limits, learn its outputs."""
        metas = [torch.empty(s, dtype=t.dtype, device="meta") for s, t in zip(sig.shapes, sig.tensors)]
        tr = trace.Trace(self.name, self.grid, device="meta")
        result, inputs = _run(self.fn, sig, metas, tr)
        spec = _result_spec(result, tr, inputs)
        out_specs = [(st.shape, st.dtype) for st in tr.outputs]
        if tr.runtime_control is not None and not self.options.get("simulate"):
            warnings.warn(f"nki: kernel {self.name} runs interpreted for this signature ({_describe(sig)}): "
                          f"{tr.runtime_control}; every launch executes its instructions one by one "
                          f"on CPU copies of its tensors (slower than a compiled launch)", limits.NkiWarning,
                          stacklevel=4)
        traced = _Traced(out_specs, sorted(tr.written_inputs), spec, tr.instructions, dict(tr.peak_bytes),
                         tr.runtime_control, tr.loops, tr.storages)
        traced.loop_starts, traced.loop_ends = tr.loop_starts, tr.loop_ends  # where the recording pass rolls loops
        self._check_hazards(traced, tr, sig)
        return traced

    def _find_hazards(self, traced: _Traced, tr, sig: _Signature | None, budget: int | None) -> tuple[list, bool]:
        """hazards.find on the trace `tr`; where two programs write the same HBM elements and the launch's tensors
        have values, on one run of them (interpreted, on copies) that keeps what each write left, so that a WAW
        of equal values is told apart from a race on values."""
        found, stopped = hazards.find(tr.instructions, tr.loops, tr.storages, self.grid, budget)
        if sig is None or getattr(tr, "capture", None) is not None or not any(
                h.kind == "WAW" and h.loop.startswith("the launch grid") for h in found) or any(
                is_fake(t) or t.device.type == "meta" for t in sig.tensors):
            return found, stopped
        real = self._interpret(sig, [t.detach().cpu().clone() for t in sig.tensors], traced, True, False, capture=True)
        return hazards.find(real.instructions, real.loops, real.storages, self.grid, budget)

    def _check_hazards(self, traced: _Traced, tr: trace.Trace, sig: _Signature | None = None) -> None:
        """Once per signature: the races between affine_range iterations (and programs) in the trace's
        accesses, each a warning (strict: one error); see nki/hazards.py."""
        how = hazards.mode(self.options.get("check"))
        if how == "off":
            return
        found, stopped = self._find_hazards(traced, tr, sig, hazards.AUTO_BUDGET if how == "auto" else None)
        traced.hazards = found
        if stopped:
            metrics.log.info("nki kernel %s: the hazard checker stopped at its budget of %d elements "
                             "(NATIVELAB_NKI_HAZARDS=full or nki.jit(check='hazards') checks all)",
                             self.name, hazards.AUTO_BUDGET)
        hazards.report(found, strict=how == "strict")

    def hazards(self, *args, **kwargs) -> list:
        """The races (nki/hazards.py's Hazard) in a launch with these arguments, all of them (no budget):
        traced, not run; an empty list for a race-free kernel."""
        _, args, kwargs = _from_numpy(args, kwargs)  # the arguments a launch takes, NumPy arrays too
        sig = _Signature(self.fn, self.grid, args, kwargs)
        traced = self._traces.get(sig.key)
        if traced is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", hazards.HazardWarning)
                traced = self._traces[sig.key] = self._trace(sig)
        return self._find_hazards(traced, traced, sig, None)[0]

    def _simulate(self, sig: _Signature, tensors, traced: _Traced, estimate: bool = False,
                  target: cost.Target = cost.NEURONCORE_V3):
        """Interpret the kernel instruction by instruction on CPU copies (nki.simulate, and every launch of a
        signature whose control flow depends on runtime values; no graph, no compile). Written arguments are
        copied back. Returns the outputs and, for a signature that runs interpreted, this launch's estimate
        (when watched, profiled or asked for): its instructions are the ones this launch's values issued."""
        host = [t.cpu() if t.device.type != "cpu" else t for t in tensors]
        interpreted = traced.interpreted is not None
        first = interpreted and not traced.runs
        traced.runs += interpreted
        tr = self._interpret(sig, host, traced, interpreted, first)
        if first:  # the checking pass ran no iterations of its runtime loops: this run's accesses are checked
            self._check_hazards(traced, tr, sig)
        for k, (t, h) in enumerate(zip(tensors, host)):
            if h is not t:
                t.copy_(h)
        device = tensors[0].device if tensors else torch.device("cpu")
        est = None
        if interpreted and (estimate or observe.nki_launch is not None or settings.NKI_PROFILE.get()):
            est = cost.estimate(self.name, tr.instructions, target, tr.storages)
            if settings.NKI_PROFILE.get() and not estimate:
                print(est.summary(), file=sys.stderr)
        return [st.tensor.to(device) for st in tr.outputs], est

    def _interpret(self, sig: _Signature, host, traced: _Traced, record: bool, warn: bool,
                   ordering=None, capture: bool = False) -> trace.Trace:
        """One interpreted run on the CPU tensors `host` (written in place). `record`: the instructions are
        recorded (an interpreted signature's estimate is its launch's); `warn`: its NkiWarnings are given (an
        interpreted signature's first launch: its checking pass skipped its runtime loops). `ordering`:
        nki/order.py's Order for the affine_range loops and the programs."""
        tr = trace.Trace(self.name, self.grid, quiet=not record, device="cpu", order=ordering,
                         capture={} if capture else None)
        with warnings.catch_warnings():
            if not warn:
                warnings.simplefilter("ignore", limits.NkiWarning)
            _run(self.fn, sig, host, tr)
        got = [(st.shape, st.dtype) for st in tr.outputs]
        if got != traced.out_specs:
            raise limits.NkiError(f"nki: kernel {self.name} allocated HBM tensors {got} at run time, but its checking "
                                  f"pass (which runs loops on runtime values no times) allocated {traced.out_specs}: "
                                  f"allocate the kernel's outputs outside loops and conditions on registers")
        return tr

    def _order_check(self, sig: _Signature, tensors, traced: _Traced):
        """nki.simulate(kernel, order=...): interpreted in order and in the other order, compared (nki/order.py);
        the in-order run's outputs, its written arguments copied back."""
        def run(how):
            host = [t.detach().cpu().clone() for t in tensors]
            tr = self._interpret(sig, host, traced, how is None, False, how)  # in order: its accesses recorded
            kept = hazards.escaping_loops(tr.instructions, tr.loops, tr.storages) if how is None else set()
            return [st.tensor for st in tr.outputs] + [host[k] for k in traced.written_inputs], tr.loops, \
                tr.launch.programs, kept

        names = [f"output {j}" for j in range(len(traced.out_specs))]
        names += [f"argument {sig.names[sig.tensor_pos[k]]!r}" for k in traced.written_inputs]
        results = order.check_order(run, self.options["order"], self.options.get("seed", 0), names)
        n = len(traced.out_specs)
        for k, value in zip(traced.written_inputs, results[n:]):
            tensors[k].copy_(value)
        device = tensors[0].device if tensors else torch.device("cpu")
        return [r.to(device) for r in results[:n]]

    def _compile(self, sig: _Signature, traced: _Traced) -> None:
        """Pass 2, under make_fx: record the graph (outputs as arguments) and compile it through the cache."""
        n_in = len(sig.tensors)
        examples = [torch.empty(t.shape, dtype=t.dtype) for t in sig.tensors]
        examples += [torch.empty(s, dtype=d) for s, d in traced.out_specs]
        written = list(traced.written_inputs) + [n_in + j for j in range(len(traced.out_specs))]
        unrolled: set = set()  # loops the roller must trace as written (a roll found wrong: nki/rolling.py)

        def body(*ts):
            tr = trace.Trace(self.name, self.grid, output_examples=list(ts[n_in:]), quiet=True, device="cpu",
                             fuser=fusion.PsumFuser(traced.written_inputs) if self.options.get("fuse", True) else None)
            tr.roller = roller
            _run(self.fn, sig, ts[:n_in], tr)
            if roller is not None:
                roller.verify(tr, fx_graph())
            return tuple(ts[i] for i in written)

        t0 = time.perf_counter()
        while True:
            roller = rolling.Roller.for_trace(traced, self.options.get("roll", True), unrolled)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", limits.NkiWarning)  # pass 1 warned already
                    gm = make_fx(body, tracing_mode="fake")(*examples)
                break
            except rolling.Unroll as e:
                metrics.log.info("nki kernel %s: %s; traced again with it unrolled", self.name, e)
                unrolled.add(e.loop)
        t_trace = time.perf_counter() - t0
        lifted = _lift_constants(gm)
        key = self._key(gm, examples, lifted)
        artifact, how = compile_cached(gm, examples + lifted, key)
        if how == "compiled" or how == "cache hit":  # on disk: a later process compiles this signature at once
            index = self._index_key(sig)
            if cache.read(index) != key.encode():
                cache.write(index, key.encode())
        metrics.log.info("nki kernel %s: traced in %.2fs, %s for %s in %.2fs", self.name, t_trace, how,
                         [tuple(t.shape) for t in examples], time.perf_counter() - t0 - t_trace)
        name = self.name

        def launch(*ts):
            if observe.kernel_run is not None:
                observe.kernel_run(name, gm)
            if observe.nki_launch is not None:  # the estimate is computed once per signature, when first watched
                observe.nki_launch(name, traced.estimate(name))
            for i, r in zip(written, artifact(*ts, *lifted)):
                t = ts[i]
                if r.data_ptr() != t.data_ptr():
                    t.copy_(r)

        launch.source = gm
        traced.launch, traced.source = launch, gm

    def _key(self, gm, examples, lifted) -> str:
        h = hashlib.sha256()
        for part in (NKI_VERSION, COMPILER_VERSION, torch.__version__, self.name, repr(self.grid), gm.code):
            h.update(part.encode())
        h.update(repr([(tuple(t.shape), t.dtype) for t in examples]).encode())
        for t in lifted:  # the values the trace baked in (nl.shared_constant's): they are not in the code
            h.update(repr((tuple(t.shape), t.dtype)).encode())
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _source_id(fn) -> str:
    """The kernel's code as a hash: its file's bytes (its helpers there too), or its bytecode where it has
    none (a kernel made by exec)."""
    try:
        with open(inspect.getsourcefile(fn), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except (OSError, TypeError):
        code = fn.__code__
        return hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()


def _lift_constants(gm: torch.fx.GraphModule) -> list:
    """The tensors the trace baked into the graph (nl.shared_constant's values) made inputs after its own, in
    place; returns them, to pass at each launch. An artifact loaded from the disk cache takes a graph's baked-in
    tensors as inputs, where the freshly compiled one held them itself: lifted, both are called alike."""
    last = ([n for n in gm.graph.nodes if n.op == "placeholder"] or [None])[-1]
    lifted = []
    for node in [n for n in gm.graph.nodes if n.op == "get_attr"]:
        value = getattr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        with gm.graph.inserting_after(last) if last is not None else gm.graph.inserting_before(node):
            ph = gm.graph.placeholder(f"constant_{len(lifted)}")
        ph.meta = dict(node.meta)
        node.replace_all_uses_with(ph)
        gm.graph.erase_node(node)
        delattr(gm, node.target)
        lifted.append(value)
        last = ph
    if lifted:
        gm.recompile()
    return lifted


def _describe(sig: _Signature) -> str:
    return ", ".join(f"{sig.tensor_name(k)}: {tuple(s)} {str(t.dtype).replace('torch.', '')}"
                     for k, (s, t) in enumerate(zip(sig.shapes, sig.tensors)))


def _from_numpy(args, kwargs):
    """Standalone NKI's NumPy arrays as CPU tensors: (whether any argument was one, args, kwargs)."""
    numpy_mode = any(isinstance(a, np.ndarray) for a in list(args) + list(kwargs.values()))
    if numpy_mode:  # ml_dtypes' bf16 / fp8 arrays too, as AWS's simulator takes them
        args = [to_tensor(a) if isinstance(a, np.ndarray) else a for a in args]
        kwargs = {k: to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    return numpy_mode, args, kwargs


def _direct_call(args, kwargs):
    """call(fn, _): fn(*args, **kwargs) as they are."""
    return lambda fn, _: fn(*args, **kwargs)


def _host_call(args, kwargs, places):
    """call(fn, host): fn(*args, **kwargs) with the tensors at `places` (_tensor_places) replaced, a list
    argument's in a copy of the list."""
    def call(fn, host):
        a, kw = list(args), dict(kwargs)
        copied = {}  # list arguments copied -> their type (a tuple stays a tuple)
        for (w, j), t in zip(places, host):
            where = kw if type(w) is str else a
            if j is None:
                where[w] = t
                continue
            if w not in copied:
                copied[w] = type(where[w])
                where[w] = list(where[w])
            where[w][j] = t
        for w, kind in copied.items():
            if kind is not list:
                where = kw if type(w) is str else a
                where[w] = kind(where[w])
        return fn(*a, **kw)
    return call


def _copy_result(name: str, dst, src, copy: bool = True, check: bool = True) -> None:
    """A lowering's result `src` into the kernel's outputs `dst` (the same structure), each `check`ed to be
    what the kernel returns there (`copy` False: checked only)."""
    if isinstance(dst, torch.Tensor):
        if check and (not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype):
            got = f"{tuple(src.shape)} {src.dtype}" if isinstance(src, torch.Tensor) else repr(src)
            raise limits.NkiError(f"nki: kernel {name}'s lowering returned {got} where the kernel returns "
                                  f"{tuple(dst.shape)} {dst.dtype}")
        if copy and src.data_ptr() != dst.data_ptr():
            dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        if check and (not isinstance(src, (tuple, list)) or len(src) != len(dst)):
            raise limits.NkiError(f"nki: kernel {name}'s lowering returned {type(src).__name__} where the kernel "
                                  f"returns {len(dst)} values")
        for d, s_ in zip(dst, src):
            _copy_result(name, d, s_, copy, check)
    elif isinstance(dst, dict):
        for k, d in dst.items():
            _copy_result(name, d, src[k], copy, check)


def _result(traced: _Traced, outs, tensors, numpy_mode: bool):
    r = _build_result(traced.result_spec, outs, tensors)
    if numpy_mode:
        return _to_numpy(r)
    return r


def _to_numpy(r):
    if isinstance(r, torch.Tensor):
        return to_numpy(r)  # bf16 / fp8 as ml_dtypes' types
    if isinstance(r, (tuple, list)):
        return type(r)(_to_numpy(x) for x in r)
    if isinstance(r, dict):
        return {k: _to_numpy(v) for k, v in r.items()}
    return r


def jit(fn=None, **options):
    """@nki.jit / @nki.jit(...): make `fn` an NKI kernel. Options AWS's compiler takes (mode=, platform
    target, debug flags) are accepted and ignored. nativelab's own: simulate=True interprets every launch
    (nki.simulate); fuse=False compiles each instruction as issued (no tile GEMMs fused: nki/fusion.py);
    check="hazards" checks every access for races between affine_range iterations (no budget),
    "hazards-strict" raises on one, "off" skips it (default: NATIVELAB_NKI_HAZARDS; nki/hazards.py);
    roll=False compiles every loop unrolled (default: a large regular loop is compiled as a loop, nki/rolling.py;
    an int: the instructions a loop must issue for that, rolling.MIN_INSTRUCTIONS by default); first_call=
    "interpret" or "compile": what a new signature's first launch does (default: NATIVELAB_NKI_FIRST_CALL);
    lower=False runs the kernel's own code where a lowering is declared (`kernel.lowering`)."""
    if fn is None:
        return lambda f: jit(f, **options)
    return fn if isinstance(fn, JitKernel) else JitKernel(fn, **options)
