"""Lab 2's core tier: the base Llama with its MLP, RoPE and attention on nki_ops.py's kernels."""
