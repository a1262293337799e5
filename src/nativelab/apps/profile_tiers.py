"""The Lab 2 tiers profiled side by side: one set of weights, each tier warmed up (compiled) in one session
and measured in another over the same prompt and number of tokens."""

from __future__ import annotations

import torch

from ..device.config import DEVICE_NAME
from ..models.llama import TIERS, Generator, Llama, Sampling, check_fits
from ..profile import Session

PROMPT = [1, 2, 3, 4, 5, 6]  # any fixed prompt: random-weight models have no tokenizer


def profile_tiers(tiers=TIERS, size: str = "small", compile: bool = True, greedy: bool = True, tokens: int = 50,
                  dtype: str = "bfloat16", seed: int = 0, timeline: bool = True) -> list[Session]:
    """One measured session per tier (with `.warmup`, the session of its first, compiling generation)."""
    unknown = [t for t in tiers if t not in TIERS]
    if unknown:
        raise ValueError(f"unknown tier(s) {unknown}; choose from {list(TIERS)}")
    base = Llama.random(size, seed=seed)
    prompt = [t % base.cfg.vocab_size for t in PROMPT]
    check_fits(base.cfg, len(prompt), tokens, of=f"size {size!r}")
    sessions = []
    for tier in tiers:
        model = base.copy_as(tier, getattr(torch, dtype), DEVICE_NAME)
        gen = Generator(model, Sampling(greedy=greedy, seed=seed))
        if compile:
            gen.compile()
        with Session(f"{tier} warmup", timeline=False) as warm:
            warm.tokens = len(gen.generate(prompt, tokens))
        with Session(tier, timeline=timeline) as s:
            s.tokens = len(gen.generate(prompt, tokens))
        s.warmup = warm
        sessions.append(s)
    return sessions
