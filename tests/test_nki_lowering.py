"""An NKI kernel's declared lowering (`kernel.lowering`, nki/jit.py) and the library's (kernels/nki/host.py).

A launch of a kernel with a lowering is checked and estimated from the kernel's own trace and computed by the
lowering; each library lowering must compute what its kernel's own code computes (nki.simulate, the kernel
interpreted instruction by instruction), up to the rounding of another fp32 summation order. These tests are
what keeps one kernel source: edit a library kernel so that it computes something else, and its case here
fails."""

import importlib
import warnings

import pytest
import torch

from nativelab import nki
from nativelab.kernels import nki as nkilib
from nativelab.nki import isa as nisa
from nativelab.nki import language as nl
from test_nki_kernels import TOL, _decode_weights, _weight, _with_cache_copies, sample_ops

host = importlib.import_module("nativelab.kernels.nki.host")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    monkeypatch.delenv("NATIVELAB_NKI_LOWER", raising=False)


def _close(got, want, dtype, **tol):
    torch.testing.assert_close(got.cpu().float(), want.cpu().float(), **{**TOL[dtype], **tol})


# --- the mechanism, on a kernel of our own -------------------------------------------------------------------

def _double():
    """A kernel of our own, made afresh (no lowering declared yet): out = 2 x."""
    @nki.jit
    def double(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out, src=t)
        return out

    return double


def _doubling_kernel():
    """_double() with a host lowering that records the shapes it ran on, taking launches of <= 64 rows."""
    double, calls = _double(), []

    @double.lowering(accepts=lambda x: x.shape[0] <= 64)
    def double_on_host(x):
        calls.append(tuple(x.shape))
        return x * 2

    return double, calls


@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_a_launch_runs_the_lowering_after_the_kernels_checks(device):
    """The lowering computes the launch (on `neuron` queued, its tensors host views), its values are the
    kernel's; a second launch of the same signature takes the fast path to the lowering too."""
    double, calls = _doubling_kernel()
    x = torch.randn(32, 16).to(device)
    torch.testing.assert_close(double(x).cpu(), x.cpu() * 2)
    torch.testing.assert_close(double(x + 1).cpu(), (x.cpu() + 1) * 2)
    assert calls == [(32, 16), (32, 16)]


def test_a_launch_the_lowering_refuses_and_lowering_off_run_the_kernels_own_code(monkeypatch):
    double, calls = _doubling_kernel()
    x = torch.randn(100, 16, device="neuron")  # accepts: at most 64 rows
    torch.testing.assert_close(double(x).cpu(), x.cpu() * 2)
    monkeypatch.setenv("NATIVELAB_NKI_LOWER", "0")
    y = torch.randn(32, 16, device="neuron")
    torch.testing.assert_close(double(y).cpu(), y.cpu() * 2)
    monkeypatch.setenv("NATIVELAB_NKI_LOWER", "1")
    torch.testing.assert_close(nki.simulate(double)(y.cpu()), y.cpu() * 2)  # simulate: the kernel's own code
    assert calls == []
    double(y)
    torch.neuron.synchronize()  # the lowered launch is queued
    assert calls == [(32, 16)]


def test_a_kernel_over_the_chips_limits_fails_with_a_lowering_too():
    """The lowering runs only after the kernel's checking pass: a tile beyond SBUF's 128 partitions is the
    same NkiError with or without one."""
    double, calls = _doubling_kernel()
    with pytest.raises(nki.NkiError, match="partition"):
        double(torch.randn(200, 16, device="neuron"))
    assert calls == []


def test_a_lowering_returning_another_shape_is_an_error_naming_it():
    double = _double()
    double.lowering(lambda x: x[:1] * 2)
    with pytest.raises(nki.NkiError, match=r"lowering returned \(1, 8\) torch.float32 where the kernel returns "
                                           r"\(4, 8\) torch.float32"):
        double(torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"a lowering runs on 'host' or 'device', got 'gpu'"):
        double.lowering(lambda x: x * 2, on="gpu")


