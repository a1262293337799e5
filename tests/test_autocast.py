"""torch.autocast('neuron', dtype=torch.bfloat16)."""

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
