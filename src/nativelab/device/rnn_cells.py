"""LSTM and GRU cells on the device.

`nn.LSTM` / `nn.GRU` / `LSTMCell` / `GRUCell` on a PrivateUse1 device reach PyTorch's fused cell ops
(`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell` and their backward ops), which only CUDA implements: a CPU
fallback has no kernel to run. These are the same computations written with device ops, returning what
CUDA's kernels return (the workspace layouts included), so PyTorch's autograd formulas for the fused cells
apply unchanged. Each is a handful of elementwise device ops.
"""

from __future__ import annotations

import torch


def _gates(gates, bias):
    return gates if bias is None else gates + bias


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _gates(input_gates, input_bias) + _gates(hidden_gates, hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat((i, f, g, o), 1)  # workspace: the activated gates, as CUDA keeps them


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    gcx = torch.zeros_like(cy) if grad_cy is None else grad_cy.clone()
    if grad_hy is not None:
        gcx = gcx + grad_hy * o * (1 - tanh_cy * tanh_cy)
        go = grad_hy * tanh_cy * o * (1 - o)
    else:
        go = torch.zeros_like(o)
    gi = gcx * g * i * (1 - i)
    gf = gcx * cx * f * (1 - f)
    gg = gcx * i * (1 - g * g)
    grad_gates = torch.cat((gi, gf, gg, go), 1)
    return grad_gates, gcx * f, grad_gates.sum(0) if has_bias else None


def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, ii, in_ = _gates(input_gates, input_bias).chunk(3, 1)
    hr, hi, hn = _gates(hidden_gates, hidden_bias).chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat((r, z, n, hx, hn), 1)  # workspace, in CUDA's layout


def gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    gn = grad_hy * (1 - z) * (1 - n * n)
    gz = grad_hy * (hx - n) * z * (1 - z)
    gr = gn * hn * r * (1 - r)
    grad_input_gates = torch.cat((gr, gz, gn), 1)
    grad_hidden_gates = torch.cat((gr, gz, gn * r), 1)
    grad_hx = grad_hy * z
    if has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)
    return grad_input_gates, grad_hidden_gates, grad_hx, None, None


def install(aten_lib) -> None:
    for name, kernel in (
        ("_thnn_fused_lstm_cell", lstm_cell),
        ("_thnn_fused_lstm_cell_backward_impl", lstm_cell_backward),
        ("_thnn_fused_gru_cell", gru_cell),
        ("_thnn_fused_gru_cell_backward", gru_cell_backward),
    ):
        aten_lib.impl(name, kernel, "PrivateUse1")
