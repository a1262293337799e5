"""Lab 1, Step 1: Device & Tensor Basics (the guide's interpreter session, as a script).

    python labs/lab1/device_basics.py
"""

import torch

# Create a CPU tensor
cpu_tensor = torch.randn(3, 3)
print(">>> print(cpu_tensor.device)")
print(cpu_tensor.device)

# Move to the Neuron device
neuron_tensor = cpu_tensor.to("neuron")
print(">>> print(neuron_tensor.device)")
print(neuron_tensor.device)

# Operate directly on Neuron (no need to go back to CPU)
result = neuron_tensor * 2 + 1
print(">>> print(result)")
print(result)
assert torch.allclose(result.cpu(), cpu_tensor * 2 + 1)  # the device computed what the CPU computes

# Device-agnostic code: works on both GPU and Neuron
device = torch.accelerator.current_accelerator()
# Upstream PyTorch returns the accelerator without an index ("neuron"); the guide shows the current core.
device = torch.device(device.type, torch.accelerator.current_device_index())
print(">>> print(device)")
print(device)

portable_tensor = torch.randn(3, 3, device=device)
print(">>> print(portable_tensor.device)")
print(portable_tensor.device)

torch.neuron.synchronize()
print(f"\nlogical NeuronCores: {torch.neuron.device_count()}, device memory in use on neuron:0: "
      f"{torch.neuron.memory_allocated(0)} bytes")
