"""A warm launch of a kernel whose loop rolled (nki/rolling.py) against the same kernel compiled unrolled
(nki.jit(roll=False)): issue 47's "warm launches stay as fast" (<= 1.1x) for a loop kept a loop.

The kernel is AWS's tensor_addition example's pattern, written here: two [M, N] HBM tensors added tile by tile
(128 x 512) over an nl.affine_range nest, whose outer loop rolls (roll=1: any loop of rolling.MIN_TRIP or more
iterations may). Both kernels are compiled first, their outputs checked against a + b, then launched
interleaved, rolled / unrolled, --repeats times of --iters launches each; the medians and their ratio.

    python bench/nki_roll.py [--shape 2048 4096] [--dtype bfloat16] [--repeats 7] [--iters 10] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nativelab import nki
from nativelab.device import cpu_info
from nativelab.nki import language as nl
from nativelab.nki import rolling


def tensor_add(a_input, b_input):
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    M, N = a_input.shape
    TILE_M, TILE_N = 128, 512
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            a_tile = nl.load(a_input[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N])
            b_tile = nl.load(b_input[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N])
            nl.store(c_output[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], value=nl.add(a_tile, b_tile))
    return c_output


def _has_loop(kernel) -> bool:
    return bool(rolling.loop_bodies(next(iter(kernel._traces.values())).source))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", type=int, nargs=2, default=(2048, 4096))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: as it is)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dt = getattr(torch, args.dtype)
    torch.manual_seed(0)
    a, b = (torch.randn(*args.shape, dtype=dt) for _ in range(2))
    kernels = {"rolled": nki.jit(tensor_add, roll=1, first_call="compile"),
               "unrolled": nki.jit(tensor_add, roll=False, first_call="compile")}
    for name, kernel in kernels.items():
        t0 = time.perf_counter()
        got = kernel(a, b)
        print(f"{name}: first call {time.perf_counter() - t0:.1f} s, loop kept a loop: {_has_loop(kernel)}")
        torch.testing.assert_close(got, a + b, rtol=0, atol=0)
    times = {name: [] for name in kernels}
    for _ in range(args.repeats):
        for name, kernel in kernels.items():
            kernel(a, b)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                kernel(a, b)
            times[name].append((time.perf_counter() - t0) / args.iters * 1e3)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"tensor_add {args.shape[0]}x{args.shape[1]} {args.dtype}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} x {args.iters} warm launches, interleaved; {cpu_info.describe()}")
    for name, m in med.items():
        print(f"  {name:9s} {m:8.2f} ms   ({' '.join(f'{t:.2f}' for t in times[name])})")
    print(f"  rolled / unrolled: {med['rolled'] / med['unrolled']:.2f}x")


if __name__ == "__main__":
    main()
