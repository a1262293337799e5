"""`nativelab run`: the guide's Lab 2 benchmark (`python run.py --model base --compile --greedy`).

Builds the Llama in the chosen tier(s) on one set of weights, optionally compiles the decode and prefill steps
with `torch.compile(backend="neuron")`, warms up, then times the generation of `--tokens` tokens between
`synchronize()` fences and prints the guide's report, the CPU fallback ops, and with `--model all` a table.

`--device cuda` runs the same on a GPU: the library kernels in Triton, `--compile` with Inductor, and the
experimental tier's decode step replayed as one CUDA graph per token.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import nativelab
from ..device import threads
from ..device.config import DEVICE_NAME
from ..models.llama import SIZES, TIERS, Generator, Llama, Sampling, check_fits
from ..models.llama import checkpoint
from ..models.llama.tokenizer import Tokenizer
from ..profile import plots as _plots
from ..profile import traffic_per_token
from .timed_section import timed_section

REAL_SIZES = ("smollm2-135m",)

DESCRIPTIONS = {
    "base": "Baseline (pure PyTorch ops, RoPE, static KV cache)",
    "core": "NKI core (CTE prefill + TKG decode, static KV cache)",
    "experimental": "NKI experimental (CTE prefill + megakernel decode, static KV cache)",
}
DEFAULT_PROMPT = [1, 15043, 29892, 590, 1024, 338]  # a fixed prompt for random-weight models


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="nativelab run", description="The Lab 2 Llama benchmark.")
    ap.add_argument("--model", default="base", choices=[*TIERS, "all"])
    ap.add_argument("--compile", action="store_true",
                    help='torch.compile the model steps (backend "neuron"; Inductor on cuda)')
    ap.add_argument("--greedy", action="store_true", help="greedy decoding (default: top-p sampling)")
    ap.add_argument("--size", default="small", choices=[*sorted(SIZES), *REAL_SIZES],
                    help="random-weight tiny/small, or smollm2-135m: the real SmolLM2-135M-Instruct (offline)")
    ap.add_argument("--model-path", default=None, help="a local Hugging Face Llama checkpoint directory")
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5,
                    help="timed runs of --tokens tokens each; the median is reported (one run is ~0.1-0.5 s)")
    ap.add_argument("--device", default=DEVICE_NAME, choices=[DEVICE_NAME, "cpu", "cuda"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--prompt", default=None,
                    help="text (models with a tokenizer) or comma-separated token ids (random-weight models)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--plot", default="lab2_tiers.png", help="--model all: a PNG bar chart of tok/s per tier")
    args = ap.parse_args(argv)
    if args.tokens < 1:
        ap.error("--tokens must be at least 1")
    if args.repeat < 1 or args.warmup < 0:
        ap.error("--repeat must be >= 1 and --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available to this PyTorch")
    if args.device == DEVICE_NAME and not (nativelab.device.is_registered() or nativelab.device.real_neuron_installed()):
        ap.error("--device neuron: the emulated device is not registered (see the warning at import)")
    if args.model == "all" and not os.path.isdir(os.path.dirname(args.plot) or "."):
        ap.error(f"--plot: directory {os.path.dirname(args.plot)!r} does not exist")
    return args


DEFAULT_TEXT = "The capital of France is"


def prompt_ids(args, vocab: int, tokenizer: Tokenizer | None = None) -> list[int]:
    if tokenizer is not None:
        return tokenizer.encode(args.prompt if args.prompt is not None else DEFAULT_TEXT)
    if args.prompt is None:
        return [t % vocab for t in DEFAULT_PROMPT]
    try:
        ids = [int(t) for t in args.prompt.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"--prompt: expected comma-separated token ids, got {args.prompt!r}") from None
    return ids


def sync(device: str) -> None:
    if device == DEVICE_NAME:
        torch.neuron.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


def run_tier(tier: str, args, base: Llama, tokenizer: Tokenizer | None) -> dict:
    dtype = getattr(torch, args.dtype)
    model = base.copy_as(tier, dtype, args.device)
    sampling = Sampling(greedy=args.greedy, temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    gen = Generator(model, sampling)
    if args.compile:
        gen.compile()
    prompt = prompt_ids(args, model.cfg.vocab_size, tokenizer)
    print(f"Model   : {tier} — {DESCRIPTIONS[tier]}")
    print(f"Size    : {args.size}")
    print(f"Compile : {args.compile}")
    if gen.cuda_graph:
        print("Decode  : one CUDA graph replay per token")
    print(f"Tokens  : {args.tokens}")
    if args.device != "cuda":
        print(f"Host    : {threads.describe()}")
    n = model.num_parameters()
    print(f"\nParams  : {n:,}  ({n * dtype.itemsize / 2**20:.1f} MB {args.dtype})\n")
    print("Warmup...", flush=True)
    for _ in range(args.warmup):
        gen.generate(prompt, args.tokens)
    nativelab.clear_op_tracking()
    print("Timing...", flush=True)
    times, tokens = [], []
    with timed_section() as section:  # no garbage collection inside; compiles and other processes' load counted
        for _ in range(args.repeat):
            sync(args.device)  # fence
            t0 = time.perf_counter()
            tokens = gen.generate(prompt, args.tokens)
            sync(args.device)  # wait for completion
            times.append(time.perf_counter() - t0)
    total = statistics.median(times)
    print(f"Total time      : {total:.3f}s" + (f" (median of {len(times)} runs)" if len(times) > 1 else ""))
    print(f"Tokens generated: {len(tokens)}")
    print(f"Throughput      : {len(tokens) / total:.1f} tok/s")
    for w in section.warnings():
        print(f"Warning         : {w}")
    print(f"\nGenerated IDs: {tokens[:16]}{' ...' if len(tokens) > 16 else ''}")
    if tokenizer is not None:
        print(f"Text: {tokenizer.decode(prompt)!r} -> {tokenizer.decode(tokens)!r}")
    fallbacks = nativelab.get_fallback_ops()
    print(f"\nCPU fallback ops: {fallbacks}\n", flush=True)
    # One more, untimed generation under the profiler's traffic counter (it would slow the timed ones).
    traffic = traffic_per_token(lambda: gen.generate(prompt, args.tokens)) if args.device == DEVICE_NAME else None
    return {
        "model": tier, "size": args.size, "compile": args.compile, "greedy": args.greedy, "dtype": args.dtype,
        "device": args.device, "tokens": len(tokens), "seconds": times, "tok_per_s": [len(tokens) / t for t in times],
        "fallback_ops": fallbacks, "generated": tokens, "device_bytes_per_token": traffic,
        "timed_section": section.as_dict(),
    }


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.size in SIZES and args.model_path is None:  # check the request before building anything
        check_request(args, SIZES[args.size], of=f"size {args.size!r}")
    base, tokenizer = load_model(args)
    if tokenizer is not None:
        check_request(args, base.cfg, tokenizer=tokenizer)
    tiers = list(TIERS) if args.model == "all" else [args.model]
    results = [run_tier(t, args, base, tokenizer) for t in tiers]
    if len(results) > 1:
        print_table(results)
        _plots.plot_throughput([r["model"] for r in results], [statistics.median(r["tok_per_s"]) for r in results],
                               args.plot, title=f"Lab 2 tiers ({args.size}, {args.dtype}, "
                               f"{'compiled' if args.compile else 'eager'}, {'greedy' if args.greedy else 'top-p'})")
        print(f"Plot: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


def check_request(args, cfg, of: str | None = None, tokenizer: Tokenizer | None = None) -> None:
    """Exit with one clear line if the prompt and --tokens do not fit in the model's KV cache."""
    try:
        check_fits(cfg, len(prompt_ids(args, cfg.vocab_size, tokenizer)), args.tokens, of=of)
    except ValueError as e:
        raise SystemExit(f"nativelab run: {e}") from None


