"""torch._dynamo's device interface for `neuron`: what Dynamo and Inductor ask of a device (current device,
streams, events, synchronize, properties), answered by `torch.neuron`; and the fake tensors Dynamo makes of
device tensors keep their backend metadata.

Registered when `torch._dynamo.device_interface` is first imported, not at `import torch`: importing Dynamo
takes about 1.7 s, which every program that never compiles would pay.
"""

from __future__ import annotations

import torch

from . import _private, module


def make_interface(base: type) -> type:
    class NeuronInterface(base):
        device = module.device
        Stream = module.Stream

        class Event(torch.Event):  # Dynamo captures only torch.Event subclasses
            def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
                return torch.Event.__new__(cls, device="neuron", enable_timing=enable_timing, blocking=blocking)

        class Worker:
            set_device = staticmethod(module.set_device)
            current_device = staticmethod(module.current_device)
            get_device_properties = staticmethod(module.get_device_properties)

        current_device = staticmethod(module.current_device)
        set_device = staticmethod(module.set_device)
        device_count = staticmethod(module.device_count)
        is_available = staticmethod(module.is_available)
        stream = staticmethod(module.stream)
        current_stream = staticmethod(module.current_stream)
        set_stream = staticmethod(module.set_stream)
        synchronize = staticmethod(module.synchronize)
        memory_allocated = staticmethod(module.memory_allocated)
        is_bf16_supported = staticmethod(module.is_bf16_supported)

        @staticmethod
        def exchange_device(device: int) -> int:
            prev = module.current_device()
            if device >= 0:
                module.set_device(device)
            return prev

        maybe_exchange_device = exchange_device

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return module.current_stream(device_idx).stream_id

        @staticmethod
        def get_device_properties(device=None):
            return module.get_device_properties(device)

        @staticmethod
        def get_compute_capability(device=None) -> str:
            return ""

        @staticmethod
        def is_triton_capable(device=None) -> bool:
            return False

    return NeuronInterface


def install(num_cores: int) -> None:
    def register(di) -> None:
        interface = make_interface(di.DeviceInterface)
        for name in ["neuron", *(f"neuron:{i}" for i in range(num_cores))]:
            di.register_interface_for_device(name, interface)

    _private.after_import("torch._dynamo.device_interface", register)
    _private.fakes_keep_backend_meta("neuron")  # (fake_tensor is imported with torch: nothing to wait for)
