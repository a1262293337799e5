"""The experimental tier's one-kernel decode step (csrc/decode.cpp's DecodePlan) alone, on each ISA build of the
hand-written CPU kernels this host can run, on 1 and 2 threads, tuned (kernels/cpu/tune.py) and measured in
one run against the process's own flat read of the same bytes.

    python bench/decode_isa.py [--size small] [--dtype bfloat16] [--iters 100] [--repeats 5]
                               [--without ahead=1 ...]   # take configurations away from the tuner
                               [--second]                # and what it chooses without its first choice

Per thread count and build: the configuration the tuner chooses (measured now, the cache not used), the
fastest and slowest it tried; then the chosen and the default configuration's step (ms, weight GB/s) against
the flat read (one sum over a contiguous copy of the step's weight bytes, on as many threads: the rate this
process streams those bytes at). Builds, configurations and the flat read alternate within each repeat; the
step is the median of the repeats, the flat read the fastest (the stricter ratio).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import nativelab  # noqa: F401
from nativelab.device import cpu_info
from nativelab.kernels.cpu import build, tune
from nativelab.models.llama import Llama


def plan_for(ext, model: Llama):
    c = model.cfg
    return ext.DecodePlan(model.decode_weights().named(), model.rope_cos, model.rope_sin, c.n_heads, c.n_kv_heads,
                          c.norm_eps)


def step_time(plan, iters: int) -> float:
    token, pos = torch.tensor([[7]]), torch.tensor([5])
    state, out = torch.zeros(2, dtype=torch.long), torch.empty(1, dtype=torch.long)
    logits = torch.empty(plan_for.vocab, dtype=plan_for.dtype)
    for _ in range(3):
        plan.greedy(token, pos, state, logits, out)
    t0 = time.perf_counter()
    for _ in range(iters):
        plan.greedy(token, pos, state, logits, out)
    return (time.perf_counter() - t0) / iters


def flat_read_time(flat: torch.Tensor, reads: int = 5) -> float:
    best = float("inf")
    for _ in range(reads):
        t0 = time.perf_counter()
        flat.sum()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--without", action="append", default=[], metavar="FIELDS",
                    help="configurations the tuner may not choose: those matching all these fields, e.g. "
                         "ahead=1 or rows=4,hint=l1 (repeatable)")
    ap.add_argument("--second", action="store_true",
                    help="also tune with the chosen step configuration taken away, and time that choice too")
    args = ap.parse_args()
    try:
        without = [tune.parse_fields(w) for w in args.without]
    except ValueError as e:
        ap.error(f"--without: {e}")
    model = Llama.random(args.size, seed=0).to(getattr(torch, args.dtype)).eval()
    model.setup_cache()
    plan_for.vocab, plan_for.dtype = model.cfg.vocab_size, model.lm_head.weight.dtype
    # the layers' matrices and the LM head (tied or not to the embedding, of which a step reads one row)
    w = model.decode_weights()
    weights = [t for ts in (w.wqs, w.wks, w.wvs, w.wos, w.gates, w.ups, w.downs) for t in ts] + [w.lm_head]
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    flat = torch.cat([w.reshape(-1).view(torch.uint8) for w in weights])[: weight_bytes // 4 * 4].view(torch.float32)
    host = build.isa()
    isas = [i for i in ("AVX512", "AVX2") if host == i or (host, i) == ("AVX512", "AVX2")]
    exts = {i: build.extension(i) for i in isas}
    print(f"torch {torch.__version__}, {cpu_info.describe()}")
    print(f"{args.size} {args.dtype}, {weight_bytes / 1e6:.1f} MB of weights per step; medians of {args.repeats} x "
          f"{args.iters} steps" + (f"; tuner without {', '.join(args.without)}" if without else ""))

    def gbs(t: float) -> str:
        return f"{weight_bytes / t / 1e9:5.1f} GB/s"

    with torch.inference_mode():
        for nt in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(nt)
            plans, chosen = {}, {}
            for isa, ext in exts.items():
                plan, most = plan_for(ext, model), ext.max_tile_tokens()
                t0 = time.perf_counter()
                config, tried, _ = tune.search(tune.plan_measure(plan, most), most, exclude=without, limit=60)
                took = time.perf_counter() - t0
                steps = sorted((t, str(c)) for (c, n), t in tried.items() if n == 1)
                tiles = sorted((t, f"{c.tile_rows}x{c.tile_tokens or most}") for (c, n), t in tried.items() if n > 1)
                print(f"\n{nt} thread(s) {isa}: tuner chose {config} ({len(tried)} tried, {took * 1e3:.0f} ms)")
                print(f"  step, fastest tried: {steps[0][0] * 1e3:.3f} ms {gbs(steps[0][0])}  {steps[0][1]}")
                print(f"  step, slowest tried: {steps[-1][0] * 1e3:.3f} ms {gbs(steps[-1][0])}  {steps[-1][1]}")
                if tiles:
                    print(f"  prefill of {tune.PREFILL_TOKENS} tokens, tiles (rows x tokens): "
                          + ", ".join(f"{s} {t * 1e3:.2f} ms" for t, s in tiles))
                plans[isa], chosen[isa] = (plan, most), {"tuned": config, "default": tune.DecodeConfig()}
                if args.second:  # the same search with the winner's step fields excluded
                    fields = {f: getattr(config, f) for f in ("rows", "ahead", "hint", "split")}
                    second, _, _ = tune.search(tune.plan_measure(plan, most), most, exclude=[*without, fields], limit=60)
                    print(f"  without it the tuner chooses {second}")
                    chosen[isa]["second"] = second
            times = {(isa, which): [] for isa in plans for which in chosen[isa]}
            flats = []
            for _ in range(args.repeats):
                flats.append(flat_read_time(flat))
                for (isa, which), ts in times.items():
                    plan, most = plans[isa]
                    plan.configure(*chosen[isa][which].args(most))
                    ts.append(step_time(plan, args.iters))
            flat_t = min(flats)
            print(f"\n{nt} thread(s): flat read of the same bytes {flat_t * 1e3:.3f} ms {gbs(flat_t)}")
            for (isa, which), ts in times.items():
                t = statistics.median(ts)
                print(f"  {isa:<6} {which:<7} {t * 1e3:7.3f} ms/step {gbs(t)}  {flat_t / t:5.0%} of the flat read"
                      f"  ({chosen[isa][which]})")


if __name__ == "__main__":
    main()
