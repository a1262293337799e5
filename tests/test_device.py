"""The device and its module: names, cores, the current core, torch.accelerator, synchronize, events."""

import pytest
import torch

from conftest import run_python


def test_to_neuron_and_back_roundtrips_values():
    x = torch.randn(3, 3)
    n = x.to("neuron")
    assert n.device == torch.device("neuron", 0)
    assert str(n.device) == "neuron:0"
    torch.testing.assert_close(n.cpu(), x, rtol=0, atol=0)


def test_accelerator_is_neuron():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "neuron"
    assert torch.accelerator.device_count() == 4
    t = torch.randn(3, 3, device=torch.accelerator.current_accelerator())
    assert t.device.type == "neuron"


def test_four_logical_cores_by_default():
    assert torch.neuron.device_count() == 4
    for i in range(4):
        t = torch.ones(2, device=f"neuron:{i}") * 3
        assert t.device == torch.device("neuron", i)
        assert t.cpu().tolist() == [3.0, 3.0]


def test_set_device_and_context_manager():
    torch.neuron.set_device(2)
    assert torch.neuron.current_device() == 2
    assert torch.accelerator.current_device_index() == 2
    assert torch.ones(1, device="neuron").device.index == 2
    with torch.neuron.device(3):
        assert torch.neuron.current_device() == 3
        assert torch.zeros(1, device="neuron").device.index == 3
    assert torch.neuron.current_device() == 2
    torch.accelerator.set_device_index(1)
    assert torch.neuron.current_device() == 1
    with torch.accelerator.device_index(0):
        assert torch.neuron.current_device() == 0
    assert torch.neuron.current_device() == 1


def test_invalid_core_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"neuron:7.*4 logical NeuronCores"):
        torch.ones(2, device="neuron:7")
    with pytest.raises(RuntimeError, match="neuron:9"):
        torch.neuron.set_device(9)


def test_mixing_cpu_and_device_is_an_error_but_cpu_scalars_are_fine():
    n = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*neuron:0 and cpu"):
        n + torch.ones(3)
    assert (n + torch.tensor(2.0)).cpu().tolist() == [3.0, 3.0, 3.0]  # 0-d CPU tensor, as on CUDA


def test_mixing_two_cores_is_an_error_and_copy_between_cores_works():
    a = torch.ones(3, device="neuron:1")
    b = torch.ones(3, device="neuron:2")
    with pytest.raises(RuntimeError, match="neuron:1 and neuron:2"):
        a + b
    c = a.to("neuron:2") + b
    assert c.device.index == 2 and c.cpu().tolist() == [2.0, 2.0, 2.0]


def test_numpy_is_refused_like_cuda():
    with pytest.raises(TypeError, match="can't convert neuron:0 device type tensor to numpy"):
        torch.ones(2, device="neuron").numpy()


def test_device_properties_and_name():
    p = torch.neuron.get_device_properties(1)
    assert p.index == 1 and p.total_memory == 24 * (1 << 30)
    assert torch.neuron.get_device_properties("neuron:1") == torch.neuron.get_device_properties(torch.device("neuron", 1))
    assert "emulated" in torch.neuron.get_device_name()
    with pytest.raises(ValueError, match="Expected a neuron device, got cpu"):  # CUDA: a ValueError too
        torch.neuron.get_device_properties("cpu")


def test_device_capability_lists_every_dtype_as_openreg_asserts():
    # OpenReg's test_device_capability: every dtype PyTorch has (complex32 and the quantized ones included),
    # the same on every core; torch.neuron's answer is torch.accelerator's, with the index checked.
    from torch.testing._internal.common_dtype import get_all_dtypes

    caps = [torch.neuron.get_device_capability(i) for i in range(torch.neuron.device_count())]
    assert caps[0] == torch.accelerator.get_device_capability("neuron:0")
    assert isinstance(caps[0]["supported_dtypes"], set) and all(c == caps[0] for c in caps)
    assert set(get_all_dtypes(include_complex32=True, include_qint=True)) <= caps[0]["supported_dtypes"]
    with pytest.raises(RuntimeError, match="The device index is out of range"):
        torch.neuron.get_device_capability(torch.neuron.device_count())


def test_synchronize_accepts_devices_and_rejects_bad_ones():
    torch.ones(2, device="neuron") * 2
    torch.neuron.synchronize()
    torch.neuron.synchronize("neuron:3")
    torch.neuron.synchronize(torch.device("neuron", 1))
    torch.accelerator.synchronize()
    with pytest.raises(RuntimeError, match="neuron:5"):
        torch.neuron.synchronize(5)


def test_event_elapsed_time_measures_device_work_not_dispatch():
    """Events time the device's run of the work queued between them, not the host's dispatch of it, proved
    within one measurement so that load cannot break it: the work between the events includes an entry that
    holds the device for longer than the whole dispatch took (decided once the dispatch is done), so a time
    stamped when `record()` is called could not reach it; and both stamps fall inside the host's interval."""
    import threading
    import time

    from nativelab.device import queue

    dispatched, hold_s = threading.Event(), []

    def hold():  # device work that outlasts the dispatch, whatever the load made the dispatch take
        assert dispatched.wait(timeout=30), "the device ran the work before it was dispatched"
        time.sleep(hold_s[0])

    x = torch.randn(256, 256, device="neuron")
    torch.mm(x, x) / 256  # each signature's first call runs at once: seen here, the loop below only queues
    torch.neuron.synchronize()
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    queue.launch("op", "hold", hold)
    for _ in range(50):
        x = torch.mm(x, x) / 256
    end.record()
    dispatch_ms = (time.perf_counter() - t0) * 1000
    assert not end.query()  # still queued: dispatch returned before the device ran
    with pytest.raises(RuntimeError, match="completed"):
        start.elapsed_time(end)
    hold_s.append(dispatch_ms / 1000 + 0.01)
    dispatched.set()
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000
    assert end.query() and start.query()
    elapsed = start.elapsed_time(end)
    # the hold ran between the stamps: at least its length, which exceeds the time the dispatch took
    assert elapsed >= hold_s[0] * 1000 > dispatch_ms, (elapsed, hold_s, dispatch_ms)
    # steady_clock and perf_counter are the same monotonic clock: the stamps lie within [t0, end of sync]
    assert elapsed <= wall_ms + 1e-3, (elapsed, wall_ms)


