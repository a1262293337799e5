"""The kernel interface: the guide's `wrap_nki` + `@nki_op` pattern, for the emulated device.

A *kernel* is a function that computes into output tensors it is given (like an NKI kernel writing to HBM):

    def add_kernel(a, b, out):
        torch.add(a, b, out=out)

`wrap_kernel(add_kernel)` makes it a launchable kernel: the function is traced once per input signature
(shapes, strides, dtypes, scalars) and compiled to fused C++ by Inductor, and the compiled code is kept in the
compiled-graph cache on disk (the guide's NKI trace cache), so a second process loads instead of compiling.
Launched on device tensors it is queued on the device like any device op and runs on zero-copy host views;
on CPU tensors it runs at once; on fake tensors (tracing) it does nothing.

`@kernel_op("mylib::add", mutates_args=())` turns a Python function that allocates outputs and launches
kernels into a PyTorch custom op (`torch.library.custom_op`); its body doubles as the fake implementation, so
the same call works in eager mode and inside `torch.compile`, where it stays one opaque node.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ..compiler import kernel_graph, metrics
from ..compiler.freezing import inputs_as_constants
from ..compiler.lowering import COMPILER_VERSION, compile_cached
from ..compiler.random_ops import draws_random, run_at_call
from ..device import memory, observe, queue, tracking
from ..nki import JitKernel
from ..nki import jit as nki_jit
from ._private import is_fake, lean_version_bump, overload_of, version

DEVICE = memory.DEVICE
KERNEL_VERSION = "nativelab-kernel 1"
_MAX_VARIANTS = 256  # compiled variants kept per kernel
_MAX_BOUND = 4  # bound host plans kept per kernel (each keeps its weights alive)


_weights_stay_inputs = [0]  # > 0 inside weights_stay_inputs()


@contextlib.contextmanager
def weights_stay_inputs():
    """Within this block kernels take their weights as ordinary inputs even without autograd. For a model in
    training (the held-out loss, a sample between steps): its weights change, and baking them would compile,
    and hold a constant copy of, every layer's weights for every shape (fine-tuning's 30 layers x eval /
    prefill / decode shapes: a 3-step run took 265 s and 14.6 GB peak memory instead of 58 s and 3.4 GB)."""
    _weights_stay_inputs[0] += 1
    try:
        yield
    finally:
        _weights_stay_inputs[0] -= 1


class Kernel:
    """A kernel function compiled per input signature, launchable on device, CPU and fake tensors.

    `targets` maps other device types to their own implementation of the same signature (`{"cuda": f}`:
    a Triton launcher, say), or to its "module:function" name, imported on first use (so a CPU-only install
    never imports Triton); the traced-and-compiled path serves the emulated device and the CPU. A "host"
    target is hand-written code for the host CPU (the emulated device's memory): it runs, queued on the
    device like the traced path, for each launch its `accepts(*args)` approves (shapes and dtypes).

    `weights` names argument positions holding weights (a tensor or a list of tensors). When the kernel runs
    without autograd (inference), those are baked into the generated code as constants, so their layout is
    prepacked once (Inductor freezing), as an NKI kernel keeps weights resident in SBUF; a weight that is
    replaced or written in place gets a fresh compile. With autograd on, weights stay ordinary inputs."""

    def __init__(self, fn: Callable, targets: dict[str, Callable | str] | None = None,
                 weights: tuple[int, ...] = ()):
        self.fn = fn
        self.targets = dict(targets or {})
        self.weights = tuple(weights)
        self.name = getattr(fn, "__qualname__", repr(fn))
        self._compiled: dict = {}
        self._binder = None  # the host target when it binds its weights once (see _launch_bound), else False
        self._bound: dict = {}
        self._split: dict = {}  # number of arguments -> (bound positions, the others), for _launch_bound
        self._label = f"kernel:{self.name}"  # what the device queue and tracking call its launches

    def __call__(self, *args):
        binder = self._binder
        if binder is None:
            host = self._target("host") if "host" in self.targets else None
            binder = self._binder = host if getattr(host, "bind", None) is not None else False
        if binder and self._launch_bound(binder, args):
            return None
        tensors, spec = _flatten(args)
        if any(is_fake(t) or t.device.type == "meta" for t in tensors):
            return None  # tracing: the caller's outputs already have the right metadata
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"kernel {self.name}: all tensors must be on one device, got {sorted(map(str, devices))}")
        kind = next(iter(devices)).type if devices else "cpu"
        impl = self.targets.get(kind)  # a target for this device type wins over the traced path
        if impl is None and kind not in (DEVICE, "cpu"):
            raise NotImplementedError(f"kernel {self.name} has no implementation for {kind} tensors "
                                      f"(it has: {', '.join([DEVICE, 'cpu', *self.targets])})")
        if impl is not None:
            return self._target(kind)(*args)
        host = self._target("host")
        if host is not None and host.accepts(*args):  # hand-written host code for this signature
            if kind == DEVICE:
                label, fn = _labelled(self._label, host)
                queue.launch("kernel", label, fn, *args)
                tracking.count_executed(label)
            else:
                host(*args)
            return None
        bake = self.weights and not torch.is_grad_enabled() and not _weights_stay_inputs[0]
        frozen = self._frozen_positions(spec) if bake else ()
        key = (
            tuple((tuple(t.shape), t.stride(), t.dtype) for t in tensors), tuple(map(_spec_key, spec)),
            tuple((tensors[i].data_ptr(), version(tensors[i])) for i in frozen),  # which weights, unchanged
        )
        compiled = self._compiled.get(key)
        if compiled is None:
            if len(self._compiled) >= _MAX_VARIANTS:  # frozen variants hold weight copies: keep the newest
                del self._compiled[next(iter(self._compiled))]
            compiled = self._compiled[key] = self._compile(tensors, spec, frozen)
        live = [t for i, t in enumerate(tensors) if i not in frozen] if frozen else tensors
        if tensors and tensors[0].device.type == DEVICE:
            label, fn = _labelled(self._label, compiled)
            if compiled.random:  # drawn at the call, from the device's generator, as eager random ops
                run_at_call("kernel", label, fn, live, tensors[0].device.index or 0)
            else:
                queue.launch("kernel", label, fn, *live)
            tracking.count_executed(label)
        else:
            compiled(*live)
        return None

    def _launch_bound(self, host, args) -> bool:
        """The lean launch of a host target that binds: `host.bind(*args at host.bound)` makes a plan over the
        weights once (checked in full then, by `host.accepts`), kept per memory of those tensors (their data
        pointers and dtypes, not their Python objects: a compiled graph passes new host views of the same
        memory at every step; a replaced or re-pointed weight binds again); a launch then checks and passes
        only the other arguments (`host.accepts_call`). False: not handled here (tracing, autograd, a signature
        the host does not take), the ordinary path decides. It runs at every decode step, on the thread that
        also runs the plan: written for few Python operations (~10 us for 66 weight tensors)."""
        split = self._split.get(len(args))
        if split is None:
            bound = tuple(i for i in host.bound if i < len(args))
            split = self._split[len(args)] = (bound, tuple(i for i in range(len(args)) if i not in bound))
        bound, others = split
        rest = [args[i] for i in others]
        live = [a for a in rest if isinstance(a, torch.Tensor)]
        if not live:
            return False
        device = live[0].device
        if device.type not in (DEVICE, "cpu") or any(is_fake(t) or t.device != device for t in live):
            return False
        if not host.accepts_call(*rest):
            return False
        key = [device]
        for i in bound:
            a = args[i]
            if isinstance(a, torch.Tensor):
                key.append((a.data_ptr(), a.dtype))
            elif isinstance(a, (list, tuple)):
                key.append(tuple(map(_data_ptr, a)))
            else:
                key.append(a)
        key = tuple(key)
        entry = self._bound.get(key)
        if entry is None:
            entry = self._bind(host, args, device, key)
            if entry is None:
                return False
        if device.type == DEVICE:
            label, fn = _labelled(self._label, entry[0])
            queue.launch("kernel", label, fn, *rest)  # runs on host views of `rest`
            tracking.count_executed(label)
        else:
            entry[0](*rest)
        return True

    def _bind(self, host, args, device, key):
        """A new plan for these weights (None if the host does not take them)."""
        tensors, spec = _flatten(args)
        if any(is_fake(t) or t.device != device for t in tensors) or not host.accepts(*args):
            return None
        bound = [args[i] for i in host.bound]
        if device.type == DEVICE:
            hosted = [[memory.host_view(t) for t in a] if isinstance(a, (list, tuple))
                      else memory.host_view(a) if isinstance(a, torch.Tensor) else a for a in bound]
        else:
            hosted = bound
        if len(self._bound) >= _MAX_BOUND:
            del self._bound[next(iter(self._bound))]
        entry = self._bound[key] = (host.bind(*hosted), bound)  # the tensors stay alive: their memory is the key
        return entry

    def _target(self, kind: str):
        """The implementation registered for `kind`, imported on first use ("module:function" names)."""
        impl = self.targets.get(kind)
        if isinstance(impl, str):
            module, _, attr = impl.partition(":")
            impl = self.targets[kind] = getattr(importlib.import_module(module), attr)
        return impl

    def _frozen_positions(self, spec) -> tuple[int, ...]:
        """Indices, in the flattened tensor list, of the tensors passed at the weight argument positions."""
        out = []
        for pos in self.weights:
            s = spec[pos]
            if isinstance(s, TensorArg):
                out.append(s.index)
            elif isinstance(s, TensorListArg):
                out.extend(range(s.start, s.start + s.count))
        return tuple(out)

    def _compile(self, tensors, spec, frozen=()) -> Callable:
        """Trace with scalars fixed and compile the graph of the tensor arguments: through the on-disk cache,
        or, with frozen weights, as a frozen graph (prepacked constants; not cacheable)."""
        examples = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype) for t in tensors]
        live = [i for i in range(len(tensors)) if i not in frozen]

        def traced(*ts):
            self.fn(*_rebuild(spec, ts))
            return tuple(ts[i] for i in live)  # outputs are the (possibly mutated) non-weight arguments

        gm = make_fx(traced, tracing_mode="fake")(*examples)  # fake: no real work on uninitialised inputs
        t0 = time.perf_counter()
        if frozen:
            gm = _bake_constants(gm, {i: tensors[i] for i in frozen})
            artifact, how = compile_cached(gm, [examples[i] for i in live], None, freeze=True)
        else:
            artifact, how = compile_cached(gm, examples, self._key(gm, examples))
        metrics.log.info("kernel %s: %s for %s in %.2fs", self.name, how, [tuple(t.shape) for t in tensors],
                         time.perf_counter() - t0)

        def launch(*ts):
            if observe.kernel_run is not None and observe.lowering_as() is None:
                observe.kernel_run(self.name, gm)
            for t, r in zip(ts, artifact(*ts)):  # write back what the kernel wrote
                if r.data_ptr() != t.data_ptr():
                    t.copy_(r)

        launch.source = gm  # the traced graph (baked weights included): the profiler reads its traffic from it
        launch.random = draws_random(gm)  # its code draws random numbers (seeded from the default generator)
        return launch

    def _key(self, gm: torch.fx.GraphModule, examples) -> str:
        """What was traced (so an edited kernel, or a helper it calls, gets a new entry) and for which inputs."""
        h = hashlib.sha256()
        for part in (KERNEL_VERSION, COMPILER_VERSION, torch.__version__, self.name, gm.code):
            h.update(part.encode())
        h.update(repr([(tuple(t.shape), t.stride(), t.dtype) for t in examples]).encode())
        return h.hexdigest()


_data_ptr = torch.Tensor.data_ptr


def _labelled(label: str, fn):
    """(the label a device launch of `fn` goes under, what to queue): the kernel's own, or, inside an NKI kernel's
    lowering (observe.launching_as), that NKI kernel's, with `fn` wrapped to run as part of it (its own
    attributes, which profilers read, kept)."""
    outer = observe.lowering_as()
    if outer is None:
        return label, fn
    made = _parts.get((outer, id(fn)))
    if made is not None and made[0] is fn:
        return outer, made[1]

    def part(*args):
        with observe.launching_as(outer):
            return fn(*args)

    for attr in ("source", "random", "traffic", "plan"):
        if hasattr(fn, attr):
            setattr(part, attr, getattr(fn, attr))
    if len(_parts) >= 256:  # (label, kernel) pairs: a few per lowered NKI kernel; never grows without bound
        _parts.clear()
    _parts[(outer, id(fn))] = (fn, part)  # holding fn keeps its id its own
    return outer, part


_parts: dict = {}  # (NKI label, id(fn)) -> (fn, its wrapper): made once, not at every launch


def _bake_constants(gm: torch.fx.GraphModule, constants: dict[int, torch.Tensor]) -> torch.fx.GraphModule:
    """The traced graph with the weights at `constants`' positions as constants (zero-copy host views of
    device weights, read after the queue drains), which Inductor's freezing can prepack."""
    queue.drain()  # the weights' current values
    return inputs_as_constants(gm, {i: memory.host_view(t) if t.device.type == DEVICE else t
                                    for i, t in constants.items()})


