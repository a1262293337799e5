"""`torch.autocast('neuron', dtype=torch.bfloat16)`: PyTorch's autocast policy for the device.

PyTorch ships autocast kernels for CPU and CUDA only; a PrivateUse1 backend brings its own. Ours follows
the CUDA/CPU policy for the ops that matter to the labs: matrix products run in the autocast dtype, losses
and reductions that need range run in float32, everything else passes through unchanged.
"""

from __future__ import annotations

import torch

from . import _private

DEVICE = "neuron"

# Run in the autocast dtype (matmul-like, as in PyTorch's CUDA "lower_precision_fp" list).
LOWER_PRECISION = (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "matmul", "linear", "dot", "vdot",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input",
    "prelu", "_scaled_dot_product_attention_math", "scaled_dot_product_attention", "chain_matmul",
)
# Run in float32 (PyTorch's "fp32" list, the subset with device kernels or fallbacks here).
FP32 = (
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "nll_loss", "nll_loss2d", "cross_entropy_loss",
    "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss", "log_softmax.int", "softmax.int",
    "layer_norm", "group_norm", "norm.Scalar", "cumsum", "cumprod", "prod", "sum", "pow.Tensor_Scalar",
    "exp", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "erfinv", "acos", "asin", "cosh", "sinh",
    "tan", "softplus", "dist", "cdist", "renorm", "logsumexp",
)


# Refused under autocast, as CUDA refuses them (autocast_mode.cpp's "banned" list, its message).
BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."
    ),
}


def _banned(message):
    def banned_kernel(*args, **kwargs):
        raise RuntimeError(message)

    return banned_kernel


def _cast(x, dtype):
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and x.device.type == DEVICE and x.dtype != dtype:
            return x.to(dtype)
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(y, dtype) for y in x)
    return x


def _kernel(op, target):
    def autocast_kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype(DEVICE) if target is None else target
        args = _cast(args, dtype)
        kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        with _private.without_autocast():
            return op(*args, **kwargs)

    return autocast_kernel


def _overloads(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return []
    names = [overload] if overload else packet.overloads()
    return [getattr(packet, n) for n in names if n in packet.overloads()]


def install(lib: torch.library.Library, aten_lib: torch.library.Library) -> None:
    lib.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    for names, target in ((LOWER_PRECISION, None), (FP32, torch.float32)):
        for name in names:
            for op in _overloads(name):
                schema = _private.op_schema(op)
                mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
                if not mutates and any("Tensor" in str(a.type) for a in schema.arguments):
                    aten_lib.impl(op, _kernel(op, target), "AutocastPrivateUse1")
    for name, message in BANNED.items():
        for op in _overloads(name):
            aten_lib.impl(op, _banned(message), "AutocastPrivateUse1")
