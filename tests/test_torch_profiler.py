"""torch.profiler with ProfilerActivity.PrivateUse1: the device's work as kernel events (the Kineto plugin in
csrc/profiler_plugin.cpp), as CUDA's are: present, positive, linked to the op that launched them, summing to
about the time the device was busy, and on their own lane of the exported Chrome trace."""

import json
import time

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

BOTH = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def test_device_events_are_positive_and_sum_to_about_the_wall_time():
    x = torch.randn(512, 512) / 25
    a = x.to("neuron")
    # Warm up under a profiler as below: while one runs, ops take the Python path, which works out each call
    # signature's output shapes once (host time in the first region that the device never sees).
    with profile(activities=BOTH):
        ((a @ a).tanh()).cpu()
    torch.neuron.synchronize()
    with profile(activities=BOTH) as prof:
        t0 = time.perf_counter()
        for _ in range(6):
            a = (a @ a).tanh()
        host = a.cpu()
        wall_us = (time.perf_counter() - t0) * 1e6
    dev = _device_events(prof)
    names = [e.name for e in dev]
    assert names.count("neuron::mm") == 6 and names.count("neuron::tanh") == 6, names
    assert names.count("neuron::memcpy_device_to_host") == 1, names
    assert all(e.time_range.elapsed_us() > 0 for e in dev)
    total = sum(e.time_range.elapsed_us() for e in dev)
    # The device runs the queued ops back to back at the drain, and the matmuls dominate the region.
    assert 0.5 * wall_us < total <= wall_us * 1.02, (total, wall_us)
    for _ in range(6):  # profiling does not change the work: same results as CPU
        x = (x @ x).tanh()
    torch.testing.assert_close(host, x, atol=1e-4, rtol=1e-4)


def test_device_time_is_attributed_to_the_launching_op():
    a = torch.randn(256, 256, device="neuron")
    # The device works out an op's output shapes once per call signature by running it on meta tensors (an
    # aten::mm of its own, in the first call's CPU time): warm that up so the counts below are the program's
    # (under a trace: while one runs, ops take the Python path, which has its own cache).
    with profile(activities=BOTH):
        (a @ a).cpu()
    with profile(activities=BOTH) as prof:
        for _ in range(3):
            a = a @ a
        a.cpu()
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::mm"].count == 3  # the program's calls, not also the host's runs of the queued work
    kernel = rows["neuron::mm"]
    assert kernel.count == 3 and kernel.device_type == DeviceType.PrivateUse1
    # Each kernel is linked to the aten::mm that queued it, so the CPU op row carries its device time.
    assert rows["aten::mm"].self_device_time_total == kernel.self_device_time_total > 0
    assert rows["aten::matmul"].device_time_total == kernel.device_time_total


def test_chrome_trace_has_a_device_lane(tmp_path):
    a = torch.randn(64, 64, device="neuron")
    with profile(activities=BOTH) as prof:
        (a.sin() + 1).cpu()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    # Named after the queued op overload, like the nativelab.profile report; the copy back is a transfer event.
    assert {e["name"] for e in kernels} >= {"neuron::sin", "neuron::add.Tensor", "neuron::memcpy_device_to_host"}
    assert all(e["dur"] > 0 for e in kernels)
    assert {e["pid"] for e in kernels}.isdisjoint({e["pid"] for e in cpu_ops})  # a lane of its own
    lane_names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert lane_names.get(kernels[0]["pid"]) == "neuron 0", lane_names


def test_scheduled_profiling_records_each_active_window():
    from torch.profiler import schedule

    a = torch.randn(64, 64, device="neuron")
    windows = []

    def ready(prof):
        windows.append(sorted(e.name for e in _device_events(prof) if e.name == "neuron::mm"))

    sched = schedule(wait=1, warmup=1, active=2, repeat=2)
    with profile(activities=BOTH, schedule=sched, on_trace_ready=ready) as prof:
        for _ in range(8):
            (a @ a).cpu()
            prof.step()
    assert windows == [["neuron::mm"] * 2] * 2  # the active steps only, window by window