# How a kernel's arguments map onto the flat list of its tensors (what is traced and compiled). Each type is a
# NamedTuple with its kind as a fixed first field, so specs of different kinds never compare equal.


class TensorArg(NamedTuple):
    """A tensor argument: tensors[index]."""
    index: int
    kind: str = "tensor"


class TensorListArg(NamedTuple):
    """A list of tensors: tensors[start:start + count]."""
    start: int
    count: int
    kind: str = "tensors"


class ValueArg(NamedTuple):
    """Anything else (a float, an int, a flag): fixed in the traced graph, so part of the signature."""
    value: object
    kind: str = "value"


def _flatten(args):
    """Tensors (also inside lists) in order, and a spec to rebuild the arguments from them."""
    tensors, spec = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            spec.append(TensorArg(len(tensors)))
            tensors.append(a)
        elif isinstance(a, (list, tuple)) and a and all(isinstance(x, torch.Tensor) for x in a):
            spec.append(TensorListArg(len(tensors), len(a)))
            tensors.extend(a)
        else:
            spec.append(ValueArg(a))
    return tensors, spec


def _rebuild(spec, tensors):
    out = []
    for s in spec:
        if isinstance(s, TensorArg):
            out.append(tensors[s.index])
        elif isinstance(s, TensorListArg):
            out.append(list(tensors[s.start:s.start + s.count]))
        else:
            out.append(s.value)
    return out


