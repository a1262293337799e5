"""bf16 matrix products on the device: fp32 GEMMs of upcast operands where the host has no fast bf16 GEMM."""

import pytest
import torch
import torch.nn.functional as F

from nativelab.device import cpu_info, gemm_policy, state


@pytest.fixture
def counting_upcasts(monkeypatch):
    """Force the no-bf16-instructions policy (upcast from 4 rows) and count the products that were upcast."""
    monkeypatch.setattr(gemm_policy, "min_rows", lambda: 4)
    calls = []
    original = gemm_policy.upcast_tensors

    def spy(args):
        calls.append([tuple(a.shape) for a in args if isinstance(a, torch.Tensor)])
        return original(args)

    monkeypatch.setattr(gemm_policy, "upcast_tensors", spy)
    return calls


def _exact(*mats):
    """The reference: exact bf16 products accumulated in fp32 (a CPU fp32 GEMM of the upcast operands)."""
    return [m.float() for m in mats]


def test_mm_addmm_bmm_upcast_match_fp32_products(counting_upcasts):
    torch.manual_seed(0)
    a, b = torch.randn(33, 70).bfloat16(), torch.randn(70, 45).bfloat16()
    bias = torch.randn(45).bfloat16()
    x, y = torch.randn(3, 17, 9).bfloat16(), torch.randn(3, 9, 11).bfloat16()
    da, db, dbias, dx, dy = (t.to("neuron") for t in (a, b, bias, x, y))
    fa, fb, fbias, fx, fy = _exact(a, b, bias, x, y)
    out = (da @ db).cpu()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, (fa @ fb).bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(torch.addmm(dbias, da, db, beta=0.5, alpha=2.0).cpu(),
                               torch.addmm(fbias, fa, fb, beta=0.5, alpha=2.0).bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(torch.bmm(dx, dy).cpu(), torch.bmm(fx, fy).bfloat16(), rtol=0, atol=0)
    assert len(counting_upcasts) == 3


def test_matrix_vector_products_stay_bf16(counting_upcasts):
    a, b = torch.randn(1, 64).bfloat16(), torch.randn(64, 96).bfloat16()
    torch.testing.assert_close((a.to("neuron") @ b.to("neuron")).cpu(), a @ b)
    assert counting_upcasts == []  # one row: bandwidth-bound, bf16 weights read once


def test_float32_products_are_untouched(counting_upcasts):
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    torch.testing.assert_close((a.to("neuron") @ b.to("neuron")).cpu(), a @ b)
    assert counting_upcasts == []


def test_autocast_linear_and_backward_upcast(counting_upcasts):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 24)
    w = torch.randn(40, 24, requires_grad=True)
    dw = w.detach().to("neuron").requires_grad_()
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y = F.linear(x.to("neuron"), dw)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    ref = (x.bfloat16().float().reshape(-1, 24) @ w.detach().bfloat16().float().t()).bfloat16().reshape(2, 8, 40)
    torch.testing.assert_close(y.cpu(), ref, rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.linear(x, w).float().sum().backward()
    torch.testing.assert_close(dw.grad.cpu(), w.grad, rtol=2e-2, atol=2e-2)
    assert len(counting_upcasts) >= 2  # the forward product and the weight gradient's


def test_policy_follows_the_cpu():
    rows = gemm_policy.min_rows()
    if not cpu_info.has_bf16_instructions():
        assert rows == 4
    assert gemm_policy.upcast(1, 4096, 4096) is False  # decode-sized: never
    assert gemm_policy.upcast(512, 576, 1536) is (rows is not None)


@pytest.mark.parametrize("value,rows", [("bf16", None), ("fp32", 4)])
def test_the_knob_overrides_the_policy(monkeypatch, value, rows):
    monkeypatch.setattr(state.device, "bf16_gemm", value)
    assert gemm_policy.min_rows() == rows

