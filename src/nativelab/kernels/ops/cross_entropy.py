"""Cross-entropy for training: `cross_entropy` over given logits, and `linear_cross_entropy`, which fuses the
LM head so the (tokens x vocabulary) logits never exist in device memory. Both have backward kernels; the
forward saves only the log-sum-exp per row. Targets may be int32 (the device's labels) or int64;
`ignore_index` rows count for nothing, and the loss is the mean over the rest."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..interface import kernel_op, wrap_kernel
from ._checks import check_dim, check_float, check_rank, check_same


def reference_cross_entropy(logits, target, ignore_index: int = -100):
    return F.cross_entropy(logits.float(), target.long(), ignore_index=ignore_index)


def reference_linear_cross_entropy(h, weight, target, ignore_index: int = -100):
    return reference_cross_entropy(F.linear(h, weight), target, ignore_index)


def _loss_and_lse(logits, target, ignore_index):
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    t = target.long()
    valid = t != ignore_index
    picked = lf.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    loss = torch.where(valid, lse - picked, torch.zeros_like(lse)).sum() / valid.sum().clamp(min=1)
    return loss, lse


def _grad_logits(grad, logits, target, lse, ignore_index):
    t = target.long()
    valid = (t != ignore_index).unsqueeze(-1)
    probs = torch.exp(logits.float() - lse.unsqueeze(-1))
    onehot = F.one_hot(t.clamp(min=0), logits.shape[-1]).float()
    scale = grad.float() / valid.sum().clamp(min=1)
    return (probs - onehot) * valid * scale


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.cross_entropy:ce_forward"})
def ce_forward_kernel(logits, target, ignore_index, loss_out, lse_out):
    loss, lse = _loss_and_lse(logits, target, ignore_index)
    loss_out.copy_(loss)
    lse_out.copy_(lse)


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.cross_entropy:ce_backward"})
def ce_backward_kernel(grad, logits, target, lse, ignore_index, grad_out):
    grad_out.copy_(_grad_logits(grad, logits, target, lse, ignore_index))


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.cross_entropy:lce_forward"})
def lce_forward_kernel(h, weight, target, ignore_index, loss_out, lse_out):
    loss, lse = _loss_and_lse(F.linear(h, weight), target, ignore_index)
    loss_out.copy_(loss)
    lse_out.copy_(lse)


@wrap_kernel(targets={"cuda": "nativelab.kernels.triton.cross_entropy:lce_backward"})
def lce_backward_kernel(grad, h, weight, target, lse, ignore_index, grad_h, grad_w):
    g = _grad_logits(grad, F.linear(h, weight), target, lse, ignore_index)
    grad_h.copy_(g @ weight.float())
    grad_w.copy_(g.transpose(0, 1) @ h.float())


def _check_target(logits_rows: int, target: torch.Tensor) -> None:
    check_rank("target", target, 1)
    check_dim("target", target, 0, logits_rows, "one label per row")
    if target.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"target: dtype must be int32 or int64, got {target.dtype}")


@kernel_op("nativelab::cross_entropy_fwd", mutates_args=())
def _ce_fwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    check_rank("logits", logits, 2)
    check_float("logits", logits)
    _check_target(logits.shape[0], target)
    if target.device != logits.device:
        raise ValueError(f"target: on {target.device}, logits on {logits.device}")
    loss = torch.empty((), dtype=torch.float32, device=logits.device)
    lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    ce_forward_kernel(logits, target, ignore_index, loss, lse)
    return loss, lse


@kernel_op("nativelab::cross_entropy_bwd", mutates_args=())
def _ce_bwd(grad: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
            ignore_index: int) -> torch.Tensor:
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    ce_backward_kernel(grad, logits, target, lse, ignore_index, out)
    return out


def _ce_setup(ctx, inputs, output):
    logits, target, ignore_index = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.ignore_index = ignore_index


def _ce_backward(ctx, grad_loss, _grad_lse):
    logits, target, lse = ctx.saved_tensors
    return _ce_bwd(grad_loss, logits, target, lse, ctx.ignore_index).to(logits.dtype), None, None


_ce_fwd.register_autograd(_ce_backward, setup_context=_ce_setup)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy of logits (N, V) against labels (N,), as F.cross_entropy; float32 result."""
    return _ce_fwd(logits, target, ignore_index)[0]