def test_a_lowered_launch_is_estimated_as_the_kernel():
    """What a profile session records for a lowered launch is the kernel's estimate (nki/cost.py)."""
    from nativelab import profile
    double, calls = _doubling_kernel()
    x = torch.randn(32, 16, device="neuron")
    with profile.Session() as s:
        double(x)
        torch.neuron.synchronize()
    assert calls and s.nki[double.name].calls == 1
    assert s.nki[double.name].est_seconds == pytest.approx(double.estimate(x).seconds)


# --- the library's lowerings against their kernels' own code ---------------------------------------------

def test_every_kernel_lab2_runs_has_a_host_lowering():
    """Lab 2's kernels (labs/lab2/nki_ops.py) each declare what they run on a CPU host."""
    for kernel in (nkilib.transformer_step_kernel, nkilib.mlp_kernel, nkilib.rope_kernel, nkilib.attention_cte_kernel,
                   nkilib.attention_tkg_kernel, nkilib.top_p_kernel):
        assert "host" in kernel._lowerings, kernel.name


def _both(kernel, args, device="neuron"):
    """(the lowered launch's result on `device`, nki.simulate's on CPU copies) of kernel(*args); tensors in lists
    are copied too, so each run writes its own."""
    def copies(on):
        return [a.clone().to(on) if isinstance(a, torch.Tensor) else
                [t.clone().to(on) for t in a] if isinstance(a, list) else a for a in args]
    lowered_args, own_args = copies(device), copies("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", nki.NkiWarning)
        lowered = kernel(*lowered_args)
        own = nki.simulate(kernel)(*own_args)
    return lowered, own, lowered_args, own_args


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5])  # one token (the C++ MLP), a prompt (the PyTorch reference)
def test_mlp_lowering_equals_the_kernel(dtype, rows):
    x = torch.randn(rows, 256, dtype=dtype)
    gate, up, down = _weight(384, 256, dtype), _weight(384, 256, dtype), _weight(256, 384, dtype)
    lowered, own, _, _ = _both(nkilib.mlp_kernel, [x, nkilib.tiled(gate), nkilib.tiled(up), nkilib.tiled(down)])
    _close(lowered, own, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_and_prefill_attention_lowerings_equal_the_kernels(dtype):
    x = torch.randn(1, 4, 7, 64, dtype=dtype)
    cos, sin = torch.randn(7, 64, dtype=dtype), torch.randn(7, 64, dtype=dtype)
    lowered, own, _, _ = _both(nkilib.rope_kernel, [x, cos, sin])
    _close(lowered, own, dtype)
    q, k, v = torch.randn(1, 4, 7, 64, dtype=dtype), torch.randn(1, 2, 7, 64, dtype=dtype), \
        torch.randn(1, 2, 7, 64, dtype=dtype)
    lowered, own, _, _ = _both(nkilib.attention_cte_kernel, [q, k, v])
    _close(lowered, own, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 2])  # one sequence (the C++ attention), two (the PyTorch reference)
