"""The SwiGLU MLP in one kernel: optional RMSNorm, gate/up projections, SiLU, product, down projection,
optional residual. Weights are `nn.Linear.weight` ([out, in]), passed as they are."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..interface import kernel_op, wrap_kernel
from ._checks import check_dim, check_float, check_rank, check_same
from .rmsnorm import reference_rmsnorm


def reference_mlp(x, gate_w, up_w, down_w, norm_w=None, eps: float = 1e-5, residual: bool = False):
    h = reference_rmsnorm(x, norm_w, eps) if norm_w is not None else x
    y = F.linear(F.silu(F.linear(h, gate_w)) * F.linear(h, up_w), down_w)
    return x + y if residual else y


@wrap_kernel(weights=(1, 2, 3, 4), targets={"cuda": "nativelab.kernels.triton.mlp:mlp",
                                            "host": "nativelab.kernels.cpu.decode:mlp"})
def mlp_kernel(x, gate_w, up_w, down_w, norm_w, eps, residual, out):
    out.copy_(reference_mlp(x, gate_w, up_w, down_w, norm_w, eps, residual))


@wrap_kernel(weights=(1, 2, 3), targets={"cuda": "nativelab.kernels.triton.mlp:mlp_no_norm",
                                         "host": "nativelab.kernels.cpu.decode:mlp_no_norm"})
def mlp_kernel_no_norm(x, gate_w, up_w, down_w, residual, out):
    out.copy_(reference_mlp(x, gate_w, up_w, down_w, None, 0.0, residual))


def _check(x, gate_w, up_w, down_w, norm_w) -> None:
    check_float("x", x)
    dim = x.shape[-1]
    for name, w in (("gate_w", gate_w), ("up_w", up_w)):
        check_rank(name, w, 2)
        check_dim(name, w, 1, dim, "x's hidden size: weights are [out, in]")
    check_dim("up_w", up_w, 0, gate_w.shape[0], "gate_w's intermediate size")
    check_rank("down_w", down_w, 2)
    check_dim("down_w", down_w, 1, gate_w.shape[0], "the intermediate size")
    check_dim("down_w", down_w, 0, dim, "x's hidden size")
    tensors = [x, gate_w, up_w, down_w] + ([norm_w] if norm_w is not None else [])
    check_same("x and the weights", *tensors)
    if norm_w is not None:
        check_dim("norm_w", norm_w, 0, dim, "x's hidden size")


@kernel_op("nativelab::mlp", mutates_args=())
def _mlp_op(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor,
            norm_w: torch.Tensor | None = None, eps: float = 1e-5, residual: bool = False) -> torch.Tensor:
    _check(x, gate_w, up_w, down_w, norm_w)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if norm_w is not None:
        mlp_kernel(x, gate_w, up_w, down_w, norm_w, eps, residual, out)
    else:
        mlp_kernel_no_norm(x, gate_w, up_w, down_w, residual, out)
    return out


# Training (without the optional norm): the forward kernel also returns the gate / up projections, which the
# backward kernels reuse (no recompute; SiLU and the product are recomputed, elementwise). Frozen weights (LoRA
# elsewhere, or the MLP not trained) skip the weight gradients.
@wrap_kernel
def mlp_train_kernel(x, gate_w, up_w, down_w, residual, out, a_out, b_out):
    a, b = F.linear(x, gate_w), F.linear(x, up_w)
    y = F.linear(F.silu(a) * b, down_w)
    out.copy_(x + y if residual else y)
    a_out.copy_(a)
    b_out.copy_(b)


def _mlp_grad_x(grad, a, b, gate_w, up_w, down_w, residual):
    a, b = a.float(), b.float()
    sig = torch.sigmoid(a)
    s = a * sig
    gh = F.linear(grad, down_w.t()).float()
    ga = (gh * b * sig * (1 + a * (1 - sig))).to(grad.dtype)
    gb = (gh * s).to(grad.dtype)
    gx = F.linear(ga, gate_w.t()) + F.linear(gb, up_w.t())
    return (gx + grad if residual else gx), ga, gb, (s * b).to(grad.dtype)


@wrap_kernel
def mlp_backward_x_kernel(grad, a, b, gate_w, up_w, down_w, residual, grad_x):
    grad_x.copy_(_mlp_grad_x(grad, a, b, gate_w, up_w, down_w, residual)[0])


@wrap_kernel
def mlp_backward_kernel(grad, x, a, b, gate_w, up_w, down_w, residual, grad_x, grad_gate, grad_up, grad_down):
    gx, ga, gb, h = _mlp_grad_x(grad, a, b, gate_w, up_w, down_w, residual)

    def rows(t):
        return t.reshape(-1, t.shape[-1])

    grad_x.copy_(gx)
    grad_gate.copy_(rows(ga).t() @ rows(x))
    grad_up.copy_(rows(gb).t() @ rows(x))
    grad_down.copy_(rows(grad).t() @ rows(h))


@kernel_op("nativelab::mlp_train", mutates_args=())
def _mlp_train(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor,
               residual: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(x, gate_w, up_w, down_w, None)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    a = torch.empty((*x.shape[:-1], gate_w.shape[0]), dtype=x.dtype, device=x.device)
    b = torch.empty_like(a)
    mlp_train_kernel(x, gate_w, up_w, down_w, residual, out, a, b)
    return out, a, b


@kernel_op("nativelab::mlp_bwd_x", mutates_args=())
def _mlp_bwd_x(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor,
               down_w: torch.Tensor, residual: bool) -> torch.Tensor:
    grad_x = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
    mlp_backward_x_kernel(grad, a, b, gate_w, up_w, down_w, residual, grad_x)
    return grad_x


@kernel_op("nativelab::mlp_bwd", mutates_args=())
def _mlp_bwd(grad: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, gate_w: torch.Tensor,
             up_w: torch.Tensor, down_w: torch.Tensor,
             residual: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    grads = [torch.empty(t.shape, dtype=t.dtype, device=x.device) for t in (x, gate_w, up_w, down_w)]
    mlp_backward_kernel(grad, x, a, b, gate_w, up_w, down_w, residual, *grads)
    return tuple(grads)


def _setup(ctx, inputs, output):
    x, gate_w, up_w, down_w, residual = inputs
    ctx.weight_grads = any(ctx.needs_input_grad[1:4])
    ctx.save_for_backward(x if ctx.weight_grads else None, output[1], output[2], gate_w, up_w, down_w)
    ctx.residual = residual


def _backward(ctx, grad, _ga, _gb):
    x, a, b, gate_w, up_w, down_w = ctx.saved_tensors
    grad = grad.contiguous()
    if ctx.weight_grads:
        gx, gg, gu, gd = _mlp_bwd(grad, x, a, b, gate_w, up_w, down_w, ctx.residual)
        return gx, gg, gu, gd, None
    return _mlp_bwd_x(grad, a, b, gate_w, up_w, down_w, ctx.residual), None, None, None, None


_mlp_train.register_autograd(_backward, setup_context=_setup)


def mlp(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor,
        norm_w: torch.Tensor | None = None, eps: float = 1e-5, residual: bool = False) -> torch.Tensor:
    """The SwiGLU MLP (optional RMSNorm first, optional residual); differentiable without the norm."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, gate_w, up_w, down_w)):
        if norm_w is not None:
            raise NotImplementedError("mlp: training with the fused norm (norm_w) is not implemented; "
                                      "apply rmsnorm first and pass norm_w=None")
        return _mlp_train(x, gate_w, up_w, down_w, residual)[0]
    return _mlp_op(x, gate_w, up_w, down_w, norm_w, eps, residual)
