"""The experimental tier's attention is no per-layer module call: one kernel runs the whole stack of layers of a
step, attention included (nki_ops.nki_layers / nki_layers_token, the mega-kernel). Inside it, per layer:
RMSNorm + Q/K/V + RoPE, the cache write and attention over the filled positions, the output projection and
residual, RMSNorm + SwiGLU MLP and residual; then the final norm and the LM head. Activations stay in the
kernel between layers (on Trainium, in SBUF): one HBM round trip per step instead of one per operation.

The layers' weights and static KV caches are the same modules as base's (`model.layers[i].self_attn.q_proj`,
...), so the same checkpoint loads. The NKI kernel takes the weights prepared once, at load, in the layouts its
engines want (`model.decode_stack`: every matrix with its contraction dimension on partitions, no transpose at
launch); the CPU kernels take them by name in PyTorch's layouts (`model.decode_weights()`); both write the caches."""

import torch

from nki_ops import nki_layers, nki_layers_token


def decode_logits(model, tokens, input_pos) -> torch.Tensor:
    """One decode token per sequence, tokens (B, 1) -> logits (B, 1, vocab), every layer in one kernel."""
    c = model.cfg
    weights, caches = model.decode_weights().flat()
    stack, _ = model.decode_stack.flat()
    return nki_layers(tokens, input_pos, weights, stack, caches, c.n_heads, c.n_kv_heads, c.norm_eps)


def next_token(model, tokens, input_pos, seed_state, temperature=0.0, top_k=0, top_p=1.0) -> torch.Tensor:
    """Token ids (B, T) at consecutive positions input_pos (T,) -> the next token (B,), from the embedding to the
    draw in one kernel: a decode step (T == 1) or a whole prompt (T > 1)."""
    c = model.cfg
    weights, caches = model.decode_weights().flat()
    stack, _ = model.decode_stack.flat()
    return nki_layers_token(tokens, input_pos, seed_state, weights, stack, caches, c.n_heads, c.n_kv_heads,
                            c.norm_eps, temperature, top_k, top_p)
