"""The device's settings, read once at registration from `nativelab.settings` (every environment variable
nativelab reads is declared and validated there; see its docstring for why it sits in the utility layer)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import settings
from ..settings import HBM_GB, PHYSICAL_CORES  # noqa: F401 - the emulated chip's figures, re-exported

DEVICE_NAME = "neuron"


@dataclass(frozen=True)
class Config:
    num_cores: int  # logical NeuronCores: neuron:0 .. neuron:num_cores-1
    core_memory_bytes: int  # capacity accounted per logical core
    sync: bool  # every op completes before returning (like CUDA_LAUNCH_BLOCKING)
    dtype_policy: bool  # the real device's int64->int32 / float64->float32 casting
    quiet: bool  # no "emulated on the host CPU" notice
    fast_path: bool = True  # off: every op through the Python kernel (the reference path)
    strict: bool = False  # a CPU fallback raises at the line that caused it
    threads: str | int = "auto"  # the device's host thread team: a fixed count, or sized to the machine's load
    bf16_gemm: str = "auto"  # bf16 products in bf16 ("bf16"), as fp32 GEMMs ("fp32"), or by the CPU ("auto")


def virtual_core_size() -> int:
    """Physical cores per logical core (LNC), 2 by default on Trainium2."""
    return settings.VIRTUAL_CORE_SIZE.get()


def emulate_beside_cuda() -> bool:
    """Register the emulated device on a CUDA machine too (CUDA backward then fails)."""
    return settings.EMULATE.get()


def load() -> Config:
    return Config(
        num_cores=settings.NUM_CORES.get(),  # LNC=2 (the default): 8 physical cores appear as 4 logical ones
        # the chip's HBM split over its physical cores: 24 GB per logical core at LNC=2
        core_memory_bytes=int(settings.CORE_MEMORY_GB.get() * (1 << 30)),
        sync=settings.SYNC.get(),
        dtype_policy=settings.DTYPE_POLICY.get(),
        fast_path=settings.FAST_PATH.get(),
        quiet=settings.QUIET.get(),
        strict=settings.STRICT.get(),
        threads=settings.THREADS.get(),
        bf16_gemm=settings.BF16_GEMM.get(),
    )
