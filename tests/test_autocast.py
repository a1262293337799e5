"""torch.autocast('neuron', dtype=torch.bfloat16)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


def test_matmuls_run_in_bfloat16_and_losses_in_float32():
    torch.manual_seed(0)
    a = torch.randn(8, 8)
    lin = nn.Linear(8, 4)
    d_lin = nn.Linear(8, 4).to("neuron")
    d_lin.load_state_dict(lin.state_dict())
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3], dtype=torch.int32)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        d = a.to("neuron")
        assert (d @ d).dtype == torch.bfloat16
        out = d_lin(d)
        assert out.dtype == torch.bfloat16
        assert (d + d).dtype == torch.float32  # not on the list: unchanged
        loss = F.cross_entropy(out, labels.to("neuron"))
        assert loss.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = lin(a)
    torch.testing.assert_close(out.float().cpu(), ref.float(), rtol=2e-2, atol=2e-2)
    loss.backward()
    assert d_lin.weight.grad.dtype == torch.float32 and d_lin.weight.grad.device.type == "neuron"


def test_autocast_disabled_region_and_nesting():
    d = torch.randn(4, 4).to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        with torch.autocast("neuron", enabled=False):
            assert (d @ d).dtype == torch.float32
        assert (d @ d).dtype == torch.bfloat16
    assert torch.get_autocast_dtype("neuron") in (torch.bfloat16, torch.float16)


def test_an_unsupported_autocast_dtype_warns_and_disables_autocast_naming_the_supported_ones():
    with pytest.warns(UserWarning, match="In neuron autocast, but the target dtype is not supported. Disabling "
                      "autocast.\nneuron Autocast only supports dtypes of torch.float16, torch.bfloat16 currently."):
        with torch.autocast("neuron", dtype=torch.float32):
            assert not torch.is_autocast_enabled("neuron")


def test_binary_cross_entropy_is_refused_under_autocast_as_on_cuda():
    p, y = torch.rand(2, 3, device="neuron"), torch.rand(2, 3, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast"):
            torch.nn.functional.binary_cross_entropy(p, y)
        torch.nn.functional.binary_cross_entropy_with_logits(p, y)  # the safe form runs
    want = torch.nn.functional.binary_cross_entropy(p.cpu(), y.cpu())
    torch.testing.assert_close(torch.nn.functional.binary_cross_entropy(p, y).cpu(), want)  # outside: as CPU
