"""int64 values beyond what the device's int32 and fp32 keep exact."""
import torch

ids = torch.arange(4, device="neuron") + 2**31  # int64 ids above 2^31
hashed = ids * 3  # the device casts ids to int32: they wrap
counts = torch.zeros(4, dtype=torch.int64, device="neuron")
index = torch.tensor([0, 1, 1, 3], device="neuron")
big = torch.full((4,), 2**24 + 1, dtype=torch.int64, device="neuron")
counts.scatter_add_(0, index, big)  # integer scatter-add: fp32 on the device, 2^25 + 2 is not exact
torch.neuron.synchronize()
