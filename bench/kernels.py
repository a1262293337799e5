"""Each library kernel against the unfused plain-PyTorch reference, on the device, measured in one run.

    python bench/kernels.py [--dtype bfloat16] [--iters 50] [--device cuda]

Shapes are the guide's `small` Llama at decode (batch 1, one token; hidden 512, 8 heads of 64, MLP 2048,
vocabulary 32000). Eager reference = the reference implementation run op by op on the device; compiled
reference = the same through torch.compile(backend="neuron") (with --device cuda: the Triton kernels against
the reference eager on CUDA and compiled by Inductor). Targets: mlp and qkv >= 1.5x the unfused eager
reference; transformer_tkg (a whole decode step) >= 2x the unfused eager layers; sample top-p >= 5x the
sort + multinomial path.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import nativelab  # noqa: F401
from nativelab.kernels import ops
from nativelab.kernels.ops.sample import seed_state
from nativelab.models.llama import Llama


def timed(fn, iters: int, device: str) -> float:
    sync = (torch.cuda if device == "cuda" else torch.neuron).synchronize
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters * 1e6


def sort_multinomial_top_p(logits, temperature=0.8, top_p=0.9):
    """The usual top-p sampler (what the base tier does): sort + cumsum + multinomial."""
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    cum = torch.cumsum(sorted_p, dim=-1)
    sorted_p = sorted_p.masked_fill(cum - sorted_p > top_p, 0.0)
    choice = torch.multinomial(sorted_p / sorted_p.sum(-1, keepdim=True), 1)
    return order.gather(-1, choice)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="neuron", choices=["neuron", "cuda"])
    ap.add_argument("--skip-compiled", action="store_true", help="no compiled reference (saves the compiles)")
    args = ap.parse_args()
    dt = getattr(torch, args.dtype)
    d = args.device
    backend = "inductor" if d == "cuda" else "neuron"
    torch.manual_seed(0)
    x = torch.randn(1, 1, 512, dtype=dt).to(d)
    nw = torch.ones(512, dtype=dt).to(d)
    g, u, dn = [(torch.randn(*s, dtype=dt) * 0.02).to(d) for s in ((2048, 512), (2048, 512), (512, 2048))]
    wq, wk, wv = [(torch.randn(512, 512, dtype=dt) * 0.02).to(d) for _ in range(3)]
    cos, sin = torch.randn(1, 64, dtype=dt).to(d), torch.randn(1, 64, dtype=dt).to(d)
    logits = torch.randn(1, 32000).to(d)
    state = seed_state(0, d)
    model = Llama.from_size("small").to(dt).eval().to(d)
    model.setup_cache()
    pos = torch.tensor([5]).to(d)
    h = model.embed_tokens(torch.tensor([[7]], dtype=torch.int32).to(d))
    rows = (h, pos, model.rope_cos[pos].to(dt), model.rope_sin[pos].to(dt))
    w = model.decode_weights()
    hs, labels = (torch.randn(64, 512, dtype=dt) * 0.1).to(d), torch.randint(0, 32000, (64,)).to(torch.int32).to(d)

    cases = {
        "rmsnorm": (lambda: ops.rmsnorm(x, nw), lambda: ops.reference_rmsnorm(x, nw)),
        "mlp (norm+SwiGLU+residual)": (lambda: ops.mlp(x, g, u, dn, nw, 1e-5, True),
                                       lambda: ops.reference_mlp(x, g, u, dn, nw, 1e-5, True)),
        "qkv (norm+proj+rope)": (lambda: ops.qkv(x, nw, wq, wk, wv, cos, sin, 8, 8),
                                 lambda: ops.reference_qkv(x, nw, wq, wk, wv, cos, sin, 8, 8)),
        "sample top-p 0.9 (V=32000)": (lambda: ops.sample(logits, state, 0.8, 0, 0.9),
                                       lambda: sort_multinomial_top_p(logits)),
        "transformer_tkg (6 layers)": (lambda: ops.transformer_tkg(*rows, *w.flat(), 8, 8, 1e-5),
                                       lambda: ops.reference_transformer_tkg(*rows, w, 8, 8, 1e-5)),
        "linear_cross_entropy 64x32000": (lambda: ops.linear_cross_entropy(hs, model.lm_head.weight, labels),
                                          lambda: ops.reference_linear_cross_entropy(hs, model.lm_head.weight,
                                                                                      labels)),
    }
    where = torch.cuda.get_device_name() if d == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {d} ({where}), {args.dtype}, medians of {args.repeats}")
    print(f"  {'kernel':<28} {'kernel us':>10} {'ref eager us':>13} {'ref compiled us':>16} {'vs eager':>9}")
    for name, (kern, ref) in cases.items():
        ref_c = None if args.skip_compiled else torch.compile(ref, backend=backend)
        with torch.inference_mode():
            ks, es, cs = [], [], []
            for _ in range(args.repeats):
                ks.append(timed(kern, args.iters, d))
                es.append(timed(ref, args.iters, d))
                cs.append(timed(ref_c, args.iters, d) if ref_c else float("nan"))
        k, e, c = statistics.median(ks), statistics.median(es), statistics.median(cs)
        print(f"  {name:<28} {k:>10.1f} {e:>13.1f} {c:>16.1f} {e / k:>8.2f}x")
    if d == "neuron":
        draw_alone(args)


def draw_alone(args) -> None:
    """The sampler's draw alone on host tensors, as the experimental tier's one-kernel step runs it after its
    logits (DecodePlan.draw): the C++ draw against the traced `sample` kernel (Inductor's code) it replaces."""
    from nativelab.kernels.cpu import build

    ext = build.extension()
    if ext is None:
        return
    logits = torch.randn(1, 32000).to(getattr(torch, args.dtype))
    state, out = seed_state(0, "cpu"), torch.empty(1, dtype=torch.int64)
    print(f"  draw alone (host, V=32000, {args.dtype} logits, {ext.isa()} build), us:")
    for label, (t, k, p) in {"top-p 0.9, T 0.8": (0.8, 0, 0.9), "top-k 50, T 0.8": (0.8, 50, 1.0)}.items():
        mine, traced = [], []
        with torch.inference_mode():
            for _ in range(args.repeats):
                mine.append(timed(lambda: ext.sample_out(logits, state, t, k, p, out), args.iters, "neuron"))
                traced.append(timed(lambda: ops.sample(logits, state, t, k, p), args.iters, "neuron"))
        a, b = statistics.median(mine), statistics.median(traced)
        print(f"    {label:<24} C++ {a:>8.1f}   traced sample {b:>8.1f}   {b / a:>6.2f}x")


if __name__ == "__main__":
    main()
