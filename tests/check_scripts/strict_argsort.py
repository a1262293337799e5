import torch

x = torch.ones(8).to("neuron")
order = torch.argsort(x)
print("not reached under NATIVELAB_STRICT=1")
