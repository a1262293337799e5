"""The device does what CPU PyTorch does where PyTorch's own device tests found it did not (issue 24, part B):
channels_last outputs, lazy modules, errors at the call, out= arguments that must grow, warnings of queued
ops, and no warning CPU does not give. Each case is compared with plain CPU PyTorch."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import run_python

DEV = "neuron"

PADS = [
    (nn.ReflectionPad2d(1), (2, 3, 5, 6), torch.channels_last),
    (nn.ReplicationPad2d((1, 2, 0, 1)), (2, 3, 5, 6), torch.channels_last),
    (nn.ReflectionPad3d(1), (2, 3, 4, 5, 6), torch.channels_last_3d),
    (nn.ReplicationPad3d(1), (2, 3, 4, 5, 6), torch.channels_last_3d),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("module,shape,fmt", PADS, ids=lambda p: type(p).__name__ if isinstance(p, nn.Module) else None)
def test_padding_a_channels_last_input_matches_cpu_values_and_layout(module, shape, fmt, dtype):
    """The pad's out= kernel lays a channels_last result out channels_last; the device's output has CPU's
    strides (it wrote CPU's layout into memory read as contiguous: values off by up to 5.5). float64, which
    the dtype policy computes as float32 through the functional form, lost the layout (contiguous)."""
    x = torch.randn(shape, dtype=dtype).to(memory_format=fmt)
    want = module(x)
    for _ in range(2):  # the signature's first call (run at once) and a queued one
        got = module(x.to(DEV))
        assert got.stride() == want.stride() and got.dtype == dtype
        torch.testing.assert_close(got.cpu(), want, rtol=1e-6 if dtype == torch.float64 else 0, atol=0)


@pytest.mark.parametrize("loss", [
    nn.NLLLoss(), nn.NLLLoss(weight=torch.tensor([0.5, 2.0, 1.0, 0.25, 1.5], dtype=torch.float64)),
    nn.CrossEntropyLoss(reduction="sum"), nn.CrossEntropyLoss(label_smoothing=0.1),
], ids=["nll", "nll_weight", "ce_sum", "ce_smoothing"])
def test_class_index_losses_of_float64_inputs_match_cpu_with_gradients(loss):
    """The dtype policy computes a float64 input as float32; the 0-d float64 operands beside it
    (nll_loss_backward's grad_output and total_weight) follow it, where CPU's kernel raised "expected scalar
    type Float but found Double" (PyTorch's test_modules, NLLLoss/CrossEntropyLoss float64)."""
    x = torch.randn(6, 5, dtype=torch.float64)
    target = torch.tensor([1, 0, 4, 2, 2, 3])
    xc = x.clone().requires_grad_()
    want = loss(xc, target)
    want.backward()
    dev_loss = copy.deepcopy(loss).to(DEV)
    for _ in range(2):  # the signature's first call and a queued one
        xd = x.to(DEV).requires_grad_()
        got = dev_loss(xd, target.to(DEV))
        got.backward()
        assert got.dtype == xd.grad.dtype == torch.float64
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("make,shape", [
    (lambda: nn.LazyLinear(4), (2, 3)),
    (lambda: nn.LazyConv1d(4, 3), (2, 3, 8)),
    (lambda: nn.LazyBatchNorm1d(), (4, 3)),
], ids=["LazyLinear", "LazyConv1d", "LazyBatchNorm1d"])
def test_lazy_modules_moved_to_the_device_initialise_at_the_first_call_as_on_cpu(make, shape):
    x = torch.randn(shape)
    torch.manual_seed(0)
    cpu = make()
    want = cpu(x)
    torch.manual_seed(0)
    m = make().to(DEV)
    weight = m.weight
    assert isinstance(weight, nn.parameter.UninitializedParameter) and weight.device.type == DEV
    got = m(x.to(DEV))
    assert m.weight is weight and not isinstance(m.weight, nn.parameter.UninitializedParameter)
    assert m.weight.shape == cpu.weight.shape and m.weight.device.type == DEV
    torch.testing.assert_close(got.cpu(), want)


def test_a_lazy_module_moved_with_a_dtype_stays_uninitialised_in_that_dtype():
    m = nn.LazyLinear(4).to(DEV, torch.float64)
    assert isinstance(m.weight, nn.parameter.UninitializedParameter)
    assert (m.weight.device.type, m.weight.dtype) == (DEV, torch.float64)
    assert m.to("cpu").weight.device.type == "cpu"


def test_checks_made_at_the_call_on_cpu_raise_at_the_call():
    a = torch.zeros(3, 3)
    d = a.to(DEV)
    cases = [
        (lambda t: t.__setitem__(([0, 1], [0, 1, 2]), 0), IndexError),
        (lambda t: torch.all(t, 0, out=torch.empty(3, dtype=torch.float64, device=t.device)), RuntimeError),
        (lambda t: torch.any(t, out=torch.empty((), dtype=torch.float64, device=t.device)), RuntimeError),
        (lambda t: torch.add(t, 1, out=torch.empty(3, 3, dtype=torch.int64, device=t.device)), RuntimeError),
        (lambda t: t.__setitem__(torch.tensor([1, 0, 1], dtype=torch.uint8, device=t.device), 1.0), RuntimeError),
    ]
    for fn, error in cases:
        with pytest.raises(error) as on_cpu:
            fn(a)
        for _ in range(2):  # a failing signature is never queued: it raises at every call
            with pytest.raises(error) as on_device:
                fn(d)
            assert str(on_device.value) == str(on_cpu.value)
    torch.neuron.synchronize()  # and nothing failing was left on the queue


def test_a_cpu_tensor_the_op_writes_is_refused_as_cuda_refuses_it():
    """CPU tensors may join a device op only as 0-d scalars it reads (CUDA's rule). A 0-d CPU out= or self was
    accepted and written on the host (PyTorch's test_nonzero expects CUDA's 'on the same device')."""
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]]).to(DEV)
    same_device = "Expected all tensors to be on the same device, but found at least two devices, neuron:0 and cpu!"
    for fn in (lambda: torch.nonzero(x, out=torch.empty((), dtype=torch.long)),  # the empty out= CPU would grow
               lambda: torch.abs(x, out=torch.empty(())),
               lambda: torch.empty(()).add_(x.sum())):
        with pytest.raises(RuntimeError) as err:
            fn()
        assert str(err.value) == same_device
    torch.testing.assert_close((x + torch.tensor(2.0)).cpu(), x.cpu() + 2)  # a 0-d CPU input still reads
    torch.neuron.synchronize()


