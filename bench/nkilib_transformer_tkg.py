"""AWS's megakernel through nativelab's Trainium2 estimate: nki-library's `transformer_tkg`, run unmodified from a
checkout outside the repository, as the decode step of the guide's small Llama, under `nativelab.check`.

    python bench/nkilib_transformer_tkg.py --nkilib /tmp/nkilib [--tokens 4]

`--nkilib` is a checkout (or `git archive`) of https://github.com/aws-neuron/nki-library; nothing of it is in
this repository. This script is glue only: it puts the checkout's `src/nkilib_src` on sys.path, works around
nki-library's own bug on the way (below), lays out the model's weights as transformer_tkg takes them, and runs
a greedy decode loop on the `neuron` device under `Check(name, tokens=True)`. Each token is

  1. ONE launch of `nki.jit(transformer_tkg)` (all 6 layers: RMSNorm + QKV + RoPE + attention over the KV cache,
     the cache write, output projection, residual, RMSNorm + MLP, residual), launched on its own: a standalone
     kernel, priced by its own nki/cost.py estimate;
  2. ONE compiled graph (`torch.compile(backend="neuron")`): final RMSNorm + LM head + argmax, and the next
     token's inputs to the kernel (its embedding row, its RoPE cos/sin rows, the attention mask and the cache
     write position), all on the device, as Lab 2's Generator feeds the token and position back. The argmax
     is nativelab's sample kernel at temperature 0, as the core tier's step draws (a plain `argmax` is a CPU
     fallback on the device, the guide's Step 6).

So a token is two launches (a kernel and a graph): the least a kernel launched outside a graph allows. The
tokens are read once, at the end (one host sync per run, as Generator.generate). Each generated token is one
`watch.step("token")`, the call `Check(tokens=True)` makes per token Generator.generate returns, so the
estimate's host loop (host_step_s) is charged once per token. The prompt's prefill runs before the check
(nativelab's base tier, on CPU, fills the KV caches), so the figures are decode only.

The model: `Llama.random("small", seed=0)` in bf16 (dim 512, 6 layers, 8 heads of 64, I 2048, vocab 32000),
with one change: transformer_tkg's attention block takes one KV head per core (8 query heads over it), and the
guide's small Llama has 8, so its K and V projections are cut to their first head (GQA 8:1). Correctness: every
step's logits are compared with nativelab's base tier of that same 1-KV-head model, decoding the same tokens on
CPU in bf16 (the base tier's own cache and RoPE tables).

nki-library's bug worked around here (and only here; README "nki-library's own bugs met on the way"):
- `core/mlp/mlp_tkg/mlp_tkg_constants.py` declares `remainderIFused: int` without a default and its only
  constructor call never passes it (TypeError before any instruction); the field is read nowhere, so its
  dataclass's __init__ is wrapped to default it to 0.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import time

import torch
import torch.nn.functional as F

import nativelab  # noqa: F401  (registers the device and the `nki` namespace)
from nativelab.check import Check, Trainium2
from nativelab.check.estimate import estimate
from nativelab.device import cpu_info
from nativelab.kernels import ops as K
from nativelab.kernels.ops.sample import seed_state
from nativelab.models.llama import Llama

PROMPT = [1, 15043, 29892, 590, 1024, 338]  # bench/check_estimate.py's
CTX = 256  # KV cache positions the kernel attends over (the README's kernel table: "cache 256")
DEV = "neuron"


def load_nkilib(root: str):
    """transformer_tkg from the checkout, with the driver-only workaround applied."""
    src = os.path.join(os.path.abspath(root), "src", "nkilib_src")
    if not os.path.isdir(os.path.join(src, "nkilib")):
        raise SystemExit(f"--nkilib {root}: no src/nkilib_src/nkilib there (a checkout of aws-neuron/nki-library)")
    here = os.path.dirname(os.path.abspath(__file__))  # bench/nki.py would shadow the `nki` package
    sys.path[:] = [src] + [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from nkilib.core.mlp.mlp_tkg import mlp_tkg_constants
    from nkilib.experimental.transformer.transformer_tkg import transformer_tkg

    cls = mlp_tkg_constants.MLPTKGConstantsDimensionSizes
    if any(f.name == "remainderIFused" and f.default is dataclasses.MISSING for f in dataclasses.fields(cls)):
        init = cls.__init__

        def __init__(self, *a, **k):  # nki-library's bug: the field has no default and nobody passes it
            k.setdefault("remainderIFused", 0)
            init(self, *a, **k)

        cls.__init__ = __init__
    return transformer_tkg


def models(seed: int = 0, dtype=torch.bfloat16):
    """The guide's small Llama with its K/V projections cut to one head, as nativelab's base tier (bf16, CPU)."""
    source = Llama.random("small", seed=seed)
    cfg = dataclasses.replace(source.cfg, n_kv_heads=1)
    sd = source.state_dict()
    for k in list(sd):
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            sd[k] = sd[k][: cfg.head_dim].clone()
    ref = Llama(cfg, "base")
    ref.load_state_dict(sd)
    ref = ref.to(dtype).eval()
    ref.setup_cache()
    return ref


def kernel_weights(ref, dev: str = DEV) -> dict:
    """The per-layer lists transformer_tkg takes, on the device: W_qkv (H, (8 + 2) x 64) = [Q | K | V] columns,
    W_out (8 x 64, H), W_gate / W_up (H, I), W_down (I, H), the norms' gammas (1, H)."""
    t = lambda x: x.detach().t().contiguous().to(dev)  # noqa: E731  (nn.Linear keeps (out, in))
    w = {k: [] for k in ("W_qkvs", "W_outs", "W_gates", "W_ups", "W_downs", "W_gamma_qkvs", "W_gamma_mlps")}
    for layer in ref.layers:
        a, m = layer.self_attn, layer.mlp
        w["W_qkvs"].append(t(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])))
        w["W_outs"].append(t(a.o_proj.weight))
        w["W_gates"].append(t(m.gate_proj.weight))
        w["W_ups"].append(t(m.up_proj.weight))
        w["W_downs"].append(t(m.down_proj.weight))
        w["W_gamma_qkvs"].append(layer.input_layernorm.weight.detach().view(1, -1).to(dev))
        w["W_gamma_mlps"].append(layer.post_attention_layernorm.weight.detach().view(1, -1).to(dev))
    return w


