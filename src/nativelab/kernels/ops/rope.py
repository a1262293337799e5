"""RoPE on (B, H, T, D) with (T, D) cos/sin tables, pairing the two halves of D (Hugging Face convention)."""

from __future__ import annotations

import torch

from ..interface import kernel_op, wrap_kernel
from ._checks import check_dim, check_float, check_rank, check_same


def reference_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.rope:rope"})
def rope_kernel(x, cos, sin, out):
    out.copy_(reference_rope(x, cos, sin))


def _check(x, cos, sin):
    check_rank("x", x, 4)
    check_float("x", x)
    if x.shape[-1] % 2:
        raise ValueError(f"x: head_dim must be even for RoPE, got {x.shape[-1]}")
    for name, t in (("cos", cos), ("sin", sin)):
        check_rank(name, t, 2)
        check_dim(name, t, 0, x.shape[2], "x's sequence length")
        check_dim(name, t, 1, x.shape[3], "x's head_dim")
    check_same("x, cos, sin", x, cos, sin)


@kernel_op("nativelab::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    _check(x, cos, sin)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rope_kernel(x, cos, sin, out)
    return out


@kernel_op("nativelab::rope_", mutates_args=("x",))
def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """RoPE in place."""
    _check(x, cos, sin)
    rope_kernel(x, cos, sin, x)


def _rotate_half_transposed(v: torch.Tensor) -> torch.Tensor:
    """The transpose of RoPE's rotate-half map [-x2, x1]: [v2, -v1]."""
    half = v.shape[-1] // 2
    return torch.cat([v[..., half:], -v[..., :half]], dim=-1)


# Training: RoPE is linear in x, so its backward is the transposed rotation applied to the gradient.
@wrap_kernel
def rope_backward_kernel(grad, cos, sin, grad_x):
    grad_x.copy_((grad * cos + _rotate_half_transposed(grad * sin)).type_as(grad))


@kernel_op("nativelab::rope_bwd", mutates_args=())
def _rope_bwd(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    out = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
    rope_backward_kernel(grad, cos, sin, out)
    return out


def _setup(ctx, inputs, output):
    _, cos, sin = inputs
    if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
        raise NotImplementedError("rope: gradients with respect to cos / sin are not implemented "
                                  "(they are position tables; detach them)")
    ctx.save_for_backward(cos, sin)


def _backward(ctx, grad):
    cos, sin = ctx.saved_tensors
    return _rope_bwd(grad.contiguous(), cos, sin), None, None


rope.register_autograd(_backward, setup_context=_setup)
