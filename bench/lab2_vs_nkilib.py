"""Lab 2's NKI decode step, piece by piece, against AWS's nki-library kernels on the same work: the Trainium2
estimate (nki/cost.py, one NeuronCore-v3) of each piece of `transformer_step_kernel`, at the shapes nki-library's
figures were taken at, beside those figures.

    python bench/lab2_vs_nkilib.py [--nkilib /tmp/nkilib]

The shapes (README.md, "nki-library 2.29, kernel by kernel"): the guide's small Llama at decode, batch 1, one
token, 256 cache positions, 8 query heads over ONE kv head (the head count nki-library's attention block takes),
d_head 64, H 512, I 2048, bf16. Each of our pieces is the function the step kernel runs (kernels/nki/transformer.py,
attention.py), in a wrapper kernel that loads its inputs from HBM and stores its output, as nki-library's take
theirs: rmsnorm (rmsnorm_rows), qkv (RMSNorm + the fused projection + RoPE: qkv_rows), attention (decode_heads
over the cache, with the new token), output projection (+ residual), mlp (RMSNorm + SwiGLU + residual:
mlp_residual), and the 6-layer stack (the step kernel's layers, hidden row in and out, no embedding or head).

nki-library's figures are kernel.estimate() of its kernels, run unmodified from nki-library 2.29 (ddbca35) through
the same cost model. With `--nkilib DIR` (a checkout of aws-neuron/nki-library outside the repository) they are
measured in this run by bench/nkilib_kernels.py, on the cost model this process imports; without it they are the
figures README.md records (its table under "kernel by kernel", NKILIB below), which go stale when nki/cost.py
changes. The output says which it used. Target (issue 46): ours within 1.3x of theirs, row by row.
"""

from __future__ import annotations

import argparse
import os

import torch

import nativelab  # noqa: F401
from nativelab.kernels.nki import DecodeStack
from nativelab.kernels.nki import transformer as tr
from nativelab.kernels.nki.attention import decode_heads
from nativelab.kernels.nki.rmsnorm import load_broadcast, rmsnorm_rows
from nativelab.kernels.ops.decode_weights import DecodeWeights
from nativelab.nki import isa as nisa
from nativelab.nki import jit
from nativelab.nki import language as nl
from module_files import sibling

# nki-library 2.29's estimates at these shapes, us, and busy us (tensor / vector / scalar / dma), from README.md:
# the fallback when no checkout is given (--nkilib measures them instead)
NKILIB = {
    "rmsnorm": (2.41, (0.32, 0.99, 0.11, 0.01)),
    "qkv": (5.90, (1.39, 3.82, 0.11, 1.82)),
    "attention": (5.00, (1.12, 2.87, 0.11, 0.19)),
    "output projection": (3.40, (0.85, 1.90, 0.0, 1.45)),
    "mlp": (43.47, (12.27, 33.59, 5.65, 17.36)),
    "6-layer stack": (348.75, (85.60, 298.18, 34.24, 124.99)),
}
DIM, HEADS, KV_HEADS, D, INTER, PRIOR, LAYERS = 512, 8, 1, 64, 2048, 256, 6
P = 128


