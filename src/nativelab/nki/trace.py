"""The state of one kernel trace: which program instance runs, what is allocated and live on chip, what has
been written, which HBM tensors the kernel returns or writes, and the instructions it issued (for the cost
model). A kernel is traced once per input signature; nothing here runs at a launch.

What belongs to the running program's core (PROGRAM_STATE: its program id, its SBUF/PSUM account, engine
registers and PRNG state, the instruction call it is in) is swapped by nki/programs.py when an LNC-2 launch
switches between its two programs; the rest (HBM, outputs, instructions) is shared."""

from __future__ import annotations

import heapq
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
    immediates: tuple = ()  # the call's non-tile arguments (nki/rolling.py compares iterations by them too)
    after: tuple = ()  # instructions (stream indices) it waits for besides its data: a spill's space (nki/spills.py)


# what each program instance's core has of its own (Trace attributes swapped at a program switch)
PROGRAM_STATE = ("program", "hbm_allocs_this_program", "live", "depth", "pending_reads",
                 "pending_writes", "registers", "loop_key", "epoch")

GRID_LOOP = 0  # the loop id of the launch grid's programs (their "iterations" are the ranks)


class Occupancy:
    """One core's SBUF and PSUM tiles and when each holds its space, counted as AWS's compiler allocates them.

    AWS's pages: the compiler "analyzes the memory dependency and allocates a physical address to each tile", so
    tiles "may not be alive in the memory simultaneously" (NKI Block Dimension Migration Guide; its loop example
    needs one physical tile for a tile declared in an affine_range body, every iteration at the same address);
    nki.compiler.Allocation: the default allocator colours a graph of the traced tiles' live ranges, the LINEAR one
    "assigns an address to a tile at its first write and releases the address after its last read"; NKI Dynamic
    Loops: tensors allocated in a hardware loop's body "are allocated once and reused across iterations". SBUF and
    PSUM are two-dimensional: a tile's address is a rectangle, partitions by bytes (Data Representation in NKI;
    nki.compiler.sbuf.alloc / psum.alloc place a tile at a start partition and byte offset).

    So a tile holds its space from the instruction that first accesses it to the one that last does (the trace
    unrolls loops: each iteration's tile is its own range), wherever Python's names for it live, and it takes
    its partitions x its bytes per partition. The compiler schedules: a write that reads nothing on chip (a load
    from HBM, a memset, an iota) can be issued just before the tile is next used ("By loading into separate sbuf
    tensors, we give the compiler finer control over pre-fetching", as nki-library's output projection puts it),
    so such writes open no range: a tile's range starts at its first other access. An allocation is refused
    when, with the tiles live where its range starts, the rectangles would cover more than the memory has: then
    no placement fits them (a fuller count than that would be a guess at the compiler's schedule and placement;
    a kernel refused here does not fit the chip)."""

    def __init__(self):
        self.tiles: list = []  # on-chip storages in the order of their first access
        # each storage's .live: [the instruction call its range starts at, the last it is accessed in, the start's line]
        self.read_step = -1  # the last instruction call that read an on-chip tile

    def access(self, storage, step: int, write: bool) -> None:
        live = storage.live
        if live is None:
            live = storage.live = [None, step, None]
            _check_one(storage)
            self.tiles.append(storage)
        live[1] = step
        if not write:
            self.read_step = step
        if live[0] is None and (not write or self.read_step == step):  # not a write from HBM or immediates
            live[0], live[2] = step, limits.kernel_line()

    def check(self) -> dict:
        """Every tile placed in the order its range starts, with the tiles then live (ranges overlap: one
        instruction reads the last of one tile and writes the first of another): the peak bytes in each memory,
        or an NkiError at the first tile that does not fit."""
        peak = {"sbuf": 0, "psum": 0}
        for kind in peak:
            live, used = [], 0  # heap of (last step, n, storage) and their bytes
            tiles = sorted((t for t in self.tiles if t.buffer.name == kind), key=_start)
            for n, st in enumerate(tiles):
                first, last, line = _start(st), st.live[1], st.live[2] or st.site
                while live and live[0][0] < first:
                    used -= _area(heapq.heappop(live)[2])
                if used + _area(st) > _capacity(kind):
                    raise limits.NkiError(f"{kind.upper()} allocation at {line}: {_overflow(st, used, live)}")
                heapq.heappush(live, (last, n, st))
                used += _area(st)
                peak[kind] = max(peak[kind], used)
        return peak


def _start(st) -> int:
    """Where a tile's range starts: its first access other than a write from HBM or immediates (or its last)."""
    return st.live[0] if st.live[0] is not None else st.live[1]


def _area(st) -> int:
    return st.partitions * st.bytes_per_partition


def _capacity(kind: str) -> int:
    return limits.PMAX * (limits.SBUF_PARTITION_BYTES if kind == "sbuf" else limits.PSUM_PARTITION_BYTES)


