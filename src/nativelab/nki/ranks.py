"""nki.multi_rank_simulate: one kernel on several ranks in one CPU process, its nki.collectives exchanging data
between them, as AWS's API page for it (nki.multi_rank_simulate, Neuron SDK 2.34) specifies: each rank runs
`kernel(*args, **kwargs)` with its own (args, kwargs); array arguments may differ in value across ranks but not
in shape or dtype, every other argument must be equal on every rank; returns each rank's result, in rank order.

How the ranks meet: by replay, not by threads. Each rank's kernel runs interpreted (nki.simulate) to its first
collective over other ranks whose data it has not got, posts its sources there and stops (`Suspend`); once
every rank of that rank-list has posted the same collective, the next round runs each rank again from the
start, now through that collective with everybody's sources, to its next unknown one. A kernel with C such
collectives runs C + 1 times per rank. Replays keep one thread and one trace at a time (the tracer's state is
global), at the price of repeating work; a rank whose sources change between replays (a kernel that is not a
function of its inputs) is an error, since its partners already used the old ones.

A collective over a rank-list of one rank never waits. Outside multi_rank_simulate, in a process of an
initialized torch.distributed group of several, a kernel is that process's rank and its collectives exchange
data with the other processes over the group (AWS's NKI CPU Simulator page: "When torch.distributed is
initialized, calls through nki.simulate use its process group for collective communication. Each process
supplies only its own rank's inputs."), point to point between the rank-list's members. Otherwise a kernel
runs on one rank, rank 0, of a world of one (nki/collectives.py)."""

from __future__ import annotations

import copy
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from . import limits


class Suspend(BaseException):
    """Raised in a rank at a collective whose partners' data is not in yet: the round goes on to the next rank.
    A BaseException, so that a kernel's own `except Exception` does not swallow it."""


@dataclass
class _Post:
    instruction: str
    key: tuple
    line: str

    @property
    def group(self) -> tuple:
        return self.key[1]


@dataclass
class World:
    """The ranks of one multi_rank_simulate call and the data their collectives have exchanged so far."""
    size: int
    rank: int = 0  # the rank running now
    sources: dict = field(default_factory=dict)  # (program, group, n) -> {rank: (instruction, [tensors])}
    waiting: dict = field(default_factory=dict)  # rank -> _Post, in the round running now


_world: World | None = None


def current() -> World | None:
    return _world


def _process_group() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """The running rank: its index in the multi_rank_simulate world, else this process's in its group, else 0."""
    if _world is not None:
        return _world.rank
    return dist.get_rank() if _process_group() else 0


def size() -> int:
    """How many ranks there are (1: this kernel runs alone)."""
    if _world is not None:
        return _world.size
    return dist.get_world_size() if _process_group() else 1


def exchange(instruction: str, group: list, key: tuple, mine: list) -> list:
    """Every rank of `group` (a rank-list holding the running rank) posts `mine` (tensors) at the collective
    `key` ((program, group, n): the n-th collective over this rank-list in this run of this program); returns
    each member's list, in rank-list order, or suspends this rank until all have posted."""
    if _world is None:
        return _over_process_group(instruction, group, mine)
    w = _world
    r = w.rank
    slot = w.sources.setdefault(key, {})
    if r in slot:  # a replay: the same collective must send the same data again
        was_instruction, was = slot[r]
        limits.check(was_instruction == instruction and len(was) == len(mine)
                     and all(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
                             for a, b in zip(was, mine)), instruction,
                     f"rank {r} sends other data than it sent when this kernel last ran to this point "
                     f"(nki.multi_rank_simulate replays each rank from its start at every collective, so a "
                     f"kernel's collectives must depend only on its inputs)")
    else:
        slot[r] = (instruction, [t.detach().clone() for t in mine])
    if any(m not in slot for m in group):
        w.waiting[r] = _Post(instruction, key, limits.kernel_line())
        raise Suspend()
    kinds = {slot[m][0] for m in group}
    limits.check(len(kinds) == 1, instruction,
                 f"the ranks {group} meet at different collectives here: "
                 + ", ".join(f"rank {m} at {slot[m][0]}" for m in group)
                 + " (each rank of a rank-list must issue the same sequence of collectives over it)")
    return [slot[m][1] for m in group]


def _over_process_group(instruction: str, group: list, mine: list) -> list:
    """`mine` sent to, and the same collective's tensors received from, each other member of `group` over the
    default process group (every process runs the same kernel specialization, so its sources have this rank's
    shapes and dtypes; a header first checks that both sides are at the same collective)."""
    me = dist.get_rank()
    mine = [t.detach().contiguous() for t in mine]
    header = torch.tensor([zlib.crc32(instruction.encode()), len(mine), sum(t.numel() for t in mine)], dtype=torch.int64)
    peers = [m for m in group if m != me]
    headers = {m: torch.empty_like(header) for m in peers}
    _wait([dist.isend(header, m) for m in peers] + [dist.irecv(headers[m], m) for m in peers])
    for m in peers:
        limits.check(torch.equal(headers[m], header), instruction,
                     f"rank {me} issues it over the ranks {group}, but rank {m} is at another collective (or the same "
                     f"one with other sources): every rank of a rank-list must issue the same collectives over it")
    got = {m: [torch.empty_like(t) for t in mine] for m in peers}
    _wait([dist.isend(t, m) for m in peers for t in mine] + [dist.irecv(t, m) for m in peers for t in got[m]])
    return [mine if m == me else got[m] for m in group]


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


