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
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
import types

import torch

import nativelab  # noqa: F401
from nativelab.kernels import nki as nk
from nativelab.kernels.ops import reference_rmsnorm
from nativelab.kernels.ops.attention import reference_attention_cte, reference_attention_tkg
from nativelab.kernels.ops.decode_weights import DecodeWeights
from nativelab.kernels.ops.mlp import reference_mlp
from nativelab.kernels.ops.qkv import reference_qkv
from nativelab.kernels.ops.rope import reference_rope
from nativelab.kernels.ops.transformer import reference_transformer_tkg_token

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
        ("attention_tkg 8x512x64", nk.attention_tkg_kernel, (q1, k1, v1, k_cache, v_cache, pos.float()), tkg_ref,
         (q1, k1, v1, k_cache, v_cache, pos)),
        ("decode step, 1 layer", nk.transformer_step_kernel,
         (torch.tensor([[5]]), pos, state.clone(), *stack, 8, 8, 1e-5), step_ref,
         (torch.tensor([[5]]), pos, state.clone())),
        ("argmax 1x32000", nk.argmax_kernel, (logits,), lambda t: t.argmax(-1, keepdim=True).int(), None),
        ("top-p 1x32000", nk.top_p_kernel, (logits, -torch.log(sample_ops._uniform(state, logits.shape)).float(),
                                            0.8, 0.9),
         lambda t, s: sample_ops._sample(t, s, 0.8, 0, 0.9), (logits, state)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="only the kernels whose names contain one of these")
    ap.add_argument("--skip-cpu", action="store_true", help="only the Trainium2 estimates (no compiles)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1: steadier on a shared machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
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
