"""Lab 2's base tier: Llama in plain PyTorch (nn.Linear, manual RoPE, manual attention over a static KV cache)."""
