"""Llama with a static KV cache (gpt-fast style): one readable definition."""

from .generate import Generator, Sampling, check_fits
from .model import SIZES, TIERS, Llama, LlamaConfig

__all__ = ["Llama", "LlamaConfig", "SIZES", "TIERS", "Generator", "Sampling", "check_fits"]
