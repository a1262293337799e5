"""An unmodified CUDA training loop (runs on the CPU without a GPU)."""
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(8, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.ones(16, 8).cuda() if device == "cuda" else torch.ones(16, 8)
y = torch.zeros(16, 1, device=device)
for step in range(3):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("loss", loss.item())  # a host sync per step
print("ran on", x.device.type)
