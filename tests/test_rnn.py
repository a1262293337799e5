"""RNN modules and cells on the device (PyTorch sends PrivateUse1 to its fused LSTM/GRU cell ops), forward
and backward, against the same modules on CPU."""

import copy

import pytest
import torch
from torch import nn


def _compare(module, inputs, atol=1e-5):
    torch.manual_seed(0)
    dev = copy.deepcopy(module).to("neuron")
    out_c = module(*inputs)
    out_d = dev(*[x.to("neuron") if isinstance(x, torch.Tensor) else tuple(t.to("neuron") for t in x)
                  for x in inputs])
    flat_c = [t for t in torch.utils._pytree.tree_leaves(out_c)]
    flat_d = [t for t in torch.utils._pytree.tree_leaves(out_d)]
    assert all(t.device.type == "neuron" for t in flat_d)
    for c, d in zip(flat_c, flat_d):
        torch.testing.assert_close(d.cpu(), c, atol=atol, rtol=1e-4)
    sum(t.float().pow(2).sum() for t in flat_c).backward()
    sum(t.float().pow(2).sum() for t in flat_d).backward()
    for (name, pc), pd in zip(module.named_parameters(), dev.parameters()):
        torch.testing.assert_close(pd.grad.cpu(), pc.grad, atol=atol, rtol=1e-4, msg=name)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_rnn_modules(cls, bidirectional):
    torch.manual_seed(1)
    m = cls(5, 7, num_layers=2, batch_first=True, bidirectional=bidirectional)
    _compare(m, (torch.randn(3, 4, 5),))


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_rnn_without_bias_and_with_initial_state(cls):
    torch.manual_seed(2)
    m = cls(4, 6, bias=False)
    h0 = torch.randn(1, 2, 6)
    state = (h0, torch.randn(1, 2, 6)) if cls is nn.LSTM else h0
    _compare(m, (torch.randn(5, 2, 4), state))


@pytest.mark.parametrize("cls", [nn.LSTMCell, nn.GRUCell, nn.RNNCell])
def test_cells(cls):
    torch.manual_seed(3)
    m = cls(4, 6)
    h = torch.randn(2, 6)
    state = (h, torch.randn(2, 6)) if cls is nn.LSTMCell else h
    _compare(m, (torch.randn(2, 4), state))


def test_lstm_input_gradient_and_no_cpu_fallback():
    import nativelab

    torch.manual_seed(4)
    m = nn.LSTM(3, 4)
    x = torch.randn(6, 1, 3, requires_grad=True)
    xd = x.detach().to("neuron").requires_grad_()
    m(x)[0].sum().backward()
    nativelab.clear_op_tracking()
    m.to("neuron")(xd)[0].sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, atol=1e-5, rtol=1e-4)
    assert not [op for op in nativelab.get_fallback_ops() if "thnn" in op or "lstm" in op]
