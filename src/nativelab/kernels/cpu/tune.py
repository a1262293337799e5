"""How the hand-written decode kernels' loops run on this machine: chosen by measuring, cached per CPU.

A decode step streams every weight once, so its speed is how many memory reads one core keeps in flight: the
rows read at once (independent streams), how far ahead software prefetch asks for the next rows and into
which cache, how the rows are split between the threads; a prompt's prefill adds its tile shape. The best
values differ between CPUs (the first defaults, tuned on an Intel Xeon, read 50-56% of a flat read on an AMD Zen 4
VM, where two blocks ahead into L2, today's defaults, read 94-102%), so a `DecodePlan` chooses them at its first
step on a thread count:

1. `NATIVELAB_DECODE_CONFIG` forces one (`default`, or fields such as `rows=8,ahead=2,hint=l2,split=block,
   tile=2x3`; unnamed fields keep their defaults): nothing is measured.
2. Else the choice cached for this CPU model, kernel build (ISA and source), thread count, dtype and shapes.
3. Else it measures (`search`): the fastest of each field's values in turn, starting from the defaults, the
   fields again until a pass changes nothing (a field's best value can depend on another's: how far ahead to
   prefetch on the cache it prefetches into), each candidate timed on the plan's own weights in interleaved
   rounds (`choose`), ~0.2-0.6 s in all, and
   writes the choice to the cache (atomically, as the build cache does), unless other processes kept the
   machine busy meanwhile or the search was cut short (its 2 s limit): then this process uses it, the next
   one measures again. A choice is read only from a directory this user alone can write (`private_dir.py`).

None of this changes a value (csrc/decode.cpp's Tuning): the tests check that every candidate gives the
tokens of the default one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ...device import cpu_info, threads
from ... import settings
from ...files import write_atomic
from ...private_dir import CacheDir

ENV = settings.DECODE_CONFIG.name  # its text: parse()'s fields
CACHE_ENV = settings.TUNE_CACHE_DIR.name
CACHE = CacheDir(settings.TUNE_CACHE_DIR, "decode tuning results")
HINTS = {"l1": 3, "l2": 2, "nta": 0}  # prefetcht0, prefetcht1, prefetchnta (csrc/decode.cpp: prefetch<HINT>)
NOISE = 0.02  # candidates within 2% of the fastest count as equally fast: the earlier (the incumbent) wins
PREFILL_TOKENS = 6  # the prompt length the prefill's tile is timed on (Lab 2's prompt)
BUSY = 0.5  # cores' worth of other processes' CPU time during a search above which its choice is not cached
log = logging.getLogger("nativelab.kernels.tune")


@dataclass(frozen=True)
class DecodeConfig:
    rows: int = 4  # weight rows per call, streamed together: 2, 4, 8
    ahead: int = 2  # software prefetch of the rows this many blocks of `rows` on; 0: none
    hint: str = "l2"  # where the prefetch puts them: l1, l2, nta (non-temporal)
    split: str = "block"  # rows between the threads: one contiguous block each, or blocks dealt round-robin
    tile_rows: int = 4  # the prefill's tile: weight rows (2, 4) ...
    tile_tokens: int = 0  # ... by at most this many tokens (0: the build's most)

    def __post_init__(self):
        bad = (f"rows={self.rows} (2, 4 or 8)" if self.rows not in (2, 4, 8) else
               f"ahead={self.ahead} (0..8)" if not 0 <= self.ahead <= 8 else
               f"hint={self.hint} ({', '.join(HINTS)})" if self.hint not in HINTS else
               f"split={self.split} (block or interleave)" if self.split not in ("block", "interleave") else
               f"tile rows {self.tile_rows} (2 or 4)" if self.tile_rows not in (2, 4) else
               f"tile tokens {self.tile_tokens} (0..6)" if not 0 <= self.tile_tokens <= 6 else None)
        if bad is not None:
            raise ValueError(f"decode config: bad {bad}")

    def args(self, max_tile_tokens: int) -> tuple:
        """The arguments of DecodePlan.configure."""
        tokens = min(self.tile_tokens or max_tile_tokens, max_tile_tokens)
        return self.rows, self.ahead, HINTS[self.hint], self.split == "interleave", self.tile_rows, tokens

    def __str__(self) -> str:
        return (f"rows={self.rows},ahead={self.ahead},hint={self.hint},split={self.split},"
                f"tile={self.tile_rows}x{self.tile_tokens or 'max'}")

    def matches(self, fields: dict) -> bool:
        return all(getattr(self, k) == v for k, v in fields.items())


def parse_fields(text: str) -> dict:
    """`rows=8,ahead=2,hint=l2,split=interleave,tile=2x3` -> DecodeConfig fields (a bad one: one clear error)."""
    fields: dict = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        try:
            if not sep:
                raise ValueError
            if key in ("rows", "ahead"):
                fields[key] = int(value)
            elif key in ("hint", "split"):
                fields[key] = value.lower()
            elif key == "tile":
                r, _, t = value.lower().partition("x")
                fields["tile_rows"], fields["tile_tokens"] = int(r), 0 if t in ("", "max") else int(t)
            else:
                raise KeyError(key)
        except KeyError:
            raise ValueError(f"decode config {text!r}: unknown field {key!r} (rows, ahead, hint, split, tile)") \
                from None
        except ValueError:
            raise ValueError(f"decode config {text!r}: bad field {part!r} (e.g. rows=8,ahead=2,hint=l2,"
                             f"split=block,tile=4x6)") from None
    return fields


def parse(text: str) -> DecodeConfig:
    """A config from `parse_fields`' text (or `default`); the fields not named keep their defaults."""
    text = text.strip()
    if text.lower() == "default":
        return DecodeConfig()
    return DecodeConfig(**parse_fields(text))


