"""torch.compile(dynamic=True) over batches padded to the longest sequence of each batch."""
import torch


def score(x, w):
    return torch.tanh(x @ w).sum(-1)


compiled = torch.compile(score, backend="neuron", dynamic=True)
w = torch.ones(8, 8).to("neuron")
for length in (17, 60, 130, 250, 400, 512):
    batch = torch.ones(2, length, 8).to("neuron")
    out = compiled(batch, w)
torch.neuron.synchronize()