def _memory(kind: str) -> str:
    if kind == "sbuf":
        return f"SBUF holds {_capacity(kind)} B (28 MiB = 128 partitions x {limits.SBUF_PARTITION_BYTES} B)"
    return (f"PSUM holds {_capacity(kind)} B (2 MiB = 128 partitions x {limits.PSUM_BANKS} banks of "
            f"{limits.PSUM_BANK_BYTES} B)")


def _check_one(st) -> None:
    """A tile wider than a partition never fits: an error at its first access."""
    kind = st.buffer.name
    per = limits.SBUF_PARTITION_BYTES if kind == "sbuf" else limits.PSUM_PARTITION_BYTES
    limits.check(st.bytes_per_partition <= per, f"{kind.upper()} allocation",
                 f"the tile {st.describe()} allocated at {st.site} needs {st.bytes_per_partition} B per partition; "
                 f"{_memory(kind)}")


def _overflow(st, used: int, live: list) -> str:
    largest = sorted((entry[2] for entry in live), key=_area, reverse=True)[:3]
    names = "; ".join(f"{t.describe()} allocated at {t.site}, {_area(t)} B"
                      for t in largest)
    return (f"the tile {st.describe()} allocated at {st.site} needs {_area(st)} B ({st.partitions} partitions x "
            f"{st.bytes_per_partition} B) with {used} B already live in {len(live)} tile(s) (the largest: {names}); "
            f"{_memory(st.buffer.name)}")


@dataclass
class Trace:
    name: str
    grid: tuple[int, ...] = ()
    program: tuple[int, ...] = ()
    output_examples: list | None = None  # pass 2: the j-th shared_hbm allocation is output_examples[j]
    outputs: list = field(default_factory=list)  # storages of the kernel's HBM allocations, in order
    hbm_allocs_this_program: int = 0
    written_inputs: set = field(default_factory=set)  # indices of input tensors the kernel writes
    live: Occupancy = field(default_factory=Occupancy)
    peak_bytes: dict = field(default_factory=lambda: {"sbuf": 0, "psum": 0})  # live at once, all partitions
    warned: set = field(default_factory=set)
    instructions: list = field(default_factory=list)
    pending_reads: list = field(default_factory=list)  # regions the running instruction call read ...
    pending_writes: list = field(default_factory=list)  # ... and wrote
    depth: int = 0  # nesting of instruction calls (nl.matmul issues a transpose and an nc_matmul)
    step: int = 0  # instruction calls begun (at depth 0): when on-chip tiles are accessed (Occupancy)
    occupancies: list = field(default_factory=list)  # every program's core's Occupancy (check_capacity)
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
    collectives: dict = field(default_factory=dict)  # (program, rank-list) -> collectives over it so far (nki/ranks.py)
    roller: object = None  # the recording pass's nki/rolling.py Roller (loops kept loops), or None
    loop_starts: dict = field(default_factory=dict)  # (loop id, iteration index) -> loops entered before it
    loop_ends: dict = field(default_factory=dict)  # loop id -> loops entered by its end

    @property
    def regions(self) -> bool:
        """Whether instructions record the regions they access (the checking pass's; and the recording pass's
        while it rolls loops, to be compared with the checking pass's)."""
        return not self.quiet or self.roller is not None

    def program_state(self) -> dict:
        return {k: getattr(self, k) for k in PROGRAM_STATE}

    def load_program_state(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    @staticmethod
    def fresh_program_state(program: tuple) -> dict:
        """A core's state when a program instance starts on it: nothing live, registers unset."""
        return {"program": program, "hbm_allocs_this_program": 0, "live": Occupancy(), "depth": 0,
                "pending_reads": [], "pending_writes": [], "registers": {}, "loop_key": (), "epoch": 0}

    def enter_loop(self, kind: str, line: str) -> int:
        """A new loop instance (one execution of a `for` over nl.affine_range and the like): its id."""
        self.loops.append((kind, line))
        return len(self.loops) - 1

    def account(self, storage, write: bool) -> None:
        """An access to `storage` by the running instruction: an on-chip tile's space is held from its first
        access to its last (Occupancy), on the running program's core."""
        if storage.buffer.name in ("sbuf", "psum"):
            if not self.live.tiles:  # the core's first tile: its account is checked after the run
                self.occupancies.append(self.live)
            self.live.access(storage, self.step, write)

    def check_capacity(self) -> None:
        """After the kernel ran: every core's tiles fit its SBUF and PSUM (Occupancy), or the NkiError."""
        for occupancy in self.occupancies:
            for kind, used in occupancy.check().items():
                self.peak_bytes[kind] = max(self.peak_bytes[kind], used)

    def warn_once(self, key, instruction: str, problem: str) -> None:
        if not self.quiet and key not in self.warned:
            self.warned.add(key)
            limits.warn(instruction, problem)
