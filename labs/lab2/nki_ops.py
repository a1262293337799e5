"""Lab 2's kernels as PyTorch custom ops: wrap_nki() + @nki_op, the pattern of Lab 1 Step 4.

Each kernel is an NKI kernel from the library (nativelab.kernels.nki, the guide's nkilib: nki.language /
nki.isa code, traced once per shape and compiled): wrap_nki makes it launchable on the device, @nki_op makes
the function that launches it a custom op (one opaque node in a torch.compile graph). The tiers call the ops:
llama_nki_core/ and llama_nki_experimental/. `python run.py --kernels nki|cpu` chooses what the ops run.
"""

import torch

from nativelab.kernels import nki as nkilib
from nativelab.kernels import nki_op, wrap_nki

KERNELS = "cpu"  # "nki": the NKI kernels; "cpu": the library's CPU kernels, faster here (see use() below)

mlp_kernel = wrap_nki(nkilib.mlp_kernel)


@nki_op("nki_lab::mlp", mutates_args=())
def nki_mlp(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor) -> torch.Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x)) in one kernel; weights as nn.Linear.weight ([out, in])."""
    if KERNELS == "cpu":
        return cpu_mlp(x, gate_w, up_w, down_w)
    return mlp_kernel(x.reshape(-1, x.shape[-1]), gate_w, up_w, down_w).reshape(x.shape)


# The other kernels, registered the same way.
rmsnorm_kernel = wrap_nki(nkilib.rmsnorm_kernel)
rope_kernel = wrap_nki(nkilib.rope_kernel)
attention_prefill_kernel = wrap_nki(nkilib.attention_cte_kernel)
attention_decode_kernel = wrap_nki(nkilib.attention_tkg_kernel)
layer_decode_kernel = wrap_nki(nkilib.decode_layer_kernel)
lm_head_kernel = wrap_nki(nkilib.lm_head_kernel)
argmax_kernel = wrap_nki(nkilib.argmax_kernel)


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
    if q.shape[2] > 1:
        out = attention_prefill_kernel(q, k, v)
    else:
        out = attention_decode_kernel(q, k, v, k_cache, v_cache, pos.to(torch.float32))
    k_cache.index_copy_(2, pos, k)  # the kernels read the cache; the write at pos is the op's
    v_cache.index_copy_(2, pos, v)
    return out


@nki_op("nki_lab::layers", mutates_args=("caches",))
def nki_layers(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weights: list[torch.Tensor],
               caches: list[torch.Tensor], n_heads: int, n_kv_heads: int, eps: float) -> torch.Tensor:
    """The experimental tier's mega-kernel, for one decode token's hidden state x (B, 1, dim): every layer
    (RMSNorm + QKV + RoPE, cache write + attention, output projection, RMSNorm + MLP, residuals), the final
    norm and the LM head -> logits (B, 1, vocab). `weights, caches = model.decode_weights().flat()`: the model's
    tensors (nativelab's DecodeWeights, which names each one) as the kernel's two lists."""
    if KERNELS == "cpu":
        return cpu_layers(x, pos, cos, sin, weights, caches, n_heads, n_kv_heads, eps)
    w = DecodeWeights.unflatten(weights, caches)
    x = nki_layer_stack(x, pos, cos, sin, w, n_heads, n_kv_heads, eps)
    return lm_head_kernel(x.reshape(x.shape[0], -1), w.final_norm, w.lm_head, eps).reshape(x.shape[0], 1, -1)


@nki_op("nki_lab::layers_token", mutates_args=("seed_state", "caches"))
def nki_layers_token(tokens: torch.Tensor, pos: torch.Tensor, seed_state: torch.Tensor, weights: list[torch.Tensor],
                     caches: list[torch.Tensor], rope_cos: torch.Tensor, rope_sin: torch.Tensor, n_heads: int,
                     n_kv_heads: int, eps: float, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The same mega-kernel from token ids to the next token: tokens (B, T) at consecutive positions pos (T,)
    (a decode step, or a whole prompt) -> the token drawn (B,) (argmax at temperature 0, else top-k / top-p
    from the [seed, counter] seed_state, which advances)."""
    if KERNELS == "cpu":
        return cpu_layers_token(tokens, pos, seed_state, weights, caches, rope_cos, rope_sin, n_heads, n_kv_heads, eps,
                                temperature, top_k, top_p)
    w = DecodeWeights.unflatten(weights, caches)
    x = torch.nn.functional.embedding(tokens, w.embed)  # a gather: an indirect DMA on Trainium, not emulated
    for t in range(tokens.shape[1]):  # a prompt: token by token, each a decode step over the cache before it
        p = pos[t:t + 1]
        h = nki_layer_stack(x[:, t:t + 1].contiguous(), p, rope_cos[p].to(w.embed.dtype),
                            rope_sin[p].to(w.embed.dtype), w, n_heads, n_kv_heads, eps)
    logits = lm_head_kernel(h.reshape(h.shape[0], -1), w.final_norm, w.lm_head, eps)
    if temperature > 0.0 and top_k == 0:  # top-p: the NKI sampler (the library's noise), advancing seed_state
        return nkilib.sample_top_p(logits, seed_state, temperature, top_p)
    if temperature > 0.0:  # top-k: the library's sampler (no NKI version yet)
        return sample(logits, seed_state, temperature, top_k, top_p)
    seed_state[1:].add_(1)  # as the sampler's counter advances at every draw
    return argmax_kernel(logits).reshape(-1).to(torch.int64)


def nki_layer_stack(x, pos, cos, sin, w, n_heads, n_kv_heads, eps):
    """x (B, 1, dim) through every layer of w (DecodeWeights), one decode-layer kernel each; each layer's new
    k / v rows are written into its caches at pos (the kernel reads the cache; the write at a data-dependent
    position is ours)."""
    pos_f = pos.to(torch.float32)
    for i in range(w.n_layers):
        x, k_new, v_new = layer_decode_kernel(x, pos_f, cos, sin, w.input_norms[i], w.wqs[i], w.wks[i], w.wvs[i],
                                              w.wos[i], w.post_norms[i], w.gates[i], w.ups[i], w.downs[i],
                                              w.k_caches[i], w.v_caches[i], n_heads, n_kv_heads, eps)
        w.k_caches[i].index_copy_(2, pos, k_new)
        w.v_caches[i].index_copy_(2, pos, v_new)
    return x


def use(kernels: str) -> None:
    """What the ops run (`python run.py --kernels`): "nki", the NKI kernels above, traced and compiled, the code
    that would run on Trainium; or "cpu", the library's CPU kernels (PyTorch compiled by Inductor, hand-written
    C++ for the one-token decode step), which compute the same and run several times faster on this CPU."""
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


def cpu_layers(x, pos, cos, sin, weights, caches, n_heads, n_kv_heads, eps):
    vocab = DecodeWeights.unflatten(weights, caches).lm_head.shape[0]
    out = torch.empty(x.shape[0], x.shape[1], vocab, dtype=x.dtype, device=x.device)
    layers_decode_cpu(x, pos, cos, sin, weights, caches, n_heads, n_kv_heads, eps, out)
    return out


def cpu_layers_token(tokens, pos, seed_state, weights, caches, rope_cos, rope_sin, n_heads, n_kv_heads, eps,
                     temperature, top_k, top_p):
    w = DecodeWeights.unflatten(weights, caches)
    logits = torch.empty(tokens.shape[0], 1, w.lm_head.shape[0], dtype=w.embed.dtype, device=w.embed.device)
    out = torch.empty(tokens.shape[0], dtype=torch.int64, device=w.embed.device)
    layers_decode_token_cpu(tokens, pos, seed_state, weights, caches, rope_cos, rope_sin, n_heads, n_kv_heads, eps,
                            float(temperature), int(top_k), float(top_p), logits, out)
    return out