def test_event_without_timing_cannot_measure():
    a, b = torch.neuron.Event(), torch.neuron.Event()
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):  # the generic torch.Event: ValueError
        a.elapsed_time(b)


def test_accelerator_streams_wait_on_device_events():
    """torch.accelerator's streams are C++ torch.Streams; FSDP2 makes them wait on torch.neuron.Event()s."""
    x = torch.ones(256, 256, device="neuron")
    y = x @ x  # queued
    e = torch.neuron.Event()
    e.record()
    assert isinstance(e, torch.Event)
    torch.accelerator.current_stream().wait_event(e)
    torch.neuron.current_stream().wait_event(e)
    e.synchronize()
    assert e.query() and torch.equal(y.cpu(), torch.full((256, 256), 256.0))


def test_rng_seeding_reproduces_and_states_roundtrip():
    torch.manual_seed(123)
    a = torch.randn(5, device="neuron").cpu()
    torch.manual_seed(123)
    b = torch.randn(5, device="neuron").cpu()
    assert torch.equal(a, b)
    torch.neuron.manual_seed(7)
    assert torch.neuron.initial_seed() == 7
    state = torch.neuron.get_rng_state()
    c = torch.rand(4, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    d = torch.rand(4, device="neuron").cpu()
    assert torch.equal(c, d)
    torch.neuron.seed()
    assert torch.neuron.initial_seed() != 7


def test_streams_are_in_order():
    s = torch.neuron.Stream()
    x = torch.ones(4, device="neuron")
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        y = x * 5
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    s.synchronize()
    assert y.cpu().tolist() == [5.0] * 4


@pytest.mark.slow  # a fresh interpreter per setting
def test_env_core_count_and_bad_env_values():
    r = run_python("import torch, nativelab; print(torch.neuron.device_count())", {"NEURON_RT_NUM_CORES": "2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "2"
    r = run_python("import torch, nativelab", {"NEURON_RT_NUM_CORES": "four"})
    assert r.returncode != 0 and "NEURON_RT_NUM_CORES='four': expected an integer" in r.stderr
    r = run_python("import torch, nativelab", {"NATIVELAB_SYNC": "maybe"})
    assert r.returncode != 0 and "NATIVELAB_SYNC='maybe': expected 0 or 1" in r.stderr


def test_virtual_core_size_sets_logical_cores_and_their_memory(monkeypatch):
    from nativelab.device import config

    for var in ("NEURON_RT_NUM_CORES", "NATIVELAB_CORE_MEMORY_GB", "NEURON_RT_VIRTUAL_CORE_SIZE"):
        monkeypatch.delenv(var, raising=False)
    gib = 1 << 30
    cfg = config.load()  # trn2.3xlarge default: LNC=2, 8 physical cores -> 4 logical of 24 GB
    assert (cfg.num_cores, cfg.core_memory_bytes) == (4, 24 * gib)
    monkeypatch.setenv("NEURON_RT_VIRTUAL_CORE_SIZE", "1")
    assert (config.load().num_cores, config.load().core_memory_bytes) == (8, 12 * gib)
    monkeypatch.setenv("NEURON_RT_NUM_CORES", "2")  # an explicit count wins
    assert config.load().num_cores == 2
    monkeypatch.setenv("NEURON_RT_VIRTUAL_CORE_SIZE", "4")
    with pytest.raises(ValueError, match="NEURON_RT_VIRTUAL_CORE_SIZE='4': expected 1 or 2"):
        config.load()


def test_device_modes_change_through_the_one_state_object():
    """The device's settings live in state.device (built by register()); the modes that may change while a
    program runs change there, for a block too, and every module sees the change (here: the queue)."""
    from nativelab.device import queue, state

    if state.device.sync or not state.device.fast_path:
        pytest.skip("NATIVELAB_SYNC=1 or NATIVELAB_FAST_PATH=0: nothing stays queued")
    before = state.device.threads
    x = torch.ones(256, device="neuron")
    for _ in range(3):  # the signature learned by the Python path first, then queued by the C++ kernel
        y = x * 3
    torch.neuron.synchronize()
    y = x * 3
    assert queue.pending() == 1  # asynchronous: queued, not run
    with state.device.mode(sync=True):
        assert queue.pending() == 0  # the work queued before the change ran first
        y = x * 3
        assert queue.pending() == 0 and state.device.sync  # ran at its launch
    assert not state.device.sync
    with pytest.raises(KeyError):
        with state.device.mode(sync=True, threads=1):
            raise KeyError("inside")
    assert (state.device.sync, state.device.threads) == (False, before)  # restored after the exception
    with pytest.raises(ValueError, match="quiet is fixed at registration"):
        state.device.set(quiet=True)
    assert torch.equal(y.cpu(), torch.full((256,), 3.0))
