"""nki.collectives: collectives across ranks (NeuronCores of one or more chips) from inside a kernel, as AWS's
`nki.collectives` API pages (NKI 0.5.0) specify them: all_reduce, all_gather, reduce_scatter, all_to_all,
collective_permute, the ring forms collective_permute_implicit[_reduce] with
collective_permute_implicit_current_processing_rank_id, and rank_id, over a ReplicaGroup.

A kernel here runs on one rank, rank 0 (the emulated device has no interconnect between kernels): a
collective whose replica group gives rank 0 a rank-list of one (`[[0]]`, or no group) is exact (each
collective of one rank is a copy, the reductions over one operand), and one that needs other ranks is an
NkiError naming the group. The copies are DMA work in the cost model.

(The LNC-2 exchange between the two cores of a logical core is nki.isa.sendrecv / core_barrier:
nki/isa/collectives.py.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import limits
from .core import compute, instruction, on_chip, record
from .ops import Op
from .tensor import NkiTensor, VirtualRegister, read, write
from .language import NKIObject

__all__ = ["ReplicaGroup", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
           "collective_permute_implicit", "collective_permute_implicit_reduce",
           "collective_permute_implicit_current_processing_rank_id", "rank_id"]

RANK = 0  # the rank a kernel runs on here


@dataclass
class ReplicaGroup(NKIObject):
    """The ranks a collective runs over, as rank-lists (each runs the collective independently; no rank in
    two lists)."""
    replica_groups: list = field(default_factory=lambda: [[RANK]])

    def __post_init__(self):
        groups = [list(g) for g in self.replica_groups]
        seen = [r for g in groups for r in g]
        if len(seen) != len(set(seen)):
            raise limits.NkiError(f"nki.collectives.ReplicaGroup: rank-lists {groups} overlap (a rank may be in "
                                  f"one rank-list only)")
        self.replica_groups = groups

    def ranks_with(self, rank: int) -> list:
        return next((g for g in self.replica_groups if rank in g), [rank])


def _one_rank(instruction: str, replica_group) -> None:
    """The collective's rank-list for this rank must be this rank alone (the only rank there is)."""
    group = replica_group.ranks_with(RANK) if isinstance(replica_group, ReplicaGroup) else [RANK]
    limits.check(group == [RANK], instruction,
                 f"replica group {getattr(replica_group, 'replica_groups', replica_group)} puts rank {RANK} with "
                 f"ranks {group}: a kernel here runs on one rank (rank {RANK}), so a collective across {len(group)} "
                 f"ranks cannot run (use rank-lists of one, [[0]], to run the kernel's single-rank path)")


def _pairs(instruction: str, srcs, dsts):
    srcs, dsts = list(srcs), list(dsts)
    limits.check(len(srcs) == len(dsts) and srcs, instruction,
                 f"takes one destination per source, got {len(srcs)} source(s) and {len(dsts)} destination(s)")
    for s, d in zip(srcs, dsts):
        limits.check(isinstance(s, NkiTensor) and isinstance(d, NkiTensor), instruction,
                     f"sources and destinations are NKI tensors, got {s!r} and {d!r}")
        limits.check(s.buffer.on_chip == d.buffer.on_chip, instruction,
                     f"mixes memories ({s!r} -> {d!r}): all tensors are on HBM or all on SBUF")
        limits.check(s.numel() == d.numel(), instruction,
                     f"on one rank the destination {d!r} receives the source {s!r} whole: their sizes differ")
    return zip(srcs, dsts)


def _copy(instruction: str, src: NkiTensor, dst: NkiTensor) -> None:
    record(instruction, "dma", dst)
    write(dst, read(src, instruction).reshape(dst.shape), instruction, source=src)


def _each_to_itself(instruction: str, srcs, dsts, replica_group) -> None:
    """A collective over a rank-list of one rank: each destination receives its source."""
    _one_rank(instruction, replica_group)
    for s, d in _pairs(instruction, srcs, dsts):
        _copy(instruction, s, d)


