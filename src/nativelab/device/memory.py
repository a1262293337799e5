"""Device memory: host buffers behind device storages, accounted per logical core.

Every device storage's memory is a block of the C++ runtime (memory.cpp), which keeps the per-core account,
raises the OOM and is PyTorch's allocator for the device (`torch.UntypedStorage(n, device=...)`, storage
`resize_`, `torch.accelerator`'s memory queries). A block is either memory the runtime allocated (the outputs of
ops the C++ kernel queues, `alloc_storage`) or the memory of a CPU result that the device adopts without
copying (fallbacks, copies, the Python path: `adopt`, `from_host`). It is freed, and its bytes returned to the
core's account, when the device storage and every host view of it are gone.
"""

from __future__ import annotations

import torch

from . import _private, config as _config, observe, state

DEVICE = _config.DEVICE_NAME


class CoreStats:
    """One core's account, read from the runtime when asked."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    allocated = property(lambda self: state.device.rt.mem_stats(self.index)[0])
    peak = property(lambda self: state.device.rt.mem_stats(self.index)[1])
    num_allocs = property(lambda self: state.device.rt.mem_stats(self.index)[2])
    num_frees = property(lambda self: state.device.rt.mem_stats(self.index)[3])
    capacity = property(lambda self: state.device.rt.mem_stats(self.index)[4])
    blocks = property(lambda self: state.device.rt.mem_stats(self.index)[5])  # allocations alive

    def reset_peak(self) -> None:
        state.device.rt.mem_reset_peak(self.index)


_stats: list[CoreStats] = []
_templates: dict[tuple[int, torch.dtype, bool], torch.Tensor] = {}
_inference_mode = torch.is_inference_mode_enabled
_devices: list[torch.device] = []


def init() -> None:
    """Give the runtime each core's capacity (the runtime keeps the account and raises the OOM)."""
    dev = state.device
    for i in range(dev.num_cores):
        dev.rt.mem_set_capacity(i, dev.core_memory_bytes)
    _stats[:] = [CoreStats(i) for i in range(dev.num_cores)]
    _devices[:] = [torch.device(DEVICE, i) for i in range(dev.num_cores)]


def stats(index: int) -> CoreStats:
    return _stats[index]


def device_stats(index: int) -> dict:
    """The core's allocator statistics as PyTorch's allocator interface reports them (CUDA's names, nested)."""
    return state.device.rt.mem_device_stats(index)


def reset_accumulated(index: int) -> None:
    state.device.rt.mem_reset_accumulated(index)


def live_blocks() -> list[tuple[int, int, int]]:
    """(address, nbytes, core) of every live block, by address."""
    return state.device.rt.mem_blocks()


class Allocation:
    """What a watching tool (`observe.alloc`) is given for each allocation: its size and core; it lives (weakly
    referenceable) exactly as long as the device storage (PyTorch keeps a storage's Python object, and so its
    attributes, alive with the C++ storage)."""

    __slots__ = ("index", "nbytes", "__weakref__")

    def __init__(self, index: int, nbytes: int):
        self.index = index
        self.nbytes = nbytes


def _observed(st: torch.UntypedStorage, index: int) -> torch.UntypedStorage:
    st._nl_alloc = a = Allocation(index, st.nbytes())
    observe.alloc(a)
    return st


def adopt(host: torch.UntypedStorage, index: int, resizable: bool = True) -> torch.UntypedStorage:
    """Make a device storage on `neuron:index` backed by (and keeping alive) a CPU storage."""
    st = state.device.rt.mem_adopt(host, index, resizable)
    return st if observe.alloc is None else _observed(st, index)


def alloc_storage(nbytes: int, index: int) -> torch.UntypedStorage:
    st = state.device.rt.mem_storage(index, nbytes)
    return st if observe.alloc is None else _observed(st, index)


def host_storage(st: torch.UntypedStorage, resizable: bool = False) -> torch.UntypedStorage:
    """The CPU storage over a device storage's memory. It keeps that storage alive: work queued on it may
    outlive the device tensors. A `resizable` one may be grown by a CPU kernel (an out= argument it resizes):
    it then moves to new CPU memory, which the caller copies back into the grown device storage."""
    if st.device.type != DEVICE or (st.data_ptr() == 0 and st.nbytes() != 0):
        raise RuntimeError("neuron: this storage was not allocated by the nativelab device")
    return state.device.rt.mem_host_storage(st, resizable)


def resizable_host_view(t: torch.Tensor, what: str = "") -> torch.Tensor:
    """A CPU tensor over a device tensor's memory that a CPU kernel may resize (grow) as it resizes its own."""
    hv = host_view(t, what)  # what a view assumes, checked (or a clear error)
    if t.is_conj() or t.is_neg() or _private.is_zero_tensor(t):
        return hv
    host = host_storage(t.untyped_storage(), resizable=True)
    return torch.empty(0, dtype=t.dtype).set_(host, t.storage_offset(), t.size(), t.stride())


