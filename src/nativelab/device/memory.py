"""Device memory: host buffers behind device storages, accounted per logical core.

Two kinds of device storage, one account (the C++ runtime's, memory.cpp, which raises the OOM):
- the outputs of ops the C++ kernel queues (ops.cpp): host memory the runtime allocated, freed with the storage;
- memory adopted here from CPU results (fallbacks, copies, the Python path): a device storage made from the
  data pointer of a CPU storage that we keep on the storage's Python object (PyTorch keeps that object alive
  exactly as long as the C++ storage). When the device storage dies, the block dies with it and its bytes
  are returned to the core's account.
"""

from __future__ import annotations

import torch

from . import _private, config as _config, observe, runtime

DEVICE = _config.DEVICE_NAME
_rt = None


class CoreStats:
    """One core's account, read from the runtime when asked."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    allocated = property(lambda self: _rt.mem_stats(self.index)[0])
    peak = property(lambda self: _rt.mem_stats(self.index)[1])
    num_allocs = property(lambda self: _rt.mem_stats(self.index)[2])
    num_frees = property(lambda self: _rt.mem_stats(self.index)[3])
    capacity = property(lambda self: _rt.mem_stats(self.index)[4])

    def reset_peak(self) -> None:
        _rt.mem_reset_peak(self.index)


_stats: list[CoreStats] = []
_templates: dict[tuple[int, torch.dtype, bool], torch.Tensor] = {}
_inference_mode = torch.is_inference_mode_enabled
_devices: list[torch.device] = []


def init(cfg: _config.Config) -> None:
    global _rt, _check_capacity, _reserve, _release
    _rt = runtime.load()
    _check_capacity, _reserve, _release = _rt.mem_check, _rt.mem_reserve, _rt.mem_release
    for i in range(cfg.num_cores):
        _rt.mem_set_capacity(i, cfg.core_memory_bytes)
    _stats[:] = [CoreStats(i) for i in range(cfg.num_cores)]
    _devices[:] = [torch.device(DEVICE, i) for i in range(cfg.num_cores)]


def stats(index: int) -> CoreStats:
    return _stats[index]


class _Block:
    """Owns the host buffer of one device storage and its place in the core's account."""

    __slots__ = ("host", "index", "nbytes", "__weakref__")

    def __init__(self, host: torch.UntypedStorage, index: int, nbytes: int):
        self.host = host
        self.index = index
        self.nbytes = nbytes

    def __del__(self):
        _release(self.index, self.nbytes)


# The runtime's account (set by init): raise torch.OutOfMemoryError / count / uncount bytes on a core.
_check_capacity = _reserve = _release = None


def adopt(host: torch.UntypedStorage, index: int) -> torch.UntypedStorage:
    """Make a device storage on `neuron:index` backed by (and keeping alive) a CPU storage."""
    nbytes = host.nbytes()
    _reserve(index, nbytes)
    block = _Block(host, index, nbytes)
    st = _private.device_storage(host.data_ptr(), _devices[index], nbytes)
    st._nl_block = block
    if observe.alloc is not None:
        observe.alloc(block)
    return st


def alloc_storage(nbytes: int, index: int) -> torch.UntypedStorage:
    _check_capacity(index, nbytes)  # before touching host memory, so an OOM leaves nothing behind
    return adopt(torch.UntypedStorage(nbytes), index)


def host_storage(st: torch.UntypedStorage) -> torch.UntypedStorage:
    """The CPU storage over a device storage's memory. It keeps that memory alive: work queued on it may
    outlive the device tensors. The runtime's own memory gets a new one each time (cached on the device
    storage's Python object it would keep that storage alive forever)."""
    try:
        return st._nl_block.host
    except AttributeError:
        pass
    if st.device.type == DEVICE and _rt.mem_owns(st):
        return _rt.mem_host_storage(st)
    return _foreign_host(st)


class _Foreign:
    """The host side of device memory the device did not allocate (a DLPack import): its owner frees it, and
    it is not in any core's account."""

    __slots__ = ("host",)

    def __init__(self, host):
        self.host = host


