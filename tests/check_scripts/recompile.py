"""A compiled function called with a new Python int: the guard on its value fails and it recompiles."""
import torch


def scale(x, k):
    return x * k


compiled = torch.compile(scale, backend="neuron")
x = torch.ones(4).to("neuron")
for k in (2, 3):
    y = compiled(x, k)
torch.neuron.synchronize()
