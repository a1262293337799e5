"""The state of one kernel trace: which program instance runs, what is allocated and live on chip, what has
been written, which HBM tensors the kernel returns or writes, and the instructions it issued (for the cost
model). A kernel is traced once per input signature; nothing here runs at a launch.

What belongs to the running program's core (PROGRAM_STATE: its program id, its SBUF/PSUM account, loop
scopes, engine registers and PRNG state, the instruction call it is in) is swapped by nki/programs.py when
an LNC-2 launch switches between its two programs; the rest (HBM, outputs, instructions) is shared."""

from __future__ import annotations

import math
import functools
from dataclasses import dataclass, field

from . import limits

_current: list = []  # the trace being run (one at a time: tracing is single-threaded)


def current() -> "Trace":
    if not _current:
        raise limits.NkiError("nki: this call is only valid inside an @nki.jit kernel while it runs")
    return _current[-1]


def active() -> "Trace | None":
    return _current[-1] if _current else None


def device() -> str:
    """Where new tensors of the running trace go (constants and fills must sit beside its tiles)."""
    return _current[-1].device if _current else "cpu"


@dataclass
class Instruction:
    """One issued instruction, as the cost model sees it."""
    name: str
    engine: str
    elements: int  # elements per partition streamed (compute engines) or bytes moved (DMA)
    partitions: int
    flops: int = 0
    line: str = ""
    dtype: object = None  # the streamed operand's dtype (Tensor Engine fp32 is 4x slower; Vector perf mode)
    inputs: int = 1  # tiles streamed in (Vector: two inputs take twice the cycles)
    # (storage id, first, last element, view) regions read: the view is (offset, shape, strides, element bytes)
    # of the elements in the view's dtype, or None where runtime offsets move it (the hazard checker's)
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)  # ... and written
    core: int = 0  # the physical core (rank) that issued it: 0, or 1 in an LNC-2 launch
    sync: tuple | None = None  # a rendezvous with the other core (sendrecv, core_barrier): the same key on both
    loops: tuple = ()  # the loop iterations it is in, outermost first: ((loop id, iteration), ...); nki/hazards.py
    epoch: int = 0  # the rendezvous its program had passed (LNC-2): what it is ordered after on the other core
    accumulates: str | None = None  # an associative accumulation into its destination ("matmul", "add")
    written: list | None = None  # with Trace.capture: per region of `writes`, the bytes it left there (or None)
    pairs: int = 1  # Tensor Engine: contraction rows each PE multiplies per cycle (2: nc_matmul's double_row)


# what each program instance's core has of its own (Trace attributes swapped at a program switch)
PROGRAM_STATE = ("program", "hbm_allocs_this_program", "live", "scopes", "depth", "pending_reads",
                 "pending_writes", "registers", "loop_key", "epoch")

GRID_LOOP = 0  # the loop id of the launch grid's programs (their "iterations" are the ranks)


def _live() -> dict:
    return {"sbuf": 0, "psum": 0, "banks": 0}  # bytes per partition live in SBUF and PSUM, PSUM banks live


