"""The engines' pseudo-random number generators as the emulator models them (nisa.rng, dropout, set_rng_seed,
rand_set_state / rand_get_state; nl.rand, nl.dropout, nl.random_seed).

Each compute lane (partition) of an engine has a state of 6 uint32 words, the size of the XORWOW state that
rand_get_state / rand_set_state move on NeuronCore-v3's GpSimd Engine. Here words 0-4 are a key and word 5 a
counter: the n-th 32-bit value a lane produces is a hash of its key and counter + n, and the counter then
advances by the values drawn. The state lives for the rest of the launch (trace.registers), per engine.

What it is and is not: the same seed or state gives the same values, in the interpreter (nki.simulate) and in
the compiled kernel alike, and different lanes and draws are independent; it is not the hardware's sequence
(the NeuronCore-v3 Vector Engine's LFSR is not documented, and XORWOW is a recurrence along each lane, which
would unroll into one step per element: a counter-based hash keeps a tile's draw one vectorised expression).
Unseeded, a launch's state comes from torch's default generator (torch.manual_seed makes launches repeat)."""

from __future__ import annotations

import torch

from .. import trace

LANES = 128
WORDS = 6
_M32 = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) of int64 values in [0, 2**32). Both multipliers are
    below 2**31, so every product fits in int64 and the graph needs no unsigned arithmetic."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def state(engine: str) -> torch.Tensor:
    """The engine's state, [128, 6] int64 words in [0, 2**32) (drawn at the launch's first use if unseeded)."""
    regs = trace.current().registers
    key = ("prng", engine)
    if key not in regs:
        regs[key] = torch.randint(0, 2**32, (LANES, WORDS), dtype=torch.int64, device=trace.device())
    return regs[key]


def set_state(engine: str, words: torch.Tensor) -> None:
    """Lanes 0..P-1 take `words` ([P, 6] integers); the others keep theirs."""
    p = words.shape[0]
    words = words.to(torch.int64) & _M32
    trace.current().registers[("prng", engine)] = words if p == LANES else torch.cat([words, state(engine)[p:]])


def seed(engine: str, value: torch.Tensor) -> None:
    """Every lane's state derived from one 32-bit seed (counters at 0)."""
    s = value.reshape(()).to(torch.int64) & _M32
    lane_word = torch.arange(LANES * (WORDS - 1), dtype=torch.int64, device=value.device).reshape(LANES, WORDS - 1)
    key = _mix(s ^ _mix(lane_word + 1))
    set_state(engine, torch.cat([key, torch.zeros(LANES, 1, dtype=torch.int64, device=value.device)], dim=1))


def bits(engine: str, p: int, n: int) -> torch.Tensor:
    """n 32-bit values for each of lanes 0..p-1 ([p, n] int64 in [0, 2**32)); their counters advance by n."""
    s = state(engine)
    k = _mix(s[:p, 0:1])
    for j in range(1, WORDS - 1):
        k = _mix(k ^ s[:p, j:j + 1])
    counter = s[:p, WORDS - 1:]
    out = _mix(k ^ _mix((counter + torch.arange(n, dtype=torch.int64, device=s.device)) & _M32))
    set_state(engine, torch.cat([s[:p, :WORDS - 1], (counter + n) & _M32], dim=1))
    return out


def uniform(engine: str, p: int, n: int) -> torch.Tensor:
    """[p, n] fp32 values uniform in [0, 1): the top 24 bits of each draw (exact in fp32)."""
    return (bits(engine, p, n) >> 8).to(torch.float32) * (2.0 ** -24)


def truncate(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The least significant bits of each 32-bit value that fit `dtype` (an integer type), as its value."""
    width = torch.iinfo(dtype).bits
    v = b & ((1 << width) - 1)
    if torch.iinfo(dtype).min < 0:
        v = v - ((v >> (width - 1)) << width)
    return v
