"""What `nativelab check` costs: the same work plain and inside a `nativelab.check.Check`, in one run.

    python bench/check_overhead.py [--tokens 50] [--steps 5] [--repeats 3]

Two workloads, each timed plain and checked, interleaved, medians of the repeats:
- a Lab 2 tier: the `small` Llama, base tier, compiled, greedy (a CPU fallback per token), tok/s;
- a fine-tuning step: a small causal LM (embedding 8000x256, two MLP blocks, tied head) on 8 x 128 tokens,
  cross-entropy, backward, AdamW, in eager mode (every op dispatched, so the check's per-op hook is on the
  hot path), ms per step.
Target: checked / plain <= 1.5x.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import nativelab  # noqa: F401  (registers the device)
from nativelab.check import Check
from nativelab.models.llama import Generator, Llama, Sampling

PROMPT = [1, 15043, 29892, 590, 1024, 338]


def lab2(gen: Generator, tokens: int, checked: bool) -> float:
    torch.neuron.synchronize()
    t0 = time.perf_counter()
    if checked:
        with Check("lab2", tokens=True):
            gen.generate(PROMPT, tokens)
    else:
        gen.generate(PROMPT, tokens)
    torch.neuron.synchronize()
    return tokens / (time.perf_counter() - t0)


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=8000, dim=256):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(dim), torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                torch.nn.Linear(4 * dim, dim)) for _ in range(2))

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = x + b(x)
        return x @ self.emb.weight.T


def train_steps(model, opt, batch, steps: int, checked: bool) -> float:
    torch.neuron.synchronize()
    t0 = time.perf_counter()

    def run():
        for _ in range(steps):
            logits = model(batch[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()

    if checked:
        with Check("finetune"):
            run()
    else:
        run()
    torch.neuron.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    gen = Generator(Llama.random("small", seed=0).copy_as("base", torch.bfloat16, "neuron"),
                    Sampling(greedy=True)).compile()
    for _ in range(2):  # compile and warm up
        gen.generate(PROMPT, args.tokens)
    torch.manual_seed(0)
    model = TinyLM().to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, 8000, (8, 129)).to("neuron")
    train_steps(model, opt, batch, 1, False)

    rows = {"lab2 base compiled greedy (tok/s)": ([], []), "fine-tuning step, eager (ms/step)": ([], [])}
    for _ in range(args.repeats):
        for checked in (False, True):
            rows["lab2 base compiled greedy (tok/s)"][checked].append(lab2(gen, args.tokens, checked))
            rows["fine-tuning step, eager (ms/step)"][checked].append(train_steps(model, opt, batch, args.steps, checked))
    print(f"{'workload':<36} {'plain':>10} {'checked':>10} {'checked/plain time':>20}")
    for name, (plain, checked) in rows.items():
        p, c = statistics.median(plain), statistics.median(checked)
        ratio = p / c if "tok/s" in name else c / p  # a time ratio either way
        print(f"{name:<36} {p:>10.2f} {c:>10.2f} {ratio:>19.2f}x")


if __name__ == "__main__":
    main()
