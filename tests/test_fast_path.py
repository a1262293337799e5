"""The C++ per-op path (csrc/ops.cpp) against plain CPU PyTorch and against the Python path it stands in for:
same values, same accounting, same queue semantics (program order, errors at the next sync naming the op)."""

from __future__ import annotations

import pytest
import torch

import nativelab
from nativelab.device import dispatch, memory, observe, queue, schema, state

DEV = "neuron"


@pytest.fixture(params=[True, False], ids=["cpp", "python"])
def path(request):
    with state.device.mode(fast_path=request.param):
        yield request.param


def _program(dev: str, x: torch.Tensor, idx: torch.Tensor) -> list[torch.Tensor]:
    """Ops the C++ path serves (functional with and without out= forms, in place, lists, several outputs,
    views, casts, copies) mixed with ones it leaves to Python (float64 under the dtype policy, fallbacks)."""
    a = x.to(dev)
    i = idx.to(dev)
    y = a * 2 + 1
    y.mul_(0.5).add_(a, alpha=-1.0)
    m, am = torch.max(y, dim=1)
    c = torch.cat([y, a], 0)
    s = torch.nn.functional.log_softmax(c, 1).sum(0)
    g = torch.gather(y, 1, i)
    h = y.to(torch.bfloat16).float() + y.t().contiguous().t()
    z = torch.empty(4, 8, device=dev).copy_(x[:4])
    z.copy_(x[4:8].to(dev))
    w = torch.zeros_like(y)
    w.copy_(torch.tensor(3.0))
    d = (y.double() * 3).float()  # the dtype policy: the Python path, on memory the C++ path allocated
    u = torch.nn.functional.nll_loss(torch.log_softmax(y, 1), idx[:, 0].to(dev))
    return [y, m, am, c, s, g, h, z, w, d, u]


def test_program_matches_cpu_on_both_paths(path):
    torch.manual_seed(0)
    x, idx = torch.randn(8, 8), torch.randint(0, 8, (8, 3))
    got = _program(DEV, x, idx)
    want = _program("cpu", x, idx)
    for g, w in zip(got, want):
        assert g.device.type == DEV
        torch.testing.assert_close(g.cpu(), w)


def test_cpp_path_runs_without_python_and_counts_its_ops():
    x = torch.randn(16, 16, device=DEV)
    x * 2 + 1  # a signature's first call runs at once through Python (dispatch._first_call)
    nativelab.clear_op_tracking()
    calls = []
    orig = dispatch._device_kernel
    dispatch._device_kernel = lambda *a, **k: calls.append(a[0]) or orig(*a, **k)
    try:
        for _ in range(3):
            y = x * 2 + 1
        assert not queue.idle()  # queued, not run
    finally:
        dispatch._device_kernel = orig
    assert calls == []  # no Python kernel at all (the C++ kernel asked Python for the output spec only)
    torch.testing.assert_close(y.cpu(), x.cpu() * 2 + 1)
    counts = nativelab.get_op_counts()["device"]
    assert counts["aten::mul.Tensor"] == 3 and counts["aten::add.Tensor"] == 3


def test_temporaries_die_before_the_queue_runs():
    """Queued work holds the memory it reads: dropping every device tensor before the sync is safe."""
    x = torch.randn(64, 64)
    a = x.to(DEV)
    outs = []
    for k in range(5):
        t = a * (k + 1)
        t2 = t.double()  # policy path reads C++-allocated memory through a host view
        outs.append((t + 1, t2 * 2))
        del t, t2
    del a
    for k, (p, q) in enumerate(outs):
        torch.testing.assert_close(p.cpu(), x * (k + 1) + 1)
        torch.testing.assert_close(q.cpu(), (x * (k + 1)).double() * 2)


def test_cpp_allocations_are_accounted_and_freed():
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    x = torch.randn(256, 256, device=DEV)
    mid = torch.neuron.memory_allocated()
    ys = [x * 2 for _ in range(4)]
    assert torch.neuron.memory_allocated() == mid + 4 * 256 * 256 * 4
    assert torch.neuron.max_memory_allocated() >= mid + 4 * 256 * 256 * 4
    del ys
    torch.neuron.synchronize()  # queued work held the outputs' memory until it ran
    assert torch.neuron.memory_allocated() == mid
    del x
    assert torch.neuron.memory_allocated() == base


