"""The per-call engine is the C++ runtime's: what Python used to say again (the queue's bound, the kinds of device
work, the names of the runtime's copies) it now reads from the runtime (module.cpp exports them from
csrc/queue.h), so the two sides cannot drift. Each mirror removed has a test here: the behaviour both sides share,
and, read from the code, that no Python module holds its own copy."""

from __future__ import annotations

import pathlib
import re

import torch

from nativelab.device import queue, state

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "nativelab"
CSRC = SRC / "device" / "csrc"


def _python_sources():
    return [p for p in SRC.rglob("*.py")]


def test_a_python_launch_drains_the_queue_at_the_runtimes_bound():
    bound = state.device.rt.MAX_PENDING
    assert bound == int(re.search(r"kMaxPending = (\d+);", (CSRC / "queue.h").read_text()).group(1))
    torch.neuron.synchronize()
    ran = []
    for i in range(bound - 1):
        queue.launch("op", "test::count", ran.append, i)
    assert queue.pending() == bound - 1 and not ran
    queue.launch("op", "test::count", ran.append, bound - 1)  # fills the queue: the launch drains it
    assert queue.pending() == 0 and ran == list(range(bound))


def test_the_fast_path_drains_at_the_same_bound():
    bound = state.device.rt.MAX_PENDING
    a = torch.ones(4, device="neuron")
    a.add_(1)  # the signature's first call runs at once; the rest are queued by the C++ kernel
    torch.neuron.synchronize()
    for _ in range(bound - 1):
        a.add_(1)
    assert queue.pending() == bound - 1
    a.add_(1)
    assert queue.pending() == 0
    assert a.cpu().tolist() == [2.0 + bound] * 4


def test_work_kinds_are_the_runtimes():
    kinds = state.device.rt.WORK_KINDS
    assert kinds == ("op", "copy", "graph", "kernel", "collective", "marker")
    for kind in kinds:  # every kind the runtime names is one a launch accepts
        queue.launch(kind, f"test::{kind}", lambda: None)
    queue.drain()
    try:
        queue.launch("opp", "test::bad", lambda: None)
    except ValueError as e:
        assert "unknown kind of device work 'opp'" in str(e) and ", ".join(kinds) in str(e)
    else:
        raise AssertionError("an unknown kind was accepted")


def test_copy_names_are_said_once_in_the_runtime():
    names = state.device.rt.WORK_NAMES
    assert set(names) == {"copy", "host_to_device_queued", "host_to_device", "device_to_host"}
    assert queue.work_name("device_to_host") == "memcpy_device_to_host"
    header = (CSRC / "queue.h").read_text()
    for what, name in names.items():  # defined in queue.h, and nowhere else in C++ or Python
        assert header.count(f'"{name}"') == 1, name
        if what == "copy":  # also the ATen op's name, which the tracking API and the schema use as such
            continue
        for f in list(CSRC.glob("*.cpp")) + _python_sources():
            assert f'"{name}"' not in f.read_text(), (f, name)
    for f in _python_sources():  # no Python bound of its own, no f"memcpy_{kind}" name built by hand
        text = f.read_text()
        assert "MAX_PENDING =" not in text and 'f"memcpy_' not in text, f


def test_a_queued_host_to_device_copy_is_the_profilers_transfer_on_both_paths():
    from nativelab.profile import Session

    for fast in (True, False):
        with state.device.mode(fast_path=fast):
            d = torch.zeros(1000, device="neuron")
            torch.neuron.synchronize()
            with Session() as s:
                d.add_(1)  # queued: the copy below goes in program order, named host_to_device_queued
                d.copy_(torch.ones(1000))
                out = d.cpu()
            assert out.tolist() == [1.0] * 1000
            assert s.summary()["transfers"]["bytes"]["host_to_device"] == 4000, fast


