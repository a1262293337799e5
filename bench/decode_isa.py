"""The experimental tier's one-kernel decode step (csrc/decode.cpp's DecodePlan) alone, on each ISA build of the
hand-written CPU kernels this host can run, on 1 and 2 threads, measured in one run.

    python bench/decode_isa.py [--size small] [--dtype bfloat16] [--iters 200] [--repeats 5]

A decode step reads every weight once, so its time is set by how fast the weights stream: each line gives
ms per step and the weight bytes it read per second; the ISA builds should match where the step is
memory-bound. The builds alternate within each repeat (medians), so drift on a shared machine hits all alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import nativelab  # noqa: F401
from nativelab.kernels.cpu import build
from nativelab.models.llama import Llama


def plan_for(ext, model: Llama):
    c = model.cfg
    return ext.DecodePlan(model.embed_tokens.weight, model.rope_cos, model.rope_sin, *model._layer_weights(),
                          model.norm.weight, model.lm_head.weight, c.n_heads, c.n_kv_heads, c.norm_eps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    args = ap.parse_args()
    model = Llama.random(args.size, seed=0).to(getattr(torch, args.dtype)).eval()
    model.setup_cache()
    # the layers' matrices and the LM head (tied or not to the embedding, of which a step reads one row)
    weight_bytes = sum(w.numel() * w.element_size() for ws in model._layer_weights()[1:9] if ws[0].dim() == 2
                       for w in ws) + model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    host = build.isa()
    isas = [i for i in ("AVX512", "AVX2", "DEFAULT") if host == i or (host, i) in
            {("AVX512", "AVX2"), ("AVX512", "DEFAULT"), ("AVX2", "DEFAULT")}]
    plans = {i: plan_for(build.extension(i), model) for i in isas if i != "DEFAULT"}
    token, pos = torch.tensor([[7]]), torch.tensor([5])
    state = torch.zeros(2, dtype=torch.long)
    logits = torch.empty(model.cfg.vocab_size, dtype=model.lm_head.weight.dtype)
    out = torch.empty(1, dtype=torch.long)
    print(f"torch {torch.__version__}, {args.size} {args.dtype}, {weight_bytes / 1e6:.1f} MB of weights per step, "
          f"host ISA {host}, medians of {args.repeats} x {args.iters} steps")
    with torch.inference_mode():
        for nt in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(nt)
            times = {i: [] for i in plans}
            for _ in range(args.repeats):
                for isa, plan in plans.items():
                    for _ in range(5):
                        plan.greedy(token, pos, state, logits, out)
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        plan.greedy(token, pos, state, logits, out)
                    times[isa].append((time.perf_counter() - t0) / args.iters)
            for isa, ts in times.items():
                t = statistics.median(ts)
                print(f"  {nt} thread(s) {isa:<7} {t * 1e3:7.3f} ms/step  {weight_bytes / t / 1e9:6.1f} GB/s")


if __name__ == "__main__":
    main()
