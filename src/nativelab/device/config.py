"""Environment settings of the emulated device, read once and validated (a bad value is an error)."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEVICE_NAME = "neuron"


def _int_env(name: str, default: int, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r}: must be >= {minimum}")
    return value


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r}: must be > 0")
    return value


def _flag_env(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected 0 or 1")


@dataclass(frozen=True)
class Config:
    num_cores: int  # logical NeuronCores: neuron:0 .. neuron:num_cores-1
    core_memory_bytes: int  # capacity accounted per logical core
    sync: bool  # NATIVELAB_SYNC=1: every op completes before returning (like CUDA_LAUNCH_BLOCKING)
    dtype_policy: bool  # the real device's int64->int32 / float64->float32 casting
    quiet: bool  # no "emulated on the host CPU" notice
    fast_path: bool = True  # NATIVELAB_FAST_PATH=0: every op through the Python kernel (the reference path)
    strict: bool = False  # NATIVELAB_STRICT=1: a CPU fallback raises at the line that caused it


PHYSICAL_CORES = 8  # trn2.3xlarge: one Trainium2 chip, 8 physical NeuronCores, 96 GB of HBM
HBM_GB = 96.0


def virtual_core_size() -> int:
    """NEURON_RT_VIRTUAL_CORE_SIZE: physical cores per logical core (LNC), 2 by default on Trainium2."""
    lnc = _int_env("NEURON_RT_VIRTUAL_CORE_SIZE", 2, minimum=1)
    if lnc not in (1, 2):
        raise ValueError(f"NEURON_RT_VIRTUAL_CORE_SIZE={lnc}: must be 1 or 2")
    return lnc


def emulate_beside_cuda() -> bool:
    """NATIVELAB_EMULATE=1: register the emulated device on a CUDA machine too (CUDA backward then fails)."""
    return _flag_env("NATIVELAB_EMULATE", False)


def load() -> Config:
    lnc = virtual_core_size()
    return Config(
        # LNC=2 (the default): 8 physical cores appear as 4 logical ones
        num_cores=_int_env("NEURON_RT_NUM_CORES", PHYSICAL_CORES // lnc, minimum=1),
        # the chip's HBM split over its physical cores: 24 GB per logical core at LNC=2
        core_memory_bytes=int(_float_env("NATIVELAB_CORE_MEMORY_GB", HBM_GB / PHYSICAL_CORES * lnc) * (1 << 30)),
        sync=_flag_env("NATIVELAB_SYNC", False),
        dtype_policy=_flag_env("NATIVELAB_DTYPE_POLICY", True),
        fast_path=_flag_env("NATIVELAB_FAST_PATH", True),
        quiet=_flag_env("NATIVELAB_QUIET", False),
        strict=_flag_env("NATIVELAB_STRICT", False),
    )
