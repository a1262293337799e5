"""Cross-entropy in Triton, forward and backward, and the fused LM head + loss (`linear_cross_entropy`) that
never holds the (tokens x vocabulary) logits: rows are processed in chunks whose logits come from cuBLAS and
live only for that chunk (Liger-Kernel's approach), in the forward and again in the backward.

Forward: one program per row, an online log-sum-exp over the vocabulary in blocks, the row's loss (0 for
`ignore_index`). Backward: softmax - one-hot, scaled by grad / (number of counted rows). The mean and the
scale are device tensors: no host sync."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024
_CHUNK_ELEMENTS = 2**25  # logits held at once by linear_cross_entropy (128 MiB in float32)


@triton.jit
def ce_rows_fwd(L, Tgt, Lse, RowLoss, V, stride, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = L + row * stride
    cols = tl.arange(0, BLOCK)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(base + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    lse = m + tl.log(s)
    tgt = tl.load(Tgt + row).to(tl.int64)
    valid = tgt != ignore_index
    picked = tl.load(base + tl.where(valid, tgt, 0)).to(tl.float32)
    tl.store(Lse + row, lse)
    tl.store(RowLoss + row, tl.where(valid, lse - picked, 0.0))


@triton.jit
def ce_rows_bwd(L, Tgt, Lse, Scale, G, V, stride_l, stride_g, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < V
    x = tl.load(L + row * stride_l + cols, mask=live, other=0.0).to(tl.float32)
    lse = tl.load(Lse + row)
    tgt = tl.load(Tgt + row).to(tl.int64)
    scale = tl.where(tgt != ignore_index, tl.load(Scale), 0.0)
    g = (tl.exp(x - lse) - tl.where(cols == tgt, 1.0, 0.0)) * scale
    tl.store(G + row * stride_g + cols, g, mask=live)


def _rows_forward(logits, target, ignore_index, lse, row_loss):
    n, v = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if n:
        ce_rows_fwd[(n,)](logits, target, lse, row_loss, v, logits.stride(0), ignore_index, BLOCK=_BLOCK,
                          num_warps=4)


def _rows_backward(logits, target, lse, scale, ignore_index, grad_out):
    n, v = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if n:
        ce_rows_bwd[(n, triton.cdiv(v, _BLOCK))](logits, target, lse, scale, grad_out, v, logits.stride(0),
                                                grad_out.stride(0), ignore_index, BLOCK=_BLOCK, num_warps=4)


def _counted(target, ignore_index) -> torch.Tensor:
    return (target != ignore_index).sum().clamp(min=1).float()


def ce_forward(logits, target, ignore_index, loss_out, lse_out):
    """The cuda target of cross_entropy's forward kernel."""
    row_loss = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    _rows_forward(logits, target, ignore_index, lse_out, row_loss)
    torch.div(row_loss.sum(), _counted(target, ignore_index), out=loss_out)


def ce_backward(grad, logits, target, lse, ignore_index, grad_out):
    """The cuda target of cross_entropy's backward kernel."""
    _rows_backward(logits, target, lse, grad.float() / _counted(target, ignore_index), ignore_index, grad_out)


def _chunks(n: int, v: int):
    step = max(1, min(n, _CHUNK_ELEMENTS // max(v, 1)))
    return range(0, n, step), step


def lce_forward(h, weight, target, ignore_index, loss_out, lse_out):
    """The cuda target of linear_cross_entropy's forward kernel."""
    n, v = h.shape[0], weight.shape[0]
    row_loss = torch.empty(n, dtype=torch.float32, device=h.device)
    starts, step = _chunks(n, v)
    for s in starts:
        logits = h[s:s + step] @ weight.t()  # in h's dtype, as F.linear in the reference
        _rows_forward(logits, target[s:s + step], ignore_index, lse_out[s:s + step], row_loss[s:s + step])
    torch.div(row_loss.sum(), _counted(target, ignore_index), out=loss_out)


def lce_backward(grad, h, weight, target, lse, ignore_index, grad_h, grad_w):
    """The cuda target of linear_cross_entropy's backward kernel (float32 gradients)."""
    n, v = h.shape[0], weight.shape[0]
    scale = grad.float() / _counted(target, ignore_index)
    wf, hf = weight.float(), h.float()
    grad_w.zero_()
    starts, step = _chunks(n, v)
    g = torch.empty(min(step, n), v, dtype=torch.float32, device=h.device)
    for s in starts:
        rows = min(step, n - s)
        logits = h[s:s + rows] @ weight.t()
        _rows_backward(logits, target[s:s + rows], lse[s:s + rows], scale, ignore_index, g[:rows])
        torch.mm(g[:rows], wf, out=grad_h[s:s + rows])
        grad_w.addmm_(g[:rows].t(), hf[s:s + rows])
