"""The ops the device runtime answers itself: allocation, copies between host and device, reading a
scalar, resizing, and re-pointing tensors at storages."""

from __future__ import annotations

import sys
import time

import torch

from . import _private, dispatch, guard, memory, observe, queue, rng, schema, state

aten = torch.ops.aten
DEVICE = memory.DEVICE
_Tensor_copy = torch.Tensor.copy_


_noticed = False


def _notice() -> None:
    """One line on first use, so nobody mistakes the emulator for a real chip."""
    global _noticed
    _noticed = True
    rng.mark_initialized()  # the device is in use from here (CUDA's lazy init)
    if state.device.rt is not None:
        state.device.rt.set_noticed()  # the C++ kernels may allocate without asking Python from now on
    if not state.device.quiet:
        print(
            "nativelab: the 'neuron' device is emulated on the host CPU (NATIVELAB_QUIET=1 hides this line)",
            file=sys.stderr,
        )


def _index_for(device) -> int:
    if not _noticed:
        _notice()
    if device is None:
        return guard.current_index()
    device = torch.device(device)
    return guard.current_index() if device.index is None else guard.check_index(device.index)


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_layout(layout)
    dtype = dtype or torch.get_default_dtype()
    return memory.empty(size, dtype, _index_for(device), memory_format)


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    dtype = dtype or torch.get_default_dtype()
    return memory.empty_strided(tuple(size), tuple(stride), dtype, _index_for(device))


def _check_layout(layout) -> None:
    if layout not in (None, torch.strided):
        raise RuntimeError(f"neuron: only strided tensors are supported, got layout={layout}")


def copy_(dst, src, non_blocking=False):
    if src.shape != dst.shape and dst.device.type == DEVICE and not (dst.dim() == 0 and src.numel() == 1):
        # CPU's broadcast check and error, at the call (as CUDA's), not at a later sync
        torch.empty(dst.shape, device="meta").copy_(torch.empty(src.shape, device="meta"))
    if dst.device.type == DEVICE and src.device.type == DEVICE:  # device to device (any two cores)
        queue.launch("copy", queue.work_name("copy"), _Tensor_copy, dst, src)
    elif dst.device.type == DEVICE:  # host to device
        if src.dim() != 0 and dst.dim() == 0 and src.numel() != 1:
            raise RuntimeError(f"copy_: cannot copy a tensor of shape {tuple(src.shape)} into a 0-d tensor")
        if queue.idle():
            _transfer("host_to_device", _Tensor_copy, dst, src)
        else:  # earlier queued ops may still read dst: copy in program order, from a snapshot of src (the launch's)
            queue.launch("copy", queue.work_name("host_to_device_queued"), _Tensor_copy, dst, src)
    else:  # device to host: the host needs the value now
        _transfer("device_to_host", _Tensor_copy, dst, src)
    state.device.rt.count_executed(queue.work_name("copy"))
    return dst


def copy_from(src, dst, non_blocking=False):
    copy_(dst, src, non_blocking)
    return dst


def copy_from_and_resize(src, dst):
    if dst.shape != src.shape:
        if dst.device.type == DEVICE:
            dispatch.resize_(dst, src.shape)
        else:
            dst.resize_(src.shape)
    return copy_(dst, src)


def local_scalar_dense(t):
    return _transfer("device_to_host", torch.Tensor.item, t)


def _transfer(kind: str, copy, *args):
    """A copy between host and device memory (`copy(*args)`, the last argument its source), run now after the
    queue drained: device work named `queue.work_name(kind)`, timed and counted by the profiler when one is active."""
    obs = observe.transfer
    if obs is None:
        return queue.run_now("copy", queue.work_name(kind), copy, *args)
    t0 = time.perf_counter()
    out = queue.run_now("copy", queue.work_name(kind), copy, *args, observed=False)
    obs(kind, args[-1].nbytes, time.perf_counter() - t0)
    return out


def resize_(t, size, memory_format=None):
    return dispatch.resize_(t, size, memory_format)


