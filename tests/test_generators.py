"""torch.Generator(device='neuron') and the default generators, against CPU generators (the device's random
ops run CPU kernels, so the same seed must give CPU's numbers)."""

import pytest
import torch


def test_new_generator_on_the_device():
    g = torch.Generator(device="neuron")
    assert g.device == torch.device("neuron", 0)
    assert torch.Generator(device="neuron:2").device == torch.device("neuron", 2)
    torch.neuron.set_device(1)
    assert torch.Generator(device="neuron").device == torch.device("neuron", 1)


@pytest.mark.parametrize("op", ["randn", "rand", "randperm"])
def test_same_seed_same_numbers_as_cpu(op):
    g = torch.Generator(device="neuron").manual_seed(1234)
    c = torch.Generator().manual_seed(1234)
    args = (17,) if op == "randperm" else ((3, 5),)
    dev = getattr(torch, op)(*args, device="neuron", generator=g).cpu()
    ref = getattr(torch, op)(*args, generator=c)
    assert torch.equal(dev, ref)
    assert g.initial_seed() == 1234


def test_in_place_random_ops_take_the_generator():
    g = torch.Generator(device="neuron").manual_seed(7)
    c = torch.Generator().manual_seed(7)
    x = torch.empty(4, 4, device="neuron").normal_(generator=g).cpu()
    torch.testing.assert_close(x, torch.empty(4, 4).normal_(generator=c))
    p = torch.tensor([0.1, 0.2, 0.7])
    m = torch.multinomial(p.to("neuron"), 5, replacement=True, generator=g).cpu()
    assert torch.equal(m, torch.multinomial(p, 5, replacement=True, generator=c))


def test_state_save_and_restore():
    g = torch.Generator(device="neuron").manual_seed(3)
    state = g.get_state()
    a = torch.randn(8, device="neuron", generator=g).cpu()
    b = torch.randn(8, device="neuron", generator=g).cpu()
    assert not torch.equal(a, b)
    g.set_state(state)
    assert torch.equal(torch.randn(8, device="neuron", generator=g).cpu(), a)


def test_default_generator_is_what_unseeded_ops_draw_from():
    torch.manual_seed(11)
    a = torch.randn(6, device="neuron").cpu()
    torch.neuron.default_generators[0].manual_seed(11)
    assert torch.equal(torch.randn(6, device="neuron").cpu(), a)
    state = torch.neuron.get_rng_state()
    assert torch.equal(state, torch.neuron.default_generators[0].get_state())
    b = torch.randn(6, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(torch.randn(6, device="neuron").cpu(), b)


def test_cores_have_their_own_default_generators():
    torch.neuron.manual_seed_all(5)
    gens = torch.neuron.default_generators
    assert [g.device.index for g in gens] == list(range(torch.neuron.device_count()))
    gens[1].manual_seed(99)
    a = torch.randn(4, device="neuron:0").cpu()
    b = torch.randn(4, device="neuron:1").cpu()
    assert torch.equal(a, torch.randn(4, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(b, torch.randn(4, generator=torch.Generator().manual_seed(99)))
