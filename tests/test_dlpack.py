"""DLPack both ways for device tensors: an export re-imported shares the memory (as on CUDA)."""

import torch
from torch.utils.dlpack import DLDeviceType, to_dlpack


def test_device_tensor_round_trip_shares_memory():
    x = torch.randn(3, 4, device="neuron:1")
    assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, 1)
    y = torch.from_dlpack(x)
    assert y.device == torch.device("neuron", 1) and y.data_ptr() == x.data_ptr()
    y.mul_(2)
    torch.testing.assert_close(x.cpu(), y.cpu())
    z = torch.from_dlpack(to_dlpack(x[1:]))  # a capsule, a view with an offset
    torch.testing.assert_close((z + 1).cpu(), x.cpu()[1:] + 1)


def test_import_of_device_memory_is_not_accounted_again():
    x = torch.randn(256, device="neuron")
    before = torch.neuron.memory_allocated()
    y = torch.from_dlpack(x)
    assert torch.neuron.memory_allocated() == before
    del x
    torch.testing.assert_close(y.cpu().sum(), y.sum().cpu())  # y keeps the memory alive


def test_cpu_capsule_onto_the_device():
    c = torch.arange(6.0)
    d = torch.from_dlpack(c, device="neuron")
    assert d.device.type == "neuron" and torch.equal(d.cpu(), c)
    assert torch.from_dlpack(torch.randn(2, device="neuron").cpu()).device.type == "cpu"