def _check_lce(h, weight, target) -> None:
    check_rank("h", h, 2)
    check_float("h", h)
    check_rank("weight", weight, 2)
    check_dim("weight", weight, 1, h.shape[1], "h's hidden size: the LM head is [vocab, hidden]")
    check_same("h, weight", h, weight)
    _check_target(h.shape[0], target)


@kernel_op("nativelab::linear_cross_entropy_fwd", mutates_args=())
def _lce_fwd(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
             ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    _check_lce(h, weight, target)
    loss = torch.empty((), dtype=torch.float32, device=h.device)
    lse = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    lce_forward_kernel(h, weight, target, ignore_index, loss, lse)
    return loss, lse


@kernel_op("nativelab::linear_cross_entropy_bwd", mutates_args=())
def _lce_bwd(grad: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, lse: torch.Tensor,
             ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device)
    grad_w = torch.empty(weight.shape, dtype=torch.float32, device=h.device)
    lce_backward_kernel(grad, h, weight, target, lse, ignore_index, grad_h, grad_w)
    return grad_h, grad_w


def _lce_setup(ctx, inputs, output):
    h, weight, target, ignore_index = inputs
    ctx.save_for_backward(h, weight, target, output[1])
    ctx.ignore_index = ignore_index


def _lce_backward(ctx, grad_loss, _grad_lse):
    h, weight, target, lse = ctx.saved_tensors
    grad_h, grad_w = _lce_bwd(grad_loss, h, weight, target, lse, ctx.ignore_index)
    return grad_h.to(h.dtype), grad_w.to(weight.dtype), None, None


_lce_fwd.register_autograd(_lce_backward, setup_context=_lce_setup)


# Training: the forward also computes the gradients for a unit upstream gradient while the logits are at hand
# (Liger-Kernel's fused linear cross-entropy), so the logits are used once and never saved or recomputed, and
# backward only scales. A frozen LM head (LoRA, embeddings not trained) skips the weight gradient.
def _loss_and_unit_grad_logits(h, weight, target, ignore_index):
    logits = F.linear(h, weight)
    loss, lse = _loss_and_lse(logits, target, ignore_index)
    return loss, _grad_logits(loss.new_ones(()), logits, target, lse, ignore_index)


@wrap_kernel
def lce_train_kernel(h, weight, target, ignore_index, loss_out, grad_h):
    loss, g = _loss_and_unit_grad_logits(h, weight, target, ignore_index)
    loss_out.copy_(loss)
    grad_h.copy_(g @ weight.float())


@wrap_kernel
def lce_train_with_weight_kernel(h, weight, target, ignore_index, loss_out, grad_h, grad_w):
    loss, g = _loss_and_unit_grad_logits(h, weight, target, ignore_index)
    loss_out.copy_(loss)
    grad_h.copy_(g @ weight.float())
    grad_w.copy_(g.transpose(0, 1) @ h.float())


@kernel_op("nativelab::linear_cross_entropy_train", mutates_args=())
def _lce_train(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
               weight_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_lce(h, weight, target)
    loss = torch.empty((), dtype=torch.float32, device=h.device)
    grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device)
    grad_w = torch.empty(weight.shape if weight_grad else (0,), dtype=torch.float32, device=h.device)
    if weight_grad:
        lce_train_with_weight_kernel(h, weight, target, ignore_index, loss, grad_h, grad_w)
    else:
        lce_train_kernel(h, weight, target, ignore_index, loss, grad_h)
    return loss, grad_h, grad_w


def _lce_train_setup(ctx, inputs, output):
    h, weight, _, _, weight_grad = inputs
    ctx.save_for_backward(output[1], output[2])
    ctx.dtypes, ctx.weight_grad = (h.dtype, weight.dtype), weight_grad


def _lce_train_backward(ctx, grad_loss, _gh, _gw):
    grad_h, grad_w = ctx.saved_tensors
    gw = (grad_w * grad_loss).to(ctx.dtypes[1]) if ctx.weight_grad else None
    return (grad_h * grad_loss).to(ctx.dtypes[0]), gw, None, None, None


_lce_train.register_autograd(_lce_train_backward, setup_context=_lce_train_setup)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         ignore_index: int = -100) -> torch.Tensor:
    """cross_entropy(h @ weight.T, target) without materialising the logits; h (N, hidden), weight [V, hidden]."""
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _lce_train(h, weight, target, ignore_index, weight.requires_grad)[0]
    return _lce_fwd(h, weight, target, ignore_index)[0]
