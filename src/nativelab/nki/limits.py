"""NeuronCore-v3 (Trainium2) limits that the NKI compiler checks, and the one error a violation raises.

Every figure is AWS's, from the pages named beside it (Neuron SDK docs, the aws-neuron/aws-neuron-sdk sources):
  [trn2]  "Trainium2 Architecture Guide for NKI" (nki/about/trainium2_arch.rst)
  [trn1]  "Trainium/Inferentia2 Architecture Guide for NKI" (nki/about/trainium_inferentia2_arch.rst), for
          what the Trainium2 guide says is unchanged
  [mm]    the nki.isa.nc_matmul API page (v2.31)
  [mx]    the nki.isa.nc_matmul_mx and nki.isa.quantize_mx API pages (aws-neuron-sdk nki/api/nki/isa/__init__.py)
  [pm]    the nki.isa.matmul_perf_mode page: double_row, "Double FP8 mode, 2x matmul throughput by packing two
          FP8 weight/ifmap element pairs"; the Trainium2 guide's "Double FP8 Matmul Performance" [trn2]
"""

from __future__ import annotations

import inspect
import os
import warnings

from .. import settings

PMAX = 128  # partitions of SBUF and PSUM [trn1: "two-dimensional memories with 128 partitions each"]
SBUF_PARTITION_BYTES = 224 * 1024  # [trn2: "SBUF capacity is 28MiB (or, 128 partitions of 224KiB)"]
PSUM_PARTITION_BYTES = 16 * 1024  # [trn2: "PSUM capacity remains the same at 2MiB"; trn1: 16KB per partition]
PSUM_BANKS = 8  # [trn1: "Each partition is further divided into 8 PSUM banks, with each bank holding up to
PSUM_BANK_FP32 = 512  #  512 32-bit values"]
PSUM_BANK_BYTES = PSUM_BANK_FP32 * 4
GEMM_STATIONARY_FMAX = 128  # [mm, trn1 "Tile Size": stationary free size <= 128, the PE columns]
GEMM_MOVING_FMAX = 512  # [mm, trn1: moving free size <= 512, one PSUM bank of fp32 per partition]
TENSOR_TRANSPOSE_MAX = 128  # nc_transpose on the Tensor Engine: a matmul against identity, so <= 128 x 128
BN_STATS_FMAX = 512  # [trn1: bn_stats "free dimension size of input tile cannot exceed 512"; its API page]
VECTOR_TRANSPOSE_MAX = 32  # nc_transpose on the Vector Engine: 32 x 32 blocks (nki.isa.nc_transpose page)
DOUBLE_ROW_ROWS = 2  # [trn2] double FP8: stationary (K/2, 2, M), moving (K/2, 2, N), "the second dimension (the
# most major free dimension) of both input tensors must be two": two K rows per partition, contraction up to 256
DOUBLE_ROW_DTYPES = ("float8_e4m3fn", "float8_e5m2")  # [trn2, pm] FP8_E4 / FP8_E5, mixed allowed (FP8_E3 has no
# double rate); the maximum tiles are [128, 2, 128] and [128, 2, 512], the usual K, M, N limits per row [trn2]
MX_PARTITION_MULTIPLE = 32  # [mx] MX data tiles span whole quadrants: partitions a multiple of 32, <= 128
MX_MOVING_FMAX_FP32 = 4096  # [mx] nc_matmul_mx moving free size: 8 PSUM banks of fp32 (the entire PSUM) ...
MX_MOVING_FMAX_BF16 = 8192  # ... or of bf16
MX_ROW_TILES = (32, 64, 128)  # [mx] row tiling mode: 4 x 32, 2 x 64 rows, or the whole 128-row array

_HERE = os.path.dirname(os.path.abspath(__file__))


class NkiError(ValueError):
    """A kernel broke a rule of the NKI language or a limit of the hardware (raised where the kernel does it)."""


def kernel_line() -> str:
    """`file:line` of the innermost frame outside this package: the kernel source line being traced."""
    frame = inspect.currentframe()
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_HERE + os.sep):
            return f"{os.path.relpath(path) if not path.startswith('..') else path}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def fail(instruction: str, problem: str) -> NkiError:
    """The error for `instruction` at the kernel's current line (raise it)."""
    return NkiError(f"{instruction} at {kernel_line()}: {problem}")


def check(ok: bool, instruction: str, problem: str) -> None:
    if not ok:
        raise fail(instruction, problem)


def target_version() -> int:
    """The NeuronCore generation kernels are traced for: 3 (trn2, the default) or 4 (trn3), as
    NEURON_PLATFORM_TARGET_OVERRIDE says (AWS's compiler reads the same variable)."""
    return settings.PLATFORM_TARGET.get()


def needs_v4(instruction: str, what: str) -> NkiError:
    """The error for an API that NeuronCore-v4 (Trainium3) added and nativelab does not emulate (raise it)."""
    if target_version() >= 4:
        return fail(instruction, f"{what} (NeuronCore-v4) is not emulated: of v4's instructions nativelab runs "
                                 f"nc_matmul_mx and quantize_mx")
    return fail(instruction, f"{what} is available on NeuronCore-v4 (Trainium3) and newer; the emulated core is a "
                             f"NeuronCore-v3 (Trainium2)")


def check_v4(instruction: str) -> None:
    """A NeuronCore-v4 instruction nativelab emulates: an error unless the target is trn3."""
    if target_version() < 4:
        raise fail(instruction, f"{instruction} is available on NeuronCore-v4 (Trainium3) and newer; the target is "
                                f"NeuronCore-v3 (Trainium2): set NEURON_PLATFORM_TARGET_OVERRIDE=trn3 to trace for "
                                f"Trainium3")


def check_partitions(instruction: str, what: str, shape) -> None:
    """An on-chip tile's first dimension is its partition dimension: at most 128."""
    p = shape[0] if len(shape) else 1
    check(p <= PMAX, instruction,
          f"{what} has {p} partitions (shape {tuple(shape)}); the partition dimension is at most {PMAX} "
          f"(nl.tile_size.pmax)")


def warn(instruction: str, problem: str) -> None:
    warnings.warn(f"nki: {instruction} at {kernel_line()}: {problem}", NkiWarning, stacklevel=2)


class NkiWarning(UserWarning):
    """Something a kernel does that is legal but almost certainly a bug (reading memory never written)."""
