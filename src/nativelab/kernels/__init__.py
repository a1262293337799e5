"""Kernels: the kernel interface (`wrap_kernel` / `kernel_op`, alias `wrap_nki` / `nki_op`) and the library."""

from .interface import Kernel, kernel_op, nki_op, weights_stay_inputs, wrap_kernel, wrap_nki

__all__ = ["Kernel", "kernel_op", "wrap_kernel", "nki_op", "wrap_nki", "weights_stay_inputs"]
