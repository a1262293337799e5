"""What torch.compile(backend="neuron") buys, measured side by side in one run.

    python bench/compile.py [--size small] [--dtype bfloat16] [--steps 30] [--repeats 3] [--skip-cold]

1. One decode step of the Llama (static KV cache, batch 1): eager on the device vs compiled on the device
   (target >= 3x), and compiled on the device vs Inductor on plain CPU tensors for the same model
   (target >= 0.9x: the device layer costs <= 10%). Medians of interleaved repeats.
2. Compile time of that step in a fresh process with empty caches (cold) and in a second process (warm),
   with weights frozen (the default for inference) and not frozen (artifacts cached on disk):
   target warm / cold <= 0.25x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import nativelab  # noqa: F401
from nativelab.models.llama import Llama


def decode_step_ms(step, tok, pos, sync, steps: int) -> float:
    for _ in range(3):
        step(tok, pos)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(tok, pos)
    sync()
    return (time.perf_counter() - t0) / steps * 1e3


def make(size: str, dtype: torch.dtype, device: str) -> Llama:
    torch.manual_seed(0)
    m = Llama.from_size(size).to(dtype).eval()
    m.to(device)
    m.setup_cache()
    return m


def bench_steps(args) -> None:
    dtype = getattr(torch, args.dtype)
    dev_model = make(args.size, dtype, "neuron")
    cpu_model = make(args.size, dtype, "cpu")
    tok_d, pos_d = torch.tensor([[7]], dtype=torch.int32).to("neuron"), torch.tensor([5]).to("neuron")
    tok_c, pos_c = torch.tensor([[7]]), torch.tensor([5])
    compiled_dev = torch.compile(dev_model, backend="neuron")
    with torch._inductor.config.patch(freezing=True):
        compiled_cpu = torch.compile(cpu_model)
    sync_dev, sync_cpu = torch.neuron.synchronize, (lambda: None)
    results: dict[str, list[float]] = {"eager (device)": [], "compiled (device)": [], "inductor (plain CPU)": []}
    with torch.inference_mode():
        t0 = time.perf_counter()
        compiled_dev(tok_d, pos_d)
        sync_dev()
        first_dev = time.perf_counter() - t0
        with torch._inductor.config.patch(freezing=True):
            compiled_cpu(tok_c, pos_c)
        for _ in range(args.repeats):
            results["eager (device)"].append(decode_step_ms(dev_model, tok_d, pos_d, sync_dev, max(args.steps // 3, 5)))
            results["compiled (device)"].append(decode_step_ms(compiled_dev, tok_d, pos_d, sync_dev, args.steps))
            with torch._inductor.config.patch(freezing=True):
                results["inductor (plain CPU)"].append(decode_step_ms(compiled_cpu, tok_c, pos_c, sync_cpu, args.steps))
        torch.testing.assert_close(compiled_dev(tok_d, pos_d).float().cpu(), compiled_cpu(tok_c, pos_c).float(),
                                   rtol=5e-2, atol=5e-2)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nDecode step, Llama '{args.size}' {args.dtype}, batch 1, {torch.get_num_threads()} threads "
          f"(first compiled call {first_dev:.1f}s)")
    print(f"  {'variant':<22} {'median ms':>10} {'min':>8} {'max':>8}")
    for k, v in results.items():
        print(f"  {k:<22} {med[k]:>10.2f} {min(v):>8.2f} {max(v):>8.2f}")
    print(f"  compiled / eager on the device: {med['eager (device)'] / med['compiled (device)']:.2f}x speed-up "
          f"(target >= 3x)")
    print(f"  compiled on the device vs Inductor on plain CPU: "
          f"{med['inductor (plain CPU)'] / med['compiled (device)']:.2f}x (target >= 0.9x)")


CHILD = """
import time, torch, nativelab
from nativelab.models.llama import Llama
torch.manual_seed(0)
m = Llama.from_size({size!r}).to(torch.{dtype}).eval().to('neuron'); m.setup_cache()
c = torch.compile(m, backend='neuron', options={{'freezing': {freeze}}})
tok, pos = torch.tensor([[7]], dtype=torch.int32).to('neuron'), torch.tensor([5]).to('neuron')
t0 = time.perf_counter()
with torch.inference_mode():
    c(tok, pos); torch.neuron.synchronize()
print(time.perf_counter() - t0)
"""


def bench_cold_warm(args) -> None:
    print("\nCompile time of the decode step (time to the first output of a fresh process)")
    for freeze in (True, False):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, NATIVELAB_CACHE_DIR=os.path.join(d, "neff"),
                       TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"), NATIVELAB_QUIET="1")
            code = CHILD.format(size=args.size, dtype=args.dtype, freeze=freeze)
            times = []
            for _ in range(2):
                r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError(r.stderr[-2000:])
                times.append(float(r.stdout.strip().splitlines()[-1]))
        label = "frozen weights (inference default)" if freeze else "weights as inputs (artifact cached)"
        print(f"  {label:<38} cold {times[0]:6.1f}s  warm {times[1]:6.1f}s  warm/cold {times[1] / times[0]:.2f}x "
              f"(target <= 0.25x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-cold", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, nativelab {nativelab.__version__}")
    bench_steps(args)
    if not args.skip_cold:
        bench_cold_warm(args)


if __name__ == "__main__":
    main()
