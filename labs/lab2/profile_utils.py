"""Lab 2 profiling utilities (the guide's profile_utils.py) and Step 6: which ops fall back to the CPU.

The tiers are this folder's (Llama.copy_as(tier) builds llama_base/, llama_nki_core/, llama_nki_experimental/).

    python labs/lab2/profile_utils.py            # Step 6 for every tier, greedy and top-p (compiled, tiny model)
    python labs/lab2/profile_utils.py --size small

In your own code:

    from profile_utils import fallback_report, profile_generation
    session = profile_generation(gen, prompt, 50, name="base")   # tables in the terminal
    print(f"CPU fallback ops: {fallback_report()}")
"""

from __future__ import annotations

import argparse

import torch
try:
    import torch_neuronx  # the guide's API: AWS's, or nativelab's stand-in for it where AWS's is not installed
except ImportError:  # no neuron device in this process (the emulator could not start): --device cpu or cuda
    import nativelab.device.torch_neuronx_api as torch_neuronx

from nativelab.models.llama import TIERS, Generator, Llama, Sampling
from nativelab.profile import Session, print_report


def fallback_report() -> list[str]:
    """The ops that fell back to the CPU so far in this process (torch_neuronx.get_fallback_ops())."""
    return torch_neuronx.get_fallback_ops()


def profile_generation(gen: Generator, prompt: list[int], tokens: int, name: str = "generate",
                       show: bool = True) -> Session:
    """Profile one generation: fallbacks, device traffic per token, time by category, host syncs."""
    with Session(name) as session:
        session.tokens = len(gen.generate(prompt, tokens))
    if show:
        print_report(session)
    return session


def step6(size: str = "tiny", tokens: int = 16, compile: bool = True) -> dict[tuple[str, str], list[str]]:
    """The guide's Step 6 for each tier and decoding mode: the CPU fallback ops of a compiled generation."""
    base = Llama.random(size)
    prompt = [1, 2, 3, 4, 5, 6]
    found = {}
    for tier in TIERS:
        model = base.copy_as(tier, device="neuron")
        for mode in ("greedy", "top-p"):
            gen = Generator(model, Sampling(greedy=mode == "greedy"))
            if compile:
                gen.compile()
            gen.generate(prompt, tokens)  # warm up (compiles)
            torch_neuronx.clear_op_tracking()
            gen.generate(prompt, tokens)
            found[tier, mode] = fallback_report()
            print(f"{tier:<13} {mode:<7} CPU fallback ops: {found[tier, mode]}")
            torch._dynamo.reset()
    return found


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Lab 2 Step 6: CPU fallback ops per tier, greedy and top-p.")
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--eager", action="store_true", help="do not torch.compile the steps")
    a = ap.parse_args()
    step6(a.size, a.tokens, compile=not a.eager)