def test_op_counts_are_one_count_in_the_runtime_whichever_path_ran_the_op():
    from nativelab.device import tracking

    a = torch.ones(8, device="neuron")
    a.mul_(2)  # each signature's first call (Python) before the count starts
    b = a + a
    torch.neuron.synchronize()
    tracking.clear_op_tracking()
    assert tracking.get_op_counts()["device"] == {}
    a.mul_(2)  # the C++ kernel queues these
    b = a + a
    with state.device.mode(fast_path=False):  # and the Python path these
        a.mul_(2)
        b = b + a
        a.copy_(torch.ones(8))  # a runtime op (runtime_ops.copy_)
    a.copy_(b)  # the C++ copy kernel
    counts = tracking.get_op_counts()["device"]
    assert counts == {"aten::mul_.Tensor": 2, "aten::add.Tensor": 2, "aten::copy_": 2}, counts
    assert list(counts) == tracking.get_executed_ops() == ["aten::mul_.Tensor", "aten::add.Tensor", "aten::copy_"]
    assert counts == state.device.rt.executed_counts()  # read, not taken: a second look sees the same
    assert a.cpu().tolist() == b.cpu().tolist() == [16.0] * 8  # (1 * 2 * 2 * 2) * 2, copied into a


def test_no_python_module_counts_launches_of_its_own():
    for f in _python_sources():
        text = f.read_text()
        assert "executed[" not in text and "take_executed" not in text, f


def test_the_cpp_key_takes_the_python_paths_rule_for_floats():
    # Whether a float's value is part of a call's signature key is decided once, by schema.py (OpRecord.out_args),
    # and handed to the C++ kernel with the op's route: arange.start_out keys its floats (they size out=) on both
    # paths, so a new step gives a new spec, not the first call's.
    from nativelab.device import dispatch, schema

    op = torch.ops.aten.arange.start_out
    assert schema.record_for(op).out_args
    assert dispatch.fast_route("aten::arange", "start_out")[3] is True
    assert dispatch.fast_route("aten::add_", "Tensor")[3] is False
    src = (CSRC / "ops.cpp").read_text()
    assert "e->key_floats = true" not in src  # the C++ side no longer derives the rule from the schema itself
    for fast in (True, False):
        with state.device.mode(fast_path=fast):
            for step in (1.0, 1.0, 0.5, 0.25, 0.5):
                out = torch.empty(0, device="neuron")
                torch.arange(0.0, 2.0, step, out=out)
                assert out.cpu().tolist() == torch.arange(0.0, 2.0, step).tolist(), (fast, step)


# -- The call's signature key: built once, in C++ (ops.cpp build_key), for the C++ kernel's spec cache and the
# Python path's (OpRecord.meta_cache): the Python path is handed the key, it does not build one of its own.

def _calls():
    a = torch.linspace(-1, 1, 24).reshape(4, 6).to("neuron")
    b, c = a * 3, a.flip(0)
    return a, c, [
        ("aten::mul.Tensor", lambda: a * 2),  # a wrapped number
        ("aten::add.Tensor", lambda: torch.add(a, b, alpha=0.5)),  # a float left out of the key
        ("aten::cat", lambda: torch.cat([a, b], 1)),  # a tensor list
        ("aten::sum.dim_IntList", lambda: a.sum((0,), keepdim=True)),  # an int list, a bool
        ("aten::clamp", lambda: a.clamp(min=-0.5)),  # an optional number
        ("aten::mul_.Tensor", lambda: c.mul_(a)),  # an op that writes its argument
    ]


def test_both_paths_cache_a_signature_under_the_one_key(monkeypatch):
    from nativelab.device import dispatch, schema

    if not state.device.fast_path or state.device.sync:
        import pytest

        pytest.skip("NATIVELAB_FAST_PATH=0 or NATIVELAB_SYNC=1: every op takes the Python path")
    a, c, calls = _calls()
    c0 = c.cpu()
    with state.device.mode(fast_path=False):  # the Python path sees each signature first (and caches it)
        want = [(name, call().cpu()) for name, call in calls]
    python_path = []
    real = dispatch._device_kernel
    monkeypatch.setattr(dispatch, "_device_kernel", lambda op, *a, **k: python_path.append(op) or real(op, *a, **k))
    got = [(name, call().cpu()) for name, call in calls]  # the C++ kernel finds each under its key: all queued
    assert python_path == []
    torch.testing.assert_close(c.cpu(), c0 * a.cpu() * a.cpu())  # (written twice)
    for (name, g), (_, w) in zip(got, want):
        if name != "aten::mul_.Tensor":
            torch.testing.assert_close(g, w)
        keys = state.device.rt.spec_keys(name)
        op = next(op for op, rec in schema.records.items() if rec.name == name)
        assert keys and set(keys) <= set(schema.records[op].meta_cache), name  # one key, both caches


