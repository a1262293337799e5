"""The real device's dtype policy: int64 -> int32 and float64 -> float32 for inputs that are not 0-d."""

import logging

import torch
import torch.nn.functional as F

from conftest import run_python


def test_int64_is_computed_in_int32_and_returned_as_int64():
    big = torch.tensor([2**31 + 5, 7], dtype=torch.int64)
    got = (big.to("neuron") + torch.tensor([1, 1]).to("neuron")).cpu()
    assert got.dtype == torch.int64  # cast back: an input was int64
    # computed in int32, as on the device: the first value wraps like int32 does
    expected = (big.to(torch.int32) + 1).to(torch.int64)
    assert torch.equal(got, expected)
    assert got[1].item() == 8 and got[0].item() != 2**31 + 6


def test_float64_is_computed_in_float32():
    x = torch.tensor([1.0 + 1e-12, 2.0], dtype=torch.float64)
    got = (x.to("neuron") * 1).cpu()
    assert got.dtype == torch.float64
    assert got[0].item() == 1.0  # float32 cannot hold 1 + 1e-12
    assert (x * 1)[0].item() != 1.0


def test_zero_dim_and_out_arguments_are_not_cast():
    s = torch.tensor(2**40, dtype=torch.int64).to("neuron")
    assert (s + 1).cpu().item() == 2**40 + 1  # 0-d: exact
    out = torch.empty(2, dtype=torch.int64, device="neuron")
    torch.add(torch.tensor([1, 2], dtype=torch.int32).to("neuron"), 2**33, out=out)
    assert out.dtype == torch.int64


def test_warning_is_logged_once(caplog):
    import nativelab.device.ops as ops

    ops._policy_warned.discard(torch.int64)
    with caplog.at_level(logging.WARNING, logger="nativelab.device.dtype_policy"):
        a = torch.arange(4).to("neuron")
        (a * 2).cpu()
        (a * 3).cpu()
    msgs = [r.getMessage() for r in caplog.records if "int64" in r.getMessage()]
    assert msgs == [
        "Neuron backend does not support int64. Automatically casting to int32. Consider using int32 directly "
        "for better performance until native int64 support is added."
    ]


def test_int32_labels_work_with_cross_entropy_and_nll_loss():
    torch.manual_seed(0)
    logits = torch.randn(8, 5, requires_grad=True)
    labels = torch.randint(0, 5, (8,))
    ref = F.cross_entropy(logits, labels)
    ref.backward()
    ref_grad = logits.grad.clone()
    d_logits = logits.detach().to("neuron").requires_grad_()
    d_labels = labels.to(torch.int32).to("neuron")
    loss = F.cross_entropy(d_logits, d_labels)
    loss.backward()
    torch.testing.assert_close(loss.cpu(), ref.detach())
    torch.testing.assert_close(d_logits.grad.cpu(), ref_grad)
    torch.testing.assert_close(
        F.nll_loss(torch.log_softmax(d_logits, 1), d_labels).cpu(),
        F.nll_loss(torch.log_softmax(logits, 1), labels),
    )


def test_policy_can_be_turned_off():
    r = run_python(
        "import torch, nativelab\n"
        "big = torch.tensor([2**31 + 5, 7]).to('neuron')\n"
        "print((big + 1).cpu().tolist())\n",
        {"NATIVELAB_DTYPE_POLICY": "0"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str([2**31 + 6, 8])
    assert "does not support int64" not in r.stderr
