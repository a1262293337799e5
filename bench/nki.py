"""NKI kernels: traced NKI vs the same computation in PyTorch compiled by Inductor, on this CPU; and the cost
model's Trainium2 estimate of bf16 matmuls against the Tensor Engine's roofline.

One row per kernel of kernels/nki: add, rmsnorm, softmax, matmul, and Lab 2's (RoPE, the SwiGLU MLP for 128
tokens and for one, QKV, prefill and decode attention, the whole decode step for a one-layer model (embedding
to greedy token, one launch), argmax, top-p sampling) at the small Llama's shapes, each against its reference in kernels/ops.

    python bench/nki.py [--iters 20] [--dtype bfloat16] [--threads 1] [--only rope mlp ...] [--skip-cpu]

Both sides run on the host CPU (CPU tensors, so the device queue adds nothing to either): the NKI kernel is
traced once and compiled by Inductor (kernels/nki), the reference is the plain PyTorch expression under
torch.compile. Target: NKI within 3x of the reference. The estimate column is nativelab's NeuronCore-v3 cost
model (nki/cost.py: published clocks and rates, none fitted): TensorE's roofline is 79 BF16 TFLOPS per core.

    python bench/nki.py --first-call [--nki-samples DIR] [--neuron-sdk DIR] [--limit 120] [--only ...]

prints instead what a kernel's first call costs with nothing cached (issue 47, item 4), each measurement in a fresh
interpreter whose compile caches are new, empty temporary directories (nativelab's, NATIVELAB_CACHE_DIR, and
Inductor's, TORCHINDUCTOR_CACHE_DIR): the first call as a user gets it (NATIVELAB_NKI_FIRST_CALL's default: the
checking pass, then the kernel interpreted; it compiles at its second launch), its ratio to nki.simulate's first
call on the same inputs, the first call compiled (NATIVELAB_NKI_FIRST_CALL=compile: make_fx's trace, Inductor, and
the compiled graph's nodes, "(loop)" where a loop was kept a loop, nki/rolling.py) and nki.simulate's; a
measurement past --limit seconds prints "> 120 s". Rows: a tiny add (the floor), the library's kernels at the
shapes above, a 1024x2048 softmax; with --nki-samples, an nki-samples checkout, its matrix-multiplication
tutorial's five kernels at the tutorial's shapes; with --neuron-sdk, an aws-neuron-sdk checkout, its fused Mamba
example's v1-v3 at its driver's (nki-samples' Mamba is the neuronxcc-era API, not served). Those are imported from
DIR unmodified.

Measured alone on 2 cores of an AMD EPYC (Zen 4, AVX-512 with AVX512_BF16), bf16, --limit 150:
kernel                                first s ratio compiled s trace s Inductor s graph nodes simulate s  outputs
add 128x128 (floor)                      0.00  1.2x       9.73    0.04       9.69          44       0.00  same
add 1024x1024                            0.04  1.0x      10.55    0.20      10.32         303       0.04  same
rmsnorm 1024x1024                        0.06  0.9x      11.55    0.31      11.20         511       0.07  same
softmax 1024x1024                        0.06  1.1x      11.97    0.26      11.68         421       0.05  same
matmul 512x1024x1024                     0.14  1.0x      19.55    2.79      16.68        5073       0.15  same
rope 8x128x64                            0.03  1.0x      13.82    0.72      13.07        1459       0.03  same
mlp 128x512x2048                         0.23  1.0x      60.97    6.61      54.22       12587       0.22  same
mlp 1x512x2048                           0.18  1.0x      46.91    7.15      39.65       14157       0.18  same
qkv 128x512                              0.11  1.0x      23.23    2.40      20.76        4115       0.11  same
attention_cte 8x128x64                   0.09  0.9x      23.72    1.29      22.37        2385       0.10  same
attention_tkg 8x512x64                   0.11  1.0x      33.81    3.60      30.14        5629       0.10  same
decode step, 1 layer                     0.77  1.0x    > 150 s       -          -           -       0.79  same
argmax 1x32000                           0.02  1.1x      11.11    0.15      10.94         208       0.01  same
top-p 1x32000                            0.34  1.0x      34.90    3.46      31.19        6208       0.33  same
softmax 1024x2048                        0.08  1.0x      11.95    0.30      11.61         421       0.08  same
matmul basic 64x128x512                  0.01  1.1x       9.69    0.05       9.64          45       0.00  same
matmul tiled 4096x1024x2048              3.35  1.0x      29.33    4.61      23.01 4412 (loop)       3.28  same
matmul hoisted 4096x1024x2048            2.84  0.9x      30.89    3.69      25.47 3098 (loop)       3.20  same
matmul blocked 4096x1024x2048            2.49  1.0x      33.05    5.33      26.30 4460 (loop)       2.52  same
matmul fully optimized 4096x1024x2048    2.35  0.9x     149.40   29.15     118.90       49015       2.59  same
mamba v1 256x2048x16                     1.99  0.9x      58.63    5.33      51.73        9097       2.14  same
mamba v2 256x2048x16                     1.86  1.0x      57.18    5.01      50.55        7913       1.83  same
mamba v3 256x2048x16                     3.04  0.8x    > 150 s       -          -           -       3.67  same
Every first call within 1.2x of nki.simulate's and under 4 s (issue 47's targets: <= 2x, < 10 s for the tutorials
and Mamba), with nki.simulate's outputs. Compiled, ~9.5 s of each is the floor: a fresh process's first Inductor
compile into an empty cache directory, most of it Inductor's CPU-ISA probes. The tiled, hoisted and blocked
tutorials keep their outer loop a while_loop (4412 / 3098 / 4460 nodes: three traced iterations and one body;
unrolled, their compiled first calls took > 120 / > 120 / 66 s); the fully optimized one unrolls plain Python
`range` loops and its nl loops are short, and Mamba v1 / v2 issue 384 instructions in their loops (below
rolling.MIN_INSTRUCTIONS): their compiles shrank with tensor_tensor_scan's log-step form (> 420 s before); v3's
scan runs in nl.static_range, unrolled by definition. Before (1eca441, every first call compiled, on a loaded
machine): 10-105 s a first call, 12x-2016x nki.simulate's; the tutorials' simulate 18-33 s, Mamba's 16-22 s.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import logging
import os
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import nativelab  # noqa: F401
from nativelab import settings
from nativelab.kernels import nki as nk
from nativelab.kernels.ops import reference_rmsnorm
from nativelab.kernels.ops.attention import reference_attention_cte, reference_attention_tkg
from nativelab.kernels.ops.decode_weights import DecodeWeights
from nativelab.kernels.ops.mlp import reference_mlp
from nativelab.kernels.ops.qkv import reference_qkv
from nativelab.kernels.ops.rope import reference_rope
from nativelab.kernels.ops.transformer import reference_transformer_tkg_token
from nativelab.nki import rolling, simulate
from module_files import load  # public kernel files run as they are: their `import nki` is nativelab's

sample_ops = importlib.import_module("nativelab.kernels.ops.sample")  # the module (the package exports its op)


def timed(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


# A one-layer model's per-layer weights, in the order cases() makes them.
_LAYER_FIELDS = ("input_norms", "wqs", "wks", "wvs", "wos", "post_norms", "gates", "ups", "downs")


def _w(out_features, in_features, dt):
    return (torch.randn(out_features, in_features) * in_features ** -0.5).to(dt)


def cases(dt):
    """(name, NKI kernel, its inputs, PyTorch reference, its inputs): Lab 2's small Llama's shapes (dim 512, 8
    heads of 64, MLP 2048, a 512-position cache, vocab 32000) where a kernel is one of its pieces."""
    torch.manual_seed(0)
    x = torch.randn(1024, 1024, dtype=dt)
    y = torch.randn(1024, 1024, dtype=dt)
    w = torch.randn(1024, dtype=dt)
    a, b = torch.randn(512, 1024, dtype=dt), torch.randn(1024, 1024, dtype=dt)
    q, k, v = (torch.randn(1, 8, 128, 64, dtype=dt) for _ in range(3))
    rows, cos, sin = torch.randn(128, 512, dtype=dt), torch.randn(128, 64, dtype=dt), torch.randn(128, 64, dtype=dt)
    mlp_w = (_w(2048, 512, dt), _w(2048, 512, dt), _w(512, 2048, dt))
    qkv_w = (torch.randn(512, dtype=dt), _w(512, 512, dt), _w(512, 512, dt), _w(512, 512, dt))
    q1, k1, v1 = (torch.randn(1, 8, 1, 64, dtype=dt) for _ in range(3))
    k_cache, v_cache = torch.randn(1, 8, 512, 64, dtype=dt), torch.randn(1, 8, 512, 64, dtype=dt)
    pos = torch.tensor([300])
    layer = (qkv_w[0], *qkv_w[1:], _w(512, 512, dt), torch.randn(512, dtype=dt), *mlp_w)
    head, logits = _w(32000, 512, dt), torch.randn(1, 32000, dtype=dt)
    state = torch.tensor([7, 0])
    tkg_ref = lambda *t: reference_attention_tkg(*t[:3], t[3].clone(), t[4].clone(), t[5])  # noqa: E731
    final_norm = torch.randn(512, dtype=dt)
    one_layer = DecodeWeights(embed=head, **{f: [u] for f, u in zip(_LAYER_FIELDS, layer)}, final_norm=final_norm,
                              lm_head=head, k_caches=[k_cache.clone()], v_caches=[v_cache.clone()])
    tables = torch.randn(512, 64, dtype=dt), torch.randn(512, 64, dtype=dt)
    stack = nk.DecodeStack.prepare(one_layer, *tables, 8)  # the weights in the kernel's layouts, once

    def step_ref(tokens, pos, seed):  # the token and logits of reference_transformer_tkg_token
        logits = reference_transformer_tkg_token(tokens, pos, seed, one_layer, *tables, 8, 8, 1e-5)[:, -1]
        return logits.argmax(-1, keepdim=True), logits
    mlp_t = [nk.tiled(w_) for w_ in mlp_w]  # the kernels take weights laid out once, as the ops pass them
    return [
        ("add 1024x1024", nk.add_kernel, (x, y), lambda x, y: x + y, None),
        ("rmsnorm 1024x1024", nk.rmsnorm_kernel, (x, w, 1e-5), reference_rmsnorm, None),
        ("softmax 1024x1024", nk.softmax_kernel, (x,), nk.reference_softmax, None),
        ("matmul 512x1024x1024", nk.matmul_kernel, (a, b), lambda a, b: a @ b, None),
        ("rope 8x128x64", nk.rope_kernel, (q, cos, sin), reference_rope, None),
        ("mlp 128x512x2048", nk.mlp_kernel, (rows, *mlp_t), reference_mlp, (rows, *mlp_w)),
        ("mlp 1x512x2048", nk.mlp_kernel, (rows[:1], *mlp_t), reference_mlp, (rows[:1], *mlp_w)),
        ("qkv 128x512", nk.qkv_kernel, (rows[None], qkv_w[0], *map(nk.tiled, qkv_w[1:4]), cos, sin, 8, 8, 1e-5),
         reference_qkv, (rows[None], *qkv_w, cos, sin, 8, 8, 1e-5)),
        ("attention_cte 8x128x64", nk.attention_cte_kernel, (q, k, v), reference_attention_cte, None),
        ("attention_tkg 8x512x64", nk.attention_tkg_kernel, (q1, k1, v1, k_cache, v_cache, pos), tkg_ref,
         (q1, k1, v1, k_cache, v_cache, pos)),
        ("decode step, 1 layer", nk.transformer_step_kernel,
         (torch.tensor([[5]]), pos, state.clone(), *stack, 8, 8, 1e-5), step_ref,
         (torch.tensor([[5]]), pos, state.clone())),
        ("argmax 1x32000", nk.argmax_kernel, (logits,), lambda t: t.argmax(-1, keepdim=True).int(), None),
        ("top-p 1x32000", nk.top_p_kernel, (logits, -torch.log(sample_ops._uniform(state, logits.shape)).float(),
                                            0.8, 0.9),
         lambda t, s: sample_ops._sample(t, s, 0.8, 0, 0.9), (logits, state)),
    ]


# --first-call: what a kernel's first call costs with nothing cached, against nki.simulate on the same inputs.

MARK = "FIRSTCALL "  # the prefix of the lines a measuring child hands its parent (anything else it prints is not)
TUTORIAL_MATMUL = "src/nki_samples/tutorials/matrix_multiplication/matrix_multiplication_nki_kernels.py"
MAMBA = "nki/examples/fused_mamba/mamba_nki_kernels.py"  # in an aws-neuron-sdk checkout


def first_call_cases(dt, nki_samples: Path | None, neuron_sdk: Path | None) -> dict:
    """name -> a function building (kernel, inputs): a tiny add (what any first call costs), the library's kernels
    at cases()'s shapes, a 1024x2048 softmax; given the checkouts, nki-samples' matrix-multiplication tutorial
    kernels and aws-neuron-sdk's fused Mamba v1-v3, each at its own driver's shapes, with its driver's inputs."""
    found = {"add 128x128 (floor)": lambda: (nk.add_kernel, (torch.ones(128, 128, dtype=dt),) * 2)}
    found.update((name, lambda k=kernel, i=inputs: (k, i)) for name, kernel, inputs, _, _ in cases(dt))
    found["softmax 1024x2048"] = lambda: (nk.softmax_kernel, (torch.randn(1024, 2048, dtype=dt),))
    if nki_samples is not None:
        for label, kernel, shape in [("basic", "nki_matmul_basic_", (64, 128, 512)),
                                     ("tiled", "nki_matmul_tiled_", (4096, 1024, 2048)),
                                     ("hoisted", "nki_matmul_hoist_load_", (4096, 1024, 2048)),
                                     ("blocked", "nki_matmul_block_free_dimension_", (4096, 1024, 2048)),
                                     ("fully optimized", "nki_matmul_fully_optimized_", (4096, 1024, 2048))]:
            found[f"matmul {label} {'x'.join(map(str, shape))}"] = functools.partial(
                _tutorial_matmul, nki_samples / TUTORIAL_MATMUL, kernel, shape)
    if neuron_sdk is not None:
        for version in ("v1", "v2", "v3"):
            found[f"mamba {version} 256x2048x16"] = functools.partial(_mamba, neuron_sdk / MAMBA, version)
    return found