def kernel_caches(ref, dev: str = DEV) -> tuple[list, list]:
    """The base tier's caches (B, 1, S, d) after the prefill, as the kernel's: K transposed (B, 1, d, CTX),
    V (B, 1, CTX, d)."""
    ks = [layer.self_attn.k_cache[:, :, :CTX].transpose(-1, -2).contiguous().to(dev) for layer in ref.layers]
    vs = [layer.self_attn.v_cache[:, :, :CTX].contiguous().to(dev) for layer in ref.layers]
    return ks, vs


class Around(torch.nn.Module):
    """What runs around the kernel, one compiled graph per token: the final RMSNorm, LM head and argmax of the
    kernel's output, then the next token's kernel inputs (embedding, RoPE rows, mask, cache write position)."""

    def __init__(self, ref, dev: str = DEV):
        super().__init__()
        cfg = ref.cfg
        self.n_heads, self.half = cfg.n_heads, cfg.head_dim // 2
        self.embed = ref.embed_tokens.weight.detach().to(dev)
        self.lm_head = ref.lm_head.weight.detach().to(dev)
        self.norm = copy.deepcopy(ref.norm).to(dev)
        self.cos = ref.rope_cos[:, : self.half].to(torch.bfloat16).to(dev)  # (max_seq_len, d/2): HF's halves
        self.sin = ref.rope_sin[:, : self.half].to(torch.bfloat16).to(dev)
        self.cols = torch.arange(CTX, device=dev)
        self.seed_state = seed_state(0, dev)

    def inputs(self, token, pos):
        """token (1,) and pos (1,) -> X (1, 1, H), cos / sin (d/2, 1, 1), the cascaded mask (CTX, 1, heads, 1):
        the cache's rows before pos and the last column (the active token's, in nki-library's convention), and
        the cache write position (1, 1)."""
        x = F.embedding(token.view(1, 1), self.embed)
        cos = self.cos[pos].view(self.half, 1, 1)
        sin = self.sin[pos].view(self.half, 1, 1)
        seen = (self.cols < pos) | (self.cols == CTX - 1)
        mask = seen.view(CTX, 1, 1, 1).expand(CTX, 1, self.n_heads, 1).contiguous()
        return x, cos, sin, mask, pos.view(1, 1).to(torch.int32)

    def forward(self, hidden, pos):
        logits = F.linear(self.norm(hidden), self.lm_head)
        token = K.sample(logits.view(1, -1).float(), self.seed_state, 0.0).view(1)  # greedy, as core's step
        return (logits, token, *self.inputs(token, pos + 1))