def _spec_key(s):
    """A hashable key of one argument's spec (values by their repr: they may be unhashable)."""
    return s if not isinstance(s, ValueArg) else ValueArg(repr(s.value))


def wrap_kernel(fn: Callable | None = None, *, targets: dict[str, Callable | str] | None = None,
                weights: tuple[int, ...] = ()):
    """Make `fn(*inputs, *outputs)` a kernel compiled per signature and launchable on the device; `targets`
    adds implementations for other device types (e.g. {"cuda": triton_launcher}); `weights` marks argument
    positions to bake in as prepacked constants for inference. Usable as `@wrap_kernel(weights=(1, 2))`."""
    if fn is None:
        return lambda f: wrap_kernel(f, targets=targets, weights=weights)
    return fn if isinstance(fn, Kernel) else Kernel(fn, targets, weights)


def kernel_op(name: str, *, mutates_args=()):
    """Register the decorated function as the custom op `name`; its body is also its fake implementation."""

    def register(fn: Callable):
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        op.register_fake(fn)
        if mutates_args:
            lean_version_bump(op)  # launch cost: PyTorch's version bump is quadratic in the argument count
        kernel_graph.register(overload_of(op), fn)  # a compiled graph that is just this op runs `fn` itself
        return op

    return register


def wrap_nki(fn: Callable | None = None, **options):
    """The guide's `wrap_nki`: an NKI kernel (`@nki.jit`, or a function written with nki.language / nki.isa)
    stays an NKI kernel, called with tensors and returning its outputs, traced and compiled per signature;
    a PyTorch function that computes into the outputs it is given becomes a `wrap_kernel` kernel."""
    if fn is None:
        return lambda f: wrap_nki(f, **options)
    if isinstance(fn, JitKernel):
        return fn
    if _written_in_nki(fn):
        return nki_jit(fn)
    return wrap_kernel(fn, **options)


def _written_in_nki(fn) -> bool:
    """`fn`'s module uses nki.language or nki.isa (AWS's names, nativelab's stand-in for them, or
    nativelab.nki itself)."""
    names = getattr(fn, "__globals__", {}).values()
    return any(getattr(v, "__name__", "").split(".")[-2:] in (["nki", "language"], ["nki", "isa"])
               for v in names if isinstance(v, type(importlib)))


nki_op = kernel_op  # the guide's name