def forced() -> DecodeConfig | None:
    """$NATIVELAB_DECODE_CONFIG's configuration, None when unset (measure instead)."""
    raw = settings.DECODE_CONFIG.get()
    if raw is None:
        return None
    try:
        return parse(raw)
    except ValueError as e:
        raise ValueError(f"{ENV}={raw!r}: {e}") from None


# ---- choosing ----

def choose(candidates: list, measure: Callable[[object], float], rounds: int = 5,
           noise: float = NOISE, deadline: float = float("inf"), limit: float = float("inf")) -> tuple[object, dict]:
    """The fastest candidate and every candidate's best time: `rounds` rounds, each timing every candidate once
    (interleaved: a burst of load on a shared machine slows all alike, not one), the fastest reading of each
    kept (load only ever slows a reading); past `deadline` (time.perf_counter) no round starts after the
    second (a loaded machine makes every reading slow), and past `limit` no reading at all after the first
    (the candidates not read yet are left out). Within `noise` of the fastest, the earliest candidate wins: a
    tie keeps the incumbent (list it first) rather than follow the noise."""
    if not candidates:
        raise ValueError("choose: no candidates")
    best = {c: float("inf") for c in candidates}
    for i in range(rounds):
        if i >= 2 and time.perf_counter() > deadline:
            break
        for c in candidates:
            if best[candidates[0]] < float("inf") and time.perf_counter() > limit:
                break
            best[c] = min(best[c], measure(c))
    best = {c: t for c, t in best.items() if t < float("inf")}
    fastest = min(best.values())
    return next(c for c in candidates if best[c] <= fastest * (1 + noise)), best


# Each field's values, the default first. The prefetch distance reaches 8 blocks: on a 2-core AMD EPYC (Zen 4,
# AVX-512) the `small` bf16 step at 2 threads took 2.47 ms with rows=2,ahead=1,hint=l2 (the best of (1, 0, 2)
# there) and 1.86 ms with ahead=4 (115% of a flat torch.sum read of its bytes; bench/decode_isa.py).
DECODE_FIELDS = (("rows", (4, 2, 8)), ("ahead", (2, 0, 1, 4, 8)), ("hint", ("l2", "l1", "nta")),
                 ("split", ("block", "interleave")))
PASSES = 3  # passes over DECODE_FIELDS at most: a field's best value depends on the others' (ahead on hint)
SPACE = [[f, list(v)] for f, v in DECODE_FIELDS] + [["passes", PASSES]]  # in the cache key: a wider search redoes it