def _tutorial_matmul(path: Path, kernel: str, shape):
    """matrix_multiplication_torch.py's inputs: bf16 torch.rand, the kernel given lhs.T."""
    torch.manual_seed(0)
    m, k, n = shape
    lhs, rhs = torch.rand(m, k, dtype=torch.bfloat16), torch.rand(k, n, dtype=torch.bfloat16)
    return getattr(load(path, "nki_samples_matmul"), kernel), (lhs.T, rhs)


def _mamba(path: Path, version: str):
    """mamba_nki_kernels.py's driver: float32 NumPy arrays of ones (A: minus ones), batch 1, seq_len 2048, 256
    channels, state size 16. aws-neuron-sdk's NKI 0.5 example: nki-samples' copy is in the neuronxcc-era API,
    which nativelab does not serve (its `nisa.activation(op=..., data=...)` returns a tile)."""
    batch, seq_len, channels, state_size = 1, 2048, 256, 16
    delta = np.ones((batch, channels, seq_len), dtype=np.float32)
    u = np.ones((batch, channels, seq_len), dtype=np.float32)
    a = -np.ones((channels, state_size), dtype=np.float32)
    b = np.ones((batch, state_size, seq_len), dtype=np.float32)
    c = np.ones((batch, state_size, seq_len), dtype=np.float32)
    return getattr(load(path, "aws_neuron_sdk_mamba"), f"mamba_{version}"), (delta, u, a, b, c)