def all_reduce(srcs, dsts, replica_group=None, op=None, **_kw) -> None:
    """Each destination gets the op-reduction of its source over the group's ranks (one rank: the source)."""
    _each_to_itself("nki.collectives.all_reduce", srcs, dsts, replica_group)


def all_gather(srcs, dsts, replica_group=None, collective_dim: int = 0, **_kw) -> None:
    """Each destination gets the group's sources concatenated along collective_dim (one rank: its own)."""
    _each_to_itself("nki.collectives.all_gather", srcs, dsts, replica_group)


def reduce_scatter(srcs, dsts, replica_group=None, op=None, collective_dim: int = 0, **_kw) -> None:
    """Each rank gets its slice of the reduction over the group (one rank: the whole source)."""
    _each_to_itself("nki.collectives.reduce_scatter", srcs, dsts, replica_group)


def all_to_all(srcs, dsts, replica_group=None, collective_dim: int = 0, **_kw) -> None:
    """Rank r's j-th slice goes to rank j's r-th slice (one rank: the source unchanged)."""
    _each_to_itself("nki.collectives.all_to_all", srcs, dsts, replica_group)


def collective_permute(srcs, dsts, replica_group=None, source_target_pairs=None, **_kw) -> None:
    """Data sent between ranks along explicit (source, target) pairs (one rank: (0, 0), a copy)."""
    _one_rank("nki.collectives.collective_permute", replica_group)
    pairs = [tuple(p) for p in (source_target_pairs or [(RANK, RANK)])]
    limits.check(all(p == (RANK, RANK) for p in pairs), "nki.collectives.collective_permute",
                 f"source-target pairs {pairs} name ranks other than {RANK}, the one rank a kernel runs on here")
    _each_to_itself("nki.collectives.collective_permute", srcs, dsts, replica_group)


def _by_channel(instruction: str, *lists):
    for lst in lists:
        for inner in lst:
            limits.check(len(inner) == 1, instruction,
                         f"each channel's list holds exactly one tensor (no coalescing), got {len(inner)}")
    return [[inner[0] for inner in lst] for lst in lists]


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group=None, channel_ids=(0,),
                                **_kw) -> None:
    """Each rank sends to its ring successor and receives from its predecessor, per channel (a ring of one
    rank: its own data)."""
    ins = "nki.collectives.collective_permute_implicit"
    _each_to_itself(ins, *_by_channel(ins, srcs_by_channel, dsts_by_channel), replica_group)


def collective_permute_implicit_reduce(srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group=None,
                                       op=None, channel_ids=(0,), **_kw) -> None:
    """As collective_permute_implicit, each rank sending op(srcs0[i], srcs1[i]) (a ring of one: its own)."""
    ins = "nki.collectives.collective_permute_implicit_reduce"
    _one_rank(ins, replica_group)
    limits.check(isinstance(op, Op), ins, f"op must be an nl operator (nl.add, nl.maximum, ...), got {op!r}")
    a, b, dsts = _by_channel(ins, srcs0_by_channel, srcs1_by_channel, dsts_by_channel)
    for x, y, d in zip(a, b, dsts):
        if d.buffer.on_chip:
            on_chip(ins, x, y)
        value, _ = compute(op, [read(x, ins), read(y, ins)])
        record(ins, "dma", d)
        write(d, value.reshape(d.shape), ins)


def collective_permute_implicit_current_processing_rank_id(iteration_id: int = 0, channel_id: int = 0,
                                                           replica_group=None, **_kw) -> int:
    """The rank whose data a ring iteration processes (a ring of one: always this rank)."""
    _one_rank("nki.collectives.collective_permute_implicit_current_processing_rank_id", replica_group)
    return RANK


def rank_id() -> VirtualRegister:
    """This rank's id, as a register (usable as an index and as a select's index): 0."""
    return VirtualRegister(RANK)


for _name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
              "collective_permute_implicit", "collective_permute_implicit_reduce"):
    globals()[_name] = instruction(globals()[_name])  # what they read and write are their dependencies
del _name