def search(measure: Callable[[DecodeConfig, int], float], max_tile_tokens: int, rounds: int = 5,
           exclude: Iterable[dict] = (), start: DecodeConfig = DecodeConfig(), budget: float = 0.5,
           limit: float = 2.0) -> tuple[DecodeConfig, dict, bool]:
    """The configuration to use, the best time of every one tried, and whether the search ran to its end (not
    stopped at `limit` seconds, the rest untried): `measure(config, n_tok)` times a decode
    step (n_tok 1) or a prefill of n_tok tokens. Each field in turn: the best so far with that field's values
    (the decode step's fields on the step, again until a pass changes nothing, at most PASSES; then the tile on
    a prefill of PREFILL_TOKENS). `exclude`: field sets
    no candidate may match (to see what is chosen without the winner). Past `budget` seconds each field
    gets two rounds (~0.2-0.3 s in all on a quiet 2-core Xeon), past `limit` it stops (a loaded machine, where a
    step with a descheduled thread took 0.1-0.4 s instead of 2 ms)."""
    exclude = list(exclude)
    t0 = time.perf_counter()
    deadline, stop = t0 + budget, t0 + limit

    def allowed(c: DecodeConfig) -> bool:
        return not any(c.matches(f) for f in exclude)

    def norm(c: DecodeConfig) -> DecodeConfig:  # without prefetch, its hint means nothing
        return dataclasses.replace(c, hint="l1") if c.ahead == 0 else c

    if not allowed(start):
        grid = [norm(DecodeConfig(rows=r, ahead=a, hint=h, split=s)) for a in (2, 1, 4, 8, 0) for r in (4, 2, 8)
                for h in HINTS for s in ("block", "interleave")]
        start = next((c for c in grid if allowed(c)), None)
        if start is None:
            raise ValueError(f"decode tuning: every configuration is excluded ({exclude})")
    best, tried = start, {}
    for _ in range(PASSES):  # until a whole pass keeps the incumbent
        before = best
        for field, values in DECODE_FIELDS:
            if time.perf_counter() > stop:
                return best, tried, False
            cands = list(dict.fromkeys(c for c in (norm(dataclasses.replace(best, **{field: v})) for v in values)
                                       if allowed(c)))
            cands = [best] + [c for c in cands if c != best]
            if len(cands) > 1:
                best, times = choose(cands, lambda c: measure(c, 1), rounds, deadline=deadline, limit=stop)
                tried.update({(c, 1): t for c, t in times.items()})
        if best == before:
            break
    most = max_tile_tokens
    tiles = [(4, 0), (2, 0), (4, (most + 1) // 2), (2, (most + 1) // 2)]
    cands = list(dict.fromkeys(dataclasses.replace(best, tile_rows=r, tile_tokens=t) for r, t in tiles))
    cands = [c for c in cands if allowed(c)]
    if time.perf_counter() > stop:
        return best, tried, False
    if len(cands) > 1:
        best, times = choose(cands, lambda c: measure(c, PREFILL_TOKENS), max(2, rounds - 2), deadline=deadline,
                             limit=stop)
        tried.update({(c, PREFILL_TOKENS): t for c, t in times.items()})
    elif cands:
        best = cands[0]
    return best, tried, time.perf_counter() <= stop


def plan_measure(plan, max_tile_tokens: int, calls: int = 1) -> Callable[[DecodeConfig, int], float]:
    """`search`'s measure on a DecodePlan: configure it, then its fastest of `calls` runs (state kept)."""
    def measure(config: DecodeConfig, n_tok: int) -> float:
        plan.configure(*config.args(max_tile_tokens))
        return plan.measure(n_tok, calls)
    return measure


# ---- the cache ----

def cache_dir() -> Path:
    """$NATIVELAB_TUNE_CACHE_DIR, else $XDG_CACHE_HOME/nativelab/tune, else ~/.cache/nativelab/tune (or a
    private directory instead of one other users can write)."""
    return CACHE.root()


def cache_key(build: str, threads: int, dtype: str, shape: tuple) -> dict:
    """What a choice holds for: this CPU (its model string and ISA), the kernel build (its ISA and source:
    the extension's cache name), the thread count, the dtype, the model's shapes and the search's space."""
    return {"cpu": cpu_info.model(), "cpu_isa": cpu_info.isa(), "build": build, "threads": int(threads),
            "dtype": dtype, "shape": list(shape), "space": SPACE}


def _path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return CACHE.path(f"decode-{digest}.json")


def cached(key: dict) -> DecodeConfig | None:
    """The choice stored for exactly this key, or None (none yet, unreadable, or made for another key)."""
    try:
        entry = json.loads(_path(key).read_text())
        if entry.get("key") != key:
            return None
        return DecodeConfig(**entry["config"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def store(key: dict, config: DecodeConfig, tried: dict, seconds: float) -> Path:
    path = _path(key)
    entry = {"key": key, "config": dataclasses.asdict(config), "search_seconds": round(seconds, 4),
             "tried_ms": {f"{c} n_tok={n}": round(t * 1e3, 4) for (c, n), t in tried.items()}}
    return write_atomic(path, json.dumps(entry, indent=1).encode())


_chosen: dict[str, DecodeConfig] = {}  # this process's choices, by key: one search per key, cached or not


def config_for(plan, key: dict, max_tile_tokens: int) -> DecodeConfig:
    """The configuration a plan runs with for `key`: forced, this process's earlier choice, cached, or measured
    now (and cached)."""
    config = forced()
    if config is not None:
        return config
    memo = json.dumps(key, sort_keys=True)
    config = _chosen.get(memo) or cached(key)
    if config is None:
        config = _chosen[memo] = _measure(plan, key, max_tile_tokens)
    return config


def _measure(plan, key: dict, max_tile_tokens: int) -> DecodeConfig:
    t0, before = time.perf_counter(), threads.cpu_sample()
    config, tried, complete = search(plan_measure(plan, max_tile_tokens), max_tile_tokens)
    seconds, after = time.perf_counter() - t0, threads.cpu_sample()
    busy = threads.others(before, after) if before and after else 0.0
    if not complete or busy >= BUSY:  # this process uses it; the next one measures again, maybe on a quiet machine
        log.info("decode tuning for %s: %s for now (%.1f s, other processes kept %.1f cores busy)", key, config,
                 seconds, busy)
        return config
    try:
        store(key, config, tried, seconds)
    except OSError as e:  # a read-only cache: measure again next time
        log.warning("nativelab: could not cache the decode tuning in %s (%s)", cache_dir(), e)
    log.info("decode tuning for %s: %s (%d candidates, %.0f ms)", key, config, len(tried), seconds * 1e3)
    return config