def _tensors(result) -> list:
    results = result if isinstance(result, (tuple, list)) else (result,)
    return [torch.from_numpy(r) if isinstance(r, np.ndarray) else r for r in results
            if isinstance(r, (torch.Tensor, np.ndarray))]


def first_call_child(args) -> None:
    """One measurement in this fresh process: the case's first call, compiled or nki.simulate'd; its seconds
    (and, compiled, the make_fx trace's and Inductor's from the compile log) on a MARK line, its outputs saved."""
    # `python bench/nki.py` puts bench/ first on sys.path, where this file would answer a kernel's `import nki`
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    name, how = args.first_call_child, args.how
    kernel, inputs = first_call_cases(getattr(torch, args.dtype), args.nki_samples, args.neuron_sdk)[name]()
    run = simulate(kernel) if how == "simulate" else kernel
    spans = []

    class Spans(logging.Handler):  # jit.py's "nki kernel %s: traced in %.2fs, %s for %s in %.2fs"
        def emit(self, record):
            if record.msg.startswith("nki kernel") and len(record.args) == 5:
                spans.append((record.args[1], record.args[4]))
    log = logging.getLogger("nativelab.compiler")
    log.addHandler(Spans())
    log.setLevel(logging.INFO)
    log.propagate = False
    print(MARK + "ready", flush=True)
    t0 = time.perf_counter()
    result = run(*inputs)
    seconds = time.perf_counter() - t0
    torch.save(_tensors(result), args.out)
    graphs = [t.source for t in getattr(kernel, "_traces", {}).values() if t.source is not None]
    print(MARK + json.dumps({"seconds": seconds, "trace": sum(t for t, _ in spans) if spans else None,
                             "compile": sum(c for _, c in spans) if spans else None,
                             "nodes": sum(len(g.graph.nodes) for g in graphs) if graphs else None,
                             "loops": sum(len(rolling.loop_bodies(g)) for g in graphs)}),
          flush=True)


