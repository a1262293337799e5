"""Every private PyTorch API the emulated device relies on, each behind one named function.

PyTorch gives out-of-tree Python backends only part of what a C++ backend gets. Each call below reaches
past the public API; `tests/test_private_apis.py` exercises every one of them so that a PyTorch upgrade
that changes one fails loudly there, not deep inside an op.
"""

from __future__ import annotations

import ctypes

import functools

import torch
from torch._ops import OpOverload  # noqa: F401 - the type of an ATen operator overload (`torch.ops.aten.mm.default`)

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_COMPOSITE_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
_AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_DL_EXT_DEV = 12  # DLDeviceType::kDLExtDev: from_dlpack maps it to PrivateUse1

# Op handles, called below the Python OpOverload layer: these two run for every device allocation.
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed
_alias = torch.ops.aten.alias.default._handle.redispatch_boxed


# -- Operators and the dispatcher ---------------------------------------------------------------------------


def op_schema(op):
    """An operator overload's schema (name, overload_name, arguments, returns; their alias_info), or None for a
    callable that is not one (a graph node's Python function)."""
    return getattr(op, "_schema", None)


def op_callable(op):
    """The C++ operator an OpOverload wraps, called without the OpOverload's Python layer (queued work)."""
    return op._op


def has_kernel_for_dispatch_key(name: str, key: str) -> bool:
    """Whether the operator `name` ('aten::mul.Tensor') has a kernel for the dispatch key `key`; RuntimeError
    for an overload the dispatcher does not know (a TorchScript-only one such as aten::le.int)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


def privateuse1_backend_name() -> str:
    """The name PrivateUse1 has now ('privateuseone' until a backend renames it)."""
    return torch._C._get_privateuse1_backend_name()


def redispatch_to_composite(op):
    """`op` called below the device's own kernel, at its CompositeExplicitAutograd kernel (PyTorch's own)."""
    return functools.partial(op.redispatch, _COMPOSITE_KEYS)


def without_autocast():
    """A context in which the device's autocast key is skipped: an autocast kernel calls the op below itself."""
    return torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS)


def parse_to(*args, **kwargs) -> tuple:
    """What `Tensor.to` and `Module.to` make of their arguments: (device, dtype, non_blocking, memory_format)."""
    return torch._C._nn._parse_to(*args, **kwargs)


def own_tensor_tables(module: torch.nn.Module) -> tuple[dict, dict]:
    """A module's own parameter and buffer dicts (name -> tensor or None), which `_apply` walks and which can
    be edited in place."""
    return module._parameters, module._buffers


def neg_view(t: torch.Tensor) -> torch.Tensor:
    """A lazily negated view of `t` (what a tensor whose `is_neg()` is set reads as)."""
    return t._neg_view()


# -- The backend ----------------------------------------------------------------------------------------------


def register_backend(name: str, module) -> None:
    """Rename PrivateUse1 and install the device module (the C++ runtime has registered guard and hooks)."""
    torch.utils.rename_privateuse1_backend(name)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    torch._register_device_module(name, module)


def empty_on_index(index: int, dtype: torch.dtype) -> torch.Tensor:
    """A 0-element device tensor on `neuron:index`.

    The Python device guard always answers index 0, so no factory can make a tensor on another index.
    DLPack can: a CPU tensor's capsule, relabelled as an extension device with our index.
    """
    cap = torch._C._to_dlpack(torch.empty(0, dtype=dtype))
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ptr = get(cap, b"dltensor")
    # DLManagedTensor starts with DLTensor{void* data; DLDevice{int32 type; int32 id}; ...}
    ctypes.c_int32.from_address(ptr + 8).value = _DL_EXT_DEV
    ctypes.c_int32.from_address(ptr + 12).value = index
    return torch._C._from_dlpack(cap)


def is_zero_tensor(t: torch.Tensor) -> bool:
    """Whether a tensor is one of PyTorch's zero tensors (the ZeroTensor key: sizes and a dtype, no memory)."""
    return t._is_zerotensor()


def new_tensor_like(template: torch.Tensor) -> torch.Tensor:
    """A fresh TensorImpl with the template's device and dtype (its storage is replaced right after)."""
    return _alias(_COMPOSITE_KEYS, template)


