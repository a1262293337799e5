"""The device's random numbers: read when a random op is called, with a per-core state that
`torch.neuron.get_rng_state/set_rng_state`, `torch.random.fork_rng` and `torch.utils.checkpoint` save and restore.
With the same seed the device draws what the CPU draws (its generators are CPU Mersenne Twisters)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _block_run(device, use_reentrant):
    torch.manual_seed(0)
    lin = nn.Linear(8, 8).to(device)
    x = torch.randn(4, 8).to(device).requires_grad_()
    torch.manual_seed(1)

    def block(x):
        return F.dropout(lin(x), 0.5, training=True) * torch.rand_like(x)

    y = checkpoint(block, x, use_reentrant=use_reentrant)
    y.sum().backward()
    return y.detach().cpu(), x.grad.cpu(), lin.weight.grad.cpu()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_replays_the_same_dropout_and_rand_like_as_cpu(use_reentrant):
    # The backward pass recomputes the block after restoring the RNG state: its masks must be the forward's.
    for got, want in zip(_block_run("neuron", use_reentrant), _block_run("cpu", use_reentrant)):
        torch.testing.assert_close(got, want)


def test_random_ops_read_the_generator_when_called():
    torch.manual_seed(3)
    x = torch.ones(1000, device="neuron")
    a = F.dropout(x, 0.5, training=True)
    torch.manual_seed(3)  # before the queue ran the first dropout
    b = F.dropout(x, 0.5, training=True)
    assert torch.equal(a.cpu(), b.cpu())
    torch.manual_seed(3)
    assert torch.equal(a.cpu(), F.dropout(torch.ones(1000), 0.5, training=True))  # the CPU's numbers
    # the device's dropout draws from the device's generator, not the CPU one
    torch.neuron.manual_seed(5)
    cpu_state = torch.get_rng_state()
    F.dropout(x, 0.5, training=True).cpu()
    assert torch.equal(torch.get_rng_state(), cpu_state)


def test_rng_state_api_per_core_and_fork_rng():
    assert torch.neuron._initialized and torch.neuron.is_initialized()
    torch.manual_seed(11)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    a = torch.rand(5, device="neuron:1").cpu()
    torch.neuron.set_rng_state(states[1], "neuron:1")
    assert torch.equal(torch.rand(5, device="neuron:1").cpu(), a)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        inside = torch.randn(4, device="neuron").cpu()
    assert torch.equal(torch.randn(4, device="neuron").cpu(), inside)
    with pytest.raises(TypeError, match="RNG state"):
        torch.neuron.set_rng_state(torch.zeros(3))


@pytest.mark.slow
def test_a_traced_kernel_draws_at_the_launch_from_the_device_generator():
    # A kernel's traced code seeds its random numbers from the default generator when it runs; launched on the
    # device it is queued, and must still draw at the launch from the device's generator, like eager ops.
    from nativelab.kernels import wrap_kernel

    def noisy_kernel(x, out):
        out.copy_(x * (torch.rand_like(x) > 0.5))

    kernel = wrap_kernel(noisy_kernel)
    x, out = torch.ones(64), torch.empty(64)
    torch.manual_seed(0)
    kernel(x, out)  # the same kernel on CPU
    xd, outd = x.to("neuron"), torch.empty(64, device="neuron")
    torch.manual_seed(0)
    kernel(xd, outd)
    batch = torch.randn(8)  # a CPU draw before the sync
    assert torch.equal(outd.cpu(), out)
    torch.manual_seed(0)
    assert torch.equal(batch, torch.randn(8))


def test_an_accelerator_query_does_not_mark_the_device_in_use():
    # Dynamo asks torch.accelerator for the current device whenever it traces, a CPU function too, and PyTorch
    # calls torch.neuron._lazy_init() first. If that marked the device in use, a CPU program compiling inside
    # torch.utils.checkpoint would fail ("device state was initialized in the forward pass"), as it does not
    # without nativelab. The first allocation marks it.
    from conftest import run_python

    r = run_python(
        "import torch, nativelab\n"
        "from torch.utils.checkpoint import checkpoint\n"
        "x = torch.ones(3, requires_grad=True)\n"
        "def f(t):\n"
        "    torch.accelerator.current_device_index()\n"
        "    return t * 2\n"
        "checkpoint(f, x, use_reentrant=False).sum().backward()\n"
        "print(torch.neuron._initialized)\nprint(x.grad.tolist())\n"
        "y = torch.ones(2, device='neuron')\nprint(torch.neuron._initialized)\n"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["False", "[2.0, 2.0, 2.0]", "True"]
