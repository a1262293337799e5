"""The Trainium2 estimate of `nativelab check` against the guide's measured Lab 2 throughput, in one run.

    python bench/check_estimate.py [--tokens 50] [--fit launch_s]

Runs the three tiers (`small`, bf16, compiled, greedy, as in the guide) under a check, fits ONE parameter
(default: launch_s, the per-launch cost of a compiled graph, on the base tier) so that base's estimate equals
the guide's 359 tok/s, and prints each tier's estimate with that value beside the guide's figure and the
error. Every other figure is a published hardware figure or a stated default (nativelab/check/hardware.py).
"""

from __future__ import annotations

import argparse

import torch

import nativelab  # noqa: F401  (registers the device)
from nativelab.check import Check, Trainium2
from nativelab.check.estimate import estimate, fit
from nativelab.models.llama import TIERS, Generator, Llama, Sampling

GUIDE = {"base": 359.0, "core": 435.3, "experimental": 537.4}  # tok/s on trn2, compiled, greedy
PROMPT = [1, 15043, 29892, 590, 1024, 338]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--fit", default="launch_s", choices=Trainium2.UNPUBLISHED)
    args = ap.parse_args()
    source = Llama.random("small", seed=0)
    watches = {}
    for tier in TIERS:
        gen = Generator(source.copy_as(tier, torch.bfloat16, "neuron"), Sampling(greedy=True)).compile()
        gen.generate(PROMPT, args.tokens)  # compile outside the check (paid once, not part of tok/s)
        with Check(tier, tokens=True) as c:
            gen.generate(PROMPT, args.tokens)
        watches[tier] = c.watch
    base = watches["base"]
    value = fit(base, args.fit, 1.0 / GUIDE["base"], base.steps)
    hw = Trainium2().with_params({args.fit: value})
    print(f"fitted on base: {args.fit} = {value * 1e6:.1f} us (all else published or default: {hw})")
    print(f"{'tier':<14} {'estimate tok/s':>15} {'guide tok/s':>12} {'error':>8}   where the time goes (ms/token)")
    for tier, w in watches.items():
        e = estimate(w, hw, w.steps)
        rate = 1.0 / e["seconds_per"]
        parts = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in e["parts_per"].items() if v)
        err = rate / GUIDE[tier] - 1
        print(f"{tier:<14} {rate:>15.1f} {GUIDE[tier]:>12.1f} {err:>+7.0%}   {parts}  "
              f"[{e['counts']['launches'] / w.steps:.2f} graph launches, {e['counts']['eager_ops'] / w.steps:.2f} eager "
              f"ops, {e['counts']['kernels'] / w.steps:.0f} kernels "
              f"per token]")


if __name__ == "__main__":
    main()
