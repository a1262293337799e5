"""Per-op, per-training-step and per-decode-step cost of the emulated device against plain CPU PyTorch, in one run.

    python bench/device_overhead.py [--iters 10000] [--steps 500] [--decode-steps 20] [--trace]

Prints microseconds per `t * 2 + 1` on 64x64 (two ops), per training step of a small MLP (Linear 10->2,
CrossEntropy, Adam, batch 64), for plain CPU, the device (default asynchronous mode) and the device in
NATIVELAB_SYNC mode, and the device/CPU ratios; then milliseconds per eager decode step of the guide's `small`
Llama (bf16, batch 1, static KV cache) on plain CPU tensors and on the device. Medians of 5 interleaved repeats.
`--trace` adds both figures inside a `torch.profiler` trace (CPU activity for CPU, CPU + PrivateUse1 for the
device) beside the same work untraced, so the trace's cost on each can be compared.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

import nativelab
from nativelab.device import state
from nativelab.models.llama import Llama


def elementwise(device: str, iters: int) -> float:
    x = torch.randn(64, 64).to(device)
    for _ in range(100):
        y = x * 2 + 1
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        y = x * 2 + 1
    sync(device)
    del y
    return (time.perf_counter() - t0) / iters * 1e6


def train_step(device: str, steps: int) -> float:
    torch.manual_seed(0)
    model = nn.Linear(10, 2).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    X = torch.randn(64, 10).to(device)
    y = torch.randint(0, 2, (64,), dtype=torch.int32 if device != "cpu" else torch.int64).to(device)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        loss = loss_fn(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - t0) / steps * 1e6


_llamas: dict = {}


def decode_step(device: str, steps: int) -> float:
    """One eager decode step of the `small` Llama in bf16 (batch 1, static KV cache), in microseconds."""
    if device not in _llamas:
        torch.manual_seed(0)
        m = Llama.from_size("small").to(torch.bfloat16).eval()
        m.to(device)
        m.setup_cache()
        # as bench/compile.py: the token in the device's int32, the position as the model gets it
        tok = torch.tensor([[7]], dtype=torch.int32 if device != "cpu" else torch.int64).to(device)
        _llamas[device] = (m, tok, torch.tensor([5]).to(device))
    m, tok, pos = _llamas[device]
    with torch.inference_mode():
        for _ in range(3):
            m(tok, pos)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            m(tok, pos)
        sync(device)
    return (time.perf_counter() - t0) / steps * 1e6


def sync(device: str) -> None:
    if device != "cpu":
        torch.neuron.synchronize()


def measure(fn, n: int, repeats: int, with_sync: bool = True) -> dict[str, list[float]]:
    results = {"cpu": [], "neuron (async)": []} | ({"neuron (sync)": []} if with_sync else {})
    for _ in range(repeats):  # interleaved, so machine noise hits every variant alike
        results["cpu"].append(fn("cpu", n))
        results["neuron (async)"].append(fn("neuron", n))
        if with_sync:
            with state.device.mode(sync=True):
                results["neuron (sync)"].append(fn("neuron", n))
    return results


def measure_traced(fn, n: int, repeats: int) -> dict[str, list[float]]:
    """`fn` on CPU and on the device, untraced and inside a torch.profiler trace, interleaved."""
    from torch.profiler import ProfilerActivity, profile

    def traced(device):
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if device != "cpu" else [])
        with profile(activities=acts):
            return fn(device, n)

    results = {"cpu": [], "neuron (async)": [], "cpu traced": [], "neuron traced": []}
    for _ in range(repeats):
        results["cpu"].append(fn("cpu", n))
        results["neuron (async)"].append(fn("neuron", n))
        results["cpu traced"].append(traced("cpu"))
        results["neuron traced"].append(traced("neuron"))
    return results


def report(title: str, results: dict[str, list[float]]) -> None:
    cpu = statistics.median(results["cpu"])
    print(f"\n{title}")
    print(f"  {'variant':<16} {'median us':>10} {'min':>9} {'max':>9} {'vs cpu':>8}")
    for name, xs in results.items():
        med = statistics.median(xs)
        print(f"  {name:<16} {med:>10.1f} {min(xs):>9.1f} {max(xs):>9.1f} {med / cpu:>7.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode-steps", type=int, default=20)
    ap.add_argument("--trace", action="store_true", help="also measure inside a torch.profiler trace")
    ap.add_argument("--trace-iters", type=int, default=2000, help="iterations (and steps) of the traced rows")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, nativelab {nativelab.__version__}, 1 thread")
    report(f"t * 2 + 1 on 64x64 ({args.iters} iterations, 2 ops each): us per iteration",
           measure(elementwise, args.iters, args.repeats))
    report(f"training step, Linear(10->2) + CrossEntropy + Adam, batch 64 ({args.steps} steps): us per step",
           measure(train_step, args.steps, args.repeats))
    if args.trace:
        for title, fn in (("t * 2 + 1 on 64x64", elementwise), ("training step", train_step)):
            res = measure_traced(fn, args.trace_iters, args.repeats)
            report(f"{title} under torch.profiler ({args.trace_iters} iterations): us per iteration", res)
            med = {k: statistics.median(v) for k, v in res.items()}
            print(f"  trace cost: cpu {med['cpu traced'] / med['cpu']:.2f}x, "
                  f"device {med['neuron traced'] / med['neuron (async)']:.2f}x")
    decode = measure(decode_step, args.decode_steps, args.repeats, with_sync=False)
    report(f"eager decode step, Llama 'small' bf16, batch 1 ({args.decode_steps} steps): us per step", decode)
    speed = statistics.median(decode["cpu"]) / statistics.median(decode["neuron (async)"])
    print(f"  device speed / plain CPU speed: {speed:.2f}x")


if __name__ == "__main__":
    main()
