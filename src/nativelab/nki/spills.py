"""The spills a compiler adds where a kernel's SBUF tiles live at once do not fit a partition, for the cost model.

AWS's Fused Mamba tutorial (aws-neuron-sdk nki/tutorials/fused_mamba.rst, SDK 2.26) shows what happens on the
chip: mamba_v2 at seq_len 8192 has six [128, 8192] fp32 tiles (inputs, accumulator, intermediates) and a
one-partition row of B live at once, one row more than a 192 KiB trn1 partition holds, and its profile gains
"DMA activity rows qSyncSpillReload0 and qVectorSpillReload0, which are associated with data movement traffic for
intermediate data spill from SBUF into device memory or reload back to SBUF"; "VectorE enters idle states due to
a blocking semaphore wait" for them, and the kernel takes 52.2 ms against 27.8 for mamba_v3, which tiles seq_len
to keep its tiles small. The checker (nki/trace.py Occupancy) refuses only a kernel whose tiles cannot fit by
their area; between that and a placement that fits every partition lies what the compiler spills.

The model, on the estimate's instruction stream, per core:
- A tile (an SBUF storage) is allocated where its live range starts and freed after its last access, the ranges
  as the checker counts them (a write from HBM or immediates opens none: the compiler issues it just in time).
- SBUF is 128 partitions of the target's bytes ([trn2] 224 KiB, [trn1] 192 KiB a partition): a tile of p
  partitions takes its bytes on p adjacent partitions (a window aligned to p, or ending at 128), the window
  with the least use.
- Where no window has room, the compiler spills: the live tile not accessed by the instruction whose next
  access is farthest away (Belady's choice; AWS does not document its compiler's), until one has room. A spill
  is a DMA store of the tile to HBM, and before the tile's next access a DMA reload (the whole tile, each way).
- The compiler issues a spill and a reload in the instruction stream of the engine whose instruction needs them
  (the profile's queues are named for that engine: qVectorSpillReload0), and the engine waits for them ("VectorE
  enters idle states due to a blocking semaphore wait"): each starts after that engine's previous instruction,
  a reload after its store too, and the instruction waits for the stores that made its space and its reloads.
Nothing is spilled, and the stream is returned unchanged, where the tiles live at once fit every partition.
PSUM is not modelled (its tiles are one bank or a few: the checker's bank limits keep them within it)."""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math

from . import trace

PARTITIONS = 128


def _tiles(instructions, storages: dict) -> dict:
    """SBUF storage id -> [partitions, bytes a partition, range start, range end, access indices]."""
    tiles: dict = {}
    for i, ins in enumerate(instructions):
        onchip_read = any(storages.get(r[0], (None, None))[1] in ("sbuf", "psum") for r in ins.reads)
        for regions, write in ((ins.reads, False), (ins.writes, True)):
            for sid, *_ in regions:
                st = storages.get(sid)
                if st is None or st[1] != "sbuf":
                    continue
                t = tiles.get(sid)
                if t is None:
                    shape = st[4]
                    p = shape[0] if len(shape) else 1
                    t = tiles[sid] = [p, math.prod(shape[1:]) * st[5], None, i, []]
                if not t[4] or t[4][-1] != i:
                    t[4].append(i)
                t[3] = i
                if t[2] is None and (not write or onchip_read):
                    t[2] = i
    for t in tiles.values():
        if t[2] is None:
            t[2] = t[3]
    return tiles


def _fits_sequentially(tiles: dict, cores: dict, capacity: int) -> bool:
    """Whether, on every core, the tiles live at once never hold more than a partition's bytes together (then
    any placement fits every partition, and nothing spills)."""
    for core in set(cores.values()):
        events = []
        for sid, (p, b, start, end, _) in tiles.items():
            if cores[sid] == core:
                events += [(start, 0, b), (end, 1, -b)]  # a range starting where another ends overlaps it
        used = 0
        for _, _, delta in sorted(events):
            used += delta
            if used > capacity:
                return False
    return True


