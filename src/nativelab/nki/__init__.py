"""NKI (AWS's Neuron Kernel Interface, the 0.5.0 API) on the emulated device: `@nki.jit` kernels written
with `nki.language` and `nki.isa` run unmodified on `neuron` and CPU tensors, traced once per input
signature into a graph of torch operations, compiled and cached like every nativelab kernel, and checked
against NeuronCore-v3's limits as they trace.

Where AWS's `nki` is not installed, `import nki`, `import nki.language as nl` and `import nki.isa as nisa`
resolve here (nativelab's stand-in); where it is, AWS's package serves them and this one steps aside.
"""

from __future__ import annotations

import torch

from . import collectives, compiler, isa, language, typing
from .dtypes import KernelDtype
from .jit import JitKernel, jit
from .hazards import HazardError, HazardWarning
from .limits import NkiError, NkiWarning
from .order import OrderError
from .ranks import multi_rank_simulate
from .standalone import EstimateWarning, baremetal, benchmark, profile, simulate

__version__ = "0.5.0+nativelab"
__all__ = ["jit", "language", "isa", "collectives", "compiler", "typing", "JitKernel", "NkiError", "NkiWarning", "HazardWarning",
           "HazardError", "OrderError", "simulate", "multi_rank_simulate", "dtype", "baremetal", "benchmark", "profile",
           "EstimateWarning"]

dtype = KernelDtype  # NKI's dtype type, nl.bfloat16's (kernels annotate `dtype: nki.dtype = nl.bfloat16`)

