"""NKI kernels: traced NKI vs the same computation in PyTorch compiled by Inductor, on this CPU; and the cost
model's Trainium2 estimate of bf16 matmuls against the Tensor Engine's roofline.

    python bench/nki.py [--iters 20] [--dtype bfloat16] [--threads 1] [--skip-cpu]

Both sides run on the host CPU (CPU tensors, so the device queue adds nothing to either): the NKI kernel is
traced once and compiled by Inductor (kernels/nki), the reference is the plain PyTorch expression under
torch.compile. Target: NKI within 3x of the reference. The estimate column is nativelab's NeuronCore-v3 cost
model (nki/cost.py: published clocks and rates, none fitted): TensorE's roofline is 79 BF16 TFLOPS per core.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import nativelab  # noqa: F401
from nativelab.kernels import nki as nk
from nativelab.kernels.ops import reference_rmsnorm


def timed(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def cases(dt):
    torch.manual_seed(0)
    x = torch.randn(1024, 1024, dtype=dt)
    y = torch.randn(1024, 1024, dtype=dt)
    w = torch.randn(1024, dtype=dt)
    a, b = torch.randn(512, 1024, dtype=dt), torch.randn(1024, 1024, dtype=dt)
    return [
        ("add 1024x1024", nk.add_kernel, (x, y), lambda x, y: x + y),
        ("rmsnorm 1024x1024", nk.rmsnorm_kernel, (x, w, 1e-5), reference_rmsnorm),
        ("softmax 1024x1024", nk.softmax_kernel, (x,), nk.reference_softmax),
        ("matmul 512x1024x1024", nk.matmul_kernel, (a, b), lambda a, b: a @ b),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-cpu", action="store_true", help="only the Trainium2 estimates (no compiles)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1: steadier on a shared machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dt = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    if not args.skip_cpu:
        print(f"{'kernel':24s} {'NKI us':>10s} {'Inductor us':>12s} {'ratio':>7s} {'est. trn2 us':>13s}  bound")
        for name, kernel, inputs, ref in cases(dt):
            compiled_ref = torch.compile(ref)
            torch.testing.assert_close(kernel(*inputs).float(), ref(*inputs).float(), rtol=3e-2, atol=3e-2)
            nki_us = statistics.median(timed(lambda: kernel(*inputs), args.iters) for _ in range(args.repeats))
            ref_us = statistics.median(timed(lambda: compiled_ref(*inputs), args.iters) for _ in range(args.repeats))
            e = kernel.estimate(*inputs)
            print(f"{name:24s} {nki_us:10.1f} {ref_us:12.1f} {nki_us / ref_us:6.2f}x {e.seconds * 1e6:13.2f}  {e.bound}")
    print("\nmatmul_kernel on one NeuronCore-v3 (cost model), bf16; roofline 79 TFLOPS")
    print(f"{'M x K x N':>20s} {'est. us':>10s} {'TFLOPS':>8s} {'of roofline':>12s}  bound   busy us (tensor / vector / dma)")
    for m, k, n in [(128, 128, 512), (128, 1024, 512), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
                    (4096, 4096, 4096)]:
        a = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
        b = torch.empty(k, n, dtype=torch.bfloat16, device="meta")
        e = nk.matmul_kernel.estimate(a, b)
        tf = 2 * m * k * n / e.seconds / 1e12
        busy = " / ".join(f"{e.busy.get(x, 0) * 1e6:.1f}" for x in ("tensor", "vector", "dma"))
        print(f"{f'{m}x{k}x{n}':>20s} {e.seconds * 1e6:10.2f} {tf:8.1f} {tf / 79:11.0%}  {e.bound:6s}  {busy}")


if __name__ == "__main__":
    main()
