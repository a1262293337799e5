"""The device's observer stack (device/observe.py): what it publishes, the order nested observers see events in,
and that it is the only place a watching tool hooks into (read from the code)."""

from __future__ import annotations

import ast
import pathlib

import pytest

from nativelab.device import observe

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "nativelab"


class Recorder(observe.Observer):
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def run(self, kind, name, fn, args):
        self.log.append((self.name, "run", kind, name, fn.__name__, fn.__self__.source))
        res = fn(*args)
        self.log.append((self.name, "ran", res))
        return res

    def host_op(self, name, fallback, fn, fargs, dev_args):
        self.log.append((self.name, "host_op", name, fallback, fargs, dev_args))
        return fn(*fargs)

    def dispatch(self, op, args, kwargs, run):
        self.log.append((self.name, "dispatch", op, args, kwargs))
        res = run()
        self.log.append((self.name, "dispatched", res))
        return res

    def transfer(self, kind, nbytes, seconds):
        self.log.append((self.name, "transfer", kind, nbytes))


class Graph:
    source = "the graph's source"

    def __init__(self, log):
        self.log = log

    def launch(self, a, b):
        self.log.append(("work", a, b))
        return a + b


class GraphsOnly(observe.Observer):
    def graph(self, kind, shapes):
        pass


def test_nothing_is_published_while_nobody_watches():
    assert not observe.watched()
    assert all(getattr(observe, e) is None for e in observe.EVENTS)
    only = GraphsOnly()
    with observe.watching(only):
        # only the events it implements: the others stay free for the device
        assert [e for e in observe.EVENTS if getattr(observe, e) is not None] == ["graph"]
        assert observe.graph == only.graph  # one observer: its own bound method, no chain
    assert all(getattr(observe, e) is None for e in observe.EVENTS)


def test_nested_observers_see_every_event_outermost_first():
    log = []
    outer, inner = Recorder("outer", log), Recorder("inner", log)
    g = Graph(log)
    with observe.watching(outer), observe.watching(inner):
        assert observe.observers() == (outer, inner)
        assert observe.run("graph", "g1", g.launch, (2, 3)) == 5
        assert observe.host_op("aten::sort", True, lambda rec, x: x * 2, ("rec", 4), ("dev",)) == 8
        assert observe.dispatch("aten::add", (1,), {"alpha": 2}, lambda: "result") == "result"
        observe.transfer("device_to_host", 64, 0.0)
    # each sees the work's own function (its name, its owner's source) however deep it sits
    assert log[:5] == [("outer", "run", "graph", "g1", "launch", g.source),
                       ("inner", "run", "graph", "g1", "launch", g.source),
                       ("work", 2, 3), ("inner", "ran", 5), ("outer", "ran", 5)]
    assert log[5:7] == [(who, "host_op", "aten::sort", True, ("rec", 4), ("dev",)) for who in ("outer", "inner")]
    assert log[7:11] == [("outer", "dispatch", "aten::add", (1,), {"alpha": 2}),
                         ("inner", "dispatch", "aten::add", (1,), {"alpha": 2}),
                         ("inner", "dispatched", "result"), ("outer", "dispatched", "result")]
    assert log[11:] == [(who, "transfer", "device_to_host", 64) for who in ("outer", "inner")]
    assert not observe.watched()


def test_pop_keeps_the_others_in_order_and_names_a_stranger():
    a, b, c = GraphsOnly(), GraphsOnly(), GraphsOnly()
    for o in (a, b, c):
        observe.push(o)
    try:
        observe.pop(b)  # not the innermost: a session closed out of order
        assert observe.observers() == (a, c)
        with pytest.raises(ValueError, match="is not watching the device"):
            observe.pop(b)
    finally:
        observe.pop(c)
        observe.pop(a)
    assert not observe.watched() and observe.graph is None


def test_no_other_module_sets_a_hook():
    """Watching tools push observers; nobody assigns the published events (or keeps a slot of its own)."""
    published = set(observe.EVENTS)
    offenders = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "device" / "observe.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                        t.value.id in ("observe", "_observe") and t.attr in published | {"_stack", "_listeners"}:
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno} sets observe.{t.attr}")
                if isinstance(t, ast.Attribute) and t.attr in ("observer", "graph_observer", "pull"):
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno} sets a hook slot .{t.attr}")
    assert offenders == []


def test_the_device_tools_implement_the_protocols_events_as_declared():
    import inspect

    from nativelab.check.watch import Watch
    from nativelab.device.multiprocessing import _RefuseInForkedChild
    from nativelab.profile import Session

    def arity(fn):
        return len(inspect.signature(fn).parameters)

    implemented = {}
    for cls in (Session, Watch, _RefuseInForkedChild):
        assert observe.Observer in cls.__mro__  # its defaults: the events it does not implement
        mine = [e for e in observe.EVENTS if getattr(cls, e) is not getattr(observe.Observer, e)]
        implemented[cls.__name__] = mine
        for e in mine:
            assert arity(getattr(cls, e)) == arity(getattr(observe.Observer, e)), (cls.__name__, e)
    assert implemented == {"Session": ["run", "host_op", "transfer", "kernel_run", "nki_launch"], "Watch": list(observe.EVENTS),
                           "_RefuseInForkedChild": ["dispatch"]}
