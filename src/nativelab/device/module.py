"""`torch.neuron`: the device module, shaped like `torch.cuda` (device, memory, rng, events, streams)."""

from __future__ import annotations

import contextlib
from collections import OrderedDict, namedtuple

import torch

from . import guard, memory, queue, rng


def __getattr__(name):
    # `_initialized` follows the device's first use (torch.utils.checkpoint reads it to decide whether to save
    # the device's RNG state), so it is looked up, not copied.
    if name == "_initialized":
        return rng.is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _lazy_init() -> None:
    """PyTorch calls this before any accelerator query (`torch.accelerator.current_device_index()`, which
    Dynamo asks when it traces any function, a CPU one too) as well as before device work. It does not mark the
    device in use: that happens at its first allocation (runtime_ops), so a CPU program that compiles inside
    `torch.utils.checkpoint` does not see the device 'initialized in the forward pass' (checkpoint raises)."""


# -- device -------------------------------------------------------------------------------------------------


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    # CUDA's and OpenReg's: not in a child forked after the parent initialised the device.
    return rng.is_initialized() and not _is_in_bad_fork()


def init() -> None:
    if _is_in_bad_fork():  # as torch.cuda.init() there (OpenReg's test_device_poison_fork asserts it)
        from . import multiprocessing as _mp

        raise RuntimeError(_mp.FORK_ERROR)
    rng.mark_initialized()


def _is_in_bad_fork() -> bool:
    """True in a child forked after the parent used the device (its device ops raise, as CUDA's do there).
    `torch.manual_seed` and `torch.seed` ask it and leave the device's generators alone in such a child."""
    from . import multiprocessing as _mp  # here: a module-level name would become torch.neuron.<name>

    return _mp.in_bad_fork()


def device_count() -> int:
    return guard.core_count()


def current_device() -> int:
    return guard.current_index()


def set_device(device) -> None:
    rng.mark_initialized()
    guard.set_index(guard.index_of(device))


class device:
    """Context manager that makes `device` the current logical core."""

    def __init__(self, device):
        self.idx = -1 if device is None else guard.index_of(device)
        self.prev = -1

    def __enter__(self):
        self.prev = guard.current_index()
        if self.idx >= 0:
            guard.set_index(self.idx)

    def __exit__(self, *exc):
        if self.idx >= 0:
            guard.set_index(self.prev)
        return False


def synchronize(device=None) -> None:
    """Wait until every queued op has run (the device has one in-order queue, so this covers all cores)."""
    if device is not None:
        guard.index_of(device)
    queue.drain()


_Props = namedtuple("_NeuronDeviceProperties", "name type index total_memory multi_processor_count")


def get_device_name(device=None) -> str:
    guard.index_of(device)
    return "NeuronCore-v3 (emulated on host CPU)"


def get_device_properties(device=None):
    i = guard.index_of(device)
    return _Props(get_device_name(i), "neuron", i, memory.stats(i).capacity, 1)


def get_device_capability(device=None) -> dict:
    # torch.accelerator's answer for the core ({"supported_dtypes": {...}}, from the device guard), after the index
    # check that torch.accelerator.get_device_capability does not make.
    return torch.accelerator.get_device_capability(guard.index_of(device))


# -- rng (the state lives in rng.py) ------------------------------------------------------------------------


def manual_seed(seed: int) -> None:
    rng.manual_seed(guard.current_index(), seed)


def manual_seed_all(seed: int) -> None:
    # Called by torch.manual_seed: must not call it back.
    for i in range(guard.core_count()):
        rng.manual_seed(i, seed)


def seed() -> None:
    rng.seed(guard.current_index())


def seed_all() -> None:
    for i in range(guard.core_count()):
        rng.seed(i)


def initial_seed() -> int:
    return rng.initial_seed(guard.current_index())


def get_rng_state(device="neuron") -> torch.Tensor:
    return rng.get_state(guard.index_of(device))


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    rng.set_state(guard.index_of(device), new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(guard.core_count())]


def set_rng_state_all(new_states) -> None:
    for i, s in enumerate(new_states):
        set_rng_state(s, i)


# -- memory -------------------------------------------------------------------------------------------------


def memory_allocated(device=None) -> int:
    return memory.stats(guard.index_of(device)).allocated


def max_memory_allocated(device=None) -> int:
    return memory.stats(guard.index_of(device)).peak