@pytest.mark.parametrize("dtype,value", [(torch.int64, -1), (torch.float64, 212.0)])
def test_setting_narrowed_int64_float64_tensors_through_indices_matches_cpu(dtype, value):
    """Under the dtype policy a written int64/float64 tensor is computed on in int32/float32; the 0-d value a
    Python number becomes (int64/float64) now follows it, where index_put_ raised 'Index put requires the
    source and destination dtypes match' (PyTorch's test_empty_index, test_index_setitem_bools_slices)."""
    a = torch.arange(12, dtype=dtype).view(4, 3)
    setters = [
        lambda t: t.__setitem__(torch.tensor([0, 2], device=t.device), value),
        lambda t: t.__setitem__(torch.tensor([], dtype=torch.long, device=t.device), value),
        lambda t: t.__setitem__((torch.tensor([1, 3], device=t.device), torch.tensor([2, 0], device=t.device)), value),
        lambda t: t.__setitem__(torch.tensor(True, device=t.device), torch.full_like(t, value)[None, None]),
        lambda t: t.index_put_((torch.tensor([1, 1], device=t.device),), torch.tensor(value, dtype=dtype), True),
        # a 0-d index stays int64 (CPU's index_copy_ / index_fill_ require long indices)
        lambda t: t[0].index_copy_(0, torch.tensor(1, device=t.device), torch.tensor([value], dtype=dtype, device=t.device)),
        lambda t: t.index_fill_(1, torch.tensor(2, device=t.device), torch.tensor(value, dtype=dtype)),
    ]
    for set_ in setters:
        want, got = a.clone(), a.to(DEV)
        set_(want)
        set_(got)
        assert got.dtype == dtype
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def _texts(seen) -> list[str]:
    return [str(w.message).split(" (Triggered internally")[0] for w in seen]


