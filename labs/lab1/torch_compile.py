"""Lab 1, Step 3: torch.compile with the Neuron backend, and why benchmarks need synchronize().

    python labs/lab1/torch_compile.py

The first call compiles (Dynamo -> AOTAutograd -> partitioning -> generated code) and stores the result in
the compiled-graph cache; later runs load it from there.
"""

import time

import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("neuron")

model = nn.Sequential(nn.Linear(10, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 5)).to(device)
model.eval()
x = torch.randn(2, 10).to(device)

compiled = torch.compile(model, backend="neuron")
with torch.no_grad():
    output = compiled(x)
print(f"Input shape:  {x.shape}")
print(f"Output shape: {output.shape}")
torch.testing.assert_close(output.cpu(), model.cpu()(x.cpu()), rtol=1e-4, atol=1e-5)
model.to(device)


def timed(fn, iters: int, fence: bool) -> float:
    if fence:
        torch.neuron.synchronize()  # fence
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(iters):
            fn(x)
    if fence:
        torch.neuron.synchronize()  # wait for completion
    return (time.perf_counter() - start) / iters * 1e3


iters = 100  # as in the guide; fewer launches than the device queue holds
for fn in (model, compiled):  # warm up both
    timed(fn, 10, fence=True)
eager_ms = timed(model, iters, fence=True)
compiled_ms = timed(compiled, iters, fence=True)
print(f"\nWith synchronize() fences ({iters} iterations):")
print(f"  eager    : {eager_ms:.3f} ms/iter")
print(f"  compiled : {compiled_ms:.3f} ms/iter  ({eager_ms / compiled_ms:.1f}x faster)")

unfenced_ms = timed(compiled, iters, fence=False)
torch.neuron.synchronize()
print("\nWithout synchronize() (misleading):")
print(f"  compiled : {unfenced_ms:.3f} ms/iter  <- only the time to launch the work, not to run it")

import nativelab.compiler  # noqa: E402

s = nativelab.compiler.stats()
print(f"\ncompiled graphs: {s['graphs']}, cache hits/misses: {s['cache_hits']}/{s['cache_misses']}, "
      f"compile time: {s['compile_seconds']:.1f}s, cache: {nativelab.compiler.cache_dir()}")