def set_tensor_storage(t: torch.Tensor, storage, offset: int, size, stride) -> torch.Tensor:
    """Point a device tensor at (storage, offset, size, stride) without running our own kernels."""
    return _set_storage(_CPU_KEYS, t, storage, offset, size, stride)


def run_backward_in_caller_thread() -> None:
    """Autograd sizes its device threads from the guard's device count (1 for a Python guard);
    running backward in the calling thread avoids those threads for `neuron:1..3`. Per OS thread."""
    torch._C._set_multithreading_enabled(False)


def patch_tensor_repr(device_type: str) -> None:
    """Print device tensors from a host copy: PyTorch formats with slicing/min/max ops that would otherwise
    run (and be reported as fallbacks) on the device. Same idea as PyTorch's own rule for xla/lazy/mtia."""
    import torch._tensor_str as ts

    original = ts._str_intern

    def _str_intern(inp, *, tensor_contents=None):
        if (
            tensor_contents is None
            and type(inp) in (torch.Tensor, torch.nn.Parameter)  # not fake/functional wrappers
            and inp.device.type == device_type
            and inp.layout == torch.strided
            and inp.numel() > 0
        ):
            prefix = "tensor(" if type(inp) in (torch.Tensor, torch.nn.Parameter) else f"{type(inp).__name__}("
            with torch.no_grad():
                host = inp.detach().cpu()
            tensor_contents = ts._tensor_str(host, len(prefix))
        return original(inp, tensor_contents=tensor_contents)

    ts._str_intern = _str_intern


def no_python_modes():
    """Context that pops every active Python dispatch mode (fake tensors, functionalization) for its body."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def keep_out_of_fused_transformer_paths() -> None:
    """`nn.TransformerEncoder`, `TransformerEncoderLayer` and `MultiheadAttention` take their fused fast paths
    (nested tensors from a padding mask, `_transformer_encoder_layer_fwd`, `_native_multi_head_attention`) on
    devices named in lists that include `torch.utils.backend_registration._privateuse1_backend_name`, which
    `rename_privateuse1_backend` sets to our name. Those paths need nested-tensor and fused kernels that only
    C++ backends can have ("NestedTensorImpl doesn't support sizes"); with the module's name reset, the device
    is not in those lists and the modules take their ordinary path of device ops. (The C++ name that the
    rest of PyTorch reads, `torch._C._get_privateuse1_backend_name()`, stays ours.)"""
    import torch.utils.backend_registration as br

    if not hasattr(br, "_privateuse1_backend_name"):
        raise RuntimeError("torch.utils.backend_registration._privateuse1_backend_name is gone")
    br._privateuse1_backend_name = "privateuseone"


def fakes_keep_backend_meta(device_type: str) -> None:
    """Fake copies of the device's tensors (Dynamo's example values, AOTAutograd's inputs) carry the tensor's
    backend metadata (`torch._utils.set_tensor_metadata`, csrc/backend_meta.cpp), as OpenReg's do: torch 2.13's
    `FakeTensorConverter.from_real_tensor` builds them from meta tensors and never asks the backend."""
    from torch._subclasses import fake_tensor

    converter = fake_tensor.FakeTensorConverter
    original = converter.from_real_tensor
    if getattr(original, "_nl_keeps_backend_meta", False):
        return

    def from_real_tensor(self, fake_mode, t, *args, **kwargs):
        out = original(self, fake_mode, t, *args, **kwargs)
        if t.device.type == device_type:
            meta = torch._C._get_tensor_metadata(t)
            if meta:
                torch._C._set_tensor_metadata(out, meta)
        return out

    from_real_tensor._nl_keeps_backend_meta = True
    converter.from_real_tensor = from_real_tensor


def after_import(name: str, fn) -> None:
    """Call fn(module) once the module `name` is imported (now, if it already is), without importing it."""
    import importlib.abc
    import importlib.util
    import sys

    if name in sys.modules:
        fn(sys.modules[name])
        return

    class _After(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(mod):
                run(mod)
                fn(mod)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _After())


def patch_dlpack_device(device_type: str) -> None:
    """`Tensor.__dlpack_device__` recognises a PrivateUse1 tensor only under the name "privateuse1", so a renamed
    backend's tensors cannot be exported; answer (kDLExtDev, index) for them, as PyTorch's C++ `to_dlpack` does."""
    original = torch.Tensor.__dlpack_device__

    def __dlpack_device__(self):
        if self.device.type == device_type:
            from torch.utils.dlpack import DLDeviceType

            return (DLDeviceType.kDLExtDev, self.device.index)
        return original(self)

    __dlpack_device__.__wrapped__ = original
    torch.Tensor.__dlpack_device__ = __dlpack_device__


# -- What Module._apply does to a parameter it converts (device/conversion.py watches it per thread) ------------


def is_shallow_copy_check(func) -> bool:
    """Whether `func`, as a TorchFunctionMode is handed it, is the test `Module._apply` makes of each converted
    tensor: can the moved one be set into the old one in place (`param.data = moved`)? False across the
    device boundary (a PrivateUse1 tensor is not "shallow-copy compatible" with a CPU one)."""
    return func is torch._has_compatible_shallow_copy_type


def is_data_setter(func) -> bool:
    """Whether `func` is `Tensor.data`'s setter (`param.data = moved`, `param.grad.data = moved`)."""
    return getattr(func, "__self__", None) is torch._C.TensorBase.data and func.__name__ == "__set__"


