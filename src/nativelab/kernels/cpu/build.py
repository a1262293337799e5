"""Building the hand-written CPU kernels: one C++ source, compiled once per vector ISA (AVX-512, AVX2, the
portable default) into its own extension module, loaded for the ISA PyTorch uses on this host
(`ATEN_CPU_CAPABILITY=avx2` on an AVX-512 machine selects the AVX2 build, as it does for ATen and Inductor).

On by default; `NATIVELAB_CPU_KERNELS=0` turns them off (see `enabled`); the kernels' traced-and-compiled path
runs then, and on a machine that cannot build C++ (one warning).
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

from ... import cpp_build, settings
from ...device import cpu_info

CSRC = Path(__file__).parent / "csrc"
# The flags Inductor compiles its own C++ with for each ISA; the CPU_CAPABILITY namespace keeps each build's
# inline at::vec code apart from PyTorch's and the other builds'.
ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mfma", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY_AVX2"],
    "DEFAULT": [],
}


def isa() -> str:
    """The build to use: PyTorch's CPU capability on this host, mapped to a build above."""
    cap = cpu_info.isa()
    return "AVX512" if cap.startswith("AVX512") else "AVX2" if cap.startswith("AVX2") else "DEFAULT"


def enabled() -> bool:
    """On unless NATIVELAB_CPU_KERNELS=0. On a 2-core Xeon (AVX-512) the whole decode step took 2.1 ms with
    the hand-written kernel against 5.7 ms for the traced one (Inductor + oneDNN matrix-vector products),
    same process; `bench/lab2.py --traced-too` compares the two in the Lab 2 tier."""
    return settings.CPU_KERNELS.get()


def host_kernels(on: bool):
    """The hand-written kernels on or off for the block (a context manager), in this process: the setting's
    override, restored after it. Child processes started inside it keep the environment's setting."""
    return settings.CPU_KERNELS.set(on)


@functools.cache
def extension(which: str | None = None):
    """The decode kernels' module for ISA `which` (default: this host's), or None where it cannot be built."""
    which = which or isa()
    # -fopenmp: without it ATen's parallel_for is compiled serial (ATen/Parallel.h parallelises only under
    # _OPENMP), which left the first version of these kernels on one thread. The OpenMP runtime is the one
    # torch already loaded (same soname), so the device's thread policy sizes these teams too.
    flags = ["-O3", "-fopenmp", f"-DCPU_CAPABILITY=nativelab_{which}", *ISA_FLAGS[which]]
    try:  # cached on disk by content and flags (nativelab.cpp_build)
        return cpp_build.load_extension(f"nativelab_decode_{which.lower()}", [CSRC / "decode.cpp"], flags,
                                        ["-fopenmp"], depends=[CSRC / "prefill.h", CSRC / "sample.h"])
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a compile error: the traced path still works
        warnings.warn(f"nativelab: the hand-written CPU decode kernels could not be built ({e}); "
                      f"the traced kernels run instead")
        return None
