"""Lab 1, Step 2: Eager Mode Training. The same loop as on a GPU; only the device line differs.

    python labs/lab1/eager_mode.py
"""

import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("neuron")
print(f"Using: {device}")

model = nn.Sequential(nn.Linear(10, 2)).to(device)
X = torch.randn(100, 10).to(device)
y = torch.randint(0, 2, (100,), dtype=torch.int32).to(device)  # Neuron has no int64: int32 labels

criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for epoch in range(10):
    output = model(X)
    loss = criterion(output, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"Epoch {epoch + 1}, Loss: {loss.item():.4f}")