def is_grad_getter(func) -> bool:
    """Whether `func` is `Tensor.grad`'s getter."""
    return getattr(func, "__self__", None) is torch._C.TensorBase.grad and func.__name__ == "__get__"


def swap_tensors_held_by_autograd(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """`torch.utils.swap_tensors(t1, t2)` for a parameter that autograd graphs still hold.

    PyTorch's swap refuses a tensor whose C++ use count is above 2 (itself plus its AccumulateGrad node): an
    output computed before `module.to()` (`expected = model(x)`) keeps each parameter it saved for backward
    (a Linear after the first saves its weight). The swap moves the Python object to the new TensorImpl; C++
    holders keep the old one, which is what they would keep without swapping too (the module would get new
    Parameter objects and they would hold the old ones). So we swap as PyTorch does, and poison the old
    AccumulateGrad as PyTorch does for count 2: backward through a graph built before the move raises instead
    of accumulating into a tensor nobody sees. Python weak references still refuse (PyTorch's rule)."""
    import copyreg
    import weakref

    for name, t in (("t1", t1), ("t2", t2)):
        if weakref.getweakrefs(t):
            raise RuntimeError(f"Cannot swap {name} because it has weakref associated with it")
    if t2._use_count() > 1:
        raise RuntimeError(f"Expected use_count of t2 to be 1, got {t2._use_count()}")
    slots = set(copyreg._slotnames(t1.__class__))
    if slots != set(copyreg._slotnames(t2.__class__)):
        raise RuntimeError("Cannot swap t1 and t2 if they have different slots")
    if t1.requires_grad and t1.is_leaf and not t1.is_inference():  # an inference tensor has no autograd edge
        # autograd off (a .to() under torch.inference_mode or no_grad) makes no edge: switched on for the lookup
        with torch.inference_mode(False), torch.enable_grad():
            torch.autograd.graph.get_gradient_edge(t1).node.register_prehook(_moved_parameter_backward)

    def swap_attr(name):
        tmp = getattr(t1, name)
        setattr(t1, name, getattr(t2, name))
        setattr(t2, name, tmp)

    swap_attr("__class__")
    swap_attr("__dict__")
    for slot in slots:
        if hasattr(t1, slot) and hasattr(t2, slot):
            swap_attr(slot)
        elif hasattr(t1, slot):
            setattr(t2, slot, getattr(t1, slot))
            delattr(t1, slot)
        elif hasattr(t2, slot):
            setattr(t1, slot, getattr(t2, slot))
            delattr(t2, slot)
    torch._C._swap_tensor_impl(t1, t2)


def _moved_parameter_backward(grad_outputs):
    raise RuntimeError(
        "neuron: backward through a graph built before its module moved to another device (module.to()): the "
        "parameter it would accumulate into has moved. Run backward before .to(), or compute the output again."
    )
