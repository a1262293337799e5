"""NKI (AWS's Neuron Kernel Interface, the 0.5.0 API) on the emulated device: `@nki.jit` kernels written
with `nki.language` and `nki.isa` run unmodified on `neuron` and CPU tensors, traced once per input
signature into a graph of torch operations, compiled and cached like every nativelab kernel, and checked
against NeuronCore-v3's limits as they trace.

Where AWS's `nki` is not installed, `import nki`, `import nki.language as nl` and `import nki.isa as nisa`
resolve here (nativelab's stand-in); where it is, AWS's package serves them and this one steps aside.
"""

from __future__ import annotations

import torch

from . import collectives, isa, language, typing
from .dtypes import KernelDtype
from .jit import JitKernel, jit
from .hazards import HazardError, HazardWarning
from .limits import NkiError, NkiWarning
from .order import ORDERS, OrderError

__version__ = "0.5.0+nativelab"
__all__ = ["jit", "language", "isa", "collectives", "typing", "JitKernel", "NkiError", "NkiWarning", "HazardWarning",
           "HazardError", "OrderError", "simulate", "dtype"]

dtype = KernelDtype  # NKI's dtype type, nl.bfloat16's (kernels annotate `dtype: nki.dtype = nl.bfloat16`)


def simulate(kernel, order: str | None = None, seed: int = 0):
    """`nki.simulate(kernel)(*args)`, AWS's CPU simulator's entry point: the kernel interpreted instruction
    by instruction on CPU tensors (same checks and results as the compiled run, no compile: for debugging).

    nativelab's order check: order="reverse" or "shuffle" (seeded by `seed`) also runs every nl.affine_range
    loop's iterations, and a launch grid's programs, in that order, and raises nki.order.OrderError naming the
    first output element that differs from the in-order run and the loop it traces to (nki/order.py)."""
    if order is not None and order not in ORDERS:
        raise ValueError(f"nki.simulate: order must be one of {ORDERS} (or None: in order), got {order!r}")
    fn = kernel.fn if isinstance(kernel, JitKernel) else kernel
    options = dict(kernel.options) if isinstance(kernel, JitKernel) else {}
    options.update(simulate=True, order=order, seed=int(seed))
    return JitKernel(fn, kernel.grid if isinstance(kernel, JitKernel) else (), **options)
