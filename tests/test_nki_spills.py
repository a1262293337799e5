"""The estimate's SBUF spills (nki/spills.py): where the tiles live at once fit by their area (the checker passes
them) but not on every partition of the target's SBUF, the compiler spills a tile to HBM and reloads it, and the
engine that needs the space waits. The references: the architecture guides' partition sizes ([trn1] 192 KiB,
[trn2] 224 KiB) and the tiles' bytes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nativelab import nki
from nativelab.nki import cost
from nativelab.nki import isa as nisa
from nativelab.nki import language as nl

F = 14336  # fp32 elements a partition: 56 KiB; four such tiles on one partition are 224 KiB


@nki.jit
def _crowded(x):
    """a, b, c: [128, F] fp32; e: [1, F], written while a, b and c are live: 224 KiB on partition 0."""
    outs = [nl.ndarray((128, F), dtype=x.dtype, buffer=nl.shared_hbm) for _ in range(3)]
    out_e = nl.ndarray((1, F), dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((128, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    b = nl.ndarray((128, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=b, data=a, op0=nl.multiply, operand0=2.0)
    c = nl.ndarray((128, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=c, data=b, op0=nl.add, operand0=1.0)
    e = nl.ndarray((1, F), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=e, src=c[0:1, :])
    nisa.dma_copy(dst=out_e, src=e)
    nisa.dma_copy(dst=outs[0], src=a)
    nisa.dma_copy(dst=outs[1], src=b)  # b's next access is the farthest when e needs room: b is spilled
    nisa.dma_copy(dst=outs[2], src=c)
    return (*outs, out_e)


def _unbounded(target):
    return dataclasses.replace(target, sbuf_partition_bytes=1 << 40)


def _instructions(kernel, *args):
    """The traced launch's instructions and storages, as the estimate reads them."""
    kernel.estimate(*args)  # traces it once
    traced = next(iter(kernel._traces.values()))
    return traced.instructions, traced.storages


def test_a_tile_that_fits_by_area_but_not_on_its_partition_is_spilled_and_reloaded_on_trn1():
    x = torch.empty(128, F)
    v2 = _crowded.estimate(x, target=cost.NEURONCORE_V2)
    tile = 128 * F * 4
    assert (v2.spills, v2.spill_bytes) == (1, 2 * tile)  # one [128, F] fp32 tile stored, then reloaded
    names = [e[0] for e in v2.events]
    assert names.count("spill") == 1 and names.count("reload") == 1
    spill = v2.events[names.index("spill")]
    reload = v2.events[names.index("reload")]
    copy = v2.events[names.index("tensor_copy")]
    assert reload[2] >= spill[3]  # reloaded after it was stored
    assert copy[2] >= spill[3]  # e is written where b was, once b is out
    rate = cost.NEURONCORE_V2.dma_bytes_per_s
    assert spill[3] - spill[2] == pytest.approx(tile / rate + cost.DMA_FIXED_S)
    # the reload serves the store of b (Belady: b's next access is farther than a's)
    stores = [e for e in v2.events if e[0] == "dma_copy"]
    assert reload[4] == stores[-2][4]
    instructions, storages = _instructions(_crowded, x)
    unbounded = cost.estimate("crowded", instructions, _unbounded(cost.NEURONCORE_V2), storages)
    assert unbounded.spills == 0
    # the vector engine waited for the store: at least its time is added
    assert v2.seconds >= unbounded.seconds + tile / rate
    assert "SBUF spills: 1 tiles, 14.0 MiB" in v2.summary()  # 2 x 128 x 56 KiB


def test_the_same_tiles_fit_trn2s_larger_partitions_and_nothing_spills():
    x = torch.empty(128, F)
    v3 = _crowded.estimate(x)
    assert 4 * F * 4 == 224 * 1024 and v3.spills == 0 and "spill" not in v3.summary()
    instructions, storages = _instructions(_crowded, x)
    unbounded = cost.estimate("crowded", instructions, _unbounded(cost.NEURONCORE_V3), storages)
    assert v3.seconds == unbounded.seconds and [e[0] for e in v3.events] == [e[0] for e in unbounded.events]


def test_the_sbuf_partition_sizes_are_the_architecture_guides():
    """[trn1] 'a 24MiB SBUF ... one SBUF partitions has 192KiB'; [trn2] '128 partitions of 224KiB'."""
    assert cost.NEURONCORE_V2.sbuf_partition_bytes * 128 == 24 * 2**20
    assert cost.NEURONCORE_V3.sbuf_partition_bytes * 128 == 28 * 2**20
