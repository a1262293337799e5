"""A training loop with three porting problems: a boolean-mask index, an argsort and a loss.item() per step."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(16, 1).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(8, 32, 16).to("neuron")
target = torch.randn(8, 32, 1).to("neuron")
STEPS = 4
for step in range(STEPS):
    x, y = data[step], target[step]
    pred = model(x)
    keep = y[:, 0] > 0
    loss = ((pred[keep] - y[keep]) ** 2).mean()  # x[mask]: a data-dependent shape
    order = torch.argsort(pred[:, 0])  # argsort falls back to the CPU
    loss = loss + 0.0 * pred[order].sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")  # .item(): a host sync every step
