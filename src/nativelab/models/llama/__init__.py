"""Llama with a static KV cache (gpt-fast style): the shared pieces here, each tier's code in Lab 2's folders."""

from .generate import Generator, Sampling, check_fits
from .model import SIZES, TIERS, Llama, LlamaConfig, RMSNorm, rope_tables, tier_class

__all__ = ["Llama", "LlamaConfig", "RMSNorm", "rope_tables", "SIZES", "TIERS", "tier_class", "Generator", "Sampling",
           "check_fits"]