def set_source_storage_offset(t, source, storage_offset, size, stride=()):
    if source.device.type != DEVICE:
        raise RuntimeError(f"set_: expected a storage on {t.device}, got one on {source.device}")
    if not stride:
        stride = memory.contiguous_strides(size)
    if storage_offset < 0:
        raise RuntimeError(f"Tensor: invalid storage offset {storage_offset}")
    need = memory._nbytes_for(size, stride, t.dtype.itemsize)
    if need and need + storage_offset * t.dtype.itemsize > source.nbytes():  # CPU's set_ grows the storage
        source.resize_(need + storage_offset * t.dtype.itemsize)
    return memory.set_storage(t, source, storage_offset, size, stride)


def set_source_storage(t, source):
    n = source.nbytes() // t.dtype.itemsize
    return memory.set_storage(t, source, 0, (n,), (1,))


def set_source_tensor(t, source):
    return memory.set_storage(t, source.untyped_storage(), source.storage_offset(), source.shape, source.stride())


def set_empty(t):
    st = memory.alloc_storage(0, t.device.index)
    return memory.set_storage(t, st, 0, (0,), (1,))


def record_stream(t, stream):
    return None  # one in-order queue per process: nothing to record


def to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    """`.to()`: PyTorch's own kernel, made blocking: a non-blocking copy to the host would pin memory,
    which a Python backend cannot provide, and the host must wait for the value anyway."""
    return _to_copy_composite(
        self, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
        non_blocking=False, memory_format=memory_format,
    )


_to_copy_composite = _private.redispatch_to_composite(aten._to_copy.default)
_pin_memory_composite = _private.redispatch_to_composite(aten._pin_memory.default)


def convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Convolutions reach a non-CPU/CUDA device as `convolution_overrideable`: a CPU fallback."""
    return _host_fallback(
        "aten::convolution_overrideable", aten.convolution.default,
        (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups),
    )


def convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation, transposed,
                                      output_padding, groups, output_mask):
    bias_sizes = [weight.shape[1] * groups] if transposed else [weight.shape[0]]
    return _host_fallback(
        "aten::convolution_backward_overrideable", aten.convolution_backward.default,
        (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
         output_mask),
    )


def _host_fallback(name: str, cpu_op, args: tuple):
    index = dispatch._device_index(args)
    rec = schema.record_for(cpu_op)
    return dispatch.run_on_host(name, rec, list(args), index)


KERNELS = {
    "empty.memory_format": empty_memory_format,
    "empty_strided": empty_strided,
    "copy_": copy_,
    "_copy_from": copy_from,
    "_copy_from_and_resize": copy_from_and_resize,
    "_local_scalar_dense": local_scalar_dense,
    "resize_": resize_,
    "set_.source_Storage_storage_offset": set_source_storage_offset,
    "set_.source_Storage": set_source_storage,
    "set_.source_Tensor": set_source_tensor,
    "set_": set_empty,
    "record_stream": record_stream,
    "_to_copy": to_copy,
    "convolution_overrideable": convolution_overrideable,
    "convolution_backward_overrideable": convolution_backward_overrideable,
}


def install(lib: torch.library.Library) -> None:
    """Register the runtime's own kernels for the device (they take precedence over the boxed fallback). The
    C++ runtime takes some of them (allocation, copies): it serves their common case and calls the Python
    kernel here for the rest."""
    taken = set(state.device.rt.install_runtime_kernels(KERNELS))
    for name, kernel in KERNELS.items():
        if name not in taken:
            lib.impl(name, kernel, "PrivateUse1")
    if not _pinning_works():
        lib.impl("_pin_memory", pin_memory_without_allocator, "CPU")


def _pinning_works() -> bool:
    try:
        torch.empty(1).pin_memory()
        return True
    except (NotImplementedError, RuntimeError):
        return False


def pin_memory_without_allocator(self, device=None):
    """`pin_memory()` while the device has no pinned-memory allocator: a copy in ordinary host memory, which the
    emulator copies from just as fast. PyTorch's own kernel would raise for want of the allocator, and
    `DataLoader(pin_memory=True)` (Hugging Face's Trainer default) calls it as soon as an accelerator is present:
    a program that never uses the device must still run as it does without nativelab."""
    if device is not None and torch.device(device).type != DEVICE:
        return _pin_memory_composite(self, device)
    return self.clone(memory_format=torch.preserve_format)
