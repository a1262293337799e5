"""nanoGPT compiles with the default backend (Inductor, no backend= given), on device tensors."""
import torch

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to("neuron")
model = torch.compile(model)
for _ in range(2):
    out = model(torch.ones(4, 8).to("neuron"))
torch.neuron.synchronize()
