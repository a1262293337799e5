"""Lab 2's kernels as PyTorch custom ops: wrap_nki() + @nki_op, the pattern of Lab 1 Step 4.

Each kernel is an NKI kernel from the library (nativelab.kernels.nki, the guide's nkilib: nki.language /
nki.isa code, traced once per shape and compiled): wrap_nki makes it launchable on the device, @nki_op makes
the function that launches it a custom op (one opaque node in a torch.compile graph). The tiers call the ops:
llama_nki_core/ and llama_nki_experimental/.

On this CPU each launch is checked against Trainium2's limits and estimated from the kernel's trace, then computed
by what the kernel lowers to here (nativelab/kernels/nki/host.py: the library's C++ and Inductor-compiled PyTorch,
tested equal to the kernel's own code). `python run.py --kernels cpu` calls those CPU kernels directly instead,
without the NKI layer: the baseline that shows what the checks and estimate cost. NATIVELAB_NKI_LOWER=0 runs the
kernels' own traced code, compiled (what you edit in an NKI kernel runs then; much slower here).
"""

import torch

from nativelab.kernels import nki as nkilib
from nativelab.kernels import nki_op, wrap_nki

KERNELS = "nki"  # "nki": the NKI kernels; "cpu": the library's CPU kernels called directly (see use() below)

mlp_kernel = wrap_nki(nkilib.mlp_kernel)


@nki_op("nki_lab::mlp", mutates_args=())
def nki_mlp(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor) -> torch.Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x)) in one kernel; weights as nn.Linear.weight ([out, in]), which nkilib
    lays out for the Tensor Engine ([P, in / P, out]) on their first call and keeps: no launch transposes them."""
    if KERNELS == "cpu":
        return cpu_mlp(x, gate_w, up_w, down_w)
    gate, up, down = nkilib.prepared(gate_w), nkilib.prepared(up_w), nkilib.prepared(down_w)
    return mlp_kernel(x.reshape(-1, x.shape[-1]), gate, up, down).reshape(x.shape)


# The other kernels, registered the same way.
rmsnorm_kernel = wrap_nki(nkilib.rmsnorm_kernel)
rope_kernel = wrap_nki(nkilib.rope_kernel)
attention_prefill_kernel = wrap_nki(nkilib.attention_cte_kernel)
attention_decode_kernel = wrap_nki(nkilib.attention_tkg_kernel)
step_kernel = wrap_nki(nkilib.transformer_step_kernel)


@nki_op("nki_lab::rmsnorm", mutates_args=())
def nki_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, in float32."""
    if KERNELS == "cpu":
        return cpu_rmsnorm(x, weight, eps)
    return rmsnorm_kernel(x.reshape(-1, x.shape[-1]), weight, eps).reshape(x.shape)


@nki_op("nki_lab::rope", mutates_args=())
def nki_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, H, T, D) with the (T, D) tables of the positions, half-split pairs (HF convention)."""
    if KERNELS == "cpu":
        return cpu_rope(x, cos, sin)
    return rope_kernel(x, cos, sin)


@nki_op("nki_lab::attn", mutates_args=("k_cache", "v_cache"))
def nki_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             pos: torch.Tensor) -> torch.Tensor:
    """Attention of q (B, H, T, D) with grouped-query k, v (B, KV, T, D) at positions pos (T,), written into the
    static caches. A prompt (T > 1, from position 0) attends causally over itself (the CTE kernel); a decode
    step (T == 1) attends over the cache's positions before it and itself (TKG)."""
    if KERNELS == "cpu":
        return cpu_attn(q, k, v, k_cache, v_cache, pos)
    if q.shape[2] > 1:  # the prompt attends over its own k, v; its rows go into the caches for the steps after
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
        return attention_prefill_kernel(q, k, v)
    return attention_decode_kernel(q, k, v, k_cache, v_cache, pos)  # it writes k, v into the caches at pos


