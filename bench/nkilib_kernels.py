"""AWS's nki-library kernels through nativelab's Trainium2 estimate, one kernel at a time: rmsnorm_tkg, qkv (TKG,
fused RMSNorm), attention_tkg, output_projection_tkg, mlp (TKG, fused RMSNorm) and transformer_tkg's 6 layers, run
unmodified from a checkout outside the repository, at the guide's small Llama's decode shapes.

    python bench/nkilib_kernels.py --nkilib /tmp/nkilib

`--nkilib` is a checkout (or `git archive`) of https://github.com/aws-neuron/nki-library (README.md's figures: tag
2.29); nothing of it is in this repository. This script is glue only, as bench/nkilib_transformer_tkg.py (whose
loader, with its workaround for nki-library's `remainderIFused` bug, and weight layout it reuses): it makes each
kernel's inputs and prints `kernel.estimate(...)` (traced on meta tensors, not run, not compiled): est. us on one
NeuronCore-v3, the bounding engine, each engine's busy us and the instruction count. It is the driver of README.md's
table under "nki-library 2.29, kernel by kernel" (`kernel.estimate(...)` at the same decode shapes), so that table
and bench/lab2_vs_nkilib.py's nki-library column can be re-run whenever nki/cost.py changes.

The shapes (README.md, same section): batch 1, one token, 256 prior cache positions, 8 query heads over the ONE kv
head nki-library's attention block takes, d_head 64, H 512, I 2048, bf16. How each kernel is called:
- rmsnorm_tkg (a subkernel, not @nki.jit): in a jit wrapper that hands it input (1, 1, H) and gamma (1, H) in HBM
  and an HBM output (128, 1, H / 128), as nki-library's test_rmsnorm_tkg does (its output aliases an HBM input);
- qkv: input (1, 1, H), fused weights (H, (8 + 2) x 64) = [Q | K | V] columns, fused RMSNorm (gamma (1, H)), output
  in HBM, BSD layout (qkv routes one token to qkv_tkg);
- attention_tkg (a subkernel): in nki-library's own test wrapper's shape (test_attention_tkg.py's attn_tkg_wrapper):
  Q (d, 8) and K active (d, 1) loaded into SBUF (cfg.qk_in_sb, as the attention block hands them over), V active
  (1, 1, 1, d) in HBM, the caches with K transposed (1, 1, d, 256) / V (1, 1, 256, d), the mask (256, 1, 8, 1), the
  output in HBM (1, 8, d, 1); an SbufManager over SBUF less 16 KiB, as that wrapper's;
- output_projection_tkg: attention (d, 1, 8, 1) in HBM, weight (8 x d, H);
- mlp: hidden (1, 1, H), gate / up (H, I), down (I, H), fused RMSNorm (gamma (1, H)); one token routes it to TKG;
- transformer_tkg: `nki.jit(transformer_tkg)`, 6 layers, bench/nkilib_transformer_tkg.py's inputs (its weight
  layout of the same 1-KV-head small Llama, its caches, its mask, cos / sin and cache position for one step).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from dataclasses import dataclass

import torch

import nativelab  # noqa: F401  (registers the device and the `nki` namespace)
from module_files import sibling

H, I, HEADS, KV_HEADS, D, PRIOR = 512, 2048, 8, 1, 64, 256
BF = torch.bfloat16
EPS = 1e-6  # nki-library's default (README: `mlp_torch(..., 1e-6, ...)`, transformer_tkg's eps=1e-6)
ENGINES = ("tensor", "vector", "scalar", "dma")
# the pieces, as bench/lab2_vs_nkilib.py names them, and the nki-library kernel each is measured by
KERNELS = {
    "rmsnorm": "rmsnorm_tkg",
    "qkv": "qkv (TKG)",
    "attention": "attention_tkg (256 prior)",
    "output projection": "output_projection_tkg",
    "mlp": "mlp (TKG)",
    "6-layer stack": "transformer_tkg, 6 layers",
}


tkg = sibling("nkilib_transformer_tkg")


@dataclass
class Row:
    """One kernel's estimate, in the units the tables print."""
    kernel: str
    us: float
    bound: str
    busy: tuple  # us: tensor / vector / scalar / dma
    instructions: int

    @classmethod
    def of(cls, kernel: str, e) -> "Row":
        return cls(kernel, e.seconds * 1e6, e.bound, tuple(e.busy.get(k, 0.0) * 1e6 for k in ENGINES),
                   len(e.events))


