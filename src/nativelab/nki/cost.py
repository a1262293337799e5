"""An estimate of a kernel's time on one NeuronCore-v3 (Trainium2) and its engine timeline, from the
instructions its trace issued. Every constant is AWS's and cited once, here:

  [trn2]  "Trainium2 Architecture Guide for NKI" (aws-neuron-sdk nki/about/trainium2_arch.rst; the current
          page, nki/arch/trainium2_arch, gives HBM as 2.9 TB/s, as the lab guide does)
  [trn1]  "Trainium/Inferentia2 Architecture Guide for NKI" (nki/about/trainium_inferentia2_arch.rst): the
          per-engine cost rules, stated for NeuronCore-v2 and applied here to v3's clocks
  [act]   the nki.isa.activation_reduce API page (MIN_II)
  [isa226] the nki.isa API reference of Neuron SDK 2.26 (aws-neuron-sdk general/nki/api/nki/isa/__init__.py,
          the last release whose pages state each instruction's "Estimated instruction cost")
  [mxfp]  "MXFP Matrix Multiplication with NKI" (aws-neuron-sdk nki/deep-dives/mxfp-matmul.rst): the
          NeuronCore-v4 Tensor Engine multiplies MXFP8/MXFP4 "achieving 4x throughput compared to BF16/FP16"

The model: each compute engine (Tensor, Vector, Scalar, GpSimd) runs its instructions in program order; an
instruction starts when its engine is free and the instructions it depends on (read-after-write,
write-after-read and write-after-write on overlapping regions of the same tensor: compared dimension by
dimension where both views are blocks of the tile, so a column block written does not hold up a read of
another: the compiler tracks dependencies by access pattern, not by whole tile) have finished. The DMA
queues (16 per core [trn2]) are one lane of the core's HBM bandwidth that is not in program order: a
transfer takes the first free stretch of bandwidth after its inputs are ready (a load for the next tile
does not wait behind the store of the previous one). Independent work on different engines overlaps.
A dma_compute moves every source's bytes through its engine (AWS gives no cost of its own).
An LNC-2 launch (kernel[2]) runs its two programs on two cores in parallel, each with its own engines and
its own share of HBM bandwidth; the launch takes as long as the slower core. A sendrecv moves its bytes
over its core's DMA share plus the fixed DMA cost, starting when both cores have reached it; a core_barrier
costs nothing of its own but holds its engine until both cores reach it, and whatever reads or writes the
barrier's HBM tensor afterwards waits for it. Where a kernel's SBUF tiles live at once fit by their area but
not on every partition of the target's SBUF, the compiler's spills and reloads are added, on the DMA lane, and
the engine that needs them waits (nki/spills.py, from the Fused Mamba tutorial's profile).
What it ignores: semaphore and sequencer latency between engines, SBUF/PSUM bank conflicts, DMA descriptor
and access-pattern efficiency (a DMA moves its bytes at the full share of HBM bandwidth however strided),
LoadStationary (hidden by background loading for tiles up to 128 x 128, [trn1]), PSUM-to-SBUF bandwidth, and
the other seven cores' demand beyond their equal share of HBM; a kernel traced for trn3 (its MX instructions)
is timed at NeuronCore-v3's clocks and bandwidth. One constant is fitted (FITTED below): how many of a NeuronCore-v2
core's DMA queues its transfers keep busy at once.

The target: NeuronCore-v3 (NEURONCORE_V3, the default) or NeuronCore-v2 (NEURONCORE_V2, trn1 / inf2, for AWS's
published trn1 measurements), a `Target` of clocks and rates, each cited: [trn1] for v2's engine frequencies
("Data-path Width ... Frequency" table: Tensor 2.8, Vector 1.12, Scalar 1.4, GpSimd 1.4 GHz) and its device (2
NeuronCore-v2 share 820 GB/s of HBM; 16 DMA engines per core at 27 GiB/s each, 464 GB/s, so HBM bounds a core at
410 GB/s). v2 has no Vector performance mode (the bf16 speedups are [trn2]'s, NeuronCore-v3's) and its pages give
no fixed DMA cost: v3's 600 ns is used for it too. AWS's trn1 measurements of DMA-bound kernels ([mm] below) moved
their bytes at 100-104 GB/s, a quarter of that share, in transfers of 2-8 KiB per queue: on v2 a core's transfers
move at the rate of DMA_QUEUES_IN_USE_V2 queues of 27 GiB/s, the one fitted constant. v3 has no published kernel
measurement to fit it to, and keeps its HBM share.

  [mm]    the "Matrix multiplication" tutorial of Neuron SDK 2.26 (aws-neuron-sdk nki/tutorials/
          matrix_multiplication.rst, commit 1db4d74e): [4096,8192] @ [8192,8192] BF16 on Trn1.32xlarge"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..files import write_atomic
from . import limits, spills
from .hazards import box

TENSOR_GHZ = 2.4  # [trn2] engine frequencies
VECTOR_GHZ = 0.96
SCALAR_GHZ = 1.2
GPSIMD_GHZ = 1.2
MM_INIT_CYCLES = 64  # [trn1] a MultiplyMoving's initiation interval is max(N, 64) TensorE cycles ...
MM_FP32_FACTOR = 4  # [trn1] ... and about 4x that for fp32 inputs ([trn2]: 79 BF16 vs 20 FP32 TFLOPS)
MIN_II_CYCLES = 64  # [act] minimum initiation interval of a Scalar Engine instruction (roughly 64 cycles)
READ_ACCUMULATOR_CYCLES = 64  # [trn1] ActReadAccumulator (activation's reduce_res) costs roughly 64 cycles
VECTOR_SMALL_OVERHEAD = 100  # [trn1] static overhead of a Vector instruction with N << 128
# [trn2] double FP8 (nc_matmul perf_mode double_row): "each processing element performs two pairs of FP8
# multiplications ... per cycle": a (K, 2, N) moving tile takes a bf16 (K, N) MultiplyMoving's max(N, 64) cycles
# for twice its FLOPs ("the same amount of time as the regular BF16/FP16 ... sequence with a 128 contraction")
MX_VALUES_PER_PE = 4  # [mxfp] each PE multiplies the four values of an _x4 element at once: an nc_matmul_mx of
# N moving columns takes a bf16 MultiplyMoving's max(N, 64) cycles and contracts 4x the rows (the 4x)
VECTOR_BF16_COPY_SPEEDUP = 4  # [trn2] Vector perf mode: tensor_copy / tensor_scalar with bf16/fp16 in SBUF
VECTOR_BF16_TT_SPEEDUP = 2  # [trn2] ... tensor_tensor with bf16/fp16 inputs in SBUF
HBM_BYTES_PER_S = 2.9e12  # [trn2] per Trainium2 chip ...
CORES_PER_CHIP = 8  # [trn2] ... shared by its 8 NeuronCore-v3
DMA_FIXED_S = 600e-9  # [trn2] "Each DGE-based DMA instruction takes about 600 ns to execute"

# [isa226] Vector Engine instructions with a cost of their own: max(MIN_II, k * N) cycles for N elements per
# partition of the tile they stream (bn_aggr: 13 cycles per (count, mean, M2) triple), without the bf16
# performance mode
VECTOR_CYCLES_PER_ELEMENT = {"bn_stats": 1.0, "bn_aggr": 13 / 3, "range_select": 1.0, "dropout": 1.0,
                             "max8": 1.0, "nc_find_index8": 1.0, "nc_match_replace8": 1.0}

# [isa226] GpSimd instructions cost GPSIMD_START + N cycles for N elements per partition (iota; affine_select:
# "GPSIMD_START is the instruction startup overhead on GpSimdE, roughly 150 engine cycles"); applied to the
# GpSimd instructions whose pages give no cost of their own (nonzero_with_count, sequence_bounds, the gathers)
GPSIMD_START_CYCLES = 150
GPSIMD_STARTUP = frozenset({"iota", "affine_select", "nonzero_with_count", "sequence_bounds", "nc_n_gather",
                            "local_gather", "nl.gather_flattened"})


@dataclass(frozen=True)
class Target:
    """One NeuronCore generation's clocks and rates: what `instruction_seconds` times an instruction with."""
    name: str  # "NeuronCore-v3"
    instance: str  # the short name estimates print: "trn2"
    tensor_ghz: float
    vector_ghz: float
    scalar_ghz: float
    gpsimd_ghz: float
    hbm_bytes_per_s: float  # per device (chip) ...
    cores_per_chip: int  # ... shared by its cores
    dma_fixed_s: float
    vector_bf16_copy_speedup: int = 1  # Vector perf mode (NeuronCore-v3 on)
    vector_bf16_tt_speedup: int = 1
    dma_queues_in_use: int = 0  # DMA queues a core's transfers keep busy at once (0: as many as HBM allows) ...
    dma_queue_bytes_per_s: float = 0.0  # ... each at this rate
    sbuf_partition_bytes: int = limits.SBUF_PARTITION_BYTES  # what the compiler places tiles in (nki/spills.py)

    @property
    def dma_bytes_per_s(self) -> float:
        """One core's share of the device's HBM bandwidth, or what the queues its transfers use move, if less."""
        share = self.hbm_bytes_per_s / self.cores_per_chip
        return min(share, self.dma_queues_in_use * self.dma_queue_bytes_per_s) if self.dma_queues_in_use else share


