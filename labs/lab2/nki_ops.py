"""Lab 2's kernels as PyTorch custom ops: wrap_nki() + @nki_op, the pattern of Lab 1 Step 4.

Each kernel comes from the kernel library (the guide's nkilib): wrap_nki makes it launchable on the device,
@nki_op makes the function that allocates the outputs and launches it a custom op (one opaque node in a
torch.compile graph). The tiers call the ops: llama_nki_core/ and llama_nki_experimental/.
"""

import torch

from nativelab.kernels import nki_op, wrap_nki
from nativelab.kernels.ops.mlp import mlp_kernel_no_norm

mlp_kernel = wrap_nki(mlp_kernel_no_norm)


@nki_op("nki_lab::mlp", mutates_args=())
def nki_mlp(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor) -> torch.Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x)) in one kernel; weights as nn.Linear.weight ([out, in])."""
    out = torch.empty_like(x)
    mlp_kernel(x, gate_w, up_w, down_w, False, out)
    return out


# The other kernels, registered the same way.
from nativelab.kernels.ops.attention import attention_cte_kernel, attention_tkg_kernel  # noqa: E402
from nativelab.kernels.ops.rmsnorm import rmsnorm_kernel  # noqa: E402
from nativelab.kernels.ops.rope import rope_kernel  # noqa: E402
from nativelab.kernels.ops.transformer import transformer_tkg_kernel, transformer_tkg_token_kernel  # noqa: E402

rmsnorm = wrap_nki(rmsnorm_kernel)
rope = wrap_nki(rope_kernel)
attention_prefill = wrap_nki(attention_cte_kernel)
attention_decode = wrap_nki(attention_tkg_kernel)
layers_decode = wrap_nki(transformer_tkg_kernel)
layers_decode_token = wrap_nki(transformer_tkg_token_kernel)


@nki_op("nki_lab::rmsnorm", mutates_args=())
def nki_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, in float32."""
    out = torch.empty_like(x)
    rmsnorm(x, weight, eps, out)
    return out


@nki_op("nki_lab::rope", mutates_args=())
def nki_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, H, T, D) with the (T, D) tables of the positions, half-split pairs (HF convention)."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rope(x, cos, sin, out)
    return out


@nki_op("nki_lab::attn", mutates_args=("k_cache", "v_cache"))
def nki_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             pos: torch.Tensor) -> torch.Tensor:
    """Attention of q (B, H, T, D) with grouped-query k, v (B, KV, T, D) at positions pos (T,), written into the
    static caches. A prompt (T > 1, from position 0) attends causally over itself (the CTE kernel); a decode
    step (T == 1) writes its row and attends over the cache's filled positions in one kernel (TKG)."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.shape[2] > 1:
        attention_prefill(q, k, v, out)
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
    else:
        attention_decode(q, k, v, k_cache, v_cache, pos, out)
    return out


# The experimental tier's: the model's tensors by name (DecodeWeights), carried as two lists.
from nativelab.kernels.ops.decode_weights import DecodeWeights  # noqa: E402


@nki_op("nki_lab::layers", mutates_args=("caches",))
def nki_layers(x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weights: list[torch.Tensor],
               caches: list[torch.Tensor], n_heads: int, n_kv_heads: int, eps: float) -> torch.Tensor:
    """The experimental tier's mega-kernel, for one decode token's hidden state x (B, 1, dim): every layer
    (RMSNorm + QKV + RoPE, cache write + attention, output projection, RMSNorm + MLP, residuals), the final
    norm and the LM head -> logits (B, 1, vocab). `weights, caches = model.decode_weights().flat()`: the model's
    tensors (nativelab's DecodeWeights, which names each one) as the kernel's two lists."""
    vocab = DecodeWeights.unflatten(weights, caches).lm_head.shape[0]
    out = torch.empty(x.shape[0], x.shape[1], vocab, dtype=x.dtype, device=x.device)
    layers_decode(x, pos, cos, sin, weights, caches, n_heads, n_kv_heads, eps, out)
    return out


@nki_op("nki_lab::layers_token", mutates_args=("seed_state", "caches"))
def nki_layers_token(tokens: torch.Tensor, pos: torch.Tensor, seed_state: torch.Tensor, weights: list[torch.Tensor],
                     caches: list[torch.Tensor], rope_cos: torch.Tensor, rope_sin: torch.Tensor, n_heads: int,
                     n_kv_heads: int, eps: float, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The same mega-kernel from token ids to the next token: tokens (B, T) at consecutive positions pos (T,)
    (a decode step, or a whole prompt) -> the token drawn (B,) (argmax at temperature 0, else top-k / top-p
    from the [seed, counter] seed_state, which advances)."""
    w = DecodeWeights.unflatten(weights, caches)
    logits = torch.empty(tokens.shape[0], 1, w.lm_head.shape[0], dtype=w.embed.dtype, device=w.embed.device)
    out = torch.empty(tokens.shape[0], dtype=torch.int64, device=w.embed.device)
    layers_decode_token(tokens, pos, seed_state, weights, caches, rope_cos, rope_sin, n_heads, n_kv_heads, eps,
                        float(temperature), int(top_k), float(top_p), logits, out)
    return out
