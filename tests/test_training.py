"""Autograd and optimizers on the device match the same training on plain CPU."""

import copy

import pytest
import torch
import torch.nn as nn


def _train(model, X, y, opt_factory, steps, device):
    model = copy.deepcopy(model).to(device)
    X, y = X.to(device), y.to(device)
    opt = opt_factory(model.parameters())
    losses = []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize(
    "opt_factory",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
        lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
        lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    ],
    ids=["sgd-momentum", "adam-loop", "adam-foreach", "adamw-foreach"],
)
def test_training_matches_cpu(opt_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 3))
    X, y = torch.randn(64, 10), torch.randint(0, 3, (64,))
    ref_losses, ref_model = _train(model, X, y, opt_factory, 8, "cpu")
    dev_losses, dev_model = _train(model, X, y, opt_factory, 8, "neuron")
    assert dev_losses[-1] < dev_losses[0]
    torch.testing.assert_close(dev_losses, ref_losses, rtol=1e-4, atol=1e-5)
    for p_ref, p_dev in zip(ref_model.parameters(), dev_model.parameters()):
        assert p_dev.device.type == "neuron"
        torch.testing.assert_close(p_dev.cpu(), p_ref, rtol=1e-4, atol=1e-5)


def test_eager_lab_loop_with_int32_labels_decreases_every_epoch():
    torch.manual_seed(0)
    device = torch.device("neuron")
    model = nn.Sequential(nn.Linear(10, 2)).to(device)
    X = torch.randn(100, 10).to(device)
    y = torch.randint(0, 2, (100,), dtype=torch.int32).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(10):
        loss = criterion(model(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(b < a for a, b in zip(losses, losses[1:]))
    assert model[0].weight.grad.device == torch.device("neuron", 0)


def test_backward_on_another_core():
    w = torch.randn(4, 4).to("neuron:3").requires_grad_()
    (w * w).sum().backward()
    assert w.grad.device == torch.device("neuron", 3)
    torch.testing.assert_close(w.grad.cpu(), 2 * w.detach().cpu())


def test_no_grad_and_inference_mode():
    lin = nn.Linear(4, 4).to("neuron")
    x = torch.randn(2, 4).to("neuron")
    with torch.no_grad():
        assert not lin(x).requires_grad
    with torch.inference_mode():
        out = lin(x)
        assert out.is_inference()
    torch.testing.assert_close(out.cpu(), lin.cpu()(x.cpu()))


def test_module_to_and_back_keeps_parameters():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    ref = [p.clone() for p in m.parameters()]
    m.to("neuron")
    assert all(p.device.type == "neuron" for p in m.parameters())
    m.to("cpu")
    for a, b in zip(m.parameters(), ref):
        assert torch.equal(a, b)
    m.neuron()  # the generated method, like .cuda()
    assert next(m.parameters()).is_neuron


class _TiedLM(nn.Module):
    """An embedding and an LM head sharing one weight (GPT-2, nanoGPT, Llama with tied embeddings)."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(11, 6)
        self.lm_head = nn.Linear(6, 11, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        return self.lm_head(torch.tanh(self.wte(idx)))


def test_moving_a_module_keeps_its_parameters_and_their_ties():
    torch.manual_seed(0)
    m = _TiedLM()
    ref = copy.deepcopy(m)
    weight = m.wte.weight
    opt = torch.optim.SGD(m.parameters(), lr=0.5)  # built before .to(), as CUDA code often does
    m.to("neuron")
    assert m.lm_head.weight is m.wte.weight is weight and weight.device.type == "neuron"
    assert list(m.state_dict()) == list(ref.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    idx = torch.tensor([[1, 4, 7], [2, 9, 3]])
    for model, o, device in ((m, opt, "neuron"), (ref, ref_opt, "cpu")):
        nn.functional.cross_entropy(model(idx.to(device)).flatten(0, 1), idx.flatten().to(device)).backward()
        o.step()
    torch.testing.assert_close(m.wte.weight.grad.cpu(), ref.wte.weight.grad)
    torch.testing.assert_close(m.wte.weight.detach().cpu(), ref.wte.weight.detach())
    m.cpu()  # and back: still one parameter, with its gradient
    assert m.lm_head.weight is m.wte.weight is weight and weight.grad.device.type == "cpu"
    m.neuron()
    assert m.lm_head.weight is m.wte.weight is weight
    with torch.device("meta"):
        lazy = _TiedLM()
    lazy.to_empty(device="neuron")
    assert lazy.lm_head.weight is lazy.wte.weight
    assert not torch.__future__.get_swap_module_params_on_conversion()  # a CPU-only program converts as before
