"""Scaled dot-product attention on the device: the backend choice is the device's own (no CPU fallback), and the
overrideable fused pair PyTorch leaves to PrivateUse1 backends (OpenReg's test_sdpa) computes attention, each
against CPU PyTorch's math path."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import nativelab

DEV = "neuron"
overrideable = torch.ops.aten._scaled_dot_product_fused_attention_overrideable
overrideable_backward = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward


def cpu_math(q, k, v, **kw):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def qkv(*shape, dtype=torch.float32, grad=False):
    return [torch.rand(*shape, dtype=dtype, requires_grad=grad) for _ in range(3)]


def test_the_backend_choice_is_the_math_path_the_device_runs_with_no_fallback():
    q, k, v = qkv(2, 2, 16, 8)
    nativelab.clear_op_tracking()
    assert torch._fused_sdp_choice(q.to(DEV), k.to(DEV), v.to(DEV)) == SDPBackend.MATH.value
    assert torch._fused_sdp_choice(q, k, v) != SDPBackend.MATH.value  # CPU's own choice differs: not CPU's answer
    qd, kd, vd = (t.to(DEV).requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qd, kd, vd, is_causal=True).sum().backward()
    assert nativelab.get_fallback_ops() == []
    assert "aten::bmm" in nativelab.get_executed_ops()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", ["float bias", "bool mask", "causal", "3-D"])
def test_the_overrideable_forward_equals_cpu_math(dtype, case):
    q, k, v = qkv(2, 2, 16, 8, dtype=dtype)
    kw, ref_kw = {}, {}
    if case == "float bias":
        bias = torch.rand(2, 2, 16, 16, dtype=dtype)
        kw, ref_kw = {"attn_bias": bias.to(DEV)}, {"attn_mask": bias.float()}
    elif case == "bool mask":
        mask = torch.rand(16, 16) > 0.3
        mask[3] = False  # a row with nothing to attend to: zeros, as the math path's safe softmax gives
        kw, ref_kw = {"attn_bias": mask.to(DEV)}, {"attn_mask": mask}
    elif case == "causal":
        kw = ref_kw = {"is_causal": True}
    else:
        q, k, v = q[0], k[0], v[0]
    out, lse, *_, max_q, max_k, _, _, _ = overrideable(q.to(DEV), k.to(DEV), v.to(DEV), **kw)
    want = cpu_math(q.float(), k.float(), v.float(), **ref_kw).to(dtype)
    tol = {"rtol": 0, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 1e-3}
    torch.testing.assert_close(out.cpu(), want, **tol)
    assert out.dtype == dtype and lse.dtype == torch.float32 and (max_q, max_k) == (16, 16)
    assert lse.shape == ((1, 2, 16) if q.dim() == 3 else (2, 2, 16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_overrideable_backward_equals_cpu_math_gradients(dtype):
    """OpenReg's direct call, a float bias of the scores' shape included, and the same pair under autograd."""
    q, k, v = qkv(2, 2, 16, 8, dtype=dtype)
    bias, grad_out = torch.rand(2, 2, 16, 16, dtype=dtype), torch.rand(2, 2, 16, 8, dtype=dtype)
    ref = [t.float().requires_grad_() for t in (q, k, v, bias)]
    cpu_math(*ref[:3], attn_mask=ref[3]).backward(grad_out.float())
    want = [t.grad.to(dtype) for t in ref]
    qd, kd, vd, bd = (t.to(DEV) for t in (q, k, v, bias))
    out, lse, cq, ck, mq, mk, seed, offset, _ = overrideable(qd, kd, vd, attn_bias=bd)
    got = overrideable_backward(grad_out.to(DEV), qd, kd, vd, bd, [True] * 4, out, lse, cq, ck, mq, mk,
                                dropout_p=0.0, is_causal=False, philox_seed=seed, philox_offset=offset)
    tol = {"rtol": 0, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0, "atol": 2e-3}
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, **tol)
    leaves = [t.detach().requires_grad_() for t in (qd, kd, vd, bd)]
    overrideable(*leaves[:3], attn_bias=leaves[3])[0].backward(grad_out.to(DEV))
    for leaf, w in zip(leaves, want):
        torch.testing.assert_close(leaf.grad.cpu(), w, **tol)


def test_a_bool_mask_has_no_gradient_and_causal_gradients_equal_cpu():
    q, k, v = qkv(1, 2, 8, 4, grad=True)
    cpu_math(q, k, v, is_causal=True).sum().backward()
    leaves = [t.detach().to(DEV).requires_grad_() for t in (q, k, v)]
    overrideable(*leaves, is_causal=True)[0].sum().backward()
    for leaf, t in zip(leaves, (q, k, v)):
        torch.testing.assert_close(leaf.grad.cpu(), t.grad, rtol=0, atol=1e-6)
    mask = (torch.rand(8, 8) > 0.5).to(DEV)
    out = overrideable(*leaves, attn_bias=mask)[0]
    out.sum().backward()  # the mask takes no gradient; q, k, v do
    assert mask.grad is None


def test_dropout_in_the_fused_pair_is_refused_by_name():
    q, k, v = (t.to(DEV) for t in qkv(1, 1, 4, 4))
    with pytest.raises(NotImplementedError, match="dropout_p=0.5 is not supported.*math path"):
        overrideable(q, k, v, dropout_p=0.5)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)  # the math path takes dropout
    assert out.shape == q.shape
