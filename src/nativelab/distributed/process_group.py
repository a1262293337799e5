"""`neuron` collectives: gloo run on the host memory behind device tensors.

Device memory is host memory, so a collective needs no copies: drain the device queue (queued ops may
still be writing the inputs), hand gloo zero-copy host views of the device tensors, and its results land
in the device storages. It works across machines wherever gloo does (TCP).

PyTorch's C++ `Backend` cannot be subclassed from Python, so this is a Python `ProcessGroup` that owns a
`ProcessGroupGloo`; `init_process_group` uses a `ProcessGroup` returned by a backend's creator as the group.

Teardown: gloo's worker threads release each finished collective's tensors, and the host views among them are
Python objects, so a worker must never outlive the interpreter (a thread that takes the GIL while Python
finalizes is stopped by pthread_exit, and unwinding through C++ destructors aborts the process: "terminate
called without an active exception"). The group object itself can outlive `destroy_process_group()` (PyTorch
modules imported after `init_process_group`, such as torch.distributed.nn.functional, keep the world group in
their default arguments), so `shutdown()` drops gloo there, whose destructor joins its threads while Python is
alive; and at exit the groups never destroyed are released the same way, unless a collective is still running.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as _c10d

from ..device import memory, observe, queue
from ..device.config import DEVICE_NAME
from . import _private
from .local_rank import bind_local_rank, under_torchrun

DEVICE = memory.DEVICE
_AVG = dist.ReduceOp.AVG
_SUM = dist.ReduceOp.SUM
_PREMUL_SUM = dist.ReduceOp.RedOpType.PREMUL_SUM


def _host(x):
    """Device tensors (also in nested lists) -> zero-copy CPU views of their memory; anything else as is."""
    if isinstance(x, torch.Tensor):
        return memory.host_view(x) if x.device.type == DEVICE else x
    if isinstance(x, (list, tuple)):
        return [_host(y) for y in x]
    return x


def _flat(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat(y)]
    return []


class HostWork(dist.Work):
    """gloo's work on host views, seen from the device: waiting finishes the collective's own post-step
    (the division of an AVG) once, and the future yields the device tensors, not the host views."""

    def __init__(self, work, result: list[torch.Tensor], finish=None, done=None):
        super().__init__()
        self._work = work
        self._result = result
        self._finish = finish
        self._done = done  # tells the group this work was waited for
        self._lock = threading.Lock()

    def _complete(self) -> None:
        with self._lock:
            finish, self._finish = self._finish, None
            done, self._done = self._done, None
        if done is not None:
            done()
        if finish is not None:
            with torch.inference_mode():  # host views may be inference tensors; nothing here is differentiated
                finish()

    def wait(self, timeout: timedelta | None = None) -> bool:
        if timeout is None:
            self._work.wait()
        else:
            self._work.wait(timeout)
        self._complete()
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        def done(fut):
            fut.value()  # re-raises gloo's error
            self._complete()
            return self._result

        return self._work.get_future().then(done)


class NeuronProcessGroup(_private.PythonProcessGroup):
    """The `neuron` backend: every collective torch.distributed issues, on device or CPU tensors."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._running: dict[int, object] = {}  # gloo works launched and not yet waited for (see release)
        self._running_lock = threading.Lock()  # futures' callbacks finish works on gloo's threads
        _groups.add(self)
        self._group_name = ""
        self._group_desc = ""
        self._coalesced: list[HostWork] | None = None  # works launched inside a coalescing_manager block

    # -- identity (c10d asks a Python group for these; the C++ defaults fail with "name not set") --------

    def name(self) -> str:
        return DEVICE_NAME

    def _get_backend_name(self) -> str:
        return DEVICE_NAME

    @property
    def group_name(self) -> str:
        return self._group_name

    def set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    def backend(self, device=None):
        """The gloo backend behind this group (c10d asks it about splitting when `device_id` is given).
        Calling collectives on it directly with device tensors would bypass the host views: use the group."""
        return self._backend()

    def _backend(self):
        if self._gloo is None:
            raise RuntimeError("neuron process group: used after destroy_process_group()")
        return self._gloo

    def set_sequence_number_for_group(self) -> None:
        _private.set_sequence_number_for_group(self._backend())

    # -- the one launch path ------------------------------------------------------------------------------

    def _launch(self, method: str, outputs, *args, opts=None):
        """Run gloo's `method` on host views of `args` (+ `opts`). `outputs` are the device tensors the
        collective writes (an AVG divides them once gloo's SUM is done)."""
        finish = None
        if opts is not None and hasattr(opts, "reduceOp"):
            op = opts.reduceOp
            if op == _PREMUL_SUM:
                raise ValueError("neuron backend: ReduceOp.PREMUL_SUM is not supported (gloo has no pre-multiply)")
            if op == _AVG:
                finish = self._average(outputs)
                opts = _as_sum(opts)
        if observe.collective is not None:  # a watching tool (nativelab.check) counts it at the user's line
            observe.collective(_KINDS.get(method, method), args, self.size())
        # Run at once after the queue drained (queued device ops may still write the inputs), on host views.
        extra = (opts,) if opts is not None else ()
        started = queue.run_now("collective", _KINDS.get(method, method), getattr(self._backend(), method),
                                *args, *extra)
        work = self._track(started, _flat(outputs), finish)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _average(self, tensors):
        views = [_host(t) for t in _flat(tensors)]
        for v in views:
            if not (v.dtype.is_floating_point or v.dtype.is_complex):
                raise ValueError(f"neuron backend: ReduceOp.AVG needs floating-point tensors, got {v.dtype}")
        n = self.size()
        return lambda: [v.div_(n) for v in views]

    # -- collectives (the methods torch.distributed calls on a group) -------------------------------------

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        opts = _opts(opts, _c10d.AllreduceOptions)
        return self._launch("allreduce", tensors, tensors, opts=opts)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = _opts(opts, _c10d.AllreduceCoalescedOptions)
        return self._launch("allreduce_coalesced", tensors, tensors, opts=opts)

    def broadcast(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        return self._launch("broadcast", tensors, tensors, opts=_opts(opts, _c10d.BroadcastOptions))

    def reduce(self, tensors, opts=None):
        return self._launch("reduce", tensors, tensors, opts=_opts(opts, _c10d.ReduceOptions))

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._launch(
            "allgather", output_tensors, output_tensors, input_tensors, opts=_opts(opts, _c10d.AllgatherOptions)
        )

    def all_gather_single(self, output, input, opts=None):
        return self._launch("_allgather_base", output, output, input, opts=_opts(opts, _c10d.AllgatherOptions))

    _allgather_base = all_gather_single  # the name before PyTorch 2.12

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self._launch(
            "allgather_coalesced", output_lists, output_lists, input_list, opts=_opts(opts, _c10d.AllgatherOptions)
        )

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        return self._launch(
            "reduce_scatter", output_tensors, output_tensors, input_lists, opts=_opts(opts, _c10d.ReduceScatterOptions)
        )

    def reduce_scatter_single(self, output, input, opts=None):
        return self._launch(
            "_reduce_scatter_base", output, output, input, opts=_opts(opts, _c10d.ReduceScatterOptions)
        )

    _reduce_scatter_base = reduce_scatter_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._each_pair(self.all_gather_single, outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._each_pair(self.reduce_scatter_single, outputs, inputs, opts)

    def _each_pair(self, one, outputs, inputs, opts):
        """gloo has no coalesced form of these: one launch per pair, one handle for all."""
        works = [one(o, i, opts) for o, i in zip(outputs, inputs)]
        return HostWork(_AllWork(works), list(outputs))

    def gather(self, output_lists, input_tensors, opts=None):
        return self._launch("gather", output_lists, output_lists, input_tensors, opts=_opts(opts, _c10d.GatherOptions))

    def scatter(self, output_tensors, input_lists, opts=None):
        return self._launch(
            "scatter", output_tensors, output_tensors, input_lists, opts=_opts(opts, _c10d.ScatterOptions)
        )

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._launch(
            "alltoall_base", output, output, input, output_split_sizes, input_split_sizes,
            opts=_opts(opts, _c10d.AllToAllOptions),
        )

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._launch(
            "alltoall", output_tensors, output_tensors, input_tensors, opts=_opts(opts, _c10d.AllToAllOptions)
        )

    def send(self, tensors, dst: int, tag: int = 0):
        return self._launch("send", [], tensors, dst, tag)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._launch("recv", tensors, tensors, src, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._launch("recv_anysource", tensors, tensors, tag)

    def barrier(self, opts=None):
        opts = _opts(opts, _c10d.BarrierOptions)
        opts.device = torch.device("cpu")  # gloo's barrier: no tensors
        if observe.collective is not None:
            observe.collective("barrier", (), self.size())
        # a barrier also orders the device's queued work before it
        return self._track(queue.run_now("collective", "barrier", self._backend().barrier, opts), [])

    def start_coalescing(self, device):
        self._coalesced = []

    def end_coalescing(self, device):
        works, self._coalesced = self._coalesced or [], None
        return HostWork(_AllWork(works), [t for w in works for t in w.result()])

    def _track(self, gloo_work, result, finish=None) -> HostWork:
        key = id(gloo_work)
        finished = [k for k, w in self._snapshot() if w.is_completed()]  # done, never waited for
        with self._running_lock:
            for k in finished:
                self._running.pop(k, None)
            self._running[key] = gloo_work
        return HostWork(gloo_work, result, finish, done=lambda: self._forget(key))

    def _forget(self, key: int) -> None:
        with self._running_lock:
            self._running.pop(key, None)

    def _snapshot(self) -> list:
        """The running works, read under the lock; asked about outside it (gloo's calls release the GIL, and
        a future's callback on a gloo thread takes the lock with the GIL held)."""
        with self._running_lock:
            return list(self._running.items())

    def abort(self) -> None:
        if self._gloo is not None:
            self._gloo.abort()

    def shutdown(self) -> None:
        """`destroy_process_group()`: gloo goes now; its destructor waits for queued work and joins its threads."""
        self.release()

    def release(self, only_if_idle: bool = False) -> bool:
        """Drop the gloo backend (joining its threads); at exit, only when no collective is still running, since
        joining a worker stuck on a peer would hang the exit. Returns whether it was released."""
        if self._gloo is None:
            return False
        if only_if_idle and any(not w.is_completed() for _, w in self._snapshot()):
            return False
        with self._running_lock:
            self._running.clear()
        gloo, self._gloo = self._gloo, None
        gloo.shutdown()
        del gloo  # the last reference: ProcessGroupGloo's destructor runs here
        return True


_groups: weakref.WeakSet[NeuronProcessGroup] = weakref.WeakSet()


@atexit.register
def _release_at_exit() -> None:
    """A program that never called destroy_process_group(): stop gloo's threads before Python finalizes."""
    for group in list(_groups):
        group.release(only_if_idle=True)


# gloo's method -> the collective's name in torch.distributed (what a report calls it)
_KINDS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "allgather": "all_gather",
    "_allgather_base": "all_gather", "allgather_coalesced": "all_gather", "_reduce_scatter_base": "reduce_scatter",
    "alltoall_base": "all_to_all", "alltoall": "all_to_all", "recv_anysource": "recv",
}


def _opts(opts, cls):
    return cls() if opts is None else opts


def _as_sum(opts):
    """The same options with SUM (a copy: the caller's may be reused for other launches)."""
    new = type(opts)()
    new.reduceOp = _SUM
    new.timeout = opts.timeout
    return new


class _AllWork:
    """One handle for the works of a coalesced block (gloo ran them one by one)."""

    def __init__(self, works: list[HostWork]):
        self._works = works

    def wait(self, timeout=None):
        for w in self._works:
            w.wait(timeout)
        return True

    def is_completed(self):
        return all(w.is_completed() for w in self._works)

    def is_success(self):
        return all(w.is_success() for w in self._works)

    def exception(self):
        return next((w.exception() for w in self._works if w.exception() is not None), None)

    def source_rank(self):
        return -1

    def get_future(self):
        return torch.futures.collect_all([w.get_future() for w in self._works])


def create(store, rank: int, size: int, timeout: timedelta) -> NeuronProcessGroup:
    """The creator `Backend.register_backend` calls for `backend="neuron"` (or the device's default).
    Under torchrun each rank is bound to `neuron:{LOCAL_RANK}` here, before any collective runs."""
    if under_torchrun():
        bind_local_rank()
    return NeuronProcessGroup(store, rank, size, timeout)
