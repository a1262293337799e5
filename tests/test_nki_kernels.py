"""The library's NKI kernels (kernels/nki) against their PyTorch references: interpreted, launched eagerly on
neuron and CPU tensors, and inside torch.compile(backend="neuron")."""

import pytest
import torch

from nativelab import nki
from nativelab.kernels import nki as nki_kernels
from nativelab.kernels.ops import reference_rmsnorm

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))


def _inputs(name, dtype):
    torch.manual_seed(0)
    if name == "add":
        return (torch.randn(200, 48, dtype=dtype), torch.randn(200, 48, dtype=dtype)), lambda a, b: a + b
    if name == "matmul":  # K over several tiles (one partial), M and N with partial tiles
        a, b = torch.randn(200, 300, dtype=dtype), torch.randn(300, 700, dtype=dtype)
        return (a, b), lambda a, b: (a.double() @ b.double()).to(a.dtype)
    if name == "rmsnorm":
        return (torch.randn(3, 70, 64, dtype=dtype), torch.randn(64, dtype=dtype), 1e-5), reference_rmsnorm
    return (torch.randn(2, 150, 96, dtype=dtype) * 4,), nki_kernels.reference_softmax


KERNELS = {"add": nki_kernels.add, "matmul": nki_kernels.matmul, "rmsnorm": nki_kernels.rmsnorm,
           "softmax": nki_kernels.softmax}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(KERNELS))
def test_interpreted_equals_reference(name, dtype):
    """nki.simulate: the kernel's instructions one by one, no compile."""
    args, ref = _inputs(name, dtype)
    kernel = {"add": nki_kernels.add_kernel, "matmul": nki_kernels.matmul_kernel,
              "rmsnorm": nki_kernels.rmsnorm_kernel, "softmax": nki_kernels.softmax_kernel}[name]
    flat = [a.reshape(-1, a.shape[-1]) if isinstance(a, torch.Tensor) and a.dim() > 2 else a for a in args]
    got = nki.simulate(kernel)(*flat)
    torch.testing.assert_close(got.reshape(ref(*args).shape), ref(*args), **TOL[dtype])


@pytest.mark.slow
@pytest.mark.parametrize("device", ["neuron", "cpu"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_op_eager_and_compiled(name, device):
    dtype = torch.bfloat16
    args, ref = _inputs(name, dtype)
    expected = ref(*args)
    on = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    got = KERNELS[name](*on)
    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), expected, **TOL[dtype])
    if device == "neuron":
        compiled = torch.compile(lambda *xs: KERNELS[name](*xs) + 1, backend="neuron")
        torch.testing.assert_close(compiled(*on).cpu(), expected.float() + 1, **TOL[dtype], check_dtype=False)
