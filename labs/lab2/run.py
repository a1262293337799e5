"""Lab 2's entry point: python run.py --model base|core|experimental|all [--compile] [--greedy]

1. Selects the model folder with --model: llama_base/, llama_nki_core/ or llama_nki_experimental/, on one
   set of weights (the `small` model's, from a fixed seed; --size / --model-path for others).
2. Applies torch.compile(backend="neuron") to the prefill and decode steps if --compile is given.
3. Decodes greedily if --greedy is given (else top-p sampling).
   --kernels nki|cpu: what nki_ops.py's kernels run, the NKI kernels (default) or the library's CPU kernels they
   lower to, called directly.
4. Warms up 3 times, times 50 tokens (median of --repeat runs) and prints the throughput.

`nativelab run ...` runs this file with the same flags.
"""

import statistics
import time

import torch
try:
    import torch_neuronx  # the guide's API: AWS's, or nativelab's stand-in for it where AWS's is not installed
except ImportError:  # no neuron device in this process (the emulator could not start): --device cpu or cuda
    import nativelab.device.torch_neuronx_api as torch_neuronx

from nativelab.apps.run import (DESCRIPTIONS, finish, load_weights, parse_args, prompt_ids, sync, tiers_of,
                                untimed_figures)
from nativelab.apps.timed_section import timed_section
from nativelab.device import threads
from nativelab.models.llama import Generator, Sampling

import nki_ops  # this folder's kernels (--kernels chooses what they run)


def run(tier, args, weights, tokenizer):
    dtype = getattr(torch, args.dtype)
    model = weights.copy_as(tier, dtype, args.device)  # this tier's folder's Llama, on the shared weights
    sampling = Sampling(greedy=args.greedy, temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    gen = Generator(model, sampling)
    if args.compile:
        gen.compile()
    prompt = prompt_ids(args, model.cfg.vocab_size, tokenizer)
    print(f"Model   : {tier} — {DESCRIPTIONS[tier]}")
    print(f"Size    : {args.size}")
    print(f"Compile : {args.compile}")
    if tier != "base":
        print(f"Kernels : {args.kernels}")
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
    torch_neuronx.clear_op_tracking()
    print("Timing...", flush=True)
    times = []
    with timed_section() as section:  # no garbage collection inside; compiles and other processes' load reported
        for _ in range(args.repeat):
            sync(args.device)  # fence
            start = time.perf_counter()
            tokens = gen.generate(prompt, args.tokens)
            sync(args.device)  # wait for completion
            times.append(time.perf_counter() - start)
    fallbacks = torch_neuronx.get_fallback_ops()
    total = statistics.median(times)
    print(f"Total time      : {total:.3f}s" + (f" (median of {len(times)} runs)" if len(times) > 1 else ""))
    print(f"Tokens generated: {len(tokens)}")
    print(f"Throughput      : {len(tokens) / total:.1f} tok/s")
    for w in section.warnings():
        print(f"Warning         : {w}")
    extra = untimed_figures(gen, prompt, args)  # device MB/token and the Trainium2 estimate, untimed
    if extra["est_trn2_tok_per_s"] is not None:
        print(f"est. trn2 tok/s : {extra['est_trn2_tok_per_s']:.1f}")

    print(f"\nGenerated IDs: {tokens[:16]}{' ...' if len(tokens) > 16 else ''}")
    if tokenizer is not None:
        print(f"Text: {tokenizer.decode(prompt)!r} -> {tokenizer.decode(tokens)!r}")
    print(flush=True)
    return {
        "model": tier, "size": args.size, "compile": args.compile, "greedy": args.greedy, "dtype": args.dtype,
        "device": args.device, "kernels": args.kernels, "tokens": len(tokens), "seconds": times,
        "tok_per_s": [len(tokens) / t for t in times],
        "fallback_ops": fallbacks, "generated": tokens, **extra, "timed_section": section.as_dict(),
    }


def main(argv=None):
    args = parse_args(argv)
    nki_ops.use(args.kernels)
    weights, tokenizer = load_weights(args)
    return finish([run(tier, args, weights, tokenizer) for tier in tiers_of(args)], args)


if __name__ == "__main__":
    main()
