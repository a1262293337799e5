"""ATen ops on the device give the CPU result: views alias, in-place and out= ops write through."""

import torch
import torch.nn.functional as F


def dev(x):
    return x.to("neuron")


def test_elementwise_matmul_reductions_match_cpu():
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    cases = [
        lambda a, b: a * 2 + 1,
        lambda a, b: a @ b,
        lambda a, b: torch.softmax(a, -1),
        lambda a, b: a.sum(0),
        lambda a, b: a.mean(),
        lambda a, b: torch.tanh(a).pow(2),
        lambda a, b: torch.where(a > 0, a, torch.zeros_like(a)),
        lambda a, b: torch.cat([a, a], 1),
        lambda a, b: F.silu(a) * a,
        lambda a, b: torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * a,
    ]
    for f in cases:
        torch.testing.assert_close(f(dev(a), dev(b)).cpu(), f(a, b))


def test_views_alias_device_memory():
    x = torch.arange(12.0).reshape(3, 4)
    n = dev(x)
    v = n[1]  # a view: writes through it reach the base
    v.fill_(-1)
    x[1] = -1
    assert torch.equal(n.cpu(), x)
    t = n.t()
    assert t.data_ptr() == n.data_ptr() and t.stride() == (1, 4)
    t.mul_(2)
    x.mul_(2)
    assert torch.equal(n.cpu(), x)
    parts = n.split(2, dim=1)
    assert [p.data_ptr() - n.data_ptr() for p in parts] == [0, 8]


def test_inplace_and_out_variants():
    a = torch.randn(5)
    n = dev(a)
    r = n.add_(1)
    assert r is n
    out = torch.empty(0, device="neuron")
    torch.mul(n, 3, out=out)  # out= resized from empty, as on CPU
    assert out.shape == (5,)
    torch.testing.assert_close(out.cpu(), (a + 1) * 3)
    vals = torch.empty(0, device="neuron")
    idx = torch.empty(0, dtype=torch.long, device="neuron")
    torch.sort(n, out=(vals, idx))
    sv, si = torch.sort(a + 1)
    assert torch.equal(vals.cpu(), sv) and torch.equal(idx.cpu(), si)


def test_multi_output_and_indexing():
    a = torch.randn(4, 6)
    n = dev(a)
    v, i = torch.topk(n, 3, dim=1)
    ev, ei = torch.topk(a, 3, dim=1)
    assert torch.equal(v.cpu(), ev) and torch.equal(i.cpu(), ei)
    assert i.dtype == torch.int64
    mask = a > 0
    torch.testing.assert_close(n[dev(mask)].cpu(), a[mask])
    idx = torch.tensor([3, 0, 1])
    torch.testing.assert_close(n[dev(idx)].cpu(), a[idx])
    torch.testing.assert_close(n.index_select(1, dev(idx)).cpu(), a.index_select(1, idx))


def test_item_tolist_and_printing():
    n = torch.tensor([1.5, 2.5], device="neuron")
    assert n.sum().item() == 4.0
    assert n.tolist() == [1.5, 2.5]
    assert repr(n) == "tensor([1.5000, 2.5000], device='neuron:0')"
    assert repr(torch.zeros(0, device="neuron")) == "tensor([], device='neuron:0')"


def test_complex_and_conjugate_views():
    z = torch.randn(4, dtype=torch.complex64)
    n = dev(z)
    torch.testing.assert_close(n.conj().resolve_conj().cpu(), z.conj())
    torch.testing.assert_close((n * n.conj()).cpu(), z * z.conj())


def test_convolution_runs_as_a_cpu_fallback():
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    torch.testing.assert_close(F.conv2d(dev(x), dev(w), padding=1).cpu(), F.conv2d(x, w, padding=1))


def test_bf16_group_norm_and_addr_run_cpus_kernel_as_a_fallback():
    """Not native on the device: CPU's kernel (fp32 intermediates) runs, bit for bit, not a decomposition into
    bf16 device steps that round in between."""
    import nativelab

    torch.manual_seed(0)
    x, w, b = torch.randn(2, 6, 5, 5), torch.randn(6), torch.randn(6)
    x, w, b = (t.bfloat16() for t in (x, w, b))
    v1, v2, m = torch.randn(7).bfloat16(), torch.randn(9).bfloat16(), torch.randn(7, 9).bfloat16()
    nativelab.device.clear_op_tracking()
    for g, c in zip(torch.ops.aten.native_group_norm(dev(x), dev(w), dev(b), 2, 6, 25, 3, 1e-5),
                    torch.ops.aten.native_group_norm(x, w, b, 2, 6, 25, 3, 1e-5)):
        assert g.dtype == c.dtype
        assert torch.equal(g.cpu(), c)
    assert torch.equal(F.group_norm(dev(x), 3, dev(w), dev(b)).cpu(), F.group_norm(x, 3, w, b))
    assert torch.equal(torch.addr(dev(m), dev(v1), dev(v2), beta=0.5, alpha=2).cpu(),
                       torch.addr(m, v1, v2, beta=0.5, alpha=2))
    assert {"aten::native_group_norm", "aten::addr"} <= set(nativelab.device.get_fallback_ops())


def test_non_blocking_copies():
    a = torch.randn(3)
    n = a.to("neuron", non_blocking=True)
    back = n.to("cpu", non_blocking=True)
    assert torch.equal(back, a)


def test_bfloat16_and_integer_dtypes():
    a = torch.randn(4, 4).bfloat16()
    torch.testing.assert_close((dev(a) @ dev(a)).cpu(), a @ a)
    i = torch.arange(10, dtype=torch.int32)
    assert torch.equal((dev(i) * 3 % 7).cpu(), i * 3 % 7)


def test_cpu_indices_and_masks_where_cuda_allows_them():
    # Advanced indexing (index, index_put_) moves CPU indices to the device itself, on CUDA as here; other
    # ops (index_select, gather, where, plain arithmetic) need their tensors on the device, except 0-d scalars.
    import pytest

    x = torch.arange(12.0).view(3, 4)
    d = x.to("neuron")
    idx, mask = torch.tensor([2, 0]), x > 5
    assert torch.equal(d[idx].cpu(), x[idx])
    assert torch.equal(d[mask].cpu(), x[mask])
    assert torch.equal(d[idx, torch.tensor([1, 3])].cpu(), x[idx, torch.tensor([1, 3])])
    d2, x2 = d.clone(), x.clone()
    d2[mask] = 0.0
    x2[mask] = 0.0
    d2.index_put_((idx,), torch.tensor(7.0), accumulate=True)
    x2.index_put_((idx,), torch.tensor(7.0), accumulate=True)
    assert torch.equal(d2.cpu(), x2)
    for bad in (lambda: torch.index_select(d, 0, idx), lambda: torch.gather(d, 0, idx.view(2, 1).expand(2, 4)),
                lambda: torch.where(mask, d, d), lambda: d + torch.ones(4)):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            bad()


def test_transformer_encoder_in_eval_with_a_padding_mask_takes_the_ordinary_path():
    # PyTorch's fused fast path (nested tensors from the mask) needs kernels a Python backend cannot have.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=pad)
        want_attn = mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        got = enc.to("neuron")(x.to("neuron"), src_key_padding_mask=pad.to("neuron")).cpu()
        got_attn = mha.to("neuron")(*(x.to("neuron"),) * 3, key_padding_mask=pad.to("neuron"), need_weights=False)
    keep = ~pad  # what PyTorch specifies: the fast path zeroes padded positions, the ordinary path does not
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_attn[0].cpu(), want_attn, atol=1e-5, rtol=1e-5)
