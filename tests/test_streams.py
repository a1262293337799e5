"""Streams and events with CUDA's semantics, through the generic torch.Stream / torch.Event / torch.accelerator
APIs and torch.neuron's (one implementation): ids per device, ordering, cross-stream waits, query,
synchronize, timing."""

import time

import pytest
import torch


def test_streams_have_real_ids_per_device():
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    t = torch.Stream(device="neuron:1")
    assert s1.stream_id != s2.stream_id and s1 != s2
    assert s1.device == torch.device("neuron", 0) and t.device == torch.device("neuron", 1)
    assert torch.neuron.default_stream().stream_id == 0 == torch.neuron.default_stream(1).stream_id
    assert torch.neuron.default_stream(0) != torch.neuron.default_stream(1)
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_current_stream_is_per_device_and_restored():
    s = torch.neuron.Stream(device=1)
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream(1) == s
        assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)
    torch.accelerator.set_stream(s)
    assert torch.accelerator.current_stream(1) == s
    torch.accelerator.set_stream(torch.neuron.default_stream(1))


def test_cross_stream_wait_orders_work():
    a = torch.randn(128, 128)
    s1, s2 = torch.neuron.Stream(), torch.Stream(device="neuron")
    with torch.neuron.stream(s1):
        x = a.to("neuron")
        y = x @ x
        e = torch.Event(device="neuron")
        e.record(s1)
    s2.wait_event(e)
    with torch.neuron.stream(s2):
        z = y + 1
    s2.wait_stream(s1)
    s2.synchronize()
    assert s2.query() and e.query()
    torch.testing.assert_close(z.cpu(), a @ a + 1)


def test_two_devices_two_streams():
    a = torch.randn(32, 32)
    s0, s1 = torch.neuron.Stream(device=0), torch.neuron.Stream(device=1)
    with torch.neuron.stream(s0):
        r0 = a.to("neuron:0").relu()
    with torch.neuron.stream(s1):
        r1 = a.to("neuron:1").sigmoid()
    e0 = s0.record_event()
    s1.wait_event(e0)
    torch.accelerator.synchronize()
    assert e0.query()
    torch.testing.assert_close(r0.cpu(), a.relu())
    torch.testing.assert_close(r1.cpu(), a.sigmoid())
    assert r1.device.index == 1


def test_event_query_synchronize_and_timing():
    x = torch.randn(256, 256, device="neuron")
    start = torch.neuron.Event(enable_timing=True)
    end = torch.Event(device="neuron", enable_timing=True)  # the generic one pairs with torch.neuron's
    assert isinstance(end, torch.neuron.Event)
    t0 = time.perf_counter()
    start.record()
    for _ in range(20):
        x = (x @ x).tanh()
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000
    assert start.query() and end.query()
    ms = start.elapsed_time(end)
    assert 0 < ms <= wall_ms


def test_unrecorded_event_is_complete_and_untimed():
    e = torch.neuron.Event()
    assert e.query()
    e.synchronize()
    a, b = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with pytest.raises((RuntimeError, ValueError)):
        a.elapsed_time(b)  # not recorded
