"""nki.collectives: collectives across ranks (NeuronCores of one or more chips) from inside a kernel, as AWS's
`nki.collectives` API pages (NKI 0.5.0) specify them: all_reduce, all_gather, reduce_scatter, all_to_all,
collective_permute, the ring forms collective_permute_implicit[_reduce] with
collective_permute_implicit_current_processing_rank_id, and rank_id, over a ReplicaGroup.

Ranks: nki.multi_rank_simulate runs a kernel on several ranks in one process, an initialized torch.distributed
group runs it on one rank a process; there each collective gathers its rank-list's sources (nki/ranks.py) and
every rank computes its own destinations from them. Elsewhere a kernel runs on one
rank, rank 0: a collective whose rank-list is that rank alone (`[[0]]`, or no group) is exact (a copy, the
reductions over one operand), one that needs other ranks is an NkiError naming the group and
nki.multi_rank_simulate. The checking pass (meta tensors) computes each collective as if every rank of the
rank-list had sent this rank's sources: shapes are checked there, values exchanged only when the kernel runs.
The data moved is DMA work in the cost model (the destinations' bytes).

(The LNC-2 exchange between the two cores of a logical core is nki.isa.sendrecv / core_barrier:
nki/isa/collectives.py.)"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import limits, ranks, trace
from .core import compute, instruction, on_chip, record
from .ops import Op
from .tensor import NkiTensor, VirtualRegister, read, write
from .language import NKIObject

__all__ = ["ReplicaGroup", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
           "collective_permute_implicit", "collective_permute_implicit_reduce",
           "collective_permute_implicit_current_processing_rank_id", "rank_id"]


@dataclass
class ReplicaGroup(NKIObject):
    """The ranks a collective runs over, as rank-lists (each runs the collective independently; no rank in
    two lists)."""
    replica_groups: list = field(default_factory=lambda: [[0]])

    def __post_init__(self):
        groups = [list(g) for g in self.replica_groups]
        seen = [r for g in groups for r in g]
        if len(seen) != len(set(seen)):
            raise limits.NkiError(f"nki.collectives.ReplicaGroup: rank-lists {groups} overlap (a rank may be in "
                                  f"one rank-list only)")
        self.replica_groups = groups

    def ranks_with(self, rank: int) -> list:
        return next((g for g in self.replica_groups if rank in g), [rank])


def _rank_list(instruction: str, replica_group) -> list:
    """The running rank's rank-list in `replica_group` (no group: the rank alone), checked against the world."""
    me, size = ranks.rank(), ranks.size()
    group = replica_group.ranks_with(me) if isinstance(replica_group, ReplicaGroup) else [me]
    if group != [me] and size == 1:
        raise limits.NkiError(
            f"{instruction}: replica group {getattr(replica_group, 'replica_groups', replica_group)} puts rank {me} "
            f"with ranks {group}, but this kernel runs on one rank (rank {me}): run it on {len(group)} or more ranks "
            f"with nki.multi_rank_simulate(kernel, world_size=..., per_rank_inputs=...) or in each process of a "
            f"torch.distributed group, or use rank-lists of one ([[0]]) for the kernel's single-rank path")
    limits.check(all(isinstance(r, int) and 0 <= r < size for r in group), instruction,
                 f"replica group {getattr(replica_group, 'replica_groups', replica_group)} names ranks outside "
                 f"the world of {size} rank(s) (0..{size - 1})")
    return group


def _gathered(instruction: str, group: list, mine: list) -> list:
    """Each rank-list member's `mine`, in rank-list order: this rank's alone for a rank-list of one, its own
    repeated in the checking pass (shapes only), else exchanged (nki/ranks.py)."""
    if len(group) == 1:
        return [mine]
    tr = trace.current()
    if tr.device == "meta":
        if tr.runtime_control is None:  # a launch waits for other ranks' data: run it, a graph cannot hold that
            tr.runtime_control = (f"{instruction} at {limits.kernel_line()} exchanges data with ranks {group} while "
                                  f"the kernel runs, which a compiled graph cannot")
        return [mine] * len(group)
    program = tr.launch.rank if tr.launch is not None else 0
    n = tr.collectives.get((program, tuple(group)), 0)
    tr.collectives[(program, tuple(group))] = n + 1
    return ranks.exchange(instruction, group, (program, tuple(group), n), mine)


