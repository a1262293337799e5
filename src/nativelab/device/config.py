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


def load() -> Config:
    return Config(
        num_cores=_int_env("NEURON_RT_NUM_CORES", 4, minimum=1),
        # 96 GB of HBM over 4 logical cores, as on trn2.3xlarge
        core_memory_bytes=int(_float_env("NATIVELAB_CORE_MEMORY_GB", 24.0) * (1 << 30)),
        sync=_flag_env("NATIVELAB_SYNC", False),
        dtype_policy=_flag_env("NATIVELAB_DTYPE_POLICY", True),
        quiet=_flag_env("NATIVELAB_QUIET", False),
    )
