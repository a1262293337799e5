"""The real device's dtype policy: int64 -> int32 and float64 -> float32 for inputs that are not 0-d."""

import logging

import pytest
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


def test_numbers_beyond_the_narrow_dtype_saturate_so_bounds_still_bound():
    """A Python number beyond int32's (float32's) range beside a narrowed int64 (float64) tensor: CPU's kernel,
    given the int32 tensor, refused it ("value cannot be converted to type int without overflow"); saturated,
    the results are CPU's for values the device holds."""
    i = torch.tensor([5, -7, 2**20], dtype=torch.int64)
    f = torch.tensor([5.0, -7.0, 2.0**100], dtype=torch.float64)  # values float32 holds exactly
    imax, imin = torch.iinfo(torch.int64).max, torch.iinfo(torch.int64).min
    fmax, fmin = torch.finfo(torch.float64).max, torch.finfo(torch.float64).min
    for got, want in [
        (i.to("neuron").clamp(max=imax), i.clamp(max=imax)),
        (i.to("neuron").clamp(imin, 6), i.clamp(imin, 6)),
        (f.to("neuron").clamp(min=fmin), f.clamp(min=fmin)),
        (f.to("neuron").clamp_(-1.0, fmax), f.clone().clamp_(-1.0, fmax)),
    ]:
        assert torch.equal(got.cpu(), want)


def test_zero_dim_and_out_arguments_are_not_cast():
    s = torch.tensor(2**40, dtype=torch.int64).to("neuron")
    assert (s + 1).cpu().item() == 2**40 + 1  # 0-d: exact
    out = torch.empty(2, dtype=torch.int64, device="neuron")
    torch.add(torch.tensor([1, 2], dtype=torch.int32).to("neuron"), 2**33, out=out)
    assert out.dtype == torch.int64


def test_warning_is_logged_once(caplog):
    import nativelab.device.policy as policy

    policy._policy_warned.discard(torch.int64)
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


def test_ops_that_write_out_or_in_place_follow_the_policy():
    # The policy narrows inputs; what an op writes must follow, or CPU kernels see int32 inputs with an int64
    # out= (one_hot's scatter.value_out) or an int64 self with an int32 src (scatter_).
    labels = torch.tensor([0, 2, 1, 2])
    assert torch.equal(F.one_hot(labels.to("neuron"), 3).cpu(), F.one_hot(labels, 3))
    src = torch.tensor([[5, 6, 7], [8, 9, 10]])
    index = torch.tensor([[0, 1, 2], [2, 0, 1]])
    for dtype in (torch.int64, torch.float64):
        base = torch.arange(9, dtype=dtype).view(3, 3)
        want = base.clone().scatter_(0, index, src.to(dtype))
        got = base.to("neuron").scatter_(0, index.to("neuron"), src.to(dtype).to("neuron"))
        assert got.dtype == dtype and torch.equal(got.cpu(), want)
        out = torch.empty(3, 3, dtype=dtype, device="neuron")
        torch.scatter(base.to("neuron"), 0, index.to("neuron"), src.to(dtype).to("neuron"), out=out)
        assert torch.equal(out.cpu(), want)
        vals, idx = torch.sort(base.flip(0).to("neuron"), dim=0)
        cpu_vals, cpu_idx = torch.sort(base.flip(0), dim=0)
        assert torch.equal(vals.cpu(), cpu_vals) and torch.equal(idx.cpu(), cpu_idx)


def test_pack_padded_sequence_unsorted_in_an_rnn_classifier():
    torch.manual_seed(0)
    emb, lstm = torch.nn.Embedding(10, 4), torch.nn.RNN(4, 3, batch_first=True)
    tokens = torch.randint(0, 10, (3, 5))
    lengths = torch.tensor([2, 5, 3])

    def run(device):
        e, m = emb.to(device), lstm.to(device)
        packed = torch.nn.utils.rnn.pack_padded_sequence(e(tokens.to(device)), lengths, batch_first=True,
                                                         enforce_sorted=False)
        _, h = m(packed)
        return h.cpu()

    torch.testing.assert_close(run("neuron"), run("cpu"))


# Values that any narrowing of their dtype would change: 1 + 2^-40 is not a float32 (nor a complex64's part),
# 2^40 + 3 not an int32; bf16/fp16/int32 ... have no narrower form.
_WIDE_VALUES = {
    torch.float64: [1 + 2**-40, 3.0], torch.complex128: [1 + 2**-40 + 1j, 2 - 1j], torch.int64: [2**40 + 3, 5],
    torch.complex64: [1 + 2**-20 + 1j, 2 - 1j], torch.float32: [1 + 2**-20, 3.0], torch.int32: [2**30 + 3, 5],
    torch.bfloat16: [1.5, 3.0], torch.float16: [1 + 2**-10, 3.0], torch.int16: [2**14 + 3, 5], torch.uint8: [200, 5],
}


@pytest.mark.parametrize("fast", [True, False], ids=["cpp", "python"])
@pytest.mark.parametrize("dtype", list(_WIDE_VALUES), ids=str)
def test_is_narrowed_is_what_the_device_computes(dtype, fast):
    """policy.is_narrowed (which the Python path, the C++ kernel's fast_spec and nativelab check read) against
    what the device really computes: a product of tensors that are not 0-d equals CPU's product in the narrowed
    dtype, cast back, exactly when is_narrowed says so (complex: computed as it is, complex128 exactly); 0-d
    tensors are never narrowed."""
    from nativelab.device import policy, state

    a = torch.tensor(_WIDE_VALUES[dtype], dtype=dtype)
    narrow = policy.NARROW.get(dtype, dtype) if policy.is_narrowed(dtype) else dtype
    want = (a.to(narrow) * a.to(narrow)).to(dtype)
    if policy.is_narrowed(dtype):
        assert not torch.equal(want, a * a)  # the values tell the two apart
    with state.device.mode(fast_path=fast):
        d = a.to("neuron")
        for _ in range(3):  # a signature's first call runs through Python, later ones through C++ (fast)
            got = (d * d).cpu()
            assert got.dtype == dtype and torch.equal(got, want), (dtype, got, want)
        s = d[0].clone()  # 0-d: exact
        assert torch.equal((s * s).cpu(), a[0] * a[0])
    assert policy.is_narrowed(dtype) == (dtype in (torch.float64, torch.int64))


def test_plan_names_what_the_device_does_to_a_call():
    """One plan per call: narrowed inputs (not 0-d, not written, not index arguments), int32 indices widened for
    CPU's kernels, nothing for a CPU fallback (which computes in the dtypes it is given)."""
    from nativelab.device import policy, schema

    x64, i32 = torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int32)
    add = schema.record_for(torch.ops.aten.add.Tensor)
    assert policy.plan(add, [x64, torch.ones(4), 1]).narrow == (0,)
    assert policy.plan(add, [x64[0], torch.ones(4), 1]) is None  # 0-d
    assert policy.plan(schema.record_for(torch.ops.aten.add_.Tensor), [x64, torch.ones(4), 1]) is None  # written
    gather = schema.record_for(torch.ops.aten.gather.default)
    p = policy.plan(gather, [x64, 0, i32, False])
    assert p.narrow == (0,) and p.widen == (2,)
    p = policy.plan(gather, [torch.ones(4), 0, i32.long(), False])  # int64 indices: int32 on the device, but
    assert p.indices == (2,) and not p.work  # CPU's kernels take them as they are (the C++ kernel runs it)
    cummax = schema.record_for(torch.ops.aten.cummax.default)  # a CPU fallback
    assert cummax.route == "fallback" and policy.plan(cummax, [x64, 0]) is None