def test_cpp_path_out_of_memory_is_torch_oom_and_leaves_nothing():
    x = torch.randn(1024, 1024, device=DEV)  # 4 MiB
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    rt = state.device.rt
    cap = memory.stats(0).capacity
    rt.mem_set_capacity(0, before + (1 << 20))
    try:
        with pytest.raises(torch.OutOfMemoryError, match="neuron:0 out of memory"):
            x * 2
        with pytest.raises(torch.OutOfMemoryError, match="neuron:0 out of memory"):
            torch.empty(1024, 1024, device=DEV)
    finally:
        rt.mem_set_capacity(0, cap)
    assert torch.neuron.memory_allocated() == before


def test_cpp_queued_failure_surfaces_at_sync_naming_the_op():
    y = torch.randn(4, 4, device=DEV)
    bad = torch.tensor([[0, 9]], device=DEV)  # out of range: only the CPU kernel finds out
    for _ in range(2):  # each signature's first call runs at once (dispatch._first_call), the second reaches C++
        torch.gather(y, 1, torch.zeros_like(bad)), y + 1
    torch.neuron.synchronize()
    r = torch.gather(y, 1, bad)  # queued: no error yet
    after = y + 1
    with pytest.raises(queue.DeviceError, match=r"aten::gather.*failed.*(1 ops queued after it were dropped)"):
        torch.neuron.synchronize()
    del r, after
    torch.testing.assert_close((y * 2).cpu(), y.cpu() * 2)  # the device stays usable


def test_a_watching_tool_turns_the_cpp_path_off():
    x = torch.randn(4, 4, device=DEV)
    seen = []

    class Hook(observe.Observer):
        def dispatch(self, op, args, kwargs, run):
            seen.append(str(op))
            return run()

    with observe.watching(Hook()):
        y = x * 3
    assert observe.dispatch is None
    assert "aten.mul.Tensor" in seen
    torch.testing.assert_close(y.cpu(), x.cpu() * 3)


def test_program_order_between_cpp_and_python_entries():
    x = torch.zeros(8, device=DEV)
    x.add_(1)  # C++ entry
    x.copy_(torch.arange(8.0))  # host to device queued behind it
    x.mul_(2)
    l = x.double()  # dtype policy: a Python entry
    x.add_(1)
    torch.testing.assert_close(l.cpu(), torch.arange(8.0).double() * 2)
    torch.testing.assert_close(x.cpu(), torch.arange(8.0) * 2 + 1)


def test_python_scalars_do_not_promote_a_0d_tensor(path):
    """A Python number is a wrapped number on both paths, as on CPU: a 0-d bf16 tensor * 0.5 stays bf16."""
    for s, v in ((torch.tensor(1.5, dtype=torch.bfloat16), 0.5), (torch.tensor(3), 0.5), (torch.tensor(2.0), 3)):
        want = s * v
        got = s.to(DEV) * v
        assert got.dtype == want.dtype, (s.dtype, v)
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_layer_norm_outputs_match_cpu_dtypes(path, dtype):
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 8, dtype=dtype), torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype)
    want = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.to(DEV), [8], w.to(DEV), b.to(DEV), 1e-5)
    for g, c in zip(got, want):
        assert g.dtype == c.dtype
        torch.testing.assert_close(g.cpu(), c)


def test_float_arguments_do_not_grow_the_signature_caches(path):
    """Optimizers pass a new float every step: one cached signature, not one per value."""
    x = torch.randn(8, device=DEV)
    want = x.cpu()
    x.add_(x, alpha=0.5)  # the signature seen once
    rec = schema.record_for(torch.ops.aten.add_.Tensor)
    before = len(rec.meta_cache)
    for k in range(20):
        x.add_(x, alpha=1.0 / (k + 3))
    assert len(rec.meta_cache) == before
    for a in [0.5] + [1.0 / (k + 3) for k in range(20)]:
        want = want + want * a
    torch.testing.assert_close(x.cpu(), want)


def test_out_ops_whose_floats_size_the_output(path):
    """arange's out= form takes its length from float arguments: those stay in the signature."""
    out = torch.empty(0, device=DEV)
    for end in (4.0, 3.0, 5.0, 3.0):
        torch.arange(0.0, end, 1.0, out=out)
        torch.testing.assert_close(out.cpu(), torch.arange(0.0, end, 1.0))
        assert torch.arange(0.0, end, device=DEV).shape == (int(end),)
