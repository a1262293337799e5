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


def _onednn_allows(*isas: str) -> bool:
    """oneDNN (PyTorch's bf16 GEMM) may use one of `isas`: ONEDNN_MAX_CPU_ISA caps it. It does not follow
    ATEN_CPU_CAPABILITY: measured here, with ATEN_CPU_CAPABILITY=avx2 alone bf16 GEMMs still ran avx512_bf16."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).strip().upper()
    return cap in ("", "ALL") or cap.startswith(isas)


def has_bf16_instructions() -> bool:
    """The CPU has bf16 dot-product instructions that PyTorch's bf16 GEMM (oneDNN) may use: AVX512_BF16 or AMX
    on x86, ARM's BF16 extension. Without them oneDNN's bf16 GEMM falls back to slow code (measured here with
    ONEDNN_MAX_CPU_ISA=AVX2: 1024x576 @ 576x1536 12-128x slower than an fp32 GEMM of the upcast operands)."""
    flags = _cpuinfo()[1]
    if "bf16" in flags:  # aarch64 Features
        return True
    if "amx_bf16" in flags and _onednn_allows("AVX512_CORE_AMX", "AVX10"):
        return True
    return "avx512_bf16" in flags and _onednn_allows("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX",
                                                     "AVX10")


def has_amx() -> bool:
    return "amx_bf16" in _cpuinfo()[1] and _onednn_allows("AVX512_CORE_AMX", "AVX10")


def describe() -> str:
    flags = _cpuinfo()[1]
    extra = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return (f"{model()}, {os.cpu_count()} CPUs, vector ISA {isa()}"
            + (f" (CPU also has {', '.join(extra)})" if extra else ""))