def _measure(name: str, how: str, args, out: Path) -> dict | str:
    """Run one measurement in a fresh interpreter with fresh, empty compile caches (nativelab's compiled-graph
    cache and Inductor's: FX graph, AOTAutograd and C++ kernel caches); its limit counts from the moment its
    inputs are built. Returns the child's figures, or a string saying why there are none."""
    with tempfile.TemporaryDirectory(prefix="nki-first-call-") as tmp, tempfile.TemporaryFile() as err:
        env = dict(os.environ, **{settings.CACHE_DIR.name: f"{tmp}/neff",
                                  "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",  # Inductor's: its own variable
                                  settings.NKI_FIRST_CALL.name: "compile" if how == "compiled" else "interpret"})
        cmd = [sys.executable, __file__, "--first-call-child", name, "--how", how, "--out", str(out),
               "--dtype", args.dtype]
        cmd += ["--nki-samples", str(args.nki_samples)] if args.nki_samples else []
        cmd += ["--neuron-sdk", str(args.neuron_sdk)] if args.neuron_sdk else []
        cmd += ["--threads", str(args.threads)] if args.threads else []
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline, started, got, pending = time.monotonic() + args.startup_limit, False, None, b""
        try:
            while got is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return f"> {args.limit:g} s" if started else f"start > {args.startup_limit:g} s"
                if not sel.select(left):
                    continue
                chunk = os.read(proc.stdout.fileno(), 1 << 16)  # unbuffered: select sees every line still unread
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in map(bytes.decode, lines):
                    if line == MARK + "ready":
                        started, deadline = True, time.monotonic() + args.limit
                    elif line.startswith(MARK):
                        got = json.loads(line[len(MARK):])
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the child's session: it and Inductor's compile workers
            proc.wait()
            sel.close()
        if got is None:
            err.seek(0)
            lines = err.read().decode(errors="replace").strip().splitlines()
            return f"failed: {lines[-1] if lines else f'exit {proc.returncode}'}"[:60]
        return got