def decode(kernel, w, ks, vs, step, first_inputs, positions, eps, check=None):
    """len(positions) tokens, the first from `first_inputs` (Around.inputs of the prefill's token); returns
    (tokens, per-step logits on the device)."""
    x, cos, sin, mask, pid = first_inputs
    out, logits = [], []
    for i in range(len(positions)):
        h = kernel(x, w["W_qkvs"], w["W_outs"], w["W_gates"], w["W_ups"], w["W_downs"], w["W_gamma_qkvs"],
                   w["W_gamma_mlps"], ks, vs, cos, sin, mask, None, pid, num_layers=len(ks), eps=eps)
        lg, token, x, cos, sin, mask, pid = step(h, positions[i: i + 1])
        out.append(token)
        logits.append(lg)
        if check is not None:
            check.watch.step("token")  # what Check(tokens=True) does per token Generator.generate returns
    return torch.cat(out).cpu().tolist(), logits  # one host read at the end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nkilib", required=True, help="a checkout of aws-neuron/nki-library")
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    transformer_tkg = load_nkilib(args.nkilib)
    import nki

    kernel = nki.jit(transformer_tkg)
    ref = models(args.seed)
    cfg = ref.cfg
    with torch.no_grad():
        # prefill: the base tier on CPU fills its caches; its argmax is the first token
        lg = ref(torch.tensor([PROMPT]), torch.arange(len(PROMPT)))
        first = lg[0, -1].argmax().view(1)
        w, around = kernel_weights(ref), Around(ref)
        step = torch.compile(around, backend="neuron", fullgraph=True)
        positions = torch.arange(len(PROMPT), len(PROMPT) + args.tokens, device=DEV)
        first_inputs = around.inputs(first.to(DEV), positions[:1])  # the prefill's product, before the check
        # warm-up (outside the check): the kernel's trace and the graph's compile, paid once per shape
        t0 = time.perf_counter()
        ks, vs = kernel_caches(ref)
        decode(kernel, w, ks, vs, step, first_inputs, positions[:1], cfg.norm_eps)
        warm = time.perf_counter() - t0
        ks, vs = kernel_caches(ref)  # the warm-up wrote one cache row: start again from the prefill's caches
        t0 = time.perf_counter()
        with Check("nki-library transformer_tkg", tokens=True) as c:
            tokens, logits = decode(kernel, w, ks, vs, step, first_inputs, positions, cfg.norm_eps, check=c)
        wall = time.perf_counter() - t0
        # the base tier decodes the same tokens on CPU: each step's logits against the kernel path's
        # (and both against the same model in float32: the size of bf16's own error over 6 layers)
        ref32 = models(args.seed, torch.float32)
        ref32(torch.tensor([PROMPT]), torch.arange(len(PROMPT)))
        errs, errs32, base32, agree = [], [], [], 0
        feed = first
        for i in range(args.tokens):
            at = torch.tensor([len(PROMPT) + i])
            want = ref(feed.view(1, 1), at)[0, -1].float()
            exact = ref32(feed.view(1, 1), at)[0, -1]
            got = logits[i].cpu().view(-1).float()
            errs.append((got - want).abs().max().item())
            errs32.append((got - exact).abs().max().item())
            base32.append((want - exact).abs().max().item())
            agree += int(want.argmax().item() == tokens[i])
            feed = torch.tensor([tokens[i]])
    print(f"nki-library transformer_tkg ({args.nkilib}), the guide's small Llama with 1 KV head, bf16, greedy, "
          f"{args.tokens} tokens after a {len(PROMPT)}-token prompt; warm-up {warm:.1f} s, checked run {wall:.1f} s")
    print(f"tokens: {tokens}")
    print(f"against the base tier (CPU, bf16): argmax agrees on {agree}/{args.tokens} steps; max |logit error| "
          f"per step {', '.join(f'{e:.3f}' for e in errs)} (logits' max |value| {logits[0].abs().max().item():.2f})")
    print(f"against float32 (same model, CPU): transformer_tkg {', '.join(f'{e:.3f}' for e in errs32)}; "
          f"the base tier in bf16 {', '.join(f'{e:.3f}' for e in base32)}")
    w_ = c.watch
    e = estimate(w_, Trainium2(), w_.steps)
    n = max(e["counts"]["tokens"], 1)
    print(f"est. trn2 tok/s: {1.0 / e['seconds_per']:.1f} ({e['seconds_per'] * 1e3:.3f} ms per token)")
    print("per token (ms): " + ", ".join(f"{p} {v * 1e3:.3f}" for p, v in e["parts_per"].items()))
    cn = e["counts"]
    print(f"per token: {cn['launches'] / n:.2f} launches (graphs and standalone kernels), {cn['nki_launches'] / n:.2f} "
          f"NKI launches, {cn['eager_ops'] / n:.2f} eager ops, {cn['kernel_boundaries'] / n:.0f} kernel boundaries, "
          f"{cn['ops'] / n:.0f} ops, {cn['fallback_calls'] / n:.2f} fallbacks, {cn['sync_calls'] / n:.2f} syncs")
    print("by work (ms per token): " + ", ".join(f"{k} {v / n * 1e3:.3f}" for k, v in e["by_work"].items()))
    for name, st in w_.nki.items():
        print(f"NKI {name}: {st.calls} launches, {st.est_seconds / st.calls * 1e6:.2f} us each, "
              f"{st.instructions} instructions")
    print(f"CPU: {cpu_info.describe()}")


if __name__ == "__main__":
    main()
