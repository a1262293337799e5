"""nki.isa.constants: the enums instructions take (engine, reduce_cmd, dge_mode, oob_mode, ...)."""

from __future__ import annotations

import enum


class engine:  # noqa: N801 - NKI's names
    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    activation = "scalar"
    gpsimd = "gpsimd"
    pool = "gpsimd"
    sync = "sync"
    unknown = "unknown"


class reduce_cmd:  # noqa: N801
    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"
    load_reduce = "load_reduce"


class dge_mode:  # noqa: N801
    unknown = 0
    none = 0
    swdge = 1
    hwdge = 2


class oob_mode:  # noqa: N801
    error = "error"
    skip = "skip"


class matmul_perf_mode:  # noqa: N801
    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):  # noqa: N801
    """The NeuronCore generation: an enum as AWS's (nki-library reads `.name`), its values the generation's
    number (so it compares with an integer, as it did when these were plain integers)."""
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine:  # noqa: N801
    """Which DMA hardware moves a transfer: the DMA queues, or GpSimd's integrated DMA."""
    dma = "dma"
    gpsimd_dma = "gpsimd_dma"