def _template(index: int, dtype: torch.dtype, inference: bool = False) -> torch.Tensor:
    """A 0-element tensor whose aliases become new device tensors. An alias of a normal tensor is never an
    inference tensor, so inference mode has templates of its own."""
    key = (index, dtype, inference)
    t = _templates.get(key)
    if t is None:
        if dtype in QUANTIZED_DTYPES:
            raise NotImplementedError(quantized_message(dtype))
        with torch.inference_mode(inference):
            t = _templates[key] = _private.empty_on_index(index, dtype)
    return t


QUANTIZED_DTYPES = frozenset((torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4))


def quantized_message(dtype) -> str:
    return (
        f"neuron: quantized tensors ({dtype}) are not supported on the device (it holds strided tensors of "
        "float, integer and bool dtypes); run torch.ao quantized tensors and their ops on the CPU, or "
        "dequantize() before moving the values to the device"
    )


def wrap(storage, index: int, dtype, size, stride, offset: int = 0, inference: bool | None = None) -> torch.Tensor:
    """A device tensor viewing `storage` (a device storage on `neuron:index`). A view of a normal tensor
    stays normal in inference mode (`inference=False`), as PyTorch requires of views."""
    if inference is None:
        inference = _inference_mode()
    t = _private.new_tensor_like(_template(index, dtype, inference))
    return _private.set_tensor_storage(t, storage, offset, size, stride)


def _nbytes_for(size, stride, itemsize: int) -> int:
    if any(s == 0 for s in size):
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(size, stride))) * itemsize


def empty_strided(size, stride, dtype, index: int) -> torch.Tensor:
    try:
        host = torch.empty_strided(size, stride, dtype=dtype, device="cpu")  # not torch.set_default_device's
    except RuntimeError:  # the host itself could not provide it: report it against the core's capacity
        nbytes = _nbytes_for(size, stride, dtype.itemsize)
        if 0 < nbytes < 2**63:  # (else CPU's own error: negative sizes, a size that overflows)
            state.device.rt.mem_check(index, nbytes)  # torch.OutOfMemoryError if it would not fit
        raise
    return from_host(host, index)


def contiguous_strides(size) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(size):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def empty(size, dtype, index: int, memory_format=None) -> torch.Tensor:
    size = tuple(size)
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        stride = contiguous_strides(size)
    else:  # channels_last & co: let CPU work out the strides
        stride = torch.empty(size, dtype=dtype, device="meta", memory_format=memory_format).stride()
    return empty_strided(size, stride, dtype, index)


def host_view(t: torch.Tensor, what: str = "") -> torch.Tensor:
    """A zero-copy CPU tensor over a device tensor's memory (keeping its lazy conjugate/negative bits); a tensor
    it cannot view raises, naming `what` (the op) and why.

    Cached on the tensor (`_nl_hv`) and checked against its current pointer, sizes and strides, because
    in-place metadata ops (`resize_`, `set_`, `t_`) can change a tensor after the view was made.
    """
    hv = getattr(t, "_nl_hv", None)
    if hv is None or hv.data_ptr() != t.data_ptr() or hv.shape != t.shape or hv.stride() != t.stride():
        if _private.is_zero_tensor(t):  # no memory: its zeros (ZeroTensors are read-only)
            return zeros_view(t)
        # what the view assumes (layout, dtype, memory, bounds), or a clear error
        state.device.rt.check_device_tensor(t, what)
        host = host_storage(t.untyped_storage())
        hv = torch.empty(0, dtype=t.dtype, device="cpu").set_(host, t.storage_offset(), t.size(), t.stride())
        t._nl_hv = hv
    if t.dtype.is_complex:
        if t.is_conj():
            hv = hv.conj()
        if t.is_neg():
            hv = _private.neg_view(hv)
    return hv


def zeros_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of zeros with a zero tensor's sizes and strides: what reading one gives."""
    n = 0 if t.numel() == 0 else 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return torch.zeros(n, dtype=t.dtype).as_strided(t.shape, t.stride())


def zero_tensor(size, stride, dtype, index: int) -> torch.Tensor:
    """A device zero tensor (the ZeroTensor key: no memory), as `_efficientzerotensor` makes them."""
    return state.device.rt.zero_tensor(list(size), list(stride), dtype, index)


def from_host(result: torch.Tensor, index: int) -> torch.Tensor:
    """Move a CPU result onto `neuron:index` without copying: the device adopts its storage.

    The hot path of every device allocation, so `adopt` and `wrap` are written out inline here.
    """
    # raises OutOfMemoryError; `result` is then freed by the caller
    st = state.device.rt.mem_adopt(result.untyped_storage(), index)
    if observe.alloc is not None:
        _observed(st, index)
    inference = _inference_mode()
    tpl = _templates.get((index, result.dtype, inference))
    if tpl is None:
        tpl = _template(index, result.dtype, inference)
    t = _set_storage(_new_tensor_like(tpl), st, result.storage_offset(), result.size(), result.stride())
    t._nl_hv = result
    return t


def set_storage(t: torch.Tensor, st, offset: int, size, stride) -> torch.Tensor:
    """Re-point a device tensor (its old host view is dropped with it)."""
    t._nl_hv = None
    return _set_storage(t, st, offset, tuple(size), tuple(stride))


_new_tensor_like = _private.new_tensor_like
_set_storage = _private.set_tensor_storage
