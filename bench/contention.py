"""Throughput on a busy machine: the Lab 2 tiers, a LoRA fine-tuning step and the device-vs-Inductor decode
step, each measured quiet and beside one CPU-bound competitor process, in one run.

    python bench/contention.py [--tokens 50] [--repeats 3] [--skip-finetune] [--skip-compile]

The competitor is `python3 -c "while True: pass"` (one core's worth of someone else's work). Quiet and loaded
rounds alternate (quiet, loaded, quiet, ...) so drift of the machine hits both; medians are reported.
Targets: each tier under load >= 0.4x its quiet throughput, tier order unchanged; the LoRA step under load
>= 0.4x its quiet speed; compiled-on-the-device / plain-Inductor >= 0.9x under load.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time

import torch

import nativelab  # noqa: F401
from nativelab.device import threads
from nativelab.models.llama import TIERS, Llama, Sampling

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab2  # noqa: E402  (the same builders and timers as bench/lab2.py)


@contextlib.contextmanager
def competitor(on: bool):
    """One CPU-bound process beside the benchmark while the block runs (nothing when `on` is False)."""
    if not on:
        yield
        return
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it reach the scheduler (and the thread policy see it)
        yield
    finally:
        p.kill()
        p.wait()
        # let the thread policy see it gone: it samples the machine every 0.25 s, over the interval since its
        # last look, so a look that still covers the competitor keeps one thread (at 0.3 s the quiet round's
        # first variant ran on one thread: the device's decode step read 10.6 ms instead of 6.1)
        time.sleep(0.8)


def alternate(run_round, repeats: int) -> dict[str, dict[str, list[float]]]:
    """`run_round()` -> {name: value}, called quiet and loaded in turn, `repeats` times each."""
    out: dict[str, dict[str, list[float]]] = {"quiet": {}, "loaded": {}}
    for _ in range(repeats):
        for cond in ("quiet", "loaded"):
            with competitor(cond == "loaded"):
                for k, v in run_round().items():
                    out[cond].setdefault(k, []).append(v)
    return out


def table(title: str, res, unit: str, higher_is_better: bool = True) -> dict[str, float]:
    print(f"\n{title}")
    print(f"  {'':<24} {'quiet ' + unit + ' (min-max)':>26} {'loaded ' + unit + ' (min-max)':>27} {'loaded/quiet':>13}")
    ratios = {}
    for k in res["quiet"]:
        q, lo = res["quiet"][k], res["loaded"][k]
        mq, ml = statistics.median(q), statistics.median(lo)
        ratios[k] = ml / mq if higher_is_better else mq / ml
        print(f"  {k:<24} {f'{mq:.2f} ({min(q):.2f}-{max(q):.2f})':>26} {f'{ml:.2f} ({min(lo):.2f}-{max(lo):.2f})':>27} "
              f"{ratios[k]:>12.2f}x")
    return ratios


def bench_tiers(args) -> None:
    source = Llama.random("small", seed=0)
    sampling = Sampling(greedy=True, temperature=0.8, top_p=0.9, seed=0)
    gens = {t: lab2.build(source, t, torch.bfloat16, sampling, True, "neuron") for t in TIERS}
    prompt = lab2.PROMPT
    with torch.inference_mode():
        for g in gens.values():
            for _ in range(2):
                g.generate(prompt, args.tokens)
        res = alternate(lambda: {t: lab2.tok_per_s(g, prompt, args.tokens) for t, g in gens.items()}, args.repeats)
    ratios = table(f"Lab 2, compiled greedy, 'small' bf16, {args.tokens} tokens (speed: load / quiet)", res, "tok/s")
    for cond in ("quiet", "loaded"):
        med = {t: statistics.median(res[cond][t]) for t in TIERS}
        order = sorted(TIERS, key=med.get)
        print(f"  {cond}: core/base {med['core'] / med['base']:.2f}x, experimental/base "
              f"{med['experimental'] / med['base']:.2f}x, order (slowest first) {' < '.join(order)}")
    print(f"  target: each tier loaded/quiet >= 0.4x ({'met' if min(ratios.values()) >= 0.4 else 'NOT met'})")


def bench_compile(args) -> None:
    import compile as compile_bench  # bench/compile.py

    dev_model = compile_bench.make("small", torch.bfloat16, "neuron")
    cpu_model = compile_bench.make("small", torch.bfloat16, "cpu")
    tok_d, pos_d = torch.tensor([[7]], dtype=torch.int32).to("neuron"), torch.tensor([5]).to("neuron")
    tok_c, pos_c = torch.tensor([[7]]), torch.tensor([5])
    dev = torch.compile(dev_model, backend="neuron")
    with torch._inductor.config.patch(freezing=True):
        cpu = torch.compile(cpu_model)
    with torch.inference_mode(), torch._inductor.config.patch(freezing=True):
        dev(tok_d, pos_d)
        cpu(tok_c, pos_c)

        def one_round():
            return {"compiled (device)": compile_bench.decode_step_ms(dev, tok_d, pos_d, torch.neuron.synchronize,
                                                                      args.steps),
                    "inductor (plain CPU)": compile_bench.decode_step_ms(cpu, tok_c, pos_c, lambda: None, args.steps)}

        res = alternate(one_round, args.repeats)
    table(f"Decode step, 'small' bf16, {args.steps} steps (ms; ratio: quiet time / loaded time)", res, "ms",
          higher_is_better=False)
    for cond in ("quiet", "loaded"):
        r = statistics.median(res[cond]["inductor (plain CPU)"]) / statistics.median(res[cond]["compiled (device)"])
        print(f"  {cond}: device vs plain Inductor {r:.2f}x (target >= 0.9x)")


def bench_finetune(args) -> None:
    from nativelab.finetune import Config, train
    from nativelab.finetune import model as model_mod

    base, tok, name = model_mod.load(None)
    base.model.layers = base.model.layers[:args.layers]
    base.config.num_hidden_layers = args.layers
    results = {}
    steps = {}
    for precision in ("bf16", "fp32"):
        cfg = Config(method="lora", seq_len=128, batch_size=4, precision=precision, device="neuron",
                     sample_tokens=0, progress=False)
        _, _, _, train_b, _, _ = train.prepare(cfg, base, tok, name)
        batch = train_b.batch(0)
        ids, labels = batch["input_ids"].to("neuron"), batch["labels"].to("neuron")
        import copy

        model, _ = train.build(cfg, copy.deepcopy(base))
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

        def step(model=model, opt=opt, cfg=cfg, ids=ids, labels=labels):
            t0 = time.perf_counter()
            with train._autocast(cfg, torch.device("neuron")):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss.item()
            return time.perf_counter() - t0

        step()
        steps[f"LoRA step {precision}"] = step
    res = alternate(lambda: {k: 1.0 / f() for k, f in steps.items()}, args.repeats)
    table(f"LoRA step, {name}, first {args.layers} layers, batch 4 x 128 (steps/s)", res, "steps/s")
    for cond in ("quiet", "loaded"):
        r = statistics.median(res[cond]["LoRA step fp32"]) / statistics.median(res[cond]["LoRA step bf16"])
        print(f"  {cond}: bf16 autocast step / fp32 step time {1 / r:.2f}x")
    del results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--steps", type=int, default=30, help="decode steps per timing in the compile section")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of SmolLM2 kept for the LoRA step")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-tiers", action="store_true")
    ap.add_argument("--skip-finetune", action="store_true")
    ap.add_argument("--skip-compile", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {threads.describe()}")
    if not args.skip_tiers:
        bench_tiers(args)
    if not args.skip_compile:
        bench_compile(args)
    if not args.skip_finetune:
        bench_finetune(args)


if __name__ == "__main__":
    main()
