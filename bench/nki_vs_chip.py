"""`kernel.estimate` against the chip: AWS's NKI tutorial kernels at the shapes and on the hardware of their
published on-chip latencies, estimated by nativelab's cost model (nki/cost.py) on that hardware's target.

    python bench/nki_vs_chip.py --samples /tmp/nkisamples [--only matmul layernorm mamba] [--limit-s 180]

--samples is a folder holding AWS's tutorial sources, not part of this repository (aws-neuron/aws-neuron-sdk):
  nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py   (NKI 0.5, the current tutorial)
  nki/examples/fused_mamba/mamba_nki_kernels.py                             (NKI 0.5)
  legacy/nki/examples/layernorm/layernorm_nki_kernel.py                     (neuronxcc.nki, SDK 2.26: the tutorial
                                                                             has no NKI 0.5 version)
e.g. `git archive HEAD nki/examples | tar -x -C /tmp/nkisamples` and, for LayerNorm, the same from the commit
before "Release 2.27.0" (337e6041^) into /tmp/nkisamples/legacy.

The published figures (measured on the chip, each with its page):
  [mm]  "Matrix multiplication" tutorial (aws-neuron-sdk nki/tutorials/matrix_multiplication.rst, SDK 2.26,
        commit 1db4d74e): [4096,8192] @ [8192,8192] BF16 on Trn1.32xlarge, ms: Original Tiled 51.80,
        Optimization 1 (hoisted loads) 42.96, Optimization 2 (blocked free dimensions) 22.07, Optimization 3
        (fully optimized) 6.97
  [ln]  "LayerNorm" tutorial (nki/tutorials/layernorm.rst, SDK 2.26): "The latency measured on trn1 using an
        input tensor of (300, 1000)": v1 p50 2311 us, v2 p50 1969 us
  [mb]  "Fused Mamba" tutorial (nki/tutorials/fused_mamba.rst, SDK 2.26): mamba_v1 [batch 1, seq_len 512,
        channels 256, state 16] 172.93 us, at channels 4096 2.34 ms; mamba_v2 at channels 4096 1.61 ms; the
        seq_len table for mamba_v2 / mamba_v3 at channels 4096, 1024 to 8192 (8192: 52.2 / 27.8 ms; its 512 row
        says 1.6 / 1.6, the v2 point above, and v3 at 512 is v2's kernel with one seq_len tile). The page names no
        instance; its profiles are neuron-profile's of the SDK's trn1 era, so NeuronCore-v2 is assumed.

Prints one row per point (kernel, version, shape, hardware, measured, estimated, ratio, seconds to estimate),
the median |ratio - 1|, the largest error, and whether each pair of versions of one kernel is ordered as measured.
A point whose estimate takes longer than --limit-s is reported as skipped (tracing unrolls every loop).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

from module_files import load

MM = "nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py"
LN = "legacy/nki/examples/layernorm/layernorm_nki_kernel.py"
MB = "nki/examples/fused_mamba/mamba_nki_kernels.py"
PAGE = {"matmul": "nki/tutorials/matrix_multiplication.rst (SDK 2.26)", "layernorm": "nki/tutorials/layernorm.rst",
        "mamba": "nki/tutorials/fused_mamba.rst"}

# [mb]'s seq_len table at channels 4096: (seq_len, mamba_v2 ms, mamba_v3 ms); its 512 row's v2 is the point above
SEQ_LEN_TABLE = [(512, None, 1.6), (1024, 4.4, 3.3), (2048, 8.9, 6.6), (3072, 13.1, 10.1), (4096, 17.6, 13.3), (5120, 23.7, 17.3),
                 (6144, 27.5, 19.6), (7168, 41.3, 24.2), (8192, 52.2, 27.8)]

# (kernel, version, source, function, shape label, argument builder, hardware, measured seconds)
POINTS = [
    ("matmul", "tiled", MM, "nki_matmul_tiled_", "[4096,8192]@[8192,8192] bf16", ("mm", 4096, 8192, 8192), "trn1", 51.80e-3),
    ("matmul", "hoist_load", MM, "nki_matmul_hoist_load_", "[4096,8192]@[8192,8192] bf16", ("mm", 4096, 8192, 8192), "trn1", 42.96e-3),
    ("matmul", "block_free_dimension", MM, "nki_matmul_block_free_dimension_", "[4096,8192]@[8192,8192] bf16", ("mm", 4096, 8192, 8192), "trn1", 22.07e-3),
    ("matmul", "fully_optimized", MM, "nki_matmul_fully_optimized_", "[4096,8192]@[8192,8192] bf16", ("mm", 4096, 8192, 8192), "trn1", 6.97e-3),
    ("layernorm", "v1", LN, "nki_layernorm_kernel_v1", "(300, 1000) fp32", ("ln", 300, 1000), "trn1", 2311e-6),
    ("layernorm", "v2", LN, "nki_layernorm_kernel_v2", "(300, 1000) fp32", ("ln", 300, 1000), "trn1", 1969e-6),
    ("mamba", "v1", MB, "mamba_v1", "b1 s512 c256 n16 fp32", ("mb", 1, 512, 256, 16), "trn1?", 172.93e-6),
    ("mamba", "v1", MB, "mamba_v1", "b1 s512 c4096 n16 fp32", ("mb", 1, 512, 4096, 16), "trn1?", 2.34e-3),
    ("mamba", "v2", MB, "mamba_v2", "b1 s512 c4096 n16 fp32", ("mb", 1, 512, 4096, 16), "trn1?", 1.61e-3),
] + [(
    "mamba", version, MB, f"mamba_{version}", f"b1 s{s} c4096 n16 fp32", ("mb", 1, s, 4096, 16), "trn1?", ms * 1e-3)
    for s, v2_ms, v3_ms in SEQ_LEN_TABLE for version, ms in (("v2", v2_ms), ("v3", v3_ms)) if ms is not None]
TIE = 0.02  # two measurements this close (the seq_len table rounds to 0.1 ms: 1.61 and 1.6 at 512) order nothing


def _arguments(spec):
    import torch

    meta = dict(device="meta")
    if spec[0] == "mm":
        _, m, k, n = spec
        return [torch.empty(k, m, dtype=torch.bfloat16, **meta), torch.empty(k, n, dtype=torch.bfloat16, **meta)]
    if spec[0] == "ln":
        _, rows, cols = spec
        return [torch.empty(rows, cols, **meta), 1e-5, torch.empty(cols, **meta), torch.empty(cols, **meta)]
    _, b, s, c, n = spec  # mamba: delta, u [b, c, s]; A [c, n]; B, C [b, n, s]
    return [torch.empty(b, c, s, **meta), torch.empty(b, c, s, **meta), torch.empty(c, n, **meta),
            torch.empty(b, n, s, **meta), torch.empty(b, n, s, **meta)]


def _estimate(samples: str, source: str, function: str, spec, hardware: str, out):
    """In a child process (so a slow trace can be abandoned): the estimate's seconds and summary."""
    here = Path(__file__).resolve().parent  # bench/nki.py is not `import nki`
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    import nativelab  # noqa: F401  (`import nki` / `neuronxcc.nki` resolve to nativelab's)
    from nativelab.nki import cost

    path = Path(samples) / source
    kernels = load(path, path.stem)
    target = cost.NEURONCORE_V2 if hardware.startswith("trn1") else cost.NEURONCORE_V3
    start = time.perf_counter()
    est = getattr(kernels, function).estimate(*_arguments(spec), target=target)
    out.put((est.seconds, est.summary(), time.perf_counter() - start))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", required=True, help="folder of AWS's tutorial sources (see the docstring)")
    ap.add_argument("--only", nargs="*", default=["matmul", "layernorm", "mamba"])
    ap.add_argument("--limit-s", type=float, default=180.0, help="skip a point whose estimate takes longer")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each estimate's summary")
    args = ap.parse_args()
    rows = []
    print(f"{'kernel':<10} {'version':<21} {'shape':<29} {'hw':<6} {'measured':>10} {'estimated':>10} {'ratio':>6} {'took':>6}")
    for kernel, version, source, function, shape, spec, hardware, measured in POINTS:
        if kernel not in args.only:
            continue
        out = mp.get_context("spawn").Queue()
        child = mp.get_context("spawn").Process(target=_estimate, args=(args.samples, source, function, spec, hardware, out))
        child.start()
        child.join(args.limit_s)
        if child.is_alive():
            child.terminate()
            child.join()
            print(f"{kernel:<10} {version:<21} {shape:<29} {hardware:<6} {measured * 1e3:>8.3f}ms  skipped: the estimate "
                  f"took over {args.limit_s:.0f} s")
            continue
        if out.empty():
            print(f"{kernel:<10} {version:<21} {shape:<29} {hardware:<6} {measured * 1e3:>8.3f}ms  failed (see above)")
            continue
        seconds, summary, took = out.get()
        ratio = seconds / measured
        rows.append((kernel, version, shape, measured, seconds, ratio))
        print(f"{kernel:<10} {version:<21} {shape:<29} {hardware:<6} {measured * 1e3:>8.3f}ms {seconds * 1e3:>8.3f}ms "
              f"{ratio:>6.2f} {took:>5.0f}s")
        if args.verbose:
            print("    " + summary)
    if not rows:
        return 1
    errors = [abs(r[5] - 1) for r in rows]
    worst = max(rows, key=lambda r: max(r[5], 1 / r[5]))
    print(f"\n{len(rows)} points; median |estimate/measured - 1| = {statistics.median(errors):.0%} (target <= 25%); "
          f"largest miss {worst[0]} {worst[1]} {worst[2]}: x{max(worst[5], 1 / worst[5]):.2f} (target <= 2x)")
    ordered = total = 0
    for i, a in enumerate(rows):  # pairs of versions of one kernel at one shape
        for b in rows[i + 1:]:
            if a[0] == b[0] and a[2] == b[2] and a[1] != b[1] and abs(a[3] / b[3] - 1) > TIE:
                total += 1
                same = a[4] != b[4] and (a[3] < b[3]) == (a[4] < b[4])  # a tie orders nothing
                ordered += same
                print(f"  {a[0]} {a[2]}: {a[1]} vs {b[1]}: measured {'<' if a[3] < b[3] else '>'}, "
                      f"estimated {'<' if a[4] < b[4] else '>' if a[4] > b[4] else '='}: {'ordered' if same else 'NOT ordered'}")
    print(f"pairs ordered as measured: {ordered} / {total}")
    print("pages: " + "; ".join(f"{k}: {v}" for k, v in PAGE.items() if k in args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