def reset_peak_memory_stats(device=None) -> None:
    s = memory.stats(guard.index_of(device))
    s.reset_peak()


def memory_reserved(device=None) -> int:
    return memory_allocated(device)  # no caching allocator: reserved is allocated


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Zero the 'allocated' and 'freed' totals (and num_ooms) of a core's statistics, as CUDA's."""
    memory.reset_accumulated(guard.index_of(device))


def memory_stats_as_nested_dict(device=None) -> dict:
    return memory.device_stats(guard.index_of(device))


def memory_stats(device=None) -> OrderedDict:
    """A core's allocator statistics under `torch.cuda.memory_stats`'s names, flattened and sorted the same way
    (`allocated_bytes.all.current` / `.peak` / `.allocated` / `.freed`, `allocation.*`, `small_pool` /
    `large_pool` split at 1 MiB as CUDA's, `num_ooms`, `num_device_alloc`, ...): the numbers
    `torch.accelerator.memory_stats` reads from the device's C++ allocator. Nothing is cached, so each
    allocation is its own segment and the reserved, active and segment statistics equal the allocated ones."""
    flat = []

    def flatten(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                flatten(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat.append((prefix, value))

    flatten("", memory_stats_as_nested_dict(device))
    return OrderedDict(sorted(flat))


def memory_snapshot() -> list[dict]:
    """The live device memory as `torch.cuda.memory_snapshot()` lists it: segments (here one per allocation, as
    nothing is cached) with their blocks, on every core."""
    segments = []
    for address, nbytes, index in memory.live_blocks():
        block = {"address": address, "size": nbytes, "requested_size": nbytes, "state": "active_allocated"}
        segments.append({
            "device": index, "address": address, "total_size": nbytes, "allocated_size": nbytes,
            "active_size": nbytes, "requested_size": nbytes, "stream": 0,
            "segment_type": "small" if nbytes <= 1 << 20 else "large", "blocks": [block],
        })
    return segments


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of a core: its capacity (NATIVELAB_CORE_MEMORY_GB) less what is allocated on it."""
    s = memory.stats(guard.index_of(device))
    return (s.capacity - s.allocated, s.capacity)


def empty_cache() -> None:
    """A no-op, kept for CUDA's API: the device caches no memory. A freed tensor's memory goes back to the host
    at once, so there is nothing to release and `memory_reserved()` always equals `memory_allocated()`."""


# -- events and streams -------------------------------------------------------------------------------------
# One implementation: the C++ runtime's streams and events (csrc/events.cpp), which the generic torch.Stream /
# torch.Event / torch.accelerator APIs reach through the device guard. These classes only add CUDA's names.


class _EventType(type):
    """torch.neuron.Event(...) makes a plain torch.Event on the device: PyTorch's C++ accepts only that exact
    type as the other event (`a.elapsed_time(b)`), so a subclass would not do; isinstance still works."""

    def __call__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise RuntimeError("neuron: interprocess events are not supported")
        return torch.Event(device="neuron", enable_timing=enable_timing, blocking=blocking)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "neuron"


class Event(metaclass=_EventType):
    """A marker in the device's queue; with enable_timing it stamps the time the device reached it
    (`record`, `query`, `synchronize`, `wait`, `elapsed_time`: torch.Event's, served by the C++ runtime)."""


class Stream(torch.Stream):
    """A stream of one logical core: `Stream(device=None, priority=0)`, or the generic constructor's
    `Stream(stream_id=..., device_index=..., device_type=...)` for an existing one."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:
            return super().__new__(cls, priority=priority, **kwargs)
        return super().__new__(cls, device=torch.device("neuron", guard.index_of(device)), priority=priority)

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.priority = priority


def _as_neuron_stream(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def default_stream(device=None) -> Stream:
    s = torch.accelerator.current_stream(guard.index_of(device))
    return Stream(stream_id=0, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None) -> Stream:
    return _as_neuron_stream(torch.accelerator.current_stream(guard.index_of(device)))


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(s: torch.Stream | None):
    if s is None:
        yield
        return
    prev = current_stream(s.device_index)
    set_stream(s)
    try:
        yield
    finally:
        set_stream(prev)


# -- autocast -----------------------------------------------------------------------------------------------


def get_amp_supported_dtype() -> list[torch.dtype]:
    # CUDA's order, which PyTorch's "only supports dtypes of ..." warning for an unsupported dtype lists
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True
