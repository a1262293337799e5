"""The current device (CUDA's semantics): per thread, index-less placement follows it, autograd's device
threads work on every core without set_device."""

import threading

import pytest
import torch


def test_index_less_placement_follows_set_device():
    torch.neuron.set_device(2)
    assert torch.neuron.current_device() == 2 == torch.accelerator.current_device_index()
    assert torch.ones(3).to("neuron").device == torch.device("neuron", 2)
    assert torch.empty(2, device="neuron").device == torch.device("neuron", 2)
    assert torch.zeros(2, device="neuron").device.index == 2
    torch.accelerator.set_device_index(1)
    assert torch.neuron.current_device() == 1
    assert torch.ones(1).to("neuron").device.index == 1


def test_device_context_restores():
    with torch.neuron.device(3):
        assert torch.ones(1).to("neuron").device.index == 3
        with torch.accelerator.device_index(1):
            assert torch.neuron.current_device() == 1
        assert torch.neuron.current_device() == 3
    assert torch.neuron.current_device() == 0


def test_current_device_is_per_thread():
    torch.neuron.set_device(3)
    seen = {}

    def worker():
        seen["start"] = torch.neuron.current_device()  # a new thread starts on device 0, as on CUDA
        torch.neuron.set_device(1)
        seen["placed"] = torch.ones(1).to("neuron").device.index

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"start": 0, "placed": 1}
    assert torch.neuron.current_device() == 3  # the other thread's set_device did not leak here


@pytest.mark.parametrize("core", [0, 3])
def test_backward_in_a_thread_that_never_set_the_device(core):
    x = torch.randn(5, 4)
    w = torch.randn(4, 3)
    result = {}

    def worker():
        try:
            xd = x.to(f"neuron:{core}").requires_grad_()
            wd = w.to(f"neuron:{core}").requires_grad_()
            (xd @ wd).tanh().sum().backward()
            result["grads"] = (xd.grad.cpu(), wd.grad.cpu(), xd.grad.device)
        except Exception as e:  # noqa: BLE001 - reported below
            result["error"] = e

    t = threading.Thread(target=worker)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive() and "error" not in result, result.get("error")
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    (xc @ wc).tanh().sum().backward()
    gx, gw, dev = result["grads"]
    assert dev == torch.device("neuron", core)
    torch.testing.assert_close(gx, xc.grad)
    torch.testing.assert_close(gw, wc.grad)


def test_invalid_index_is_a_clear_error():
    # A RuntimeError, as CUDA's "invalid device ordinal"; OpenReg's tests match "The device index is out of range".
    n = torch.neuron.device_count()
    for call in (torch.neuron.set_device, torch.accelerator.set_device_index,
                 lambda i: torch.empty(2, device=f"neuron:{i}"), torch.neuron.get_device_properties):
        with pytest.raises(RuntimeError, match=f"Invalid device index neuron:{n}: The device index is out of range"):
            call(n)
    with pytest.raises(RuntimeError, match=f"neuron:0..neuron:{n - 1}"):
        torch.accelerator.set_device_index(9)
    assert torch.neuron.current_device() == 0


def test_availability_through_the_hooks():
    assert torch.accelerator.is_available() and torch.accelerator.device_count() == torch.neuron.device_count()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch._C._get_accelerator() == torch.device("neuron")