def _wrappers():
    """jit wrappers for the two subkernels that are not @nki.jit themselves (nki-library's sys.path is set)."""
    import nki
    import nki.isa as nisa
    import nki.language as nl
    from nkilib.core.attention.attention_tkg import attention_tkg
    from nkilib.core.attention.attention_tkg_utils import AttnTKGConfig
    from nkilib.core.subkernels.rmsnorm_tkg import rmsnorm_tkg
    from nkilib.core.utils.allocator import SbufManager
    from nkilib.core.utils.logging import Logger

    @nki.jit
    def rmsnorm_tkg_kernel(x, gamma):
        b, s, h = x.shape
        out = nl.ndarray((128, b * s, h // 128), dtype=x.dtype, buffer=nl.shared_hbm)
        rmsnorm_tkg(x, gamma, out, eps=EPS)
        return out

    @nki.jit
    def attention_tkg_kernel(q, k_active, v_active, k_prior, v_prior, mask):
        d, bhs = q.shape
        bs, s_active, s_prior = k_active.shape[1], v_active.shape[2], v_prior.shape[2]
        heads = bhs // (bs * s_active)
        cfg = AttnTKGConfig(bs=bs, q_head=heads, s_active=s_active, curr_sprior=s_prior, full_sprior=s_prior,
                            d_head=d, tp_k_prior=False, qk_in_sb=True)
        sbm = SbufManager(0, nl.tile_size.total_available_sbuf_size - 16 * 1024, Logger("SBM"))
        sbm.open_scope()
        out = nl.ndarray((bs, heads, d, s_active), dtype=q.dtype, buffer=nl.shared_hbm)
        q_sb = sbm.alloc_stack(q.shape, dtype=q.dtype, buffer=nl.sbuf)
        k_sb = sbm.alloc_stack(k_active.shape, dtype=k_active.dtype, buffer=nl.sbuf)
        nisa.dma_copy(q_sb, q)
        nisa.dma_copy(k_sb, k_active)
        attention_tkg(q_sb, k_sb, v_active, k_prior, v_prior, mask, out, cfg, sbm)
        sbm.close_scope()
        return out

    return rmsnorm_tkg_kernel, attention_tkg_kernel


def measure(root: str) -> dict:
    """{piece name (KERNELS): Row} of nki-library's kernels from the checkout at `root`, on the cost model of the
    nativelab this process imports (all six: a few seconds, transformer_tkg's trace the longest).
    nki-library's allocator logs each scope's SBUF use to stdout at INFO; those lines are dropped, the rest kept."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            return _measure(root)
    finally:
        sys.stdout.writelines(line for line in out.getvalue().splitlines(True) if not line.startswith("[INFO] "))


def _measure(root: str) -> dict:
    transformer_tkg = tkg.load_nkilib(root)  # sys.path and the remainderIFused workaround
    import nki
    from nkilib.core.mlp.mlp import mlp
    from nkilib.core.output_projection.output_projection_tkg import output_projection_tkg
    from nkilib.core.qkv.qkv import qkv
    from nkilib.core.utils.common_types import NormType

    rmsnorm_tkg_kernel, attention_tkg_kernel = _wrappers()
    g = torch.Generator().manual_seed(0)
    rnd = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g) * scale).to(BF)  # noqa: E731
    x, gamma = rnd(1, 1, H), rnd(1, H)
    rows = {}
    rows["rmsnorm"] = rmsnorm_tkg_kernel.estimate(x, gamma)
    w_qkv = rnd(H, (HEADS + 2 * KV_HEADS) * D, scale=H ** -0.5)  # [Q | K | V] columns
    rows["qkv"] = qkv.estimate(x, w_qkv, fused_norm_type=NormType.RMS_NORM, gamma_norm_weights=gamma, norm_eps=EPS,
                               d_head=D, num_q_heads=HEADS, num_kv_heads=KV_HEADS)
    mask = torch.ones(PRIOR, 1, HEADS, 1, dtype=torch.uint8)
    rows["attention"] = attention_tkg_kernel.estimate(rnd(D, HEADS), rnd(D, 1), rnd(1, 1, 1, D), rnd(1, 1, D, PRIOR),
                                                      rnd(1, 1, PRIOR, D), mask)
    rows["output projection"] = output_projection_tkg.estimate(rnd(D, 1, HEADS, 1), rnd(HEADS * D, H, scale=H ** -0.5))
    rows["mlp"] = mlp.estimate(x, rnd(H, I, scale=H ** -0.5), rnd(H, I, scale=H ** -0.5), rnd(I, H, scale=I ** -0.5),
                               normalization_weights_tensor=gamma, normalization_type=NormType.RMS_NORM, eps=EPS)
    rows["6-layer stack"] = _transformer_estimate(nki.jit(transformer_tkg))
    return {name: Row.of(KERNELS[name], e) for name, e in rows.items()}


def _transformer_estimate(kernel):
    """transformer_tkg's estimate for one decode step, its inputs laid out by bench/nkilib_transformer_tkg.py
    (on CPU: an estimate traces, it runs nothing)."""
    ref = tkg.models(0)
    w, (ks, vs), around = tkg.kernel_weights(ref, "cpu"), tkg.kernel_caches(ref, "cpu"), tkg.Around(ref, "cpu")
    x, cos, sin, mask, pid = around.inputs(torch.tensor([1]), torch.tensor([PRIOR // 2]))  # token 1 at 128
    return kernel.estimate(x, w["W_qkvs"], w["W_outs"], w["W_gates"], w["W_ups"], w["W_downs"], w["W_gamma_qkvs"],
                           w["W_gamma_mlps"], ks, vs, cos, sin, mask, None, pid, num_layers=len(ks), eps=EPS)


def table(rows: dict) -> str:
    out = ["| kernel | est. us | bound | busy us (tensor / vector / scalar / dma) | instructions |",
           "|---|---|---|---|---|"]
    for r in rows.values():
        busy = " / ".join("0" if b == 0 else f"{b:.2f}" for b in r.busy)
        out.append(f"| {r.kernel} | {r.us:.2f} | {r.bound} | {busy} | {r.instructions} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nkilib", required=True, help="a checkout of aws-neuron/nki-library (README's figures: 2.29)")
    args = ap.parse_args()
    rows = measure(args.nkilib)
    print(f"nki-library ({args.nkilib}) kernel.estimate(...) at the small Llama's decode shapes, one NeuronCore-v3 "
          f"(trn2), cost model of {os.path.dirname(nativelab.__file__)}")
    print(table(rows))


if __name__ == "__main__":
    main()
