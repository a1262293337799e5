"""The hand-written batch-1 decode kernels (csrc/decode.cpp) as host implementations of the kernel interface:
`transformer_tkg` (the whole decode step: per layer RMSNorm + fused QKV + RoPE + cache write, attention over
the filled cache, output projection, RMSNorm + SwiGLU; then the LM head), the core tier's one-token `qkv`,
`attention_tkg` and `mlp`, the sampler's race given its noise (`race`, the NKI top-p kernel's), and `matvec`.

Each host implementation has an `accepts(*args)` that the kernel interface asks at launch (on shapes and
dtypes only, no values): anything else (a prompt, a batch, a non-contiguous weight) takes the traced path."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from ...device import threads as device_threads
from ..ops.decode_weights import DecodeWeights
from . import build, tune

_DTYPES = (torch.bfloat16, torch.float32)


def _dense(*ts) -> bool:
    return all(t.is_contiguous() and t.dtype == ts[0].dtype for t in ts)


def transformer_tkg(x, pos, cos, sin, weights, caches, n_heads, n_kv_heads, eps, out):
    w = DecodeWeights.unflatten(weights, caches)
    build.extension().transformer_decode(x, pos, cos, sin, w.named(), n_heads, n_kv_heads, eps, out)


def _accepts_tkg(x, pos, cos, sin, weights, caches, n_heads, n_kv_heads, eps, out) -> bool:
    if not build.enabled() or x.dim() != 3 or x.shape[:2] != (1, 1) or x.dtype not in _DTYPES:
        return False
    if pos.numel() != 1 or pos.dtype not in (torch.int32, torch.int64) or torch.is_grad_enabled():
        return False
    if not _dense(x, cos, sin, out, *weights, *caches) or caches[0].shape[0] != 1:  # batch-1 caches
        return False
    return build.extension() is not None


transformer_tkg.accepts = _accepts_tkg


def matvec(w: torch.Tensor, h: torch.Tensor, out: torch.Tensor) -> None:
    """out (N) = w (N, K) @ h (K), fp32 accumulation (a test and benchmark entry point)."""
    build.extension().matvec_out(w, h, out)


def _one_token(x) -> bool:
    return x.dim() == 3 and x.shape[:2] == (1, 1) and x.dtype in _DTYPES


def _ready(*ts) -> bool:
    return build.enabled() and not torch.is_grad_enabled() and _dense(*ts) and build.extension() is not None


def qkv(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, q_out, k_out, v_out):
    build.extension().qkv_decode(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, q_out, k_out, v_out)


def _accepts_qkv(x, norm_w, wq, wk, wv, cos, sin, n_heads, n_kv_heads, eps, q_out, k_out, v_out) -> bool:
    return _one_token(x) and cos.shape[0] == 1 and _ready(x, norm_w, wq, wk, wv, cos, sin, q_out, k_out, v_out)


qkv.accepts = _accepts_qkv


def attention_tkg(q, k_new, v_new, k_cache, v_cache, pos, out):
    build.extension().attention_decode(q, k_new, v_new, k_cache, v_cache, pos, out)


def _accepts_attention(q, k_new, v_new, k_cache, v_cache, pos, out) -> bool:
    if q.dim() != 4 or q.shape[0] != 1 or q.shape[2] != 1 or q.dtype not in _DTYPES or k_cache.shape[0] != 1:
        return False
    return pos.numel() == 1 and pos.dtype in (torch.int32, torch.int64) and _ready(q, k_new, v_new, k_cache,
                                                                                   v_cache, out)


attention_tkg.accepts = _accepts_attention


def mlp(x, gate_w, up_w, down_w, norm_w, eps, residual, out):
    build.extension().mlp_decode(x, gate_w, up_w, down_w, norm_w, eps, residual, out)


def _accepts_mlp(x, gate_w, up_w, down_w, norm_w, eps, residual, out) -> bool:
    return _one_token(x) and _ready(x, gate_w, up_w, down_w, norm_w, out)


mlp.accepts = _accepts_mlp


def mlp_no_norm(x, gate_w, up_w, down_w, residual, out):
    build.extension().mlp_decode(x, gate_w, up_w, down_w, None, 0.0, residual, out)


def _accepts_mlp_no_norm(x, gate_w, up_w, down_w, residual, out) -> bool:
    return _one_token(x) and _ready(x, gate_w, up_w, down_w, out)


mlp_no_norm.accepts = _accepts_mlp_no_norm


def race(logits, exp_noise, temperature, top_k, top_p, out):
    build.extension().race_out(logits, exp_noise, temperature, top_k, top_p, out)


def _accepts_race(logits, exp_noise, temperature, top_k, top_p, out) -> bool:
    if logits.dim() != 2 or logits.dtype not in _DTYPES or exp_noise.dtype != torch.float32 or temperature <= 0.0:
        return False
    return (exp_noise.shape == logits.shape and out.dtype == torch.int32 and out.numel() == logits.shape[0]
            and logits.is_contiguous() and out.is_contiguous() and _ready(exp_noise))


race.accepts = _accepts_race


# The experimental tier's whole step from token ids (`transformer_tkg_token`): a DecodePlan binds the weights,
# caches and RoPE tables once; each launch passes the token, position, sampler state and outputs only.
# Tokens (1, T) at consecutive positions (T,): T == 1 is a decode step, T > 1 a prompt's prefill in the same
# plan (csrc/prefill.h: each weight read once for all T tokens), the logits the last token's only.


def _bind(weights, caches, rope_cos, rope_sin, n_heads, n_kv_heads, eps):
    """The plan over these (host) tensors: checked once here, its pointers reused by every step."""
    ext = build.extension()
    w = DecodeWeights.unflatten(weights, caches)
    plan = ext.DecodePlan(w.named(), rope_cos, rope_sin, n_heads, n_kv_heads, eps)
    # How its loops run (tune.py), per thread count: the device's team can change size between steps.
    shape = (w.n_layers, w.embed.shape[1], w.wqs[0].shape[0], w.wks[0].shape[0], w.gates[0].shape[0],
             w.lm_head.shape[0])
    kernel, most, threads, configs = Path(ext.__file__).parent.name, ext.max_tile_tokens(), [0], {}

    def config(n: int) -> tuple:
        if n not in configs:
            key = tune.cache_key(kernel, n, str(w.embed.dtype).removeprefix("torch."), shape)
            configs[n] = tune.config_for(plan, key, most).args(most)
        return configs[n]

    def step(tokens, pos, seed_state, temperature, top_k, top_p, logits, out):
        if torch.get_num_threads() != threads[0]:  # the first step on this many threads: forced, cached or measured
            n = threads[0] = torch.get_num_threads()
            # the first step on all the device's cores (a quiet machine) also tunes one thread now, not in a
            # timed run later when load shrinks the team
            if not configs and n == device_threads.ceiling():
                try:
                    for m in sorted({1, n}):
                        torch.set_num_threads(m)
                        config(m)
                finally:
                    torch.set_num_threads(n)
            plan.configure(*config(n))
        if temperature <= 0.0:
            plan.greedy(tokens, pos, seed_state, logits, out)
        else:  # the step and `sample`'s draw from its logits, in the one call
            plan.draw(tokens, pos, seed_state, logits, out, temperature, top_k, top_p)

    # What one launch moves through device memory, for the profiler's traffic count (a hand-written kernel's own
    # account; nativelab.profile.traffic): every weight but the embedding and the whole KV cache read, the
    # embedding and RoPE rows of the T tokens looked up; the cache rows of the T tokens, the logits and the
    # drawn token written.
    def size(ts):
        return sum(t.numel() * t.element_size() for t in ts)

    read_always = size(weights) - size([w.embed]) + size(caches)
    per_token = (w.embed[0].numel() * w.embed.element_size() + 2 * rope_cos[0].numel() * rope_cos.element_size(),
                 sum(c.shape[1] * c.shape[3] for c in caches) * caches[0].element_size())

    def traffic(tokens, pos, seed_state, temperature, top_k, top_p, logits, out):
        t = tokens.shape[1]
        read = read_always + t * per_token[0] + size([tokens, pos, seed_state])
        return read, t * per_token[1] + size([logits, out, seed_state])

    step.traffic = traffic
    step.plan = plan
    return step


# The launch's own arguments are tokens, pos and seed_state, then _bind's (bound into the plan), then the rest.
_BOUND = tuple(range(3, 3 + len(inspect.signature(_bind).parameters)))


def transformer_tkg_token(tokens, pos, seed_state, *args):
    """An unbound launch (a plan for this one call); the kernel interface binds once instead (see `bind`)."""
    n = len(_BOUND)
    _bind(*args[:n])(tokens, pos, seed_state, *args[n:])


def _accepts_token_call(tokens, pos, seed_state, temperature, top_k, top_p, logits, out) -> bool:
    """What a bound plan needs of a launch's own arguments (the rest was checked when it was bound)."""
    return (build.enabled() and not torch.is_grad_enabled() and tokens.dim() == 2 and tokens.shape[0] == 1
            and tokens.dtype in (torch.int32, torch.int64) and pos.numel() == tokens.shape[1]
            and pos.dtype in (torch.int32, torch.int64) and logits.is_contiguous() and out.numel() == 1
            and seed_state.dtype == torch.int64 and seed_state.is_contiguous() and logits.shape[-1] < 2 ** 24)


def _accepts_token(tokens, pos, seed_state, weights, caches, rope_cos, rope_sin, n_heads, n_kv_heads, eps,
                   temperature, top_k, top_p, logits, out) -> bool:
    if not _accepts_token_call(tokens, pos, seed_state, temperature, top_k, top_p, logits, out):
        return False
    dtype = weights[0].dtype  # the model's: _dense asks every weight and cache to share it
    if dtype not in _DTYPES or logits.dtype != dtype or rope_cos.dtype not in (dtype, torch.float32):
        return False
    if not _dense(*weights, *caches, logits) or not _dense(rope_cos, rope_sin):
        return False
    return caches[0].shape[0] == 1 and build.extension() is not None  # batch-1 caches


transformer_tkg_token.accepts = _accepts_token
transformer_tkg_token.bound = _BOUND
transformer_tkg_token.bind = _bind
transformer_tkg_token.accepts_call = _accepts_token_call