def _pairs(instruction: str, srcs, dsts) -> list:
    srcs, dsts = list(srcs), list(dsts)
    limits.check(len(srcs) == len(dsts) and srcs, instruction,
                 f"takes one destination per source, got {len(srcs)} source(s) and {len(dsts)} destination(s)")
    for s, d in zip(srcs, dsts):
        limits.check(isinstance(s, NkiTensor) and isinstance(d, NkiTensor), instruction,
                     f"sources and destinations are NKI tensors, got {s!r} and {d!r}")
        limits.check(s.buffer.on_chip == d.buffer.on_chip, instruction,
                     f"mixes memories ({s!r} -> {d!r}): all tensors are on HBM or all on SBUF")
    return list(zip(srcs, dsts))


def _land(instruction: str, dst: NkiTensor, value: torch.Tensor, what: str, source: NkiTensor | None = None) -> None:
    """`value` into `dst`, element by element in row-major order (a DMA: the shapes may differ, the sizes not)."""
    limits.check(value.numel() == dst.numel(), instruction,
                 f"the destination {dst!r} receives {what}, {value.numel()} elements (shape {tuple(value.shape)}): "
                 f"its size must be that")
    record(instruction, "dma", dst)
    write(dst, value.reshape(dst.shape), instruction, source=source)


def _reduce(instruction: str, op, values: list) -> torch.Tensor:
    limits.check(isinstance(op, Op), instruction, f"op must be an nl operator (nl.add, nl.minimum or nl.maximum), "
                                                  f"got {op!r}")
    total = values[0]
    for v in values[1:]:
        total, _ = compute(op, [total, v])
    return total


def _split(instruction: str, value: torch.Tensor, parts: int, dim: int) -> tuple:
    limits.check(0 <= dim < value.dim() and value.shape[dim] % parts == 0, instruction,
                 f"splits its source of shape {tuple(value.shape)} along dimension {dim} into {parts} equal parts "
                 f"(one per rank): that dimension must exist and be a multiple of {parts}")
    return value.chunk(parts, dim)


def _collective(instruction: str, srcs, dsts, replica_group, result) -> None:
    """A collective over the running rank's rank-list: `result(all_sources, position)` is a destination's value
    from every member's matching source (rank-list order) and this rank's position in the rank-list. Over a
    rank-list of one, every collective copies its source (a reduction of one operand, a gather of one part)."""
    pairs = _pairs(instruction, srcs, dsts)
    group = _rank_list(instruction, replica_group)
    gathered = _gathered(instruction, group, [read(s, instruction) for s, _ in pairs])
    me = group.index(ranks.rank())
    for k, (s, d) in enumerate(pairs):
        if len(group) == 1:
            _land(instruction, d, gathered[0][k], "its source", source=s)
        else:
            _land(instruction, d, result([member[k] for member in gathered], me), f"the data of {len(group)} ranks")


def all_reduce(srcs, dsts, replica_group=None, op=None, **_kw) -> None:
    """Each destination gets the op-reduction of its source over the rank-list's ranks."""
    ins = "nki.collectives.all_reduce"
    _collective(ins, srcs, dsts, replica_group, lambda vals, me: _reduce(ins, op, vals))


def all_gather(srcs, dsts, replica_group=None, collective_dim: int = 0, **_kw) -> None:
    """Each destination gets the rank-list's sources concatenated along collective_dim, in rank-list order."""
    _collective("nki.collectives.all_gather", srcs, dsts, replica_group,
                lambda vals, me: torch.cat(vals, int(collective_dim)))


def reduce_scatter(srcs, dsts, replica_group=None, op=None, collective_dim: int = 0, **_kw) -> None:
    """The sources reduced over the rank-list and split along collective_dim into one part per rank: the rank at
    position i of the rank-list gets part i."""
    ins = "nki.collectives.reduce_scatter"
    _collective(ins, srcs, dsts, replica_group,
                lambda vals, me: _split(ins, _reduce(ins, op, vals), len(vals), int(collective_dim))[me])


def all_to_all(srcs, dsts, replica_group=None, collective_dim: int = 0, **_kw) -> None:
    """Each source split along collective_dim into one part per rank; the rank at position i gets part i of
    every rank's source, concatenated in rank-list order."""
    ins = "nki.collectives.all_to_all"
    _collective(ins, srcs, dsts, replica_group, lambda vals, me: torch.cat(
        [_split(ins, v, len(vals), int(collective_dim))[me] for v in vals], int(collective_dim)))


