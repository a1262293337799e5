"""What profiling costs: device work with no session (the observer hook off) against the same work inside a
`nativelab.profile.Session`, in one run.

    python bench/profile_overhead.py [--iters 5000] [--tokens 16] [--repeats 5]

Prints microseconds per `t * 2 + 1` on 64x64 (two queued ops) and milliseconds per token of an eager `tiny`
Llama generation (base tier: ~100 device ops per token; experimental: a few kernel launches), off vs on, and
the ratios. Medians of interleaved repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import nativelab  # noqa: F401  (registers the device)
from nativelab.models.llama import Generator, Llama, Sampling
from nativelab.profile import Session


def elementwise(iters: int, profiled: bool) -> float:
    x = torch.randn(64, 64).to("neuron")
    torch.neuron.synchronize()
    with Session(timeline=True) if profiled else contextlib.nullcontext():
        t0 = time.perf_counter()
        for _ in range(iters):
            y = x * 2 + 1
        torch.neuron.synchronize()
        seconds = time.perf_counter() - t0
    del y
    return seconds / iters * 1e6


def generation(gen: Generator, tokens: int, profiled: bool) -> float:
    torch.neuron.synchronize()
    with Session(timeline=True) if profiled else contextlib.nullcontext():
        t0 = time.perf_counter()
        gen.generate([1, 2, 3], tokens)
        seconds = time.perf_counter() - t0
    return seconds / tokens * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    gens = {}
    for tier in ("base", "experimental"):
        model = Llama.random("tiny", tier).eval().to("neuron")
        model.setup_cache()
        gens[tier] = Generator(model, Sampling(greedy=True))
        gens[tier].generate([1, 2, 3], args.tokens)  # warm up (kernels compile)
    cases = {
        "t * 2 + 1, 64x64 (us/iter)": lambda p: elementwise(args.iters, p),
        "tiny base eager generate (ms/token)": lambda p: generation(gens["base"], args.tokens, p),
        "tiny experimental eager generate (ms/token)": lambda p: generation(gens["experimental"], args.tokens, p),
    }
    print(f"{'':<46} {'off':>10} {'profiled':>10} {'ratio':>7}")
    for label, fn in cases.items():
        off, on = [], []
        for _ in range(args.repeats):  # interleaved
            off.append(fn(False))
            on.append(fn(True))
        a, b = statistics.median(off), statistics.median(on)
        print(f"{label:<46} {a:>10.2f} {b:>10.2f} {b / a:>6.2f}x")


if __name__ == "__main__":
    main()