def test_a_key_that_would_differ_between_the_paths(monkeypatch):
    # arange.start_out keys its floats (they size out=), add_ does not (an optimizer's new step size is the same
    # signature): a new step is a new signature on both paths, a new alpha on neither. Had either path its own
    # rule, one of these would be asked of Python again, or would reuse the first call's output size.
    from nativelab.device import dispatch

    python_path = []
    real = dispatch._device_kernel
    monkeypatch.setattr(dispatch, "_device_kernel", lambda op, *a, **k: python_path.append(str(op)) or real(op, *a, **k))
    x = torch.ones(8, device="neuron")
    with state.device.mode(fast_path=False):
        x.add_(x, alpha=0.5)
        out = torch.empty(0, device="neuron")
        torch.arange(0.0, 2.0, 1.0, out=out)
    python_path.clear()
    x.add_(x, alpha=0.25)
    assert python_path == [] or not state.device.fast_path  # the same signature: the C++ kernel queues it
    out = torch.empty(0, device="neuron")
    torch.arange(0.0, 2.0, 0.5, out=out)
    assert "aten.arange.start_out" in python_path  # a new one: Python runs its first call
    assert out.cpu().tolist() == [0.0, 0.5, 1.0, 1.5]
    assert x.cpu().tolist() == [1.5 * 1.25] * 8


def test_the_python_paths_own_calls_are_keyed_too():
    # Advanced indexing takes CPU indices of any size (OpRecord.cpu_ok): the C++ kernel leaves such calls to
    # Python, with their keys, which hold the CPU index's shape: another length is another output size.
    d = torch.arange(6.0, device="neuron")
    for n in (2, 3, 2, 5):
        idx = torch.arange(n)
        assert d[idx].cpu().tolist() == list(range(n)), n  # aten::index.Tensor
        d.index_put_((idx,), torch.ones(n, device="neuron"), accumulate=True)
        d -= torch.cat([torch.ones(n), torch.zeros(6 - n)]).to("neuron")
    assert d.cpu().tolist() == torch.arange(6.0).tolist()


def test_every_argument_kind_of_a_native_op_is_one_the_key_holds():
    # build_key keys tensors, lists (of tensors, optional tensors, ints, floats, bools, numbers), ints (dtypes,
    # layouts, memory formats), floats, bools, complex numbers, strings, devices and generators; an op with an
    # argument of another kind would run uncached (dispatch._device_kernel, key None).
    from nativelab.device import schema

    keyed = {"Tensor", "int", "float", "bool", "number", "complex", "str", "Device", "Generator", "ScalarType",
             "Layout", "MemoryFormat", "SymInt"}
    seen = set()
    for name in schema.NATIVE_OPS:
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, base.split("::", 1)[1], None)
        for ov in ([overload] if overload else list(packet.overloads()) if packet is not None else []):
            op = getattr(packet, ov or "default", None)
            if op is None or schema.route(op) != "native":
                continue
            for a in schema.op_schema(op).arguments:
                t = a.type
                while t.kind() in ("OptionalType", "ListType"):
                    t = t.getElementType()
                seen.add(str(t))
    assert seen and seen <= keyed, seen - keyed
    assert {"Tensor", "int", "float", "number"} <= seen


# -- Where an op runs is read from its schema's type objects: a list of tensors prints as "List[Tensor]", so a
# comparison with the text "Tensor[]" sent every foreach op returning a list to the CPU.