def collective_permute(srcs, dsts, source_target_pairs=None, replica_group=None, **_kw) -> None:
    """Data sent between ranks along explicit (source, target) pairs: a rank that is some pair's target
    receives that pair's source rank's data; one that is no target keeps its destination."""
    ins = "nki.collectives.collective_permute"
    me = ranks.rank()
    pairs_st = [tuple(int(r) for r in p) for p in (source_target_pairs or [(me, me)])]
    targets = [t for _, t in pairs_st]
    limits.check(len(targets) == len(set(targets)), ins,
                 f"source-target pairs {pairs_st} send to one rank twice (each rank receives from one source)")
    members = sorted({r for p in pairs_st for r in p})
    group = _rank_list(ins, ReplicaGroup([members]) if members != [me] else replica_group)
    pairs = _pairs(ins, srcs, dsts)
    gathered = _gathered(ins, group, [read(s, ins) for s, _ in pairs])
    source = next((s for s, t in pairs_st if t == me), None)
    if source is None:
        return
    for k, (s, d) in enumerate(pairs):
        _land(ins, d, gathered[group.index(source)][k], f"rank {source}'s data")


def _by_channel(instruction: str, *lists):
    for lst in lists:
        for inner in lst:
            limits.check(len(inner) == 1, instruction,
                         f"each channel's list holds exactly one tensor (no coalescing), got {len(inner)}")
    return [[inner[0] for inner in lst] for lst in lists]


def _ring(instruction: str, sent: list, dsts: list, replica_group) -> None:
    """Each rank of the rank-list (a ring, in rank-list order) sends `sent` (a value per channel) to its successor
    and receives its predecessor's into `dsts`."""
    group = _rank_list(instruction, replica_group)
    gathered = _gathered(instruction, group, sent)
    before = gathered[(group.index(ranks.rank()) - 1) % len(group)]
    for value, d in zip(before, dsts):
        _land(instruction, d, value, "its ring predecessor's data")


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group=None, channel_ids=(0,),
                                **_kw) -> None:
    """Each rank sends to its ring successor and receives from its predecessor, per channel."""
    ins = "nki.collectives.collective_permute_implicit"
    srcs, dsts = _by_channel(ins, srcs_by_channel, dsts_by_channel)
    _pairs(ins, srcs, dsts)
    _ring(ins, [read(s, ins) for s in srcs], dsts, replica_group)


def collective_permute_implicit_reduce(srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group=None,
                                       op=None, channel_ids=(0,), **_kw) -> None:
    """As collective_permute_implicit, each rank sending op(srcs0[i], srcs1[i])."""
    ins = "nki.collectives.collective_permute_implicit_reduce"
    limits.check(isinstance(op, Op), ins, f"op must be an nl operator (nl.add, nl.maximum, ...), got {op!r}")
    a, b, dsts = _by_channel(ins, srcs0_by_channel, srcs1_by_channel, dsts_by_channel)
    sent = []
    for x, y, d in zip(a, b, dsts):
        if d.buffer.on_chip:
            on_chip(ins, x, y)
        xv = read(x, ins)
        value, _ = compute(op, [xv, read(y, ins)])
        sent.append(value.to(xv.dtype))
    _ring(ins, sent, dsts, replica_group)


def collective_permute_implicit_current_processing_rank_id(iteration_id: int = 0, replica_group=None,
                                                           channel_id: int = 0, num_channels: int = 1,
                                                           **_kw) -> VirtualRegister:
    """The rank whose data a ring iteration processes: this rank's at iteration 0, then, one step further back
    along the ring at each iteration, the data its predecessors sent on (the same ring on every channel)."""
    ins = "nki.collectives.collective_permute_implicit_current_processing_rank_id"
    group = _rank_list(ins, replica_group)
    limits.check(isinstance(iteration_id, int) and not isinstance(iteration_id, bool), ins,
                 f"iteration_id must be the ring step as an int, got {iteration_id!r}")
    return _register(group[(group.index(ranks.rank()) - iteration_id) % len(group)])


def _register(value: int) -> VirtualRegister:
    """A rank id in a register: an immediate on a world of one (as a compiled kernel has always seen it); in
    nki.multi_rank_simulate a value known at run time, as on the chip, where every rank runs one specialization
    of the kernel: the checking pass, shared by the ranks, cannot branch on it (nki/tensor.py VirtualRegister)."""
    if ranks.size() == 1:
        return VirtualRegister(value)
    return VirtualRegister(torch.tensor([[value]], dtype=torch.int32, device=trace.device()))


def rank_id() -> VirtualRegister:
    """This rank's id, as a register (usable as .ap's scalar_offset, a select's index, a condition)."""
    return _register(ranks.rank())


for _name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
              "collective_permute_implicit", "collective_permute_implicit_reduce"):
    globals()[_name] = instruction(globals()[_name])  # what they read and write are their dependencies
del _name