@dataclass
class Trace:
    name: str
    grid: tuple[int, ...] = ()
    program: tuple[int, ...] = ()
    output_examples: list | None = None  # pass 2: the j-th shared_hbm allocation is output_examples[j]
    outputs: list = field(default_factory=list)  # storages of the kernel's HBM allocations, in order
    hbm_allocs_this_program: int = 0
    written_inputs: set = field(default_factory=set)  # indices of input tensors the kernel writes
    live: dict = field(default_factory=_live)
    peak_bytes: dict = field(default_factory=lambda: {"sbuf": 0, "psum": 0})
    warned: set = field(default_factory=set)
    instructions: list = field(default_factory=list)
    pending_reads: list = field(default_factory=list)  # regions the running instruction call read ...
    pending_writes: list = field(default_factory=list)  # ... and wrote
    scopes: list = field(default_factory=list)  # per running nl loop iteration: the tiles allocated in it
    depth: int = 0  # nesting of instruction calls (nl.matmul issues a transpose and an nc_matmul)
    constants: list = field(default_factory=list)  # tensors baked into the trace (part of its cache key)
    quiet: bool = False  # the second pass: the first has warned already
    device: str = "cpu"  # where the trace's tensors are: "meta" (checking pass) or "cpu" (recording pass)
    registers: dict = field(default_factory=dict)  # engine state kept across instructions (accumulators, PRNGs)
    fuser: object = None  # the recording pass's fusion.PsumFuser (matmuls deferred into one GEMM), or None
    runtime_control: str | None = None  # the first loop / condition on a value read at run time (checking pass)
    launch: object = None  # nki/programs.py's scheduler of the program instances (their rendezvous)
    loop_key: tuple = ()  # the running loop iterations ((loop id, iteration), ...), outermost first
    loops: list = field(default_factory=lambda: [("grid", "the launch grid")])  # loop id -> (kind, line)
    epoch: int = 0  # rendezvous the running program has passed
    storages: dict = field(default_factory=dict)  # storage id -> (description, memory, allocation site)
    order: object = None  # nki/order.py's Order: the affine_range iterations and programs run in another order
    # a run on real values for the hazard checker: the bytes each write leaves in an HBM tensor that a launch
    # grid's programs write (storage id -> storage while running; nki/hazards.py compares programs' values)
    capture: dict | None = None

    def program_state(self) -> dict:
        return {k: getattr(self, k) for k in PROGRAM_STATE}

    def load_program_state(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    @staticmethod
    def fresh_program_state(program: tuple) -> dict:
        """A core's state when a program instance starts on it: nothing live, registers unset."""
        return {"program": program, "hbm_allocs_this_program": 0, "live": _live(), "scopes": [], "depth": 0,
                "pending_reads": [], "pending_writes": [], "registers": {}, "loop_key": (), "epoch": 0}

    def enter_loop(self, kind: str, line: str) -> int:
        """A new loop instance (one execution of a `for` over nl.affine_range and the like): its id."""
        self.loops.append((kind, line))
        return len(self.loops) - 1

    def account(self, storage) -> None:
        """Count an on-chip allocation as live from its first use (so a tile re-allocated in each loop
        iteration is not counted twice while the name still holds the previous one), until it is dropped."""
        if storage.accounted or storage.buffer.name not in ("sbuf", "psum"):
            return
        storage.accounted = True
        kind = storage.buffer.name
        per_partition = storage.bytes_per_partition
        live = self.live  # the running program's core's
        if kind == "sbuf":
            limit = limits.SBUF_PARTITION_BYTES
            limits.check(live[kind] + per_partition <= limit, "SBUF allocation",
                         f"the tile {storage.describe()} allocated at {storage.site} needs {per_partition} B per partition with "
                         f"{live[kind]} B already live; SBUF has {limit} B per partition "
                         f"(28 MiB = 128 x 224 KiB)")
        else:
            banks = math.ceil(per_partition / limits.PSUM_BANK_BYTES)
            limits.check(live["banks"] + banks <= limits.PSUM_BANKS, "PSUM allocation",
                         f"the tile {storage.describe()} allocated at {storage.site} needs {banks} bank(s) of {limits.PSUM_BANK_BYTES} B "
                         f"with {live['banks']} live; PSUM has {limits.PSUM_BANKS} banks per partition "
                         f"(16 KiB)")
            live["banks"] += banks
            storage.banks = banks
        live[kind] += per_partition
        self.peak_bytes[kind] = max(self.peak_bytes[kind], live[kind])
        storage.release = functools.partial(_release, live)  # freed from the core that holds it

    def warn_once(self, key, instruction: str, problem: str) -> None:
        if not self.quiet and key not in self.warned:
            self.warned.add(key)
            limits.warn(instruction, problem)


def _release(live: dict, kind: str, per_partition: int, banks: int) -> None:
    live[kind] -= per_partition
    live["banks"] -= banks