def test_out_arguments_that_must_grow_grow_as_on_cpu():
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 4.0]])
    for make in (lambda d: torch.empty(2, dtype=torch.long, device=d), lambda d: torch.zeros(6, dtype=torch.long, device=d)[:2]):
        cpu_out, dev_out = make("cpu"), make(DEV)
        with warnings.catch_warnings(record=True) as cpu_w:
            warnings.simplefilter("always")
            torch.nonzero(x, out=cpu_out)
        with warnings.catch_warnings(record=True) as dev_w:
            warnings.simplefilter("always")
            torch.nonzero(x.to(DEV), out=dev_out)
        assert torch.equal(dev_out.cpu(), cpu_out) and dev_out.stride() == cpu_out.stride()
        # the storage grew in place (a view's base sees it), with CPU's warning
        assert dev_out.untyped_storage().nbytes() == cpu_out.untyped_storage().nbytes()
        assert _texts(dev_w) == _texts(cpu_w)


def test_a_too_small_out_of_a_queued_op_is_resized_with_cpus_warning():
    a = torch.randn(3, 4)
    cpu_out, dev_out = torch.empty(2), torch.empty(2, device=DEV)
    with warnings.catch_warnings(record=True) as cpu_w:
        warnings.simplefilter("always")
        torch.mul(a, 2, out=cpu_out)
    with warnings.catch_warnings(record=True) as dev_w:
        warnings.simplefilter("always")
        torch.mul(a.to(DEV), 2, out=dev_out)
    torch.testing.assert_close(dev_out.cpu(), cpu_out)
    assert _texts(dev_w) == _texts(cpu_w)


def test_mode_with_out_arguments_matches_cpu():
    x = torch.tensor([[1.0, 2.0, 2.0, 3.0], [4.0, 4.0, 1.0, 1.0]])
    want = torch.mode(x, 1)
    values, indices = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.long, device=DEV)
    torch.mode(x.to(DEV), 1, out=(values, indices))
    assert torch.equal(values.cpu(), want.values) and torch.equal(indices.cpu(), want.indices)


@pytest.mark.parametrize("loss", [F.mse_loss, F.smooth_l1_loss, F.l1_loss, F.huber_loss])
def test_losses_warn_nothing_where_cpu_warns_nothing(loss):
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = loss(a.to(DEV), b.to(DEV))
        torch.neuron.synchronize()
    assert [str(w.message) for w in seen if "fell back to CPU" not in str(w.message)] == []
    torch.testing.assert_close(got.cpu(), loss(a, b))


def test_a_warning_of_a_queued_op_reaches_pythons_warnings_in_the_calling_thread():
    """A C++ kernel's TORCH_WARN in queued work (here copy_'s, complex to real) was printed to stderr by c10;
    it is a Python warning, recorded by warnings.catch_warnings, as CPU's is."""
    r = run_python(
        "import warnings, torch, nativelab\n"
        "z = torch.ones(3, dtype=torch.complex64, device='neuron')\n"
        "a = torch.zeros(3, device='neuron')\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    a.copy_(z * 2)\n"
        "    torch.neuron.synchronize()\n"
        "print([str(w.message).split(' (')[0] for w in seen])\n"
        "print(a.cpu().tolist())\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == ["['Casting complex values to real discards the imaginary part']",
                                          "[2.0, 2.0, 2.0]"]
    assert "Casting complex" not in r.stderr


def test_a_warning_turned_into_an_error_raises_at_the_sync():
    r = run_python(
        "import warnings, torch, nativelab\n"
        "z = torch.ones(3, dtype=torch.complex64, device='neuron')\n"
        "a = torch.zeros(3, device='neuron')\n"
        "warnings.simplefilter('error')\n"
        "a.copy_(z)\n"
        "try:\n"
        "    torch.neuron.synchronize()\n"
        "except UserWarning as e:\n"
        "    print('raised', str(e).split(' (')[0])\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "raised Casting complex values to real discards the imaginary part"


@pytest.mark.parametrize("make", [
    lambda: torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8).to(DEV),
    lambda: torch.quantize_per_tensor(torch.randn(3, device=DEV), 0.1, 0, torch.qint8),
    lambda: torch.empty(3, device=DEV, dtype=torch.quint8),
], ids=["to", "quantize_on_device", "empty"])
def test_quantized_tensors_get_one_clear_error(make):
    with pytest.raises(NotImplementedError, match=r"neuron: quantized tensors \(torch\.q.*int8\) are not supported"):
        make()


