"""The hazard checker: races between the iterations of an `nl.affine_range` loop, and between the programs of
a launch grid, found in the accesses a kernel's trace records (once per signature, not per launch).

Why. AWS's nl.affine_range page (Neuron SDK 2.28 and earlier, nki/api/nki/language/__init__.py;
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.language.affine_range.html):
affine_range is for loops with "no loop carried dependency"; "different iterations could be
parallelized/pipelined on different compute engines within a NeuronCore". Its sequential_range page: "Using
affine_range instead of sequential_range in case of loop carried dependency incorrectly is considered unsafe
and could lead to numerical errors", and Python's `range` "will be replaced with sequential_range"
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.language.sequential_range.html). An
emulator that runs iterations in order (this one, AWS's nki.simulate) returns the sequential answer; the
chip may not. From SDK 2.29 the page calls affine_range an alias of `range`; a kernel this checker passes is
safe under both readings.

What. Within one execution of an affine_range loop (or one launch's programs), two accesses to overlapping
elements of one tensor (SBUF, PSUM or HBM) from different iterations, at least one a write:
  RAW  a later iteration reads what an earlier one wrote;
  WAR  a later iteration writes what an earlier one read;
  WAW  two iterations write it.
Programs of an LNC-2 launch are ordered across their rendezvous (sendrecv, core_barrier): only accesses
between the same two rendezvous race. sequential_range, static_range, dynamic_range and `range` are never
reported. A tile allocated inside the loop body is a new tile in each iteration, so it races with nothing
(unless a later iteration reaches it through a Python variable: that is a carried dependency too).

Allowed, as AWS's pages say (no finding):
  - nc_matmul (and nc_matmul_mx) accumulating into one PSUM tile across iterations: the affine_range page's
    "associative reduction" example, "nc_matmul calls accumulating into the same output buffer defined
    outside of this loop level"; nc_matmul's `accumulate` page: accumulate=None "first write overwrites,
    subsequent writes accumulate" (nki.isa.nc_matmul, "Accumulation mode";
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.isa.nc_matmul.html);
  - `buffer += value` (and `t[i] += value`), the page's `result_psum += nl.matmul(...)`;
  - dma_copy(..., dst_rmw_op=nl.add), "dst = dst_rmw_op(dst, src)" by the DMA engine (the nki.isa.dma_copy
    page of SDK 2.28, aws-neuron-sdk nki/api/nki/isa/__init__.py), and dma_compute with dst among its sources.
Two accumulations of the same kind into the same tile do not race with each other; anything else that
reads or writes the accumulator in another iteration does (a partial sum read while others add to it).

Two programs of a launch writing the same HBM elements with equal values (both compute the whole output,
unsharded) are still reported, as duplicated work, but not as a race on values: where the launch's tensors have
values, one interpreted run keeps what each program's write left (Trace.capture), and a WAW whose programs left
equal bytes says so.

Not checked: accesses through runtime offsets (.ap's scalar_offset / vector_offset, gathers, scatters):
their addresses are values read at run time. Engine registers (reduce_cmd accumulators) are not memory.

Cost: per loop execution and tensor, the accesses of different iterations are compared by their element
ranges, then as boxes of the tensor's index space (a slice of each dimension: exact), and element by element
only where neither settles it (strided or reinterpreted views) or a race is there. `auto` (the default) stops at a budget
of elements compared and says so; `full` has none (NATIVELAB_NKI_HAZARDS, or nki.jit(check="hazards"))."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from . import limits, trace

AUTO_BUDGET = 1 << 24  # elements compared element by element by default (a few seconds at most)
KINDS = {"RAW": "read after write", "WAR": "write after read", "WAW": "write after write"}
_PRIORITY = ("RAW", "WAW", "WAR")  # one finding per loop, tensor and instruction pair: the first of these


class HazardWarning(limits.NkiWarning):
    """A race between the iterations of an nl.affine_range loop (or a launch's programs) that running them in
    order hides. Its `hazard` attribute is the Hazard."""

    def __init__(self, hazard: "Hazard | str"):
        # A str too: pytest-xdist rebuilds a warning from its message when it crosses processes.
        super().__init__(hazard if isinstance(hazard, str) else hazard.message())
        self.hazard = None if isinstance(hazard, str) else hazard


class HazardError(limits.NkiError):
    """Strict mode (NATIVELAB_NKI_HAZARDS=strict, or nki.jit(check="hazards-strict")): the hazards found."""

    def __init__(self, hazards: "list | str"):
        # A str too, so that pickling (multiprocessing, pytest-xdist) can rebuild it from its message.
        text = hazards if isinstance(hazards, str) else "\n".join(h.message() for h in hazards)
        super().__init__(text)
        self.hazards = [] if isinstance(hazards, str) else hazards


@dataclass(frozen=True)
class Hazard:
    kind: str  # RAW, WAR or WAW
    loop: str  # "nl.affine_range at file:line", or "the launch grid (4,)"
    tensor: str  # what it is: name, shape, dtype
    memory: str  # sbuf, psum, hbm, shared_hbm, ...
    site: str  # where it was allocated
    first: tuple  # (instruction, its line, iteration) of the earlier access in program order
    second: tuple  # ... and of the later one
    also: tuple = ()  # the other kinds between the same two instructions
    equal: bool = False  # a WAW between programs that wrote equal values (known from a run on real values)

    def message(self) -> str:
        (i1, l1, n1), (i2, l2, n2) = self.first, self.second
        what = {"RAW": ("writes", "reads"), "WAR": ("reads", "writes"), "WAW": ("writes", "writes")}[self.kind]
        unit = "program" if self.loop.startswith("the launch grid") else "iteration"
        also = f"; also {', '.join(self.also)}" if self.also else ""
        thing = "tile" if self.memory in ("sbuf", "psum") else "tensor"
        if unit == "program" and self.equal:
            return (f"nki: {self.kind} hazard ({KINDS[self.kind]}{also}) between the programs of {self.loop}: "
                    f"program {n1}'s {i1} at {l1} and program {n2}'s {i2} at {l2} write the same elements of the "
                    f"{thing} {self.tensor} ({self.memory}, allocated at {self.site}) with equal values: either "
                    f"order leaves the same result, so this is no race on values, but both programs do the same "
                    f"work: give each program its own part of the tensor")
        if unit == "program":
            fix = "give each program its own part of the tensor, or order them (nisa.core_barrier)"
        elif self.kind == "WAW":
            fix = "let each iteration write its own elements, or run the loop with nl.sequential_range"
        else:
            fix = ("carry the dependency with nl.sequential_range, or give each iteration its own tile "
                   "(allocate it inside the loop)")
        return (f"nki: {self.kind} hazard ({KINDS[self.kind]}{also}) between the {unit}s of {self.loop}: {unit} "
                f"{n1}'s {i1} at {l1} {what[0]} the {thing} {self.tensor} ({self.memory}, allocated at {self.site}) "
                f"and {unit} {n2}'s {i2} at {l2} {what[1]} the same elements. On the chip {unit}s may run in any "
                f"order or at once, so the result depends on which comes first: {fix}")


@dataclass
class _Access:
    index: int  # the instruction's position in the trace (program order)
    write: bool
    lo: int  # the first and last byte of its range in the allocation
    hi: int
    view: tuple  # (offset, shape, strides, element bytes)
    iteration: object
    epoch: int
    group: str | None  # the accumulation it belongs to, if it is an accumulator access
    left: object = None  # a write's bytes [lo, hi] as it left them (a run on real values), else None


def mode(option) -> str:
    """off, auto, full or strict: the kernel's check= option, else NATIVELAB_NKI_HAZARDS."""
    from .. import settings
    if option is None:
        return settings.NKI_HAZARDS.get()
    if option is False or option == "off":
        return "off"
    if option == "hazards":
        return "strict" if settings.NKI_HAZARDS.get() == "strict" else "full"
    if option == "hazards-strict":
        return "strict"
    raise ValueError(f"nki.jit: check must be 'hazards', 'hazards-strict', 'off' or None, got {option!r}")


def find(instructions, loops, storages, grid=(), budget: int | None = None) -> tuple[list, bool]:
    """The hazards in a trace's instructions (trace.Instruction: their loops and regions), one per loop line,
    tensor and pair of instruction lines; and whether the budget (elements compared) stopped the search."""
    parallel = {i for i, (kind, _) in enumerate(loops) if kind in ("affine", "grid")}
    groups: dict = {}  # (loop id, the loop iterations around it, storage id) -> [access]
    for index, ins in enumerate(instructions):
        inside = [k for k, (loop, _) in enumerate(ins.loops) if loop in parallel]
        if not inside:
            continue
        written = {(sid, view) for sid, _, _, view in ins.writes}
        written_ids = {sid for sid, _ in written}
        left = ins.written or [None] * len(ins.writes)
        for write, regions in ((False, ins.reads), (True, ins.writes)):
            for n, (sid, lo, hi, view) in enumerate(regions):
                if view is None:  # moved by runtime offsets (or a barrier's token): addresses unknown here
                    continue
                group = None
                if ins.accumulates and sid in written_ids and (write or (sid, view) in written):
                    group = ins.accumulates  # its destination: the accumulator
                for k in inside:
                    loop, iteration = ins.loops[k]
                    if loop == trace.GRID_LOOP and storages[sid][1] not in ("hbm", "shared_hbm"):
                        continue  # a program's own tiles and private HBM: no other program reaches them
                    groups.setdefault((loop, ins.loops[:k], sid), []).append(
                        _Access(index, write, lo * view[3], (hi + 1) * view[3] - 1, view, iteration, ins.epoch, group,
                                left[n] if write else None))
    found: dict = {}  # (loop id of the first found, loop line, tensor, instruction lines) -> {kind: (a, b)}
    spent = 0
    for (loop, _, sid), accesses in groups.items():
        if not _ranges_meet(accesses) or not _boxes_meet(accesses, storages[sid][4], storages[sid][5],
                                                           loop == trace.GRID_LOOP):
            continue
        spent += sum(_size(a.view) for a in accesses)
        for kind, a, b in _conflicts(accesses, loop == trace.GRID_LOOP):
            ia, ib = instructions[a.index], instructions[b.index]
            key = (loops[loop][1], storages[sid][:3], frozenset((ia.line, ib.line)))  # RAW and WAR of a pair: one
            entry = found.setdefault(key, (loop, {}, [True]))
            entry[1].setdefault(kind, (a, b))
            entry[2][0] = entry[2][0] and kind == "WAW" and loop == trace.GRID_LOOP and _equal_values(a, b)
        if budget is not None and spent > budget:
            return _hazards(found, instructions, loops, grid), True
    return _hazards(found, instructions, loops, grid), False


def _ranges_meet(accesses) -> bool:
    """Whether two iterations' element ranges overlap, one of them writing (else there is nothing to compare
    element by element; loops over disjoint row blocks end here)."""
    if not any(a.write for a in accesses):
        return False
    spans: dict = {}
    for a in accesses:
        lo, hi = spans.get(a.iteration, (a.lo, a.hi))
        spans[a.iteration] = (min(lo, a.lo), max(hi, a.hi))
    ordered = sorted(spans.values())
    reach = ordered[0][1]
    for lo, hi in ordered[1:]:
        if lo <= reach:
            return True
        reach = max(reach, hi)
    return False


def box(view, shape, size):
    """The view as a box of the allocation's (row-major) index space, [first, last] per dimension, when it is
    one (each of its dimensions one of the allocation's, step 1, its own dtype); else None."""
    offset, vshape, vstrides, vsize = view
    if vsize != size:
        return None
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    lo = [(offset // st) % n for st, n in zip(strides, shape)]
    hi = list(lo)
    used = set()
    for n, st in zip(vshape, vstrides):
        if n == 1:
            continue
        d = next((d for d in range(len(shape)) if strides[d] == st and shape[d] > 1 and d not in used), None)
        if d is None or lo[d] + n > shape[d]:
            return None
        used.add(d)
        hi[d] = lo[d] + n - 1
    return lo, hi


def _boxes_meet(accesses, shape, size, grid: bool) -> bool:
    """Whether two accesses of different iterations (one a write, not two of one accumulation, in a grid not
    ordered by a rendezvous) may share an element: exactly, where both are boxes (tile [i] of a tile, column
    blocks); True where one is not (the element-by-element comparison decides)."""
    boxes = [box(a.view, shape, size) for a in accesses]
    if any(b is None for b in boxes) or not shape:
        return True
    lo = np.array([b[0] for b in boxes], dtype=np.int64)
    hi = np.array([b[1] for b in boxes], dtype=np.int64)
    iters = {it: n for n, it in enumerate(dict.fromkeys(a.iteration for a in accesses))}
    code = np.array([iters[a.iteration] for a in accesses])
    groups = np.array([hash(a.group) if a.group is not None else 0 for a in accesses])
    epochs = np.array([a.epoch for a in accesses])
    for w, a in enumerate(accesses):
        if not a.write:
            continue
        meet = (lo <= hi[w]).all(axis=1) & (lo[w] <= hi).all(axis=1) & (code != code[w])
        if a.group is not None:
            meet &= groups != groups[w]
        if grid:
            meet &= epochs == epochs[w]
        if meet.any():
            return True
    return False


def _conflicts(accesses, grid: bool):
    """(kind, earlier, later) pairs of accesses from different iterations to a shared element, element by
    element: per element the last writer and the last writer of another iteration than it (so a writer of
    any other iteration than a new access's is one of the two), the same for readers. Not two accesses of
    one accumulation; in a launch grid, not accesses a rendezvous orders."""
    accesses = sorted(accesses, key=lambda a: a.index)
    unit = math.gcd(*{a.view[3] for a in accesses})
    pieces = [_pieces(a.view, unit) for a in accesses]
    base = min(int(p.min()) for p in pieces if p.size)
    span = max(int(p.max()) for p in pieces if p.size) - base + 1
    iters = {it: n for n, it in enumerate(dict.fromkeys(a.iteration for a in accesses))}
    code = np.array([iters[a.iteration] for a in accesses] + [-1], dtype=np.int64)  # [-1]: none yet
    last = {w: np.full(span, -1, dtype=np.int64) for w in (False, True)}  # access ids, per element
    other = {w: np.full(span, -1, dtype=np.int64) for w in (False, True)}
    seen = set()
    for x, (a, idx) in enumerate(zip(accesses, pieces)):
        if not idx.size:
            continue
        idx = idx - base
        mine = code[x]
        for earlier_write in ((True, False) if a.write else (True,)):
            prior = np.concatenate([last[earlier_write][idx], other[earlier_write][idx]])
            prior = np.unique(prior[(prior >= 0) & (code[prior] != mine)])
            for p in prior.tolist():
                b = accesses[p]
                if b.group is not None and b.group == a.group:
                    continue  # two accumulations into one tile: associative (the module docstring)
                if grid and b.epoch != a.epoch:
                    continue  # a rendezvous orders them
                kind = "WAW" if a.write and earlier_write else "RAW" if earlier_write else "WAR"
                if (kind, b.index, a.index) not in seen:
                    seen.add((kind, b.index, a.index))
                    yield kind, b, a
        previous = last[a.write][idx]
        moved = (previous >= 0) & (code[previous] != mine)
        other[a.write][idx[moved]] = previous[moved]
        last[a.write][idx] = x


def _equal_values(a: _Access, b: _Access) -> bool:
    """Two writes left equal bytes in the elements both wrote (known only from a run on real values)."""
    if a.left is None or b.left is None:
        return False
    common = np.intersect1d(_pieces(a.view, 1), _pieces(b.view, 1))
    return bool(np.array_equal(a.left[common - a.lo], b.left[common - b.lo]))


def _size(view) -> int:
    return math.prod(view[1])


def _pieces(view, unit: int) -> np.ndarray:
    """The view's elements as indices of `unit`-byte pieces of the allocation (views of one tile in
    different dtypes compare byte for byte)."""
    offset, shape, strides, size = view
    idx = np.asarray(offset, dtype=np.int64)
    for n, s in zip(shape, strides):
        idx = idx[..., None] + np.arange(n, dtype=np.int64) * s
    idx = idx.reshape(-1)
    if size == unit:
        return idx
    per = size // unit
    return (idx[:, None] * per + np.arange(per, dtype=np.int64)).reshape(-1)


def _hazards(found: dict, instructions, loops, grid) -> list:
    out = []
    for (line, (describe, memory, site), _), (loop, hits, equal) in found.items():
        kinds = [k for k in _PRIORITY if k in hits]
        a, b = hits[kinds[0]]
        where = (f"the launch grid {tuple(grid) or (1,)}" if loop == trace.GRID_LOOP else f"nl.affine_range at {line}")
        ia, ib = instructions[a.index], instructions[b.index]
        out.append(Hazard(kinds[0], where, describe, memory, site, (ia.name, ia.line, a.iteration),
                          (ib.name, ib.line, b.iteration), tuple(kinds[1:]), equal[0]))
    return out


def escaping_loops(instructions, loops, storages) -> set:
    """The lines of the affine_range loops whose iterations allocate a tile that is used outside its iteration
    (kept in a Python list for later loops, say): their iteration order is the trace's own, not the chip's."""
    out = set()
    for ins in instructions:
        inside = set(ins.loops)
        for sid, _, _, _ in ins.reads + ins.writes:
            for loop, iteration in storages[sid][3]:
                if (loop, iteration) not in inside and loops[loop][0] == "affine":
                    out.add(loops[loop][1])
    return out


def report(hazards: list, strict: bool, stacklevel: int = 3) -> None:
    """Each hazard as a HazardWarning, or (strict) all of them as one HazardError."""
    if not hazards:
        return
    if strict:
        raise HazardError(hazards)
    for h in hazards:
        warnings.warn(HazardWarning(h), stacklevel=stacklevel)