@nki_op("nki_lab::layers", mutates_args=("caches",))
def nki_layers(tokens: torch.Tensor, pos: torch.Tensor, weights: list[torch.Tensor], stack: list[torch.Tensor],
               caches: list[torch.Tensor], n_heads: int, n_kv_heads: int, eps: float) -> torch.Tensor:
    """The experimental tier's mega-kernel, for one decode token per sequence, tokens (B, 1) at position pos (1,):
    the embedding, every layer (RMSNorm + QKV + RoPE, cache write + attention, output projection, RMSNorm + MLP,
    residuals), the final norm and the LM head -> logits (B, 1, vocab). `stack`: the weights prepared once for
    the kernel (`model.decode_stack`, nkilib.DecodeStack); `weights`: the same in PyTorch's layouts, for the CPU
    kernels (`model.decode_weights()`); `caches`: the KV caches both write."""
    if KERNELS == "cpu":
        return cpu_layers(tokens, pos, weights, stack, caches, n_heads, n_kv_heads, eps)
    s = _stack(weights, stack, caches, n_heads)
    tokens = tokens.to(torch.int64)  # the kernel reads int64 ids (a prompt may come as int32): one signature
    scratch = torch.empty(2, dtype=torch.int64, device=tokens.device)  # no draw counted
    _, logits = step_kernel(tokens, pos, scratch, *s, n_heads, n_kv_heads, eps)
    return logits.reshape(tokens.shape[0], 1, -1)