def load_model(args) -> tuple[Llama, Tokenizer | None]:
    """The weights every tier shares: random from a seed, the shipped SmolLM2, or a local checkpoint."""
    if args.model_path is not None:
        try:
            return checkpoint.load_hf(args.model_path), None
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"nativelab run: --model-path: {e}") from None
    if args.size == "smollm2-135m":
        try:
            model, tok = checkpoint.load_gguf(checkpoint.smollm2_path())
        except (FileNotFoundError, ImportError, ValueError) as e:
            raise SystemExit(f"nativelab run: {e}") from None
        return model, Tokenizer(tok)
    torch.manual_seed(args.seed)
    return Llama.random(args.size, seed=args.seed), None


def print_table(results: list[dict]) -> None:
    base = statistics.median(results[0]["tok_per_s"])
    print(f"{'Variant':<14} {'Throughput (tok/s)':>26} {'vs. base':>9} {'Device MB/token':>16}  CPU fallback ops")
    for r in results:
        med, lo, hi = statistics.median(r["tok_per_s"]), min(r["tok_per_s"]), max(r["tok_per_s"])
        span = f"{med:.1f} ({lo:.1f}-{hi:.1f})"
        traffic = r.get("device_bytes_per_token")
        mb = f"{traffic / 1e6:.3f}" if traffic is not None else "-"
        print(f"{r['model']:<14} {span:>26} {med / base:>8.2f}x {mb:>16}  {r['fallback_ops']}")
    for r in results:
        for w in r["timed_section"]["warnings"]:
            print(f"Warning ({r['model']}): {w}")
    print(f"\n{token_agreement(results)}")


def token_agreement(results: list[dict]) -> str:
    """How far the tiers' tokens agree with the first tier's: one greedy token that differs changes the
    context, and every token after it may differ too, so the count is of the first steps."""
    ref = results[0]["generated"]
    firsts = []
    for r in results[1:]:
        same = 0
        while same < min(len(ref), len(r["generated"])) and r["generated"][same] == ref[same]:
            same += 1
        firsts.append(same)
    agree = min(firsts, default=len(ref))
    if agree == len(ref) and all(len(r["generated"]) == len(ref) for r in results):
        return f"Tokens: every tier gives the same {len(ref)} tokens"
    per_tier = ", ".join(f"{r['model']} {n}" for r, n in zip(results[1:], firsts))
    why = ("bf16 rounding differs between tiers" if results[0]["dtype"] == "bfloat16" else
           "fp32 summation order differs between tiers")
    return (f"Tokens: the tiers agree with {results[0]['model']} for the first {agree} of {len(ref)} steps "
            f"({per_tier}); {why}, and a token that differs changes the rest")