def _agree(a: Path, b: Path) -> str:
    """Whether a first call's outputs and nki.simulate's agree (as the table above checks kernels)."""
    got, want = torch.load(a), torch.load(b)
    try:
        for g, r in zip(got, want, strict=True):
            scale = max(1.0, r.float().abs().max().item()) if r.is_floating_point() else 1.0
            torch.testing.assert_close(g.float(), r.float(), rtol=3e-2, atol=3e-2 * scale)
    except (AssertionError, ValueError):
        return "DIFFER"
    return "same"


def first_call(args) -> None:
    """The --first-call table: each kernel's first call as a user gets it (NATIVELAB_NKI_FIRST_CALL's default:
    interpreted), its first call compiled (=compile: the trace and Inductor, and the compiled graph's size), and
    its nki.simulate call, each in a fresh process with empty caches."""
    chosen = [n for n in first_call_cases(getattr(torch, args.dtype), args.nki_samples, args.neuron_sdk)
              if not args.only or any(o in n for o in args.only)]
    hows = ("first", "compiled", "simulate")
    print(f"first calls: each in a fresh process with empty compile caches; limit {args.limit:g} s each")
    print(f"{'kernel':37s} {'first s':>7s} {'ratio':>5s} {'compiled s':>10s} {'trace s':>7s} {'Inductor s':>10s} "
          f"{'graph nodes':>11s} {'simulate s':>10s}  outputs")
    with tempfile.TemporaryDirectory(prefix="nki-first-call-out-") as outs:
        for name in chosen:
            files = {how: Path(outs, f"{how}.pt") for how in hows}
            got = {how: _measure(name, how, args, files[how]) for how in hows}
            f, c, s = (got[how] for how in hows)
            cell = lambda g: f"{g['seconds']:.2f}" if isinstance(g, dict) else g  # noqa: E731
            spans = isinstance(c, dict) and c["trace"] is not None
            trace, inductor = (f"{c['trace']:.2f}", f"{c['compile']:.2f}") if spans else ("-",) * 2
            nodes = (f"{c['nodes']}{' (loop)' if c['loops'] else ''}" if isinstance(c, dict) and c["nodes"]
                     else "-")
            ratio = f"{f['seconds'] / s['seconds']:4.1f}x" if isinstance(f, dict) and isinstance(s, dict) else "-"
            agree = {how: _agree(files[how], files["simulate"]) for how in ("first", "compiled")
                     if isinstance(got[how], dict) and isinstance(s, dict)}
            agree = ("same" if set(agree.values()) == {"same"} else
                     ", ".join(f"{how} {v}" for how, v in agree.items()) or "-")  # each against nki.simulate's
            print(f"{name:37s} {cell(f):>7s} {ratio:>5s} {cell(c):>10s} {trace:>7s} {inductor:>10s} {nodes:>11s} "
                  f"{cell(s):>10s}  {agree}", flush=True)
            for file in files.values():
                file.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="only the kernels whose names contain one of these")
    ap.add_argument("--skip-cpu", action="store_true", help="only the Trainium2 estimates (no compiles)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--first-call", action="store_true",
                    help="only the first-call table: first call, compiled first call (cold caches) vs nki.simulate")
    ap.add_argument("--nki-samples", type=Path, default=None,
                    help="an nki-samples checkout: --first-call adds its matrix-multiplication tutorial's kernels")
    ap.add_argument("--neuron-sdk", type=Path, default=None,
                    help="an aws-neuron-sdk checkout: --first-call adds its fused Mamba example's v1-v3")
    ap.add_argument("--limit", type=float, default=120.0, help="--first-call: seconds per measurement")
    ap.add_argument("--startup-limit", type=float, default=300.0, help=argparse.SUPPRESS)  # imports, inputs
    ap.add_argument("--first-call-child", default=None, help=argparse.SUPPRESS)  # one measurement, in a child
    ap.add_argument("--how", choices=["first", "compiled", "simulate"], help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.first_call_child:
        return first_call_child(args)
    if args.first_call:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
        return first_call(args)
    dt = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    if not args.skip_cpu:
        print(f"{'kernel':24s} {'NKI us':>10s} {'Inductor us':>12s} {'ratio':>7s} {'est. trn2 us':>13s}  bound")
        for name, kernel, inputs, ref, ref_inputs in cases(dt):
            if args.only and not any(o in name for o in args.only):
                continue
            ref_inputs = ref_inputs or inputs
            compiled_ref = torch.compile(ref)
            got, want = kernel(*inputs), ref(*ref_inputs)
            for g, r in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (got, want))):
                # the compiled GEMMs sum in another order than the reference: one bf16 step of an
                # intermediate (a projection before RoPE) moves a small output by a step of the large ones
                scale = max(1.0, r.float().abs().max().item()) if r.is_floating_point() else 1.0
                torch.testing.assert_close(g.float().reshape(r.shape), r.float(), rtol=3e-2, atol=3e-2 * scale)
            nki_us = statistics.median(timed(lambda: kernel(*inputs), args.iters) for _ in range(args.repeats))
            ref_us = statistics.median(timed(lambda: compiled_ref(*ref_inputs), args.iters)
                                       for _ in range(args.repeats))
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