@pytest.mark.parametrize("shape,fmt", [((4, 6, 2, 3), torch.channels_last), ((2, 6, 2, 3, 2), torch.channels_last_3d)])
def test_group_norm_gradients_of_a_channels_last_input_keep_its_layout_as_on_cpu(shape, fmt):
    x = torch.randn(shape).to(memory_format=fmt)
    torch.manual_seed(0)
    cpu = nn.GroupNorm(3, 6)
    dev = nn.GroupNorm(3, 6).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    grads = []
    for m, xi in ((cpu, x.clone().requires_grad_()), (dev, x.to(DEV).requires_grad_())):
        y = m(xi)
        go = torch.empty_like(y).copy_(torch.linspace(-1, 1, y.numel()).view(y.shape))
        grads.append(torch.autograd.grad(y, [xi, m.weight, m.bias], go))
    for want, got in zip(*grads):
        assert got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", [
    lambda x, out: torch.sum(x, 0, out=out), lambda x, out: torch.cumsum(x, 0, out=out),
], ids=["sum", "cumsum"])
@pytest.mark.parametrize("out_dtype", [torch.int64, torch.int32])
def test_a_float64_reduction_into_an_integer_out_computes_in_outs_dtype_as_on_cpu(op, out_dtype):
    """CPU's out= kernel computes in out's dtype (each element truncated, then summed); the dtype policy's
    functional form summed the narrowed floats and truncated the sum: sum(x, 0, out=int64) of float64 came back
    off by up to 2 (found by an OpInfo sweep of float64 inputs with a wrong-dtype out=)."""
    x = (torch.arange(25, dtype=torch.float64).view(5, 5) % 7 - 3) * 0.7 + 0.6  # sums of truncations differ
    shape = (5,) if op(x, torch.empty(0, dtype=out_dtype)).dim() == 1 else (5, 5)
    want = torch.zeros(shape, dtype=out_dtype)
    op(x, want)
    for _ in range(2):  # the signature's first call and a queued one
        got = torch.zeros(shape, dtype=out_dtype, device=DEV)
        op(x.to(DEV), got)
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_linear_cross_entropy_bf16_with_the_same_options_as_cpu_matches_cpu_bit_for_bit():
    """PyTorch picks the chunked LinearCrossEntropyLoss's accumulation per device type (`acc_policy='auto'`:
    'accurate' with fp32 accumulation on CPU; an unlisted type such as neuron gets 'compact' and acc_dtype None,
    bf16 buffers), so its bf16 gradients on the device differ from CPU's by design (up to 8% on small ones in
    PyTorch's test_cpu_gpu_parity), as they would on the real device. Given CPU's options, the device computes
    CPU's result exactly: no rounding point of its own."""
    torch.manual_seed(0)
    x, target = torch.randn(8, 8, dtype=torch.bfloat16), torch.randint(0, 4, (8,))
    opts = nn.LinearCrossEntropyOptions(allow_retain_graph=True, batch_chunk_size=2, acc_policy="accurate",
                                        acc_dtype=torch.float32)
    results = []
    for dev in ("cpu", DEV):
        torch.manual_seed(1)
        m = nn.LinearCrossEntropyLoss(8, 4, bias=True, dtype=torch.bfloat16, options=opts).to(dev)
        xi = x.clone().to(dev).requires_grad_()
        for _ in range(3):  # gradients accumulate, as in the parity test
            loss = m(xi, target.to(dev))
            loss.backward(torch.tensor(1.3, dtype=torch.bfloat16, device=dev))
        results.append([t.cpu() for t in (loss, xi.grad, m.linear.weight.grad, m.linear.bias.grad)])
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
