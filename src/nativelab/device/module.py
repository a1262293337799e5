"""`torch.neuron`: the device module, shaped like `torch.cuda` (device, memory, rng, events, streams)."""

from __future__ import annotations

import contextlib
from collections import namedtuple

import torch

from . import guard, memory, queue, rng


def __getattr__(name):
    # `_initialized` follows the device's first use (torch.utils.checkpoint reads it to decide whether to save
    # the device's RNG state), so it is looked up, not copied.
    if name == "_initialized":
        return rng.is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _lazy_init() -> None:
    rng.mark_initialized()


# -- device -------------------------------------------------------------------------------------------------


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return rng.is_initialized()


def init() -> None:
    _lazy_init()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return guard.num_cores


def current_device() -> int:
    return guard.current_index()


def set_device(device) -> None:
    _lazy_init()
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
    guard.index_of(device)
    return {}


# -- rng (the state lives in rng.py) ------------------------------------------------------------------------


def manual_seed(seed: int) -> None:
    rng.manual_seed(guard.current_index(), seed)


def manual_seed_all(seed: int) -> None:
    # Called by torch.manual_seed: must not call it back.
    for i in range(guard.num_cores):
        rng.manual_seed(i, seed)


def seed() -> None:
    rng.seed(guard.current_index())


def seed_all() -> None:
    for i in range(guard.num_cores):
        rng.seed(i)


def initial_seed() -> int:
    return rng.initial_seed(guard.current_index())


def get_rng_state(device="neuron") -> torch.Tensor:
    return rng.get_state(guard.index_of(device))


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    rng.set_state(guard.index_of(device), new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(guard.num_cores)]


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
    s.peak = s.allocated


def memory_reserved(device=None) -> int:
    return memory_allocated(device)  # no caching allocator: reserved is allocated


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def memory_stats(device=None) -> dict:
    s = memory.stats(guard.index_of(device))
    return {
        "allocated_bytes.all.current": s.allocated,
        "allocated_bytes.all.peak": s.peak,
        "allocation.all.allocated": s.num_allocs,
        "allocation.all.freed": s.num_frees,
        "allocation.all.current": s.num_allocs - s.num_frees,
        "reserved_bytes.all.current": s.allocated,
        "reserved_bytes.all.peak": s.peak,
        "capacity_bytes": s.capacity,
    }


def mem_get_info(device=None) -> tuple[int, int]:
    s = memory.stats(guard.index_of(device))
    return (s.capacity - s.allocated, s.capacity)


def empty_cache() -> None:
    """Nothing is cached: freed tensors return their memory at once."""


# -- events and streams -------------------------------------------------------------------------------------


class Event(torch.Event):
    """A marker in the device's queue; with enable_timing it stamps the time the device reached it.

    A torch.Event underneath, so the C++ streams that torch.accelerator hands out accept it
    (`torch.accelerator.current_stream().wait_event(torch.neuron.Event())`, as FSDP2 does)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, device="neuron")

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._cell = [None]
        self._recorded = False

    def record(self, stream=None) -> None:
        self._cell = [None]
        self._recorded = True
        queue.record_time(self._cell)

    def query(self) -> bool:
        return not self._recorded or self._cell[0] is not None

    def synchronize(self) -> None:
        if self._recorded and self._cell[0] is None:
            queue.drain()

    def wait(self, stream=None) -> None:
        """One in-order queue: later work already runs after this event."""

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds of device time between this event and `end` (both must have completed)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True to measure elapsed time")
        if not (self._recorded and end._recorded):
            raise RuntimeError("Both events must be recorded before calling elapsed_time()")
        if self._cell[0] is None or end._cell[0] is None:
            raise RuntimeError(
                "Both events must have completed before calling elapsed_time(): call synchronize() first"
            )
        return (end._cell[0] - self._cell[0]) * 1000.0


class Stream:
    """Streams share the device's single in-order queue, which is always a valid stream schedule."""

    _next_id = 1

    def __init__(self, device=None, priority: int = 0):
        self.device_index = guard.index_of(device)
        self.device = torch.device("neuron", self.device_index)
        self.priority = priority
        self.stream_id = Stream._next_id
        Stream._next_id += 1

    def synchronize(self) -> None:
        queue.drain()

    def query(self) -> bool:
        return queue.idle()

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, Stream) and other.stream_id == self.stream_id

    def __hash__(self):
        return hash(("neuron-stream", self.stream_id))


_default_streams: dict[int, Stream] = {}
_current_streams: dict[int, Stream] = {}


def default_stream(device=None) -> Stream:
    i = guard.index_of(device)
    if i not in _default_streams:
        _default_streams[i] = Stream(i)
    return _default_streams[i]


def current_stream(device=None) -> Stream:
    i = guard.index_of(device)
    return _current_streams.get(i) or default_stream(i)


def set_stream(stream: Stream) -> None:
    _current_streams[stream.device_index] = stream


@contextlib.contextmanager
def stream(s: Stream | None):
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
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True
