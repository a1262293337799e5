"""Asynchronous execution: ops are queued in program order; reads, fallbacks and synchronize drain the queue;
a failing queued op raises at that point with its name; NATIVELAB_SYNC=1 makes every op synchronous."""

import pytest
import torch

from conftest import run_python
from nativelab.device import queue, state


def test_ops_return_before_they_run_and_reads_wait():
    x = torch.ones(100, 100, device="neuron")
    x @ x  # a call signature's first call runs at once (CPU's checks raise at the call); later ones queue
    torch.neuron.synchronize()
    y = x @ x
    assert not queue.idle()  # launched, not run
    assert y.sum().item() == 100 * 100 * 100  # reading drains
    assert queue.idle()


def test_program_order_is_kept_across_writes_and_host_copies():
    x = torch.zeros(4, device="neuron")
    y = x + 1  # queued read of x
    src = torch.full((4,), 5.0)
    x.copy_(src)  # host-to-device write after a queued read
    src.fill_(9.0)  # the host buffer changes after the copy was issued
    z = x * 2
    assert y.cpu().tolist() == [1.0] * 4  # read the old x
    assert z.cpu().tolist() == [10.0] * 4  # saw the copy, not the later host write


def test_a_failing_queued_op_raises_at_the_sync_point_with_its_name():
    x = torch.randn(4, 3, device="neuron")
    bad = torch.tensor([[0, 1, 2], [3, 4, 9]], dtype=torch.int64).to("neuron")  # 9 is out of range
    torch.gather(x, 0, torch.zeros_like(bad)) * 2  # each signature's first call runs at once (these pass)
    g = torch.gather(x, 0, bad)  # shapes are fine, so the launch succeeds
    after = g * 2  # queued behind the failing op
    with pytest.raises(RuntimeError, match=r"queued op aten::gather failed.*out of bounds"):
        torch.neuron.synchronize()
    # the device stays usable
    assert (torch.ones(2, device="neuron") * 3).cpu().tolist() == [3.0, 3.0]
    del after


def test_shape_errors_raise_at_the_call_like_cuda():
    with pytest.raises(RuntimeError, match="broadcast|size of tensor"):
        torch.ones(3, device="neuron") + torch.ones(4, device="neuron")


def test_checks_that_only_cpu_kernels_make_raise_at_the_call_every_time():
    """Meta kernels miss some of CPU's shape and dtype checks; the first call of a signature runs at once, so
    they raise at the call, and a failing signature keeps raising there (it is never queued)."""
    for _ in range(2):
        a = torch.zeros(3, 3, device="neuron")
        with pytest.raises(IndexError, match="shape mismatch"):
            a[[0, 1], [0, 1, 2]] = 0
        with pytest.raises(RuntimeError, match="all only supports bool tensor for result"):
            torch.all(a, 0, out=torch.empty(3, dtype=torch.float64, device="neuron"))
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            torch.sin(a, out=torch.empty(3, 3, dtype=torch.int32, device="neuron"))
        torch.neuron.synchronize()  # nothing failing was queued


def test_histc_checks_of_values_raise_at_the_call_like_cuda():
    """CUDA's histc reads its input's min and max on the host when no range is given, and checks min and max,
    floats the signature key leaves out: after a signature passed, a later call of it still raises at the call
    (a non-finite range, max below min) and not at the next sync."""
    x = torch.tensor([1.0, 2.0, 1.0])
    d = x.to("neuron")
    for _ in range(2):  # the second round finds every signature already seen
        assert torch.equal(torch.histc(d, bins=4, min=0.0, max=3.0).cpu(), torch.histc(x, bins=4, min=0.0, max=3.0))
        assert torch.equal(torch.histc(d, bins=4).cpu(), torch.histc(x, bins=4))
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(d, bins=4, min=5.0, max=1.0)
    for bad in ([1.0, float("inf"), 2.0], [float("nan"), 1.0, 2.0]):
        with pytest.raises(RuntimeError, match="is not finite"):
            torch.histc(torch.tensor(bad).to("neuron"), bins=4)
    torch.neuron.synchronize()  # nothing failing was queued


def test_vector_norm_of_an_empty_tensor_checks_its_ord_at_the_call():
    """`ord` is a float, which the signature key leaves out: after ord=2 over an empty dim passed, ord=-1 (no
    identity) still raises at the call, as on CUDA."""
    e = torch.empty(0, 3, device="neuron")
    for _ in range(2):
        assert torch.linalg.vector_norm(e, ord=2.0, dim=0).cpu().tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(RuntimeError, match="cannot compute the -1 norm"):
        torch.linalg.vector_norm(e, ord=-1.0, dim=0)
    torch.neuron.synchronize()  # nothing failing was queued


def test_sync_mode_raises_at_the_op():
    r = run_python(
        "import torch, nativelab\n"
        "x = torch.randn(4, 3).to('neuron')\n"
        "bad = torch.tensor([[0, 1, 9]]).to('neuron')\n"
        "try:\n"
        "    torch.gather(x, 0, bad)\n"
        "    print('no error at the op')\n"
        "except RuntimeError as e:\n"
        "    print('raised at the op:', 'aten::gather' in str(e))\n",
        {"NATIVELAB_SYNC": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "raised at the op: True"


def test_queue_is_bounded():
    bound = state.device.rt.MAX_PENDING
    x = torch.ones(8, device="neuron")
    for _ in range(bound * 3):
        x = x + 1
    assert queue.pending() < bound
    assert x[0].item() == 1 + bound * 3


def test_cpu_operands_are_read_when_the_op_is_called_not_when_it_runs():
    # CUDA copies a CPU operand at launch; a queued op must not see later host writes to it.
    for _ in range(2):  # the first round runs each signature's first call at once; the second is queued
        torch.neuron.synchronize()
        x = torch.ones(3, device="neuron")
        s = torch.tensor(2.0)
        r = x * s  # a 0-d CPU tensor operand
        x.add_(s)  # in place, same operand
        idx = torch.tensor([0, 2])
        v = torch.zeros(3, device="neuron")
        v[idx] = 5.0  # CPU indices (allowed, as on CUDA)
        w = v[idx]
        s.fill_(100.0)
        idx.fill_(1)
    assert not queue.idle()  # the work above was still queued when the host wrote s and idx
    cpu_x, cpu_s, cpu_idx = torch.ones(3), torch.tensor(2.0), torch.tensor([0, 2])
    cpu_r = cpu_x * cpu_s
    cpu_x.add_(cpu_s)
    cpu_v = torch.zeros(3)
    cpu_v[cpu_idx] = 5.0
    assert torch.equal(r.cpu(), cpu_r)
    assert torch.equal(x.cpu(), cpu_x)
    assert torch.equal(v.cpu(), cpu_v)
    assert torch.equal(w.cpu(), cpu_v[cpu_idx])