class _Sbuf:
    """One core's SBUF: the bytes used on each partition, and where each resident tile sits."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = [0] * PARTITIONS
        self.where: dict = {}  # sid -> (first partition, partitions, bytes)

    def window(self, p: int, b: int):
        """The first partition of the least-used window that has room for p partitions of b bytes, or None."""
        p = min(p, PARTITIONS)
        starts = sorted({*range(0, PARTITIONS - p + 1, p), PARTITIONS - p})
        best = min(starts, key=lambda s: max(self.used[s:s + p]))
        return best if max(self.used[best:best + p]) + b <= self.capacity else None

    def put(self, sid, start: int, p: int, b: int) -> None:
        p = min(p, PARTITIONS)
        for k in range(start, start + p):
            self.used[k] += b
        self.where[sid] = (start, p, b)

    def drop(self, sid) -> None:
        start, p, b = self.where.pop(sid)
        for k in range(start, start + p):
            self.used[k] -= b


def with_spills(instructions, storages: dict | None, partition_bytes: int) -> tuple[list, int, int]:
    """The instruction stream with the spill stores and reloads the compiler adds (see the module docstring):
    (instructions, tiles spilled, bytes moved by spills and reloads). Each added DMA is a trace.Instruction
    named "spill" or "reload"; `after` names the instructions (indices in the returned list) it, or an
    instruction that takes the space it frees, waits for."""
    if not storages:
        return instructions, 0, 0
    tiles = _tiles(instructions, storages)
    cores = {}
    for i, ins in enumerate(instructions):
        for sid, *_ in (*ins.reads, *ins.writes):
            if sid in tiles:
                cores.setdefault(sid, ins.core)
    if _fits_sequentially(tiles, cores, partition_bytes):
        return instructions, 0, 0

    opens: dict = {}  # instruction index -> tiles whose range starts there
    closes: dict = {}  # ... ends there
    for sid, (_, _, start, end, _) in tiles.items():
        opens.setdefault(start, []).append(sid)
        closes.setdefault(end, []).append(sid)
    sbufs: dict = {}
    spilled: dict = {}  # sid -> index (in the new stream) of the store that spilled it
    last: dict = {}  # (core, engine) -> index (in the new stream) of that engine's latest instruction
    out: list = []
    count = moved = 0

    def next_access(sid, i: int) -> int:
        accesses = tiles[sid][4]
        k = bisect.bisect_right(accesses, i)
        return accesses[k] if k < len(accesses) else math.inf

    def issued_by(ins) -> tuple:
        """What a spill or reload for `ins` waits for: its engine's previous instruction (a DMA queue is not
        in program order: nothing)."""
        j = last.get((ins.core, ins.engine)) if ins.engine != "dma" else None
        return () if j is None else (j,)

    def make_room(sbuf: _Sbuf, sid, i: int, busy: set, core: int, waits: list) -> None:
        """Place tile `sid` (opened or reloaded at instruction i), spilling others until it fits."""
        p, b = tiles[sid][0], tiles[sid][1]
        start = sbuf.window(p, b)
        if start is None:
            victims = [(-next_access(v, i), v) for v in sbuf.where if v not in busy]
            heapq.heapify(victims)
            while start is None and victims:
                _, v = heapq.heappop(victims)
                waits.append(spill(sbuf, v, instructions[i]))
                start = sbuf.window(p, b)
            if start is None:  # the instruction's own tiles do not fit: the checker's business, not a spill
                start = 0
        sbuf.put(sid, start, p, b)

    def spill(sbuf: _Sbuf, v, ins) -> int:
        nonlocal count, moved
        p, b = tiles[v][0], tiles[v][1]
        sbuf.drop(v)
        out.append(trace.Instruction("spill", "dma", p * b, p, line=ins.line, core=ins.core, after=issued_by(ins),
                                     reads=[(v, 0, math.inf, None)], writes=[(("spill", v), 0, math.inf, None)]))
        spilled[v] = len(out) - 1
        count += 1
        moved += p * b
        return len(out) - 1

    for i, ins in enumerate(instructions):
        sbuf = sbufs.setdefault(ins.core, _Sbuf(partition_bytes))
        busy = {sid for sid, *_ in (*ins.reads, *ins.writes) if sid in tiles}
        waits: list = []
        for sid in sorted((s for s in busy if s in spilled), key=str):  # reload what this instruction accesses
            store = spilled.pop(sid)
            mine: list = []
            make_room(sbuf, sid, i, busy, ins.core, mine)
            p, b = tiles[sid][0], tiles[sid][1]
            after = (store, *mine, *issued_by(ins))
            out.append(trace.Instruction("reload", "dma", p * b, p, line=ins.line, core=ins.core,
                                         reads=[(("spill", sid), 0, math.inf, None)],
                                         writes=[(sid, 0, math.inf, None)], after=after))
            moved += p * b
            waits.append(len(out) - 1)
        for sid in opens.get(i, ()):
            make_room(sbuf, sid, i, busy, ins.core, waits)
        stores = tuple(w for w in waits if out[w].name == "spill")
        out.append(dataclasses.replace(ins, after=(*ins.after, *stores)) if stores else ins)
        last[(ins.core, ins.engine)] = len(out) - 1
        for sid in closes.get(i, ()):
            if sid in sbuf.where:
                sbuf.drop(sid)
    return out, count, moved