def _foreign_host(st: torch.UntypedStorage) -> torch.UntypedStorage:
    if st.device.type != DEVICE or (st.data_ptr() == 0 and st.nbytes() != 0):
        raise RuntimeError("neuron: this storage was not allocated by the nativelab device")
    host = _private.device_storage(st.data_ptr(), torch.device("cpu"), st.nbytes())
    st._nl_block = _Foreign(host)  # lives as long as the device storage, which owns the memory
    return host


def _template(index: int, dtype: torch.dtype, inference: bool = False) -> torch.Tensor:
    """A 0-element tensor whose aliases become new device tensors. An alias of a normal tensor is never an
    inference tensor, so inference mode has templates of its own."""
    key = (index, dtype, inference)
    t = _templates.get(key)
    if t is None:
        with torch.inference_mode(inference):
            t = _templates[key] = _private.empty_on_index(index, dtype)
    return t


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
        host = torch.empty_strided(size, stride, dtype=dtype)
    except RuntimeError:  # the host itself could not provide it: report it against the core's capacity
        _check_capacity(index, _nbytes_for(size, stride, dtype.itemsize))
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


def host_view(t: torch.Tensor) -> torch.Tensor:
    """A zero-copy CPU tensor over a device tensor's memory (keeping its lazy conjugate/negative bits).

    Cached on the tensor (`_nl_hv`) and checked against its current pointer, sizes and strides, because
    in-place metadata ops (`resize_`, `set_`, `t_`) can change a tensor after the view was made.
    """
    hv = getattr(t, "_nl_hv", None)
    if hv is None or hv.data_ptr() != t.data_ptr() or hv.shape != t.shape or hv.stride() != t.stride():
        host = host_storage(t.untyped_storage())
        hv = torch.empty(0, dtype=t.dtype).set_(host, t.storage_offset(), t.size(), t.stride())
        t._nl_hv = hv
    if t.dtype.is_complex:
        if t.is_conj():
            hv = hv.conj()
        if t.is_neg():
            hv = hv._neg_view()
    return hv


def from_host(result: torch.Tensor, index: int) -> torch.Tensor:
    """Move a CPU result onto `neuron:index` without copying: the device adopts its storage.

    The hot path of every device allocation, so `adopt` and `wrap` are written out inline here.
    """
    host = result.untyped_storage()
    nbytes = host.nbytes()
    _reserve(index, nbytes)  # raises OutOfMemoryError; `result` is then freed by the caller's unwinding
    st = _device_storage(host.data_ptr(), _devices[index], nbytes)
    st._nl_block = block = _Block(host, index, nbytes)
    if observe.alloc is not None:
        observe.alloc(block)
    inference = _inference_mode()
    tpl = _templates.get((index, result.dtype, inference))
    if tpl is None:
        tpl = _template(index, result.dtype, inference)
    t = _set_storage(_new_tensor_like(tpl), st, result.storage_offset(), result.size(), result.stride())
    t._nl_hv = result
    return t


def copy_bytes(dst: torch.UntypedStorage, src: torch.UntypedStorage) -> None:
    n = min(dst.nbytes(), src.nbytes())
    if n:
        u8 = torch.uint8
        torch.empty(0, dtype=u8).set_(dst, 0, (n,), (1,)).copy_(torch.empty(0, dtype=u8).set_(src, 0, (n,), (1,)))


def swap_memory(a: torch.UntypedStorage, b: torch.UntypedStorage) -> None:
    """Exchange the memory of two device storages on one core, with what owns it (a block of this module on
    the storage's Python object, or the runtime's block inside its data pointer). Each storage keeps its
    identity, so the tensors of `a` see `b`'s memory afterwards (how a storage is resized in place); their
    cached host views are dropped by `host_view`, which checks the pointer."""
    ba, bb = getattr(a, "_nl_block", None), getattr(b, "_nl_block", None)
    _private.swap_storage_memory(a, b)
    for st, block in ((a, bb), (b, ba)):
        if block is not None:
            st._nl_block = block
        elif hasattr(st, "_nl_block"):
            del st._nl_block


def set_storage(t: torch.Tensor, st, offset: int, size, stride) -> torch.Tensor:
    """Re-point a device tensor (its old host view is dropped with it)."""
    t._nl_hv = None
    return _set_storage(t, st, offset, tuple(size), tuple(stride))


_device_storage = _private.device_storage
_new_tensor_like = _private.new_tensor_like
_set_storage = _private.set_tensor_storage