def test_decode_attention_lowering_equals_the_kernel_and_writes_the_same_rows(dtype, batch):
    """The output, and the new rows at pos in both caches (the kernel writes them, the C++ it lowers to too)."""
    q, k, v = (torch.randn(batch, h, 1, 64, dtype=dtype) for h in (4, 2, 2))
    k_cache, v_cache = torch.randn(batch, 2, 40, 64, dtype=dtype), torch.randn(batch, 2, 40, 64, dtype=dtype)
    pos = torch.tensor([17])
    lowered, own, lowered_args, own_args = _both(nkilib.attention_tkg_kernel, [q, k, v, k_cache, v_cache, pos])
    _close(lowered, own, dtype)
    for i in (3, 4):
        assert torch.equal(lowered_args[i].cpu(), own_args[i]) and not torch.equal(own_args[i], [k_cache, v_cache][i - 3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_p", [0.9, 1.0])  # the bisection, and every token kept
def test_top_p_lowering_draws_the_kernels_tokens(dtype, top_p):
    """Given the same noise, the library's race draws the token the NKI kernel draws, row by row: its C++ (no grad,
    as in generation) and its compiled PyTorch (ops/sample.py, where the C++ declines)."""
    torch.manual_seed(0)
    logits = (torch.randn(3, 1500) * 3).to(dtype)
    for counter in range(3):
        exp_noise = -torch.log(sample_ops._uniform(torch.tensor([7, counter]), logits.shape)).float()
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                lowered, own, _, _ = _both(nkilib.top_p_kernel, [logits, exp_noise, 0.8, top_p])
            assert lowered.dtype == own.dtype == torch.int32 and lowered.cpu().tolist() == own.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 2])  # one sequence (the C++ DecodePlan), two (the PyTorch reference)
def test_transformer_step_lowering_equals_the_kernel(dtype, batch):
    """The whole step: the same logits, token, cache rows and sampler counter as the kernel's own code."""
    w, rope_cos, rope_sin, heads, kv_heads = _decode_weights(dtype, b=batch)
    stack = nkilib.DecodeStack.prepare(_with_cache_copies(w), rope_cos, rope_sin, heads)
    tokens, pos, seed = torch.tensor([[5], [600]][:batch]), torch.tensor([17]), torch.tensor([7, 41])
    (token, logits), (own_token, own_logits), lowered_args, own_args = _both(
        nkilib.transformer_step_kernel, [tokens, pos, seed, *stack, heads, kv_heads, 1e-5])
    # in bf16 the lowering (Inductor's fused code, or the C++) keeps some of the intermediates the kernel rounds to
    # bf16 in fp32: one-ulp differences carried through the layers into the logits and the next layer's k / v
    tol = {"atol": 5e-2} if dtype == torch.bfloat16 else {}
    _close(logits, own_logits, dtype, **tol)
    assert token.dtype == torch.int64 and token.cpu().tolist() == own_token.tolist()
    assert lowered_args[2].cpu().tolist() == own_args[2].tolist() == [7, 42]
    for got, want in zip(lowered_args[-5] + lowered_args[-4], own_args[-5] + own_args[-4]):  # k, v caches
        _close(got, want, dtype, **tol)


@pytest.mark.parametrize("rows", [1, 5])  # the C++ MLP's launch, the PyTorch reference's compiled graph
def test_a_device_lowering_is_the_nki_kernels_one_launch(rows):
    """mlp_kernel lowers on="device": the library kernel it launches is queued and counted as mlp_kernel's
    launch (no kernel:mlp_kernel_no_norm, no library kernel_run for the estimate to count twice), and a profile
    session prices it with the NKI kernel's estimate."""
    import nativelab
    from nativelab import profile
    from nativelab.device import tracking
    dt = torch.bfloat16
    x = torch.randn(rows, 256, dtype=dt, device="neuron")
    g, u, d = (nkilib.tiled(_weight(o, i, dt)).to("neuron") for o, i in ((384, 256), (384, 256), (256, 384)))
    nkilib.mlp_kernel(x, g, u, d)  # the weights laid out for the CPU kernels (once), the kernel checked
    torch.neuron.synchronize()
    nativelab.clear_op_tracking()
    with profile.Session() as s:
        nkilib.mlp_kernel(x, g, u, d)
        torch.neuron.synchronize()
    executed = tracking.executed_counts()
    assert executed.get("kernel:mlp_kernel") == 1 and "kernel:mlp_kernel_no_norm" not in executed, executed
    assert s.nki[nkilib.mlp_kernel.name].calls == 1 and not s.kernel_runs
    assert s.ops["kernel:mlp_kernel"].calls == 1
