"""Llama's shared pieces, and where its three tiers' code lives: Lab 2's folders.

The model itself (modules and forward) is written once per tier, gpt-fast style, in the lab's folders, as the
guide lays them out (`labs/lab2/`, packaged as `nativelab/lab2`):

    llama_base/llama.py                       base: plain PyTorch (nn.Linear, manual RoPE, manual attention)
    llama_nki_core/llama_nki.py               core: MLP, RoPE and attention on nki_ops.py's kernels
    llama_nki_experimental/llama_nki.py       experimental: every layer of a step in one kernel

This module holds what every tier shares and imports from here: the config and sizes, RMSNorm, the RoPE
tables, the weight plumbing (random weights, `copy_as`, the per-layer weight lists of the layer kernels) and
the tier registry. `Llama(cfg, tier)` builds the tier's class from its folder, so `nativelab run`, the
profiler, the check and the tests run exactly the code a learner opens and edits. The folders are imported
under their own top-level names (`llama_base`, `nki_ops`, ...), as `python run.py` in the folder imports them:
the package's folder is appended to `sys.path`, so a folder earlier on the path (the one `python run.py` runs
from, a copy of the lab included) is the one that runs.

Weight names follow Hugging Face's Llama, so real checkpoints load as they are. Static shapes throughout: the
KV cache is allocated once at `max_seq_len`; a step takes the tokens and their positions.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn

from ...kernels.ops.decode_weights import DecodeWeights

TIERS = ("base", "core", "experimental")
# The lab's folder: labs/lab2 of the repository (src/nativelab/lab2 is a link to it), copied into a wheel.
LAB2 = Path(__file__).parents[2] / "lab2"
TIER_MODULES = {"base": "llama_base.llama", "core": "llama_nki_core.llama_nki",
                "experimental": "llama_nki_experimental.llama_nki"}


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    dim: int = 512
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 8
    intermediate_size: int = 2048
    max_seq_len: int = 512
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


SIZES = {
    "tiny": LlamaConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=160,
                        max_seq_len=64),
    "small": LlamaConfig(),  # the guide's: 41,556,480 parameters
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position and frequency, shaped (max_seq_len, head_dim) (HF's half-split layout)."""
    inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def lab2_on_path() -> Path:
    """Make the lab's folders importable (appended: a folder already on the path wins) and return the folder."""
    if not (LAB2 / "nki_ops.py").is_file():
        raise FileNotFoundError(f"{LAB2}: Lab 2's folder is missing (it holds the tiers' code: llama_base/, ...)")
    if str(LAB2) not in sys.path:
        sys.path.append(str(LAB2))
    return LAB2


def tier_class(tier: str) -> type[Llama]:
    """The model class of a tier, imported from its folder."""
    if tier not in TIERS:
        raise ValueError(f"unknown model tier {tier!r}; choose from {', '.join(TIERS)}")
    lab2_on_path()
    cls = importlib.import_module(TIER_MODULES[tier]).Llama
    if not (isinstance(cls, type) and issubclass(cls, Llama)):
        raise TypeError(f"{TIER_MODULES[tier]}.Llama must subclass nativelab.models.llama.Llama")
    if cls.__dict__.get("tier") != tier:
        cls.tier = tier  # the registry names the tier (core's class may subclass base's)
    return cls


class _ByTier(type):
    """`Llama(cfg, tier)` builds the tier's class (from its folder); a tier's own class is built as it is."""

    def __call__(cls, cfg: LlamaConfig, tier: str | None = None):
        if cls is Llama:
            cls = tier_class(tier or "base")
        elif tier is not None and tier != cls.tier:
            raise ValueError(f"{cls.__module__}.{cls.__name__} is the {cls.tier!r} tier, not {tier!r}")
        return super(_ByTier, cls).__call__(cfg)


class Llama(nn.Module, metaclass=_ByTier):
    """What every tier shares; a tier's folder subclasses it with the modules and the forward.

    A subclass defines `embed_tokens`, `layers` (each with `input_layernorm`, `self_attn` (`q_proj`, `k_proj`,
    `v_proj`, `o_proj`, `k_cache`, `v_cache`), `post_attention_layernorm`, `mlp` (`gate_proj`, `up_proj`,
    `down_proj`)), `norm`, `lm_head`, `setup_cache` and `forward(tokens, input_pos) -> logits`."""

    tier = "base"

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg

    @classmethod
    def from_size(cls, size: str, tier: str | None = None, **overrides) -> Llama:
        if size not in SIZES:
            raise ValueError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
        return cls(replace(SIZES[size], **overrides), tier)

    @classmethod
    def random(cls, size: str, tier: str | None = None, seed: int = 0) -> Llama:
        """Random weights from a fixed seed, scaled so that even a tiny model produces varied tokens."""
        model = cls.from_size(size, tier)
        gen = torch.Generator().manual_seed(seed)
        std = 2.4 * model.cfg.dim**-0.5
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 1.0 if name == "embed_tokens.weight" else std, generator=gen)
        return model

    def copy_as(self, tier: str, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Llama:
        """A new model of `tier` on a copy of these weights (Lab 2's tiers share one set of weights), cast to
        `dtype` and moved to `device`, in eval mode with its KV cache allocated: ready to generate."""
        model = Llama(self.cfg, tier)
        model.load_state_dict(self.state_dict())
        if dtype is not None:
            model = model.to(dtype)
        model = model.eval()
        if device is not None:
            model = model.to(device)
        model.setup_cache()
        return model

    def decode_weights(self) -> DecodeWeights:
        """This model's tensors for the whole-step kernels (`transformer_tkg`, `transformer_tkg_token`), by name,
        its KV caches included."""
        return DecodeWeights.of(self)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