def _arrays_and_statics(per_rank_inputs, world_size: int) -> list:
    if isinstance(per_rank_inputs, dict):
        missing = [r for r in range(world_size) if r not in per_rank_inputs]
        extra = [r for r in per_rank_inputs if not (isinstance(r, int) and 0 <= r < world_size)]
        if missing or extra:
            raise ValueError(f"nki.multi_rank_simulate: per_rank_inputs must have one key per rank 0..{world_size - 1}"
                             f"{f'; missing {missing}' if missing else ''}{f'; not ranks: {extra}' if extra else ''}")
        pairs = [per_rank_inputs[r] for r in range(world_size)]
    else:
        pairs = list(per_rank_inputs)
        if len(pairs) != world_size:
            raise ValueError(f"nki.multi_rank_simulate: per_rank_inputs holds {len(pairs)} (args, kwargs) pairs for "
                             f"world_size={world_size} ranks")
    out = []
    for r, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], (tuple, list))
                and isinstance(pair[1], dict)):
            raise TypeError(f"nki.multi_rank_simulate: rank {r}'s input must be an (args tuple, kwargs dict) pair, "
                            f"got {type(pair).__name__}")
        out.append((tuple(pair[0]), dict(pair[1])))
    first_args, first_kwargs = out[0]
    for r, (args, kwargs) in enumerate(out[1:], start=1):
        if len(args) != len(first_args) or set(kwargs) != set(first_kwargs):
            raise ValueError(f"nki.multi_rank_simulate: every rank runs the same kernel specialization, but rank {r} "
                             f"passes {len(args)} positional argument(s) and keywords {sorted(kwargs)} where rank 0 "
                             f"passes {len(first_args)} and {sorted(first_kwargs)}")
        named = [(f"argument {k}", a, first_args[k]) for k, a in enumerate(args)]
        named += [(f"argument {name!r}", kwargs[name], first_kwargs[name]) for name in kwargs]
        for what, mine, rank0 in named:
            if _is_array(mine) or _is_array(rank0):
                if not (_is_array(mine) and _is_array(rank0) and type(mine) is type(rank0)
                        and tuple(mine.shape) == tuple(rank0.shape) and mine.dtype == rank0.dtype):
                    raise ValueError(f"nki.multi_rank_simulate: {what} is an array of one shape and dtype on every "
                                     f"rank; rank {r} has {_describe(mine)}, rank 0 {_describe(rank0)}")
            elif not _equal(mine, rank0):
                raise ValueError(f"nki.multi_rank_simulate: {what} is not an array, so it is static and must be "
                                 f"equal on every rank; rank {r} passes {mine!r}, rank 0 {rank0!r}")
    return out


def _is_array(x) -> bool:
    """A dynamic argument: AWS's page says NumPy arrays; torch tensors are taken the same way."""
    return isinstance(x, (np.ndarray, torch.Tensor))


def _describe(x) -> str:
    return f"{tuple(x.shape)} {x.dtype}" if _is_array(x) else type(x).__name__


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object whose == is not a truth value
        return a is b


def multi_rank_simulate(kernel, *, world_size: int, per_rank_inputs) -> list:
    """Run `kernel` on ranks 0..world_size-1 in this process (see the module docstring); returns each rank's
    result in rank order. Arrays a rank's kernel writes are written back into that rank's arrays."""
    from .standalone import simulate  # noqa: PLC0415 - standalone imports the jit machinery, which imports this

    global _world
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"nki.multi_rank_simulate: world_size must be an int >= 1, got {world_size!r}")
    if _world is not None:
        raise RuntimeError("nki.multi_rank_simulate: already running (a kernel cannot start another world)")
    inputs = _arrays_and_statics(per_rank_inputs, world_size)
    sim = simulate(kernel)
    world = _world = World(world_size)
    results: dict = {}
    try:
        while len(results) < world_size:
            world.waiting = {}
            for r in range(world_size):
                if r in results:
                    continue
                world.rank = r
                args, kwargs = copy.deepcopy(inputs[r])  # a replay starts from the inputs as given
                try:
                    results[r] = (sim(*args, **kwargs), args, kwargs)
                except Suspend:
                    pass
            _check_progress(world, results)
    finally:
        _world = None
    for r, (_, args, kwargs) in results.items():  # what the last run of each rank wrote into its arrays
        given_args, given_kwargs = inputs[r]
        for given, ran in [*zip(given_args, args), *((given_kwargs[k], kwargs[k]) for k in kwargs)]:
            if isinstance(given, np.ndarray) and given.flags.writeable and not np.array_equal(given, ran):
                np.copyto(given, ran)
            elif isinstance(given, torch.Tensor) and not torch.equal(given, ran):
                given.copy_(ran)
    return [results[r][0] for r in range(world_size)]


def _check_progress(world: World, results: dict) -> None:
    """After a round: every waiting rank waits for a rank that has not finished, and some collective has all its
    rank-list's data (the next round gets through it); else the kernel's collectives do not pair up."""
    if not world.waiting:
        return
    for r, post in sorted(world.waiting.items()):
        slot = world.sources[post.key]
        gone = [m for m in post.group if m not in slot and m in results]
        if gone:
            raise limits.NkiError(f"nki: {post.instruction} at {post.line}: rank {r} waits for ranks {list(post.group)}, "
                                  f"but rank {gone[0]} finished the kernel without issuing it (every rank of a "
                                  f"rank-list must issue the same collectives over it)")
    if not any(all(m in world.sources[p.key] for m in p.group) for p in world.waiting.values()):
        waits = "; ".join(f"rank {r} at {p.instruction} over {list(p.group)} ({p.line})"
                          for r, p in sorted(world.waiting.items()))
        raise limits.NkiError(f"nki.multi_rank_simulate: the ranks' collectives do not pair up: {waits}")