NEURONCORE_V3 = Target("NeuronCore-v3", "trn2", TENSOR_GHZ, VECTOR_GHZ, SCALAR_GHZ, GPSIMD_GHZ, HBM_BYTES_PER_S,
                       CORES_PER_CHIP, DMA_FIXED_S, VECTOR_BF16_COPY_SPEEDUP, VECTOR_BF16_TT_SPEEDUP)
# [trn1] "Data-path Width (elements/cycle) / Frequency (GHz)": Tensor 2.8, Vector 1.12, Scalar 1.4, GpSimd 1.4;
# a device has "2 NeuronCores (v2)" and "2 HBM stacks with ... bandwidth of 820 GB/s"; each core's 16 DMA engines
# drive 27 GiB/s each (464 GB/s, above its 410 GB/s share of HBM, which bounds it). No fixed DMA cost is published
# for v2: [trn2]'s 600 ns per DMA instruction. No Vector performance mode on v2.
DMA_QUEUE_BYTES_PER_S_V2 = 27 * 2**30  # [trn1] a NeuronCore-v2 DMA engine (queue)
# FITTED, the estimate's one fitted constant: [mm]'s Original Tiled version measured 51.80 ms on trn1 for 5.4 GB of
# transfers (104 GB/s, 3.6 queues' worth at 27 GiB/s; hoisted 102, blocked 100 GB/s): its nearest count of queues
DMA_QUEUES_IN_USE_V2 = 4
FITTED = {"DMA_QUEUES_IN_USE_V2": "[mm] Original Tiled, 51.80 ms on Trn1.32xlarge (5.4 GB of transfers: 104 GB/s)"}
SBUF_PARTITION_BYTES_V2 = 192 * 1024  # [trn1] "a 24MiB SBUF ... one SBUF partitions has 192KiB of memory"
NEURONCORE_V2 = Target("NeuronCore-v2", "trn1", 2.8, 1.12, 1.4, 1.4, 820e9, 2, DMA_FIXED_S,
                       dma_queues_in_use=DMA_QUEUES_IN_USE_V2, dma_queue_bytes_per_s=DMA_QUEUE_BYTES_PER_S_V2,
                       sbuf_partition_bytes=SBUF_PARTITION_BYTES_V2)

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
_HALF = (torch.bfloat16, torch.float16)


