"""One AdamW step on `neuron` per implementation (fused, foreach, for-loop) against plain CPU's, in one run.

    python bench/adamw.py [--steps 30] [--repeats 5] [--layers 4] [--width 256]

The parameters are a small transformer's (per layer: four width x width projections, a 4*width MLP pair, two
norms' weights and biases). Each figure is the median over interleaved repeats of the mean time of `--steps`
optimizer steps (`opt.step()` only, gradients set once; the device's queue drained at the end of each timing).
Hugging Face Trainer's `optim="adamw_torch_fused"` is `fused=True`; its default `adamw_torch` is foreach.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import nativelab  # noqa: F401  (registers the device)
from nativelab.device import cpu_info


def make_params(layers: int, width: int, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = []
    for _ in range(layers):
        shapes += [(width, width)] * 4 + [(4 * width, width), (width, 4 * width)] + [(width,)] * 4
    params = []
    for shape in shapes:
        p = torch.randn(shape, generator=g).to(device).requires_grad_()
        p.grad = torch.randn(shape, generator=g).to(device)
        params.append(p)
    return params


def sync(device: str) -> None:
    if device != "cpu":
        torch.neuron.synchronize()


def step_time(device: str, impl: str, steps: int, layers: int, width: int) -> float:
    params = make_params(layers, width, device)
    flags = {"fused": dict(fused=True), "foreach": dict(foreach=True), "forloop": dict(foreach=False)}[impl]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **flags)
    for _ in range(3):
        opt.step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    sync(device)
    return (time.perf_counter() - t0) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    cases = [("cpu", "fused"), ("cpu", "foreach"), ("neuron", "fused"), ("neuron", "foreach"), ("neuron", "forloop")]
    times: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    for _ in range(args.repeats):
        for device, impl in cases:
            times[(device, impl)].append(step_time(device, impl, args.steps, args.layers, args.width))
    n = sum(p.numel() for p in make_params(args.layers, args.width, "cpu"))
    print(f"AdamW step, {args.layers * 10} tensors, {n / 1e6:.2f} M parameters, fp32, "
          f"{torch.get_num_threads()} threads; median of {args.repeats} x {args.steps} steps; {cpu_info.describe()}")
    base = statistics.median(times[("cpu", "fused")])
    for (device, impl), ts in times.items():
        m = statistics.median(ts)
        print(f"  {device:7s} {impl:8s} {m:8.3f} ms   {m / base:5.2f}x cpu fused")


if __name__ == "__main__":
    main()
