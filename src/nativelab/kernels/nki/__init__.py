"""The library's kernels written in NKI (nki.language / nki.isa), each registered as a custom op with
wrap_nki + @nki_op, as Lab 2's nki_ops.py registers nkilib's, and equal to its PyTorch reference in
kernels/ops. These are the ones to read, check against the hardware's limits, and estimate on Trainium2
(`kernel.estimate(*args)`); on a CPU host a launch computes through what each lowers to (host.py: the PyTorch
kernels of kernels/ops and the C++ behind them), after its checks."""

from .add import add, add_kernel
from .attention import attention_cte, attention_cte_kernel, attention_tkg, attention_tkg_kernel
from .layouts import made_once, prepared, tiled
from .matmul import matmul, matmul_kernel
from .mlp import mlp, mlp_kernel
from .qkv import qkv, qkv_kernel
from .rmsnorm import rmsnorm, rmsnorm_kernel
from .rope import rope, rope_kernel
from .transformer import DecodeStack, transformer_step_kernel
from .sample import argmax, argmax_kernel, sample_top_p, top_p_kernel
from .softmax import reference_softmax, softmax, softmax_kernel
from . import host  # noqa: E402,F401  (each kernel's lowering on a CPU host, declared on import)

__all__ = ["add", "add_kernel", "argmax", "argmax_kernel", "attention_cte", "attention_cte_kernel", "attention_tkg",
           "attention_tkg_kernel", "DecodeStack", "transformer_step_kernel", "matmul",
           "made_once", "matmul_kernel", "mlp", "mlp_kernel", "prepared", "tiled", "qkv", "qkv_kernel", "rmsnorm", "rmsnorm_kernel", "rope",
           "rope_kernel", "sample_top_p", "top_p_kernel", "softmax", "softmax_kernel", "reference_softmax"]
