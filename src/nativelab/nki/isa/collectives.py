"""The LNC-2 collectives (NeuronCore-v3 and newer): nisa.sendrecv exchanges SBUF tiles between the two
physical cores of a logical core, nisa.core_barrier makes both wait until each has reached it. Each program
of a kernel[2] launch is one core (nl.program_id(0) its rank); the programs switch at these rendezvous
(nki/programs.py). The rules are the nki.isa.sendrecv and nki.isa.core_barrier API pages' (NKI 0.5.0)."""

from __future__ import annotations

import math

import numpy as np

from .. import limits, trace
from ..core import record
from ..tensor import NkiTensor, read, write
from .constants import dma_engine as _dma_engine
from .constants import engine as _engine_enum

RANKS = (0, 1)  # [sendrecv] "send_to_rank and recv_from_rank must be either 0 or 1"
# [sendrecv] dma_engine.gpsimd_dma "restricts the data size per partition to not exceed 1024 bytes for 32-bit
# types, 512 bytes for 16-bit types, 256 bytes for 8-bit types"
GPSIMD_DMA_PARTITION_BYTES = {4: 1024, 2: 512, 1: 256}
# the API page does not say it; AWS's nki-library does, padding every gpsimd_dma tile for it (attention_tkg.py,
# pad_partitions_for_ext_inst): "Extended instructions require input/output tensors have multiple of 16 partitions"
GPSIMD_DMA_PARTITION_MULTIPLE = 16


def _launch(ins: str):
    """The running LNC-2 launch: two programs, or an error naming what the launch has."""
    tr = trace.current()
    launch = tr.launch
    n = launch.programs if launch is not None else 1
    limits.check(n == 2, ins,
                 f"needs an LNC-2 launch: two programs, one per physical core (kernel[2], nl.program_id(0) the "
                 f"rank); this launch has {n} program{'s' if n != 1 else ''} (grid {tr.grid or (1,)})")
    return launch


def _free(t: NkiTensor) -> int:
    return t.numel() // (t.shape[0] if t.shape else 1)


def _rank_arg(ins: str, what: str, v) -> int:
    limits.check(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and int(v) in RANKS, ins,
                 f"{what} is {v!r}; the ranks of an LNC-2 launch are 0 or 1")
    return int(v)


def sendrecv(src: NkiTensor, dst: NkiTensor, send_to_rank, recv_from_rank, pipe_id=0,
             dma_engine=_dma_engine.dma, name=None, use_gpsimd_dma=None, **_kw):
    """This core sends its src tile to dst on core `send_to_rank` while it receives `recv_from_rank`'s src
    into its own dst. The n-th sendrecv of a pipe on one rank pairs with the n-th of that pipe on the other.
    use_gpsimd_dma=True is NKI 0.2's spelling of dma_engine=dma_engine.gpsimd_dma."""
    ins = "sendrecv"
    launch = _launch(ins)
    rank = launch.rank
    send = _rank_arg(ins, "send_to_rank", send_to_rank)
    recv = _rank_arg(ins, "recv_from_rank", recv_from_rank)
    limits.check(send == 1 - rank and recv == 1 - rank, ins,
                 f"rank {rank} sends to rank {send} and receives from rank {recv}; in an LNC-2 launch each core "
                 f"exchanges with the other one (rank {1 - rank})")
    limits.check(isinstance(pipe_id, (int, np.integer)), ins, f"pipe_id must be an integer, got {pipe_id!r}")
    if use_gpsimd_dma is not None:
        dma_engine = _dma_engine.gpsimd_dma if use_gpsimd_dma else _dma_engine.dma
    limits.check(dma_engine in (_dma_engine.dma, _dma_engine.gpsimd_dma), ins,
                 f"dma_engine must be nisa.dma_engine.dma or nisa.dma_engine.gpsimd_dma, got {dma_engine!r}")
    for what, t in (("src", src), ("dst", dst)):
        limits.check(isinstance(t, NkiTensor), ins, f"{what} must be an NKI tile, got {type(t).__name__}")
        limits.check(t.buffer.name == "sbuf", ins, f"{what} is in {t.buffer}; src and dst must both be in nl.sbuf")
        limits.check_partitions(ins, what, t.partition_shape())
    limits.check(src.dtype == dst.dtype, ins, f"src is {src.dtype} and dst is {dst.dtype}; they must have the same "
                                              f"dtype")
    p, f = (src.shape[0] if src.shape else 1), _free(src)
    limits.check((dst.shape[0] if dst.shape else 1) == p and _free(dst) == f, ins,
                 f"src {src.shape} and dst {dst.shape} must have the same partition size and elements per "
                 f"partition ({p} x {f} vs {dst.shape[0] if dst.shape else 1} x {_free(dst)})")
    size = src.data.element_size()
    if dma_engine == _dma_engine.gpsimd_dma:
        limits.check(p % GPSIMD_DMA_PARTITION_MULTIPLE == 0, ins,
                     f"with dma_engine.gpsimd_dma the tiles span a multiple of {GPSIMD_DMA_PARTITION_MULTIPLE} "
                     f"partitions (GpSimd's extended instructions); src {src.shape} has {p}: pad it")
        limit = GPSIMD_DMA_PARTITION_BYTES.get(size, 1024)
        limits.check(f * size <= limit, ins,
                     f"with dma_engine.gpsimd_dma a partition moves at most {limit} B of a {8 * size}-bit type "
                     f"(1024 / 512 / 256 B for 32 / 16 / 8-bit types); src {src.shape} has {f * size} B per "
                     f"partition")
    tr = trace.current()
    line = limits.kernel_line()
    tr.pending_reads, tr.pending_writes = [], []
    sent = read(src, ins).clone()  # what leaves this core now (src may change once this program goes on)
    record(ins, "dma", src)  # its size in bytes, as every DMA's
    issued = tr.instructions[-1]
    if dma_engine == _dma_engine.gpsimd_dma:  # GpSimd triggers and moves it, in its program order
        issued.engine = "gpsimd"
    issued.reads.extend(tr.pending_reads)
    peer = (sent, src.dtype, p, f, src.shape, line)
    got, issued.sync = launch.rendezvous("sendrecv", int(pipe_id), peer, f"sendrecv (pipe {int(pipe_id)})")
    value, dtype, gp, gf, gshape, gline = got
    limits.check(dtype == dst.dtype and gp == p and gf == f, ins,
                 f"rank {rank}'s dst {dst.shape} {dst.dtype} does not match rank {1 - rank}'s src {gshape} {dtype} "
                 f"(sent at {gline}): the paired tiles need the same dtype, partition size and elements per "
                 f"partition")
    tr.pending_reads, tr.pending_writes = [], []
    write(dst, value.reshape(dst.shape), ins)
    issued.writes.extend(tr.pending_writes)
    tr.pending_reads, tr.pending_writes = [], []
    return dst