def instruction_seconds(ins, target: Target = NEURONCORE_V3) -> tuple[float, float]:
    """(time the instruction occupies its engine, extra latency before its result is ready) on `target`."""
    t = target
    n = ins.elements
    if ins.name in ("sendrecv", "spill", "reload"):  # bytes over the core's DMA share (a spill: nki/spills.py)
        return n / t.dma_bytes_per_s, t.dma_fixed_s
    if ins.engine == "tensor":
        if ins.name == "nc_matmul":  # double_row: n counts both rows of the moving tile, streamed at once
            cycles = max(n // ins.pairs, MM_INIT_CYCLES) * (MM_FP32_FACTOR if ins.dtype == torch.float32 else 1)
        elif ins.name == "nc_matmul_mx":
            cycles = max(n, MM_INIT_CYCLES)
        else:  # a transpose is a matmul against identity (fp32 transposes are 2x faster in transpose mode)
            cycles = max(n, MM_INIT_CYCLES) * (2 if ins.dtype == torch.float32 else 1)
        return cycles / (t.tensor_ghz * 1e9), 0.0
    if ins.name == "core_barrier":  # a rendezvous: semaphore latency is not modelled
        return 0.0, 0.0
    if ins.engine == "vector" and ins.name == "quantize_mx":  # no published cost: the one-input rule [trn1]
        return max(n, MIN_II_CYCLES) / (t.vector_ghz * 1e9), 0.0  # over src's elements, no bf16 perf mode
    if ins.engine == "vector" and ins.name in VECTOR_CYCLES_PER_ELEMENT:
        return max(VECTOR_CYCLES_PER_ELEMENT[ins.name] * n, MIN_II_CYCLES) / (t.vector_ghz * 1e9), 0.0
    if ins.engine == "vector":
        speed = 1
        if ins.dtype in _HALF:
            speed = t.vector_bf16_tt_speedup if ins.inputs > 1 else t.vector_bf16_copy_speedup
        cycles = max(ins.inputs * n / speed, MIN_II_CYCLES) + (VECTOR_SMALL_OVERHEAD if n < 128 else 0)
        return cycles / (t.vector_ghz * 1e9), 0.0
    if ins.engine == "scalar":
        cycles = max(n, MIN_II_CYCLES) + (READ_ACCUMULATOR_CYCLES if ins.name == "activation_reduce" else 0)
        return cycles / (t.scalar_ghz * 1e9), 0.0
    if ins.engine == "gpsimd" and ins.name in GPSIMD_STARTUP:
        return (GPSIMD_START_CYCLES + n) / (t.gpsimd_ghz * 1e9), 0.0
    if ins.engine == "gpsimd":  # no rule of thumb [trn1]; 128 lanes of 32 bits (8 cores x 16 fp32) at 1.2 GHz
        return max(n, MIN_II_CYCLES) / (t.gpsimd_ghz * 1e9), 0.0
    if ins.engine == "dma":
        return n / t.dma_bytes_per_s, t.dma_fixed_s
    return 0.0, 0.0


@dataclass
class Estimate:
    """A launch's estimated NeuronCore-v3 time: total, busy time per engine, the bounding engine, and the
    timeline (one event per instruction: name, engine, start and end in seconds, kernel line)."""
    kernel: str
    seconds: float
    busy: dict  # of the core that finishes last (an LNC-2 launch's two cores run in parallel)
    events: list = field(repr=False, default_factory=list)
    cores: int = 1  # physical cores the launch runs on: 2 for an LNC-2 launch (kernel[2])
    event_cores: list = field(repr=False, default_factory=list)  # each event's core, when there are two
    target: Target = NEURONCORE_V3  # the NeuronCore generation it is timed on
    spills: int = 0  # SBUF tiles the compiler spills to HBM and reloads (nki/spills.py) ...
    spill_bytes: int = 0  # ... and the bytes those stores and reloads move

    @property
    def bound(self) -> str:
        return max(self.busy, key=self.busy.get) if self.busy else "none"

    def summary(self) -> str:
        busy = ", ".join(f"{e} {self.busy[e] * 1e6:.2f}" for e in ENGINES if self.busy.get(e))
        core = self.target.name
        where = f"one {core}" if self.cores == 1 else f"{self.cores} {core} (LNC-{self.cores})"
        whose = "busy us" if self.cores == 1 else "the slower core's busy us"
        spilled = (f"; SBUF spills: {self.spills} tiles, {self.spill_bytes / 2**20:.1f} MiB stored and reloaded"
                   if self.spills else "")
        return (f"nki {self.kernel}: est. {self.target.instance} {self.seconds * 1e6:.2f} us on {where}, "
                f"{self.bound}-bound ({whose}: {busy}; {len(self.events)} instructions{spilled})")

    def chrome_trace(self) -> dict:
        """The timeline as a Chrome / Perfetto trace: one lane (thread) per engine, one process per core."""
        lanes = {e: i for i, e in enumerate(ENGINES)}
        events = []
        for core in range(self.cores):
            events += [{"ph": "M", "pid": core, "tid": i, "name": "thread_name", "args": {"name": e}}
                       for e, i in lanes.items()]
            label = f"{self.target.name} {self.kernel}" + (f" (core {core})" if self.cores > 1 else "")
            events.append({"ph": "M", "pid": core, "name": "process_name", "args": {"name": label}})
        cores = self.event_cores or [0] * len(self.events)
        for (name, engine, start, end, line), core in zip(self.events, cores):
            events.append({"ph": "X", "pid": core, "tid": lanes[engine], "name": name, "ts": start * 1e6,
                           "dur": max(end - start, 0.0) * 1e6, "args": {"line": line}})
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def save_trace(self, path) -> None:
        write_atomic(Path(path), json.dumps(self.chrome_trace()).encode())


class _Bandwidth:
    """Busy stretches of a shared resource (sorted, merged); `place` books the first gap that fits."""

    def __init__(self):
        self.starts: list = []
        self.ends: list = []

    def place(self, ready: float, length: float) -> float:
        i = bisect.bisect_right(self.ends, ready)
        start = ready
        while i < len(self.starts) and self.starts[i] < start + length:
            start = max(start, self.ends[i])
            i += 1
        self.starts.insert(i, start)
        self.ends.insert(i, start + length)
        # merge with touching neighbours (keeps the list short for kernels that stream)
        for j in (i, i - 1):
            if 0 <= j < len(self.starts) - 1 and self.ends[j] >= self.starts[j + 1] - 1e-15:
                self.ends[j] = max(self.ends[j], self.ends[j + 1])
                del self.starts[j + 1], self.ends[j + 1]
        return start


def estimate(kernel: str, instructions, target: Target = NEURONCORE_V3, storages: dict | None = None) -> Estimate:
    """Schedule the instructions on their cores' engines (see the module docstring) and time them on `target`.
    storages: the trace's allocations (Trace.storages: shape and element size at [4], [5]), to compare two
    accesses of one tile block by block, and to place its SBUF tiles (the spills a compiler adds where they do
    not fit: nki/spills.py); without them, by their first and last elements, and nothing spills."""
    instructions, n_spills, spill_bytes = spills.with_spills(instructions, storages, target.sbuf_partition_bytes)
    cores = sorted({ins.core for ins in instructions}) or [0]
    free = {(c, e): 0.0 for c in cores for e in ENGINES}
    busy = {c: dict.fromkeys(ENGINES, 0.0) for c in cores}
    dma = {c: _Bandwidth() for c in cores}  # each core its own share of HBM bandwidth
    reads: dict = {}  # storage id -> [(lo, hi, end time, view)] of the reads so far
    writes: dict = {}  # ... of the writes
    events = []
    event_cores = []
    waiting: dict = {}  # sync key -> (instruction, ready, occupy, latency, event index) of the first core there

    boxes: dict = {}  # (storage, view) -> the view's box in its tile, or None

    def box_of(sid, view):
        key = (sid, view)
        if key not in boxes:
            st = storages.get(sid) if storages is not None and view is not None else None
            boxes[key] = box(view, st[4], st[5]) if st is not None else None
        return boxes[key]

    def meet(sid, view, other) -> bool:
        """Two accesses whose first-to-last spans overlap share an element (unless both are blocks of the tile
        that miss each other in some dimension)."""
        a, b = box_of(sid, view), box_of(sid, other)
        return a is None or b is None or all(l1 <= h2 and l2 <= h1 for l1, h1, l2, h2 in zip(*a, *b))

    def ready_of(ins):
        ready = free[(ins.core, ins.engine)] if ins.engine != "dma" else 0.0
        for j in ins.after:  # a spill's issuing engine, the stores that free its space (nki/spills.py); a
            if events[j] is not None:  # rendezvous still waiting for the other core is not timed yet
                ready = max(ready, events[j][3])
        for sid, lo, hi, view in ins.reads:  # read after write
            for a_lo, a_hi, end, a_view in writes.get(sid, ()):
                if lo <= a_hi and a_lo <= hi and end > ready and meet(sid, view, a_view):
                    ready = end
        for sid, lo, hi, view in ins.writes:  # write after read or write
            for table in (reads, writes):
                for a_lo, a_hi, end, a_view in table.get(sid, ()):
                    if lo <= a_hi and a_lo <= hi and end > ready and meet(sid, view, a_view):
                        ready = end
        return ready

    def place(ins, ready, occupy):
        start = dma[ins.core].place(ready, occupy) if ins.engine == "dma" else ready
        free[(ins.core, ins.engine)] = start + occupy
        busy[ins.core][ins.engine] += occupy
        return start

    def finish(ins, start, end, index):
        for regions, table in ((ins.reads, reads), (ins.writes, writes)):
            for sid, lo, hi, view in regions:
                table.setdefault(sid, []).append((lo, hi, end, view))
        events[index] = (ins.name, ins.engine, start, end, ins.line)

    for ins in instructions:
        occupy, latency = instruction_seconds(ins, target)
        ready = ready_of(ins)
        events.append(None)
        event_cores.append(ins.core)
        if ins.sync is not None:
            other = waiting.pop(ins.sync, None)
            if other is None:  # the first core at the rendezvous: timed when the second arrives
                waiting[ins.sync] = (ins, ready, occupy, latency, len(events) - 1)
                continue
            o_ins, o_ready, o_occupy, o_latency, o_index = other
            both = max(ready, o_ready)  # neither goes on before both are there
            starts = [place(x, both, occ) for x, occ in ((o_ins, o_occupy), (ins, occupy))]
            end = max(starts[0] + o_occupy + o_latency, starts[1] + occupy + latency)
            if ins.name == "core_barrier":
                for x in (o_ins, ins):  # the barrier holds its engine until both cores are there
                    free[(x.core, x.engine)] = max(free[(x.core, x.engine)], end)
            finish(o_ins, starts[0], end, o_index)
            finish(ins, starts[1], end, len(events) - 1)
            continue
        start = place(ins, ready, occupy)
        finish(ins, start, start + occupy + latency, len(events) - 1)
    for ins, ready, occupy, latency, index in waiting.values():  # unpaired (not from a trace): as issued
        start = place(ins, ready, occupy)
        finish(ins, start, start + occupy + latency, index)
    ends = {c: max((e[3] for e, k in zip(events, event_cores) if k == c), default=0.0) for c in cores}
    slowest = max(cores, key=lambda c: ends[c])
    total = ends[slowest]
    return Estimate(kernel, total, {e: b for e, b in busy[slowest].items() if b}, events,
                    cores=len(cores), event_cores=event_cores if len(cores) > 1 else [], target=target,
                    spills=n_spills, spill_bytes=spill_bytes)
