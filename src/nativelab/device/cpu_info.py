"""The host CPU the device computes on: its model name, the vector ISA PyTorch's kernels run with on it, and
whether it has bf16 instructions (what decides how bf16 matrix products should run, see gemm_policy)."""

from __future__ import annotations

import functools
import os
import platform

import torch


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def model() -> str:
    return _cpuinfo()[0]


def isa() -> str:
    """PyTorch's CPU capability in use ('AVX512', 'AVX2', 'DEFAULT', ...: ATEN_CPU_CAPABILITY lowers it)."""
    return torch.backends.cpu.get_cpu_capability()


def has_bf16_instructions() -> bool:
    """The CPU has bf16 dot-product instructions and PyTorch is allowed to use AVX-512 (AVX512_BF16 or AMX
    on x86; ARM's BF16 extension). Without them a bf16 GEMM runs a slow path (73x below fp32 on AVX2)."""
    flags = _cpuinfo()[1]
    if "bf16" in flags:  # aarch64 Features
        return True
    x86 = bool(flags & {"avx512_bf16", "amx_bf16"})
    return x86 and isa().startswith("AVX512") and "AVX2" not in os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()


def describe() -> str:
    flags = _cpuinfo()[1]
    extra = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return (f"{model()}, {os.cpu_count()} CPUs, vector ISA {isa()}"
            + (f" (CPU also has {', '.join(extra)})" if extra else ""))
