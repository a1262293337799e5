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
    assert dispatch.fast_route("aten::arange", "start_out")[2][2] is True
    assert dispatch.fast_route("aten::add_", "Tensor")[2][2] is False
    src = (CSRC / "ops.cpp").read_text()
    assert "e->key_floats = true" not in src  # the C++ side no longer derives the rule from the schema itself
    for fast in (True, False):
        with state.device.mode(fast_path=fast):
            for step in (1.0, 1.0, 0.5, 0.25, 0.5):
                out = torch.empty(0, device="neuron")
                torch.arange(0.0, 2.0, step, out=out)
                assert out.cpu().tolist() == torch.arange(0.0, 2.0, step).tolist(), (fast, step)
