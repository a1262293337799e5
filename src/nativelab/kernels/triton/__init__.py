"""Triton implementations of the kernel library for CUDA tensors, one file per kernel.

Each launcher has the signature of the library kernel it serves (inputs, then the outputs it writes) and is
named in that kernel's `targets={"cuda": "nativelab.kernels.triton.<file>:<launcher>"}`, so Triton is imported
only when a CUDA tensor reaches a kernel. The memory-bound parts (norms, RoPE, SiLU, attention, softmax,
sampling, cross-entropy) are Triton; the matrix products go to cuBLAS (`torch.matmul`), which a batch-1 GEMV
in Triton would not beat. Under `TRITON_INTERPRET=1` the same launchers run on CPU tensors (the tests).
Only plain `tl.load` / `tl.store` / `tl.dot` / reductions: Triton 3.6 and 3.9 both run them.
"""