@nki_op("nki_lab::layers_token", mutates_args=("seed_state", "caches"))
def nki_layers_token(tokens: torch.Tensor, pos: torch.Tensor, seed_state: torch.Tensor, weights: list[torch.Tensor],
                     stack: list[torch.Tensor], caches: list[torch.Tensor], n_heads: int, n_kv_heads: int, eps: float,
                     temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The same mega-kernel from token ids to the next token: tokens (B, T) at consecutive positions pos (T,)
    (a decode step, or a whole prompt) -> the token drawn (B,) (argmax at temperature 0, else top-k / top-p
    from the [seed, counter] seed_state, which advances once)."""
    if KERNELS == "cpu":
        return cpu_layers_token(tokens, pos, seed_state, weights, stack, caches, n_heads, n_kv_heads, eps,
                                temperature, top_k, top_p)
    s = _stack(weights, stack, caches, n_heads)
    tokens = tokens.to(torch.int64)  # the kernel reads int64 ids (a prompt may come as int32): one signature
    scratch = torch.empty(2, dtype=torch.int64, device=tokens.device)  # for launches whose draw is not counted
    t_len = tokens.shape[1]
    for t in range(t_len):  # a prompt: one launch a token, each a decode step over the cache before it
        counted = t == t_len - 1 and temperature <= 0.0  # greedy: the kernel's argmax is the draw
        token, logits = step_kernel(tokens[:, t:t + 1], pos[t:t + 1], seed_state if counted else scratch, *s,
                                    n_heads, n_kv_heads, eps)
    if temperature > 0.0:
        return draw(logits, seed_state, temperature, top_k, top_p)
    return token.reshape(-1)


def draw(logits, seed_state, temperature, top_k, top_p):
    """The token (B,) drawn from logits (B, vocab) as the mega-kernel's step draws it, advancing seed_state: top-p
    by the NKI sampler (the library's noise), else the library's sampler (argmax at temperature 0; top-k has no
    NKI version yet)."""
    if temperature > 0.0 and top_k == 0:
        return nkilib.sample_top_p(logits, seed_state, temperature, top_p)
    return sample(logits, seed_state, temperature, top_k, top_p)


def _stack(weights, stack, caches, n_heads):
    """The step kernel's weights: the model's, in the kernel's layouts (laid out at setup_cache, looked up here, laid
    out again for a weight changed or replaced since), and the stack's RoPE tables; the last step's, unless one of
    these tensors was replaced or written since."""
    def prepare():
        st = nkilib.DecodeStack.unflatten(stack, caches)
        return nkilib.DecodeStack.prepare(DecodeWeights.unflatten(weights, caches), st.rope_cos, st.rope_sin, n_heads)
    return nkilib.made_once(f"nki_ops.stack/{n_heads}", weights, [*stack, *caches], prepare)


def use(kernels: str) -> None:
    """What the ops run (`python run.py --kernels`): "nki", the NKI kernels above, the code that would run on
    Trainium, checked and estimated at each new shape and computed by what they lower to on this CPU; or "cpu",
    the library's CPU kernels (PyTorch compiled by Inductor, hand-written C++ for the one-token decode step)
    called directly, the same values without the NKI layer."""
    global KERNELS
    if kernels not in ("nki", "cpu"):
        raise ValueError(f"kernels: expected 'nki' or 'cpu', got {kernels!r}")
    KERNELS = kernels


# --- the CPU path: the library's kernels (nativelab.kernels.ops), registered the same way (wrap_nki of a PyTorch
# function that computes into the outputs it is given is a wrap_kernel kernel).
from nativelab.kernels.ops.attention import attention_cte_kernel, attention_tkg_kernel  # noqa: E402
from nativelab.kernels.ops.decode_weights import DecodeWeights  # noqa: E402
from nativelab.kernels.ops.mlp import mlp_kernel_no_norm  # noqa: E402
from nativelab.kernels.ops.rmsnorm import rmsnorm_kernel as rmsnorm_cpu_kernel  # noqa: E402
from nativelab.kernels.ops.rope import rope_kernel as rope_cpu_kernel  # noqa: E402
from nativelab.kernels.ops.sample import sample  # noqa: E402
from nativelab.kernels.ops.transformer import transformer_tkg_kernel, transformer_tkg_token_kernel  # noqa: E402

mlp_cpu = wrap_nki(mlp_kernel_no_norm)
rmsnorm_cpu = wrap_nki(rmsnorm_cpu_kernel)
rope_cpu = wrap_nki(rope_cpu_kernel)
attention_prefill_cpu = wrap_nki(attention_cte_kernel)
attention_decode_cpu = wrap_nki(attention_tkg_kernel)
layers_decode_cpu = wrap_nki(transformer_tkg_kernel)
layers_decode_token_cpu = wrap_nki(transformer_tkg_token_kernel)


def cpu_mlp(x, gate_w, up_w, down_w):
    out = torch.empty_like(x)
    mlp_cpu(x, gate_w, up_w, down_w, False, out)
    return out


def cpu_rmsnorm(x, weight, eps):
    out = torch.empty_like(x)
    rmsnorm_cpu(x, weight, eps, out)
    return out


def cpu_rope(x, cos, sin):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rope_cpu(x, cos, sin, out)
    return out


def cpu_attn(q, k, v, k_cache, v_cache, pos):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[2] > 1:
        attention_prefill_cpu(q, k, v, out)
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
    else:
        attention_decode_cpu(q, k, v, k_cache, v_cache, pos, out)
    return out


def cpu_layers(tokens, pos, weights, stack, caches, n_heads, n_kv_heads, eps):
    w, s = DecodeWeights.unflatten(weights, caches), nkilib.DecodeStack.unflatten(stack, caches)
    x = torch.nn.functional.embedding(tokens, w.embed)
    out = torch.empty(x.shape[0], x.shape[1], w.lm_head.shape[0], dtype=x.dtype, device=x.device)
    layers_decode_cpu(x, pos, s.rope_cos[pos], s.rope_sin[pos], weights, caches, n_heads, n_kv_heads, eps, out)
    return out


def cpu_layers_token(tokens, pos, seed_state, weights, stack, caches, n_heads, n_kv_heads, eps, temperature, top_k,
                     top_p):
    w, s = DecodeWeights.unflatten(weights, caches), nkilib.DecodeStack.unflatten(stack, caches)
    logits = torch.empty(tokens.shape[0], 1, w.lm_head.shape[0], dtype=w.embed.dtype, device=w.embed.device)
    out = torch.empty(tokens.shape[0], dtype=torch.int64, device=w.embed.device)
    layers_decode_token_cpu(tokens, pos, seed_state, weights, caches, s.rope_cos, s.rope_sin, n_heads, n_kv_heads,
                            eps, float(temperature), int(top_k), float(top_p), logits, out)
    return out