def test_foreach_ops_run_where_native_ops_txt_says():
    from nativelab.device import schema, tracking

    listed = schema.NATIVE_OPS
    torch.manual_seed(0)
    xs = [torch.randn(5), torch.randn(2, 3)]
    ys = [torch.randn(5), torch.randn(2, 3)]
    for fast in (True, False):
        with state.device.mode(fast_path=fast):
            dx = [t.to("neuron") for t in xs]
            dy = [t.to("neuron") for t in ys]
            torch.neuron.synchronize()
            tracking.clear_op_tracking()
            got = []
            for _ in range(2):  # a signature's first call, then a queued one
                cx = [t.clone() for t in xs]
                torch._foreach_add_(cx, ys, alpha=0.5)
                torch._foreach_mul_(cx, [2.0, 3.0])
                want = [*cx, *torch._foreach_add(xs, ys), *torch._foreach_mul(xs, 1.5), *torch._foreach_norm(xs)]
                d = [t.clone() for t in dx]
                torch._foreach_add_(d, dy, alpha=0.5)
                torch._foreach_mul_(d, [2.0, 3.0])
                got = [*d, *torch._foreach_add(dx, dy), *torch._foreach_mul(dx, 1.5), *torch._foreach_norm(dx)]
                assert all(g.device.type == "neuron" for g in got)
                for g, w in zip(got, want):
                    torch.testing.assert_close(g.cpu(), w)
            # They run as PyTorch's per-tensor kernels (add_/mul on each tensor, each queued on the C++ path), as on
            # CPU's slow path: measured faster here than one foreach op through the Python path (an AdamW step 2.7
            # vs 4.8 ms, 10 Linear(64, 64)); none is a CPU fallback.
            ran = ["aten::_foreach_add_.List", "aten::_foreach_mul_.ScalarList", "aten::_foreach_add.List",
                   "aten::_foreach_mul.Scalar", "aten::_foreach_norm.Scalar"]
            assert all(name in listed for name in ran)
            counts = tracking.get_op_counts()["device"]
            assert counts.get("aten::add_.Tensor", 0) >= 4 and counts.get("aten::add.Tensor", 0) >= 4, (fast, counts)
            assert not tracking.get_fallback_ops(), (fast, tracking.get_fallback_ops())
    for name in ("aten::_foreach_add.List", "aten::_foreach_norm.Scalar"):
        base, overload = name.split("::")[1].split(".")
        rec = schema.record_for(getattr(getattr(torch.ops.aten, base), overload))
        assert rec.route == "native" and rec.out_op is None  # (its out= list is not one output per result)


def test_an_optimizers_new_scalars_are_one_signature(monkeypatch):
    # Adam's foreach step divides by a list of bias corrections that changes every step: a Scalar[]'s floats are
    # left out of the key as a float argument's are, so the C++ kernel queues every step after the first.
    from nativelab.device import dispatch, schema

    if not state.device.fast_path or state.device.sync:
        import pytest

        pytest.skip("NATIVELAB_FAST_PATH=0 or NATIVELAB_SYNC=1: every op takes the Python path")
    xs = [torch.full((3,), 8.0), torch.full((2, 2), 4.0)]
    d = [t.to("neuron") for t in xs]
    torch._foreach_div_(d, [2.0, 4.0])  # the signature's first call
    torch._foreach_div_(xs, [2.0, 4.0])
    rec = schema.record_for(torch.ops.aten._foreach_div_.ScalarList)
    before = len(rec.meta_cache)
    python_path = []
    real = dispatch._device_kernel
    monkeypatch.setattr(dispatch, "_device_kernel", lambda op, *a, **k: python_path.append(op) or real(op, *a, **k))
    for k in range(1, 6):
        scalars = [1.0 + 1.0 / k, 1.0 - 1.0 / (k + 1)]
        torch._foreach_div_(d, scalars)
        torch._foreach_div_(xs, scalars)
    assert python_path == [] and len(rec.meta_cache) == before
    for g, w in zip(d, xs):
        torch.testing.assert_close(g.cpu(), w)


def test_no_python_module_builds_a_call_key():
    # The Python path is handed the C++ kernel's key (device_kernel's and fast_spec's `key`) instead of making its
    # own from the arguments; fast_spec is not even given them.
    import inspect

    from nativelab.device import dispatch

    assert list(inspect.signature(dispatch.fast_spec).parameters) == ["op", "key"]
    assert list(inspect.signature(dispatch.device_kernel).parameters)[:2] == ["op", "key"]
    for f in _python_sources():
        assert "_key_and_index" not in f.read_text(), f