def test_cpu_only_profile_and_later_work_are_unaffected():
    from nativelab.device import observe

    a = torch.randn(32, 32, device="neuron")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (a * 2).cpu()
    assert not _device_events(prof)
    assert not observe.watched()
    with profile(activities=BOTH):
        b = a + 1
    # The trace's launch tagging is gone after it (it needs no observer); results still match CPU.
    assert not observe.watched()
    assert torch.equal((b * 3).cpu(), (a.cpu() + 1) * 3)


def test_nativelab_profile_session_inside_a_torch_profiler_trace_still_sees_the_work():
    from nativelab import profile as nl_profile

    a = torch.randn(128, 128, device="neuron")
    with profile(activities=BOTH) as prof:
        with nl_profile.Session() as session:
            (a @ a).cpu()
    assert "neuron::mm" in {e.name for e in _device_events(prof)}
    assert session.wall_seconds > 0


@pytest.mark.slow  # compiles a graph
def test_each_kind_of_device_work_is_named_by_what_it_is(tmp_path):
    """A compiled graph, a kernel, a copy and an eager op each launch one unit of device work that says what it
    is: the trace shows its name and kind as the work recorded them, with positive durations."""
    from nativelab.kernels import wrap_kernel

    def add_one(x, out):
        torch.add(x, 1, out=out)

    def host_add_one(x, out):  # hand-written host code: launched on the device without compiling anything
        torch.add(x, 1, out=out)

    host_add_one.accepts = lambda x, out: True
    kernel = wrap_kernel(add_one, targets={"host": host_add_one})
    graph = torch.compile(lambda t: (t * 3).relu(), backend="neuron")
    a = torch.randn(32, 32, device="neuron")
    out = torch.empty(32, 32, device="neuron")
    graph(a)  # compiled outside the trace
    torch.neuron.synchronize()
    with profile(activities=BOTH) as prof:
        g = graph(a)
        kernel(a, out)
        c = a.clone()  # a device-to-device copy
        e = a.sin()
        host = (g + out + c + e).cpu()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    kinds = {}
    for ev in json.loads(path.read_text())["traceEvents"]:
        if ev.get("cat") == "kernel":
            assert ev["dur"] > 0, ev
            kinds.setdefault(ev["name"], set()).add(ev["args"]["kind"])
    graphs = [n for n, k in kinds.items() if k == {"graph"}]
    assert len(graphs) == 1 and graphs[0].startswith("neuron::"), kinds
    assert kinds["neuron::kernel:test_each_kind_of_device_work_is_named_by_what_it_is.<locals>.add_one"] == {"kernel"}
    assert kinds["neuron::copy_"] == {"copy"}
    assert kinds["neuron::sin"] == {"op"} and kinds["neuron::add.Tensor"] == {"op"}
    assert kinds["neuron::memcpy_device_to_host"] == {"copy"}
    x = a.cpu()
    torch.testing.assert_close(host, (x * 3).relu() + (x + 1) + x + x.sin())


def test_the_cpp_op_path_stays_on_during_a_trace(monkeypatch):
    """The C++ kernel queues ops during a torch.profiler trace too (the queue records their device events): the
    trace costs no Python per op, and the ops it queued are still attributed to the ops that launched them."""
    from nativelab.device import dispatch, state

    if not state.device.fast_path or state.device.sync:
        pytest.skip("NATIVELAB_FAST_PATH=0 or NATIVELAB_SYNC=1: every op takes the Python path")
    a = torch.randn(64, 64, device="neuron")
    (a * 2 + 1).cpu()  # the C++ kernel learns these call signatures
    python_path = []
    real = dispatch._device_kernel
    monkeypatch.setattr(dispatch, "_device_kernel", lambda op, *args, **kw: python_path.append(op) or real(op, *args, **kw))
    with profile(activities=BOTH) as prof:
        b = a * 2 + 1
        b.cpu()
    assert python_path == []  # no op took the Python kernel
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["neuron::mul.Tensor"].count == 1 and rows["neuron::add.Tensor"].count == 1
    assert rows["aten::mul"].self_device_time_total == rows["neuron::mul.Tensor"].self_device_time_total > 0
    torch.testing.assert_close(b.cpu(), a.cpu() * 2 + 1)
