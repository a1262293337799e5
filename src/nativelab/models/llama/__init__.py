"""Llama with a static KV cache (gpt-fast style): one readable definition."""

from .model import SIZES, Llama, LlamaConfig

__all__ = ["Llama", "LlamaConfig", "SIZES"]
