"""What the library's NKI kernels lower to on a CPU host (`kernel.lowering`, nki/jit.py): each kernel's
launch on `neuron` (or CPU) tensors is checked and estimated from its NKI trace, then computed by the library's
kernels for the CPU: the PyTorch ones in kernels/ops (compiled by Inductor) and, for one decode token, the
hand-written C++ behind them (kernels/cpu). They run `on="device"`: at the launch, launching those kernels as
the NKI kernel's work (one queued unit under its name), so the Python of the next launch overlaps this one's
work. They compute what the NKI kernel computes, up to the rounding of another fp32 accumulation order:
tests/test_nki_lowering.py runs each against its kernel's own code, so an edited kernel whose lowering no longer
matches fails there (NATIVELAB_NKI_LOWER=0 runs the edited code).

The NKI kernels take weights in the Tensor Engine's layout [P, K / P, N] (prepared once, layouts.py); the CPU
kernels read PyTorch's [out, in]. Each weight is laid back out once here (`_host_weights`) and kept with the
memory it came from, so every later launch, and the C++ plan bound over them, reuses it."""

from __future__ import annotations

import importlib
import sys

import torch

from ..ops.decode_weights import DecodeWeights
from ..ops.transformer import transformer_tkg_token_kernel
from .attention import attention_cte_kernel, attention_tkg_kernel
from .layouts import untiled
from .mlp import mlp_kernel
from .rope import rope_kernel
from .sample import top_p_kernel
from .transformer import transformer_step_kernel

# the modules (the ops package exports functions of the same names)
ops_attention, ops_mlp, ops_rope, ops_sample = (importlib.import_module(f"nativelab.kernels.ops.{m}")
                                                for m in ("attention", "mlp", "rope", "sample"))
_kept: dict = {}  # the data pointers of the tiled weights -> (the layout made, those tensors)
_data_ptr = torch.Tensor.data_ptr


def _host_weights(tiled: list[torch.Tensor], make):
    """make() for these tiled weights, made once per memory (their data pointers, then shapes and dtypes). The entry
    holds the tensors (a device tensor's host view holds its memory), so no other tensor can come to have those
    pointers while it is kept; an entry whose tensors nobody else holds any more is dropped at the next miss."""
    key = tuple(map(_data_ptr, tiled))
    entry = _kept.get(key)
    if entry is not None and any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(tiled, entry[1])):
        entry = None  # the same memory seen as other shapes
    if entry is None:
        for k in [k for k, (_, ts) in _kept.items() if all(sys.getrefcount(t) <= 3 for t in ts)]:
            del _kept[k]  # only this cache (and getrefcount's argument, the loop's name) still refers to them
        with torch.inference_mode(False), torch.no_grad():  # ordinary tensors: a compiled kernel keys on their versions
            entry = _kept[key] = (make(), list(tiled))
    return entry[0]


@transformer_step_kernel.lowering(on="device")
def transformer_step_on_host(tokens, pos, seed_state, embed, rope_cos, rope_sin, input_norms, wqkvs, wos, post_norms,
                             gates, ups, downs, final_norm, lm_head, k_caches, v_caches, n_heads, n_kv_heads, eps):
    """The library's whole-step kernel (ops/transformer.py: the C++ DecodePlan for one sequence, else its
    PyTorch reference compiled), greedy: the same token, logits, cache rows and counter."""
    dim, d = embed.shape[1], rope_cos.shape[1]
    hd, kvd, inter = n_heads * d, n_kv_heads * d, gates[0].shape[-1]

    def layout():
        qkv = [untiled(w, dim) for w in wqkvs]
        # copies of the rest too: the reference path bakes its weights and keys on their versions, which a
        # tensor made in inference mode (a host view, a model set up under torch.inference_mode) does not have
        return DecodeWeights(
            embed=embed.clone(), input_norms=[w.clone() for w in input_norms], wqs=[w[:hd] for w in qkv],
            wks=[w[hd:hd + kvd] for w in qkv], wvs=[w[hd + kvd:] for w in qkv], wos=[untiled(w, hd) for w in wos],
            post_norms=[w.clone() for w in post_norms], gates=[untiled(w, dim) for w in gates],
            ups=[untiled(w, dim) for w in ups], downs=[untiled(w, inter) for w in downs],
            final_norm=final_norm.clone(), lm_head=untiled(lm_head, dim), k_caches=[], v_caches=[])

    w = _host_weights([embed, *input_norms, *wqkvs, *wos, *post_norms, *gates, *ups, *downs, final_norm, lm_head],
                      layout)
    weights, _ = w.flat()
    b = tokens.shape[0]
    logits = torch.empty(b, 1, embed.shape[0], dtype=embed.dtype, device=embed.device)
    token = torch.empty(b, dtype=torch.int64, device=embed.device)
    transformer_tkg_token_kernel(tokens, pos, seed_state, weights, [*k_caches, *v_caches], rope_cos, rope_sin,
                                 n_heads, n_kv_heads, eps, 0.0, 0, 1.0, logits, token)
    return token.reshape(b, 1), logits.reshape(b, -1)


@mlp_kernel.lowering(on="device")
def mlp_on_host(x, gate, up, down):
    """ops/mlp.py's SwiGLU (the C++ one-token MLP, else its PyTorch reference compiled)."""
    dim, inter = x.shape[1], gate.shape[-1]
    g, u, dn = _host_weights([gate, up, down], lambda: (untiled(gate, dim), untiled(up, dim), untiled(down, inter)))
    out = torch.empty((1, *x.shape), dtype=x.dtype, device=x.device)
    ops_mlp.mlp_kernel_no_norm(x.reshape(1, *x.shape), g, u, dn, False, out)
    return out.reshape(x.shape)


@rope_kernel.lowering(on="device")
def rope_on_host(x, cos, sin):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    ops_rope.rope_kernel(x, cos, sin, out)
    return out


@attention_cte_kernel.lowering(on="device")
def attention_cte_on_host(q, k, v):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ops_attention.attention_cte_kernel(q, k, v, out)
    return out


@attention_tkg_kernel.lowering(on="device")
def attention_tkg_on_host(q, k_new, v_new, k_cache, v_cache, pos):
    """ops/attention.py's decode attention (the C++ one for one sequence, else its PyTorch reference compiled):
    the output, and k_new / v_new written into the caches at pos, as the kernel writes them."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ops_attention.attention_tkg_kernel(q, k_new, v_new, k_cache, v_cache, pos, out)
    return out


@top_p_kernel.lowering(on="device")
def top_p_on_host(logits, exp_noise, temperature, top_p):
    """ops/sample.py's race given the noise (on the host the C++ sampler's, cpu/csrc/sample.h; else compiled by
    Inductor): the token the library's sampler draws from the same noise."""
    out = torch.empty((logits.shape[0], 1), dtype=torch.int32, device=logits.device)
    ops_sample.race_kernel(logits, exp_noise, float(temperature), 0, float(top_p), out)
    return out
