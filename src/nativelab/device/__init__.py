"""The emulated `neuron` device: PyTorch's PrivateUse1 backend on host memory: a small C++ runtime (csrc/:
device guard, streams, events, generators, pinned memory, the PrivateUse1 hooks) under Python policy.

`register()` is what `import torch` runs through the `torch.backends` entry point. It does nothing when
the real Neuron stack (`torch_neuronx`) is installed: then the real device serves `neuron`. Otherwise it also
serves `import torch_neuronx` (`torch_neuronx_api.py`, through `nativelab.stand_ins`), which is how accelerate
and the Hugging Face Trainer find a Neuron device, and `import nki` (`nativelab.nki`) for NKI kernels. It also stands
aside when a CUDA GPU is present (NATIVELAB_EMULATE=1 registers anyway): PyTorch takes a registered
PrivateUse1 backend as *the* accelerator, and from then on every CUDA backward fails inside the autograd
engine (`opt_ready_stream && opt_parent_stream`, pytorch/pytorch#161129).
"""

from __future__ import annotations

import sys
import types

import torch

from .. import stand_ins
from . import (
    _private, attention, autocast, config, conversion, crash_report, dispatch, dynamo_interface, guard,
    int32_targets, memory, module, rnn_cells, runtime_ops, sparse, state,
)
from .tracking import clear_op_tracking, get_executed_ops, get_fallback_ops, get_op_counts

__all__ = [
    "register", "is_registered", "real_neuron_installed",
    "get_fallback_ops", "get_executed_ops", "get_op_counts", "clear_op_tracking",
]

_state = {"registered": False, "noticed": False}
_libs: list = []  # torch.library registrations live as long as these objects


def real_neuron_installed() -> bool:
    """AWS's torch_neuronx is importable (nativelab's own stand-in for it does not count)."""
    return stand_ins.real_spec("torch_neuronx") is not None


def cuda_present() -> bool:
    """A real CUDA GPU, which the emulator must not displace as PyTorch's accelerator."""
    return torch.cuda.is_available()


def is_registered() -> bool:
    return _state["registered"]


def register() -> bool:
    """Register the emulator as `neuron`; False (and nothing done) when the real stack is present."""
    if _state["registered"]:
        return True
    if real_neuron_installed():
        return False
    if cuda_present() and not config.emulate_beside_cuda():
        return False
    current = _private.privateuse1_backend_name()
    if current != "privateuseone":
        raise RuntimeError(f"PrivateUse1 is already taken by the '{current}' backend; nativelab cannot register")
    dev = state.device.build(config.load())  # the runtime handle and every setting, in one object
    crash_report.install(dev.rt)  # a crash from here on names the device work it happened in
    guard.init()

    _private.register_backend("neuron", _device_module(dev.num_cores))
    conversion.install()  # after the generated Module.neuron() exists
    _private.keep_out_of_fused_transformer_paths()
    memory.init()
    lib = torch.library.Library("_", "IMPL")
    dispatch.install()  # the boxed kernel every op reaches (C++, Python behind it)
    aten_lib = torch.library.Library("aten", "IMPL")
    runtime_ops.install(aten_lib)
    rnn_cells.install(aten_lib)
    attention.install(aten_lib)  # the device's own SDPA backend choice, the overrideable fused pair
    dynamo_interface.install(dev.num_cores)
    autocast.install(lib, aten_lib)
    int32_targets.install(aten_lib)
    sparse.install(lib, aten_lib)  # sparse layouts: one clear error
    from . import multiprocessing as _multiprocessing  # torch.multiprocessing: shared memory; fork: CUDA's error

    _multiprocessing.install()
    # Lazy conjugate/negative bits: let `_copy_from` see them (host views keep them) instead of PyTorch's
    # math-bit fallback cloning the source, which re-enters `_copy_from` forever for a device.
    for key in ("Conjugate", "Negative"):
        aten_lib.impl("aten::_copy_from", torch.library.fallthrough_kernel, key)
    # Quantized tensors have no device form (memory.quantized_message): one clear error for every op that
    # reaches the quantized device key (`.to('neuron')` of a quantized tensor), not the dispatcher's text.
    lib.fallback(_no_quantized, "QuantizedPrivateUse1")
    _libs.extend((lib, aten_lib))
    _private.patch_tensor_repr("neuron")
    _private.patch_dlpack_device("neuron")
    guard.set_index(0)  # also makes backward run in this thread (see _private)
    stand_ins.install("torch_neuronx", "nativelab.device.torch_neuronx_api")  # accelerate, the Trainer, the guide
    stand_ins.install("nki", "nativelab.nki")  # `import nki`, `nki.language`, `nki.isa`: kernels run as written
    # AWS's NKI 0.x docs import `from neuronxcc import nki` (nki.baremetal / benchmark / profile's examples):
    # `neuronxcc.nki[.language|.isa|.typing]` resolve to nativelab.nki[...] (`neuronxcc` itself is nativelab)
    stand_ins.install("neuronxcc", "nativelab")
    _state["registered"] = True
    return True


def _no_quantized(op, *args, **kwargs):
    dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_quantized), None)
    dtype = dtype or kwargs.get("dtype") or "quantized"
    raise NotImplementedError(f"{memory.quantized_message(dtype)} (in {op})")


def _device_module(num_cores: int) -> types.ModuleType:
    mod = types.ModuleType("torch.neuron", "nativelab's emulated neuron device")
    for name in dir(module):
        if not name.startswith("__"):
            setattr(mod, name, getattr(module, name))
    mod.__getattr__ = module.__getattr__  # attributes computed on access (`_initialized`)
    mod.default_generators = tuple(guard.default_generator(i) for i in range(num_cores))
    sys.modules["torch.neuron"] = mod
    return mod