def _cores(ins: str, cores) -> tuple:
    raw = cores
    if isinstance(cores, (int, np.integer)) and not isinstance(cores, bool):
        cores = (cores,)  # core_barrier(data, (0)): one core
    limits.check(isinstance(cores, (tuple, list)) and len(cores) > 0
                 and all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in cores), ins,
                 f"cores must be a tuple of core indices, (0, 1), got {raw!r}")
    return tuple(sorted({int(c) for c in cores}))


def core_barrier(data: NkiTensor, cores=(0, 1), engine=_engine_enum.unknown, name=None, **_kw):
    """Every listed core reaches the barrier before any goes on: what each wrote to the shared HBM tensor
    `data` before it, the other sees after it. cores=(0, 1) in an LNC-2 launch; a one-core barrier
    (cores=(0,), nkilib's call for one shard) in a one-program launch waits for nobody: nothing happens.
    The page describes `data` as the shared HBM tensor the cores write; an on-chip tile is taken too (a
    synchronization point that orders each core's own accesses to it), because AWS's own nki-library does
    that in a kernel its tests run (moe_cte's bwmm_shard_on_I.py: `core_barrier(block_idx, (0, 1))`, an SBUF
    counter), and the barrier itself is semaphores between the cores, whatever `data` holds."""
    ins = "core_barrier"
    tr = trace.current()
    limits.check(isinstance(data, NkiTensor), ins,
                 f"data must be the tensor the cores synchronize on (the shared HBM tensor they write), got {data!r}")
    cores = _cores(ins, cores)
    n = tr.launch.programs if tr.launch is not None else 1
    limits.check(all(c in RANKS for c in cores), ins, f"cores {cores}: only cores (0, 1) are supported")
    if n == 1:
        limits.check(cores == (0,), ins,
                     f"cores {cores} are the two cores of an LNC-2 launch (kernel[2]); this launch has 1 program, "
                     f"so core 1 never reaches the barrier: with one program it is cores=(0,), which waits for "
                     f"nobody")
        return None
    launch = _launch(ins)
    limits.check(cores == RANKS, ins, f"cores {cores}: an LNC-2 launch synchronizes cores=(0, 1)")
    eng = engine if engine in (_engine_enum.vector, _engine_enum.scalar, _engine_enum.gpsimd) else _engine_enum.gpsimd
    record(ins, eng, data)
    issued = tr.instructions[-1]
    whole = (data.storage.uid, 0, math.prod(data.storage.shape) - 1, None)  # every write to data before it, both cores'
    issued.reads.append(whole)
    issued.writes.append(whole)
    _, issued.sync = launch.rendezvous("core_barrier", None, None, "core_barrier")
    return None