def _row(x):
    t = nl.ndarray((1, x.shape[-1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def _store(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _rope_rows(rope_cos, rope_sin, heads):
    c = nl.ndarray((1, heads, D), dtype=rope_cos.dtype, buffer=nl.sbuf)
    s = nl.ndarray((1, heads, D), dtype=rope_sin.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=rope_cos.ap(pattern=[[D, 1], [0, heads], [1, D]], offset=0))
    nisa.dma_copy(dst=s, src=rope_sin.ap(pattern=[[D, 1], [0, heads], [1, D]], offset=0))
    return c, s


def _before(pos_f, heads, s_len):
    before = nl.ndarray((heads, s_len), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=before, pattern=[[1, s_len]])
    pos_t = nl.ndarray((heads, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=pos_t, src=pos_f.ap(pattern=[[0, heads], [1, 1]]))
    nisa.tensor_scalar(dst=before, data=before, op0=nl.less, operand0=pos_t)
    return before


@jit
def rmsnorm_piece(x, w):
    return _store(rmsnorm_rows(nl.ndarray((1, DIM), dtype=x.dtype, buffer=nl.sbuf), _row(x), load_broadcast(w, 1),
                               1e-5))


@jit
def qkv_piece(x, w, wqkv, rope_cos, rope_sin):
    c, s = _rope_rows(rope_cos, rope_sin, HEADS)
    q, k, v = tr.qkv_rows(_row(x), load_broadcast(w, 1), wqkv, c, s, HEADS, KV_HEADS, 1e-5, P)
    return _store(q), _store(k), _store(v)


@jit
def attention_piece(q, k, v, k_cache, v_cache, pos_f):
    q_t, k_t = tr._columns(_row(q), HEADS, D), tr._columns(_row(k), KV_HEADS, D)
    att = decode_heads(nl.ndarray((P, HEADS * D // P), dtype=q.dtype, buffer=nl.sbuf), q_t, k_t, _row(v), k_cache,
                       v_cache, _before(pos_f, HEADS, k_cache.shape[1]), D ** -0.5, q.dtype, P)
    return _store(att)


@jit
def output_projection_piece(att, wo, x):
    t = nl.ndarray(att.shape, dtype=att.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=att)
    return _store(tr.output_projection(t, wo, _row(x), HEADS * D, P))


@jit
def mlp_piece(x, w, gate, up, down):
    return _store(tr.mlp_residual(_row(x), load_broadcast(w, 1), gate, up, down, 1e-5, P))


@jit
def stack_piece(x, pos, pos_f, rope_cos, rope_sin, input_norms, wqkvs, wos, post_norms, gates, ups, downs, k_caches,
                v_caches):
    pos_i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=pos_i, src=tr.low_words(pos, 1))
    c, s = _rope_rows(rope_cos, rope_sin, HEADS)
    before = _before(pos_f, HEADS, k_caches[0].shape[2])
    h = _row(x)
    for i in range(len(wqkvs)):
        h = tr._layer(h, 0, pos_i, before, c, s, load_broadcast(input_norms[i], 1), wqkvs[i], wos[i],
                      load_broadcast(post_norms[i], 1), gates[i], ups[i], downs[i], k_caches[i], v_caches[i], HEADS,
                      KV_HEADS, 1e-5, P)
    return _store(h)


def _w(out_features, in_features):
    return (torch.randn(out_features, in_features) * in_features ** -0.5).to(torch.bfloat16)


def nkilib_figures(root: str | None) -> tuple[dict, str]:
    """{piece: (us, busy us)} of nki-library's side and where they came from: measured from the checkout at
    `root` by bench/nkilib_kernels.py (loaded by path: bench/ is not a package), else README.md's record."""
    if root is None:
        return NKILIB, "README.md's recorded figures (nki-library 2.29; pass --nkilib DIR to measure them)"
    rows = sibling("nkilib_kernels").measure(root)
    return ({name: (r.us, r.busy) for name, r in rows.items()},
            f"measured now from {root} by bench/nkilib_kernels.py, on this cost model")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nkilib", help="a checkout of aws-neuron/nki-library to measure its side from (default: "
                                     "README.md's recorded figures)")
    opts = ap.parse_args()
    torch.manual_seed(0)
    bf = torch.bfloat16
    weights = DecodeWeights(
        embed=_w(64, DIM), input_norms=[torch.randn(DIM, dtype=bf) for _ in range(LAYERS)],
        wqs=[_w(HEADS * D, DIM) for _ in range(LAYERS)], wks=[_w(KV_HEADS * D, DIM) for _ in range(LAYERS)],
        wvs=[_w(KV_HEADS * D, DIM) for _ in range(LAYERS)], wos=[_w(DIM, HEADS * D) for _ in range(LAYERS)],
        post_norms=[torch.randn(DIM, dtype=bf) for _ in range(LAYERS)],
        gates=[_w(INTER, DIM) for _ in range(LAYERS)], ups=[_w(INTER, DIM) for _ in range(LAYERS)],
        downs=[_w(DIM, INTER) for _ in range(LAYERS)], final_norm=torch.randn(DIM, dtype=bf), lm_head=_w(64, DIM),
        k_caches=[torch.randn(1, KV_HEADS, PRIOR, D, dtype=bf) for _ in range(LAYERS)],
        v_caches=[torch.randn(1, KV_HEADS, PRIOR, D, dtype=bf) for _ in range(LAYERS)])
    tables = torch.randn(PRIOR, D, dtype=bf), torch.randn(PRIOR, D, dtype=bf)
    st = DecodeStack.prepare(weights, *tables, HEADS)  # the weights in the step kernel's layouts
    x, pos = torch.randn(1, DIM, dtype=bf), torch.tensor([PRIOR - 1])
    row = lambda n: torch.randn(1, n, dtype=bf)  # noqa: E731
    cache = st.k_caches[0][0], st.v_caches[0][0]  # [KV, S, D]
    pieces = {
        "rmsnorm": (rmsnorm_piece, (x, st.input_norms[0])),
        "qkv": (qkv_piece, (x, st.input_norms[0], st.wqkvs[0], *tables)),
        "attention": (attention_piece, (row(HEADS * D), row(KV_HEADS * D), row(KV_HEADS * D), *cache, pos.float())),
        "output projection": (output_projection_piece, (torch.randn(P, HEADS * D // P, dtype=bf), st.wos[0], x)),
        "mlp": (mlp_piece, (x, st.post_norms[0], st.gates[0], st.ups[0], st.downs[0])),
        "6-layer stack": (stack_piece, (x, pos, pos.float(), *tables, st.input_norms, st.wqkvs, st.wos, st.post_norms,
                                        st.gates, st.ups, st.downs, st.k_caches, st.v_caches)),
    }
    figures, source = nkilib_figures(opts.nkilib)
    print(f"est. trn2 us on one NeuronCore-v3, cost model of {os.path.dirname(nativelab.__file__)}; "
          "busy us: tensor / vector / scalar / dma")
    print(f"nki-library: {source}")
    print(f"{'piece':18s} {'ours':>8s} {'nki-library':>12s} {'ratio':>6s}  {'ours busy':>28s}  {'nki-library busy':>28s}")
    for name, (kernel, args) in pieces.items():
        e = kernel.estimate(*args)
        busy = " / ".join(f"{e.busy.get(k, 0.0) * 1e6:.2f}" for k in ("tensor", "vector", "scalar", "dma"))
        theirs, their_busy = figures[name]
        print(f"{name:18s} {e.seconds * 1e6:8.2f} {theirs:12.2f} {e.seconds * 1e6 / theirs:5.2f}x  {busy:>28s}  "
              f"{' / '.join(f'{b:.2f}' for b in their_busy):>28s}")


if __name__ == "__main__":
    main()
