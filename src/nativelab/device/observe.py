"""Named hooks for tools that watch the device op by op (`nativelab.check`).

Each hook is None while nobody watches, so the device pays one module-attribute test per op. Unlike the
queue's `observer` (which sees queued work when it runs, long after the Python line that queued it), these run
at the moment the user's code calls into the device, so the caller's stack is the user's.
"""

from __future__ import annotations

import sys
import types

# dispatch(op, args, kwargs, run) -> result: wraps every ATen op that reaches the device's boxed kernel;
# `run()` performs the op and returns its result. The hook may look at the arguments before and the result after.
dispatch = None

# alloc(block): every device allocation; `block.nbytes`, `block.index` (the logical core), weak-referenceable,
# freed (its bytes returned to the core) when the storage dies.
alloc = None

# kernel_run(name, traced graph): each library-kernel call as it runs (inside a compiled graph too, where the
# graph's queue entry is all the queue sees), so a tool can count the ops the kernel performs.
kernel_run = None

# The user's source line of the compiled graph node running now ("file:line" or a Dynamo stack trace), set by
# the graph compiler around CPU-fallback nodes while a dispatch hook is installed: inside a compiled graph the
# Python stack only shows the call of the compiled function.
compiled_source: str | None = None

# collective(kind, tensors, world_size): each collective the `neuron` process group launches, as the user's code
# calls it. `kind` is the collective's name (all_reduce, all_gather, reduce_scatter, broadcast, barrier, ...),
# `tensors` its tensor arguments as passed (outputs and inputs, nested lists), `world_size` the group's size.
collective = None

_listeners: list = []  # called when a hook is set or cleared (ops.py: the C++ fast path stays off while one is)


class _Notifying(types.ModuleType):
    """A module whose attributes named in `_watched` call its `_listeners` when set."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in self._watched:
            for fn in self._listeners:
                fn()


def notify_on_set(module_name: str, names) -> None:
    """Make setting `names` on the module call its `_listeners` (a list it defines)."""
    mod = sys.modules[module_name]
    mod._watched = frozenset(names)
    mod.__class__ = _Notifying


notify_on_set(__name__, ("dispatch", "alloc"))
