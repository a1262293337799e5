"""The device's observers: tools that watch what the device does (a `nativelab.profile` session, `nativelab
check`), held in one stack that every event source calls.

    with observe.watching(my_observer):   # or observe.push(o) ... observe.pop(o)
        ...

An observer implements the events of `Observer` it wants (subclass it: the others are the defaults, which only
run the work). Several may watch at once (a check of a script that profiles itself, two sessions nested): each
sees every event, the first pushed outermost (its `run` wraps the others', so it times their bookkeeping too).

Each event is published here as a module attribute, None while no observer on the stack implements it (so the
device pays one attribute test per op when nobody watches, and the C++ queue one pointer test per unit), else
the callable the source calls: the one observer's bound method, or a chain through all of them.

`run` sees queued work when it runs, long after the Python line that queued it; `dispatch`, `alloc`,
`kernel_run`, `collective` and `graph` run at the moment the user's code calls into the device, so the caller's
stack is the user's.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Protocol


class Observer(Protocol):
    """What the device tells an observer. The work-running events (`run`, `host_op`, `dispatch`) must run the
    work they are given and return its result; the others are notices."""

    def run(self, kind: str, name: str, fn, args):
        """One unit of device work (queued, or run at once by the host): `kind` is one of the runtime's
        `WORK_KINDS`, `name` what profilers show; return `fn(*args)`. With observers nested, `fn` may run the
        inner ones first: it answers every attribute of the work's own function (`__self__`, `__name__`,
        `source`, `traffic`)."""
        return fn(*args)

    def host_op(self, name: str, fallback: bool, fn, fargs, dev_args):
        """A CPU fallback (`fallback`), or a device op that had to run at once on the host: return `fn(*fargs)`
        (`fargs[0]` is the op's record, the rest its host arguments); `dev_args` are its device arguments."""
        return fn(*fargs)

    def transfer(self, kind: str, nbytes: int, seconds: float) -> None:
        """A copy between host and device memory ("host_to_device" / "device_to_host"), just done."""

    def dispatch(self, op, args, kwargs, run):
        """Every ATen op that reaches the device's boxed kernel, at the user's call: return `run()`, which
        performs it. The observer may look at the arguments before and at the result after."""
        return run()

    def alloc(self, block) -> None:
        """Every device allocation: `block.nbytes`, `block.index` (the logical core); weak-referenceable, freed
        (its bytes returned to the core) when the storage dies."""

    def kernel_run(self, name: str, gm) -> None:
        """Each library-kernel call as it runs (inside a compiled graph too, where the graph's queue entry is all
        `run` sees), with its traced graph, so a tool can count the ops the kernel performs."""

    def nki_launch(self, name: str, estimate) -> None:
        """Each NKI kernel launch as it runs (queued on the device, inside a compiled graph, on CPU tensors, or
        interpreted by nki.simulate), with its estimated time on one NeuronCore-v3 (`nki.cost.Estimate`:
        `seconds`, `busy` per engine, `bound`, and the per-engine `events` of its timeline)."""

    def collective(self, kind: str, tensors, world_size: int) -> None:
        """Each collective the `neuron` process group launches, as the user's code calls it: `kind` its name
        (all_reduce, all_gather, ..., barrier), `tensors` its tensor arguments as passed (nested lists)."""

    def graph(self, kind: str, shapes) -> None:
        """Each static graph the compiler backend is handed, and each new concrete shape of a symbolic one (each
        a compile on the real device): `kind` ("forward", "backward", "inference"), the inputs' shapes."""


EVENTS = ("run", "host_op", "transfer", "dispatch", "alloc", "kernel_run", "nki_launch", "collective", "graph")

# The published events (see the module's docstring): None while nobody on the stack implements one.
run = None
host_op = None
transfer = None
dispatch = None
alloc = None
kernel_run = None
nki_launch = None
collective = None
graph = None

# The user's source line of the compiled graph node running now ("file:line" or a Dynamo stack trace), set by
# the graph compiler around CPU-fallback nodes while a dispatch observer watches: inside a compiled graph the
# Python stack only shows the call of the compiled function.
compiled_source: str | None = None

# The NKI kernel whose declared lowering runs on this thread now (nki/jit.py), else None: the library kernels it
# launches are that kernel's work, which the kernel's own estimate prices, so they are queued and counted under
# its name and are not told as `kernel_run`s. Per thread: the device's queue runs on its own.
_lowering = threading.local()


def lowering_as() -> str | None:
    """The label (`kernel:<name>`) of the NKI kernel whose lowering runs on this thread, or None."""
    return getattr(_lowering, "label", None)


class launching_as:
    """`with launching_as(label):` inside the block, this thread's library-kernel launches are the NKI kernel
    `label`'s lowering. (A class, not a generator: it is entered at every lowered launch and every unit it queues.)"""

    __slots__ = ("label", "before")

    def __init__(self, label: str):
        self.label = label

    def __enter__(self):
        self.before = getattr(_lowering, "label", None)
        _lowering.label = self.label

    def __exit__(self, *exc):
        _lowering.label = self.before


_stack: list = []
_listeners: list = []  # called after the stack changes (dispatch.py: the C++ fast path stays off while anyone watches)


def push(observer) -> None:
    """Start telling `observer` everything the device does (innermost of those watching)."""
    _stack.append(observer)
    _publish()


def pop(observer) -> None:
    """Stop telling `observer` (which need not be the innermost: the others keep their order)."""
    for i in range(len(_stack) - 1, -1, -1):
        if _stack[i] is observer:
            del _stack[i]
            _publish()
            return
    raise ValueError(f"observe.pop: {observer!r} is not watching the device")


@contextlib.contextmanager
def watching(observer):
    """`observer` watches the device inside the block."""
    push(observer)
    try:
        yield observer
    finally:
        pop(observer)


def observers() -> tuple:
    """Everyone watching, outermost first."""
    return tuple(_stack)


def watched() -> bool:
    """Anyone watches (then the C++ fast path is off: every op takes the Python path the observers see)."""
    return bool(_stack)


def _implementers(event: str) -> list:
    default = getattr(Observer, event)
    return [o for o in _stack if getattr(type(o), event, default) is not default]


def _publish() -> None:
    g = globals()
    for event in EVENTS:
        who = _implementers(event)
        g[event] = None if not who else getattr(who[0], event) if len(who) == 1 else _CHAINS[event](who)
    for fn in _listeners:
        fn()


class _Inner:
    """The work an outer observer's `run` is given when others are nested in it: calling it runs the inner
    observers' `run` (and the work); any other attribute is the work's own function's."""

    __slots__ = ("_run", "_kind", "_name", "_fn")

    def __init__(self, run, kind, name, fn):
        self._run, self._kind, self._name, self._fn = run, kind, name, fn

    def __call__(self, *args):
        return self._run(self._kind, self._name, self._fn, args)

    def __getattr__(self, attr):
        return getattr(self._fn, attr)


def _chain_run(who):
    def chained(kind, name, fn, args):
        for o in reversed(who[1:]):
            fn = _Inner(o.run, kind, name, fn)
        return who[0].run(kind, name, fn, args)

    return chained


def _chain_host_op(who):
    def chained(name, fallback, fn, fargs, dev_args):
        for o in reversed(who[1:]):
            fn = (lambda o, inner: lambda *a: o.host_op(name, fallback, inner, a, dev_args))(o, fn)
        return who[0].host_op(name, fallback, fn, fargs, dev_args)

    return chained


def _chain_dispatch(who):
    def chained(op, args, kwargs, run):
        for o in reversed(who[1:]):
            run = (lambda o, inner: lambda: o.dispatch(op, args, kwargs, inner))(o, run)
        return who[0].dispatch(op, args, kwargs, run)

    return chained


def _each(event):
    def chain(who):
        methods = [getattr(o, event) for o in who]

        def each(*args):
            for m in methods:
                m(*args)

        return each

    return chain


_CHAINS = {"run": _chain_run, "host_op": _chain_host_op, "dispatch": _chain_dispatch,
           **{e: _each(e) for e in ("transfer", "alloc", "kernel_run", "nki_launch", "collective", "graph")}}
