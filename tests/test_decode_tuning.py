"""The decode kernels' tuning (kernels/cpu/tune.py): the choice on fake timings, the per-CPU cache, the forced
configuration, and that no configuration changes a value (every candidate's tokens and logits equal the
default's, on the real kernels)."""

import itertools
import json
import random

import pytest
import torch

from nativelab.device import cpu_info, threads
from nativelab.kernels.cpu import build, decode, tune
from nativelab.kernels.cpu.tune import DecodeConfig


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(tune.CACHE_ENV, str(tmp_path / "tune"))
    monkeypatch.delenv(tune.ENV, raising=False)
    monkeypatch.setattr(threads, "others", lambda prev, now: 0.0)  # a quiet machine (the test machine is shared)
    monkeypatch.setattr(tune, "_chosen", {})  # no choice from an earlier test


def test_choose_takes_the_fastest_reading_of_each_candidate():
    """Noisy fake timings (load only ever slows a reading, sometimes 3x): the candidate with the fastest true
    time wins, though its median reading is slower than another's."""
    rng = random.Random(0)
    true = {"a": 1.00, "b": 0.80, "c": 0.85, "d": 1.30}
    spikes = {"b": 0.7}  # b is hit by load in 70% of its readings

    def measure(c):
        slow = 2.0 if rng.random() < spikes.get(c, 0.1) else rng.uniform(0, 0.01)
        return true[c] * (1 + slow)

    chosen, best = tune.choose(list(true), measure, rounds=8)
    assert chosen == "b"
    assert best["b"] == pytest.approx(0.80, rel=0.011) and best["d"] >= 1.30


def test_choose_keeps_the_incumbent_within_noise():
    true = {"default": 1.000, "other": 0.990, "far": 1.5}
    chosen, _ = tune.choose(list(true), true.__getitem__, rounds=2)
    assert chosen == "default"  # 1% faster is within the 2% noise: not worth a change
    chosen, _ = tune.choose(list(true), true.__getitem__, rounds=2, noise=0.005)
    assert chosen == "other"
    with pytest.raises(ValueError, match="no candidates"):
        tune.choose([], true.__getitem__)


def _fake_machine(best_rows=8, best_ahead=2, best_hint="l2", best_split="interleave", best_tile=(2, 3)):
    """Fake step times: each field off its best value costs a fixed share; the prefill by its tile."""
    calls = []

    def measure(c: DecodeConfig, n_tok: int) -> float:
        calls.append((c, n_tok))
        if n_tok > 1:
            return 5e-3 * (1 + 0.1 * ((c.tile_rows, c.tile_tokens) != best_tile))
        return 2e-3 * (1 + 0.2 * (c.rows != best_rows) + 0.1 * (c.ahead != best_ahead)
                       + 0.05 * (c.hint != best_hint) + 0.03 * (c.split != best_split))
    return measure, calls


def test_search_finds_each_fields_best_value():
    measure, calls = _fake_machine()
    chosen, tried, complete = tune.search(measure, max_tile_tokens=6, rounds=3)
    assert complete
    assert chosen == DecodeConfig(rows=8, ahead=2, hint="l2", split="interleave", tile_rows=2, tile_tokens=3)
    # a handful of candidates, not the whole grid: the step's fields twice (the second pass keeps them), the tiles
    assert len(tried) <= 24 and len(calls) <= 2 * 3 * (3 + 5 + 3 + 2) + 2 * 4
    assert all(n == tune.PREFILL_TOKENS for c, n in calls if n > 1)


def test_search_passes_again_where_one_fields_best_value_depends_on_another():
    """A fake Zen 4: prefetching far ahead pays only into L2 (into L1 it evicts what the step still reads), so
    from the Xeon's defaults (one block ahead into L1) the first pass, timing the distance while the hint is still
    l1, keeps ahead=1; the second finds ahead=4."""
    def measure(c: DecodeConfig, n_tok: int) -> float:
        if n_tok > 1:
            return 5e-3
        far = {"l2": {1: 1.0, 0: 1.3, 2: 0.9, 4: 0.75, 8: 0.8}, "l1": {1: 1.0, 0: 1.3, 2: 1.2, 4: 1.4, 8: 1.5},
               "nta": {1: 1.1, 0: 1.3, 2: 1.2, 4: 1.3, 8: 1.4}}[c.hint][c.ahead]
        return 2e-3 * (far - 0.05 * (c.hint == "l2") + 0.1 * (c.rows != 2))

    xeon = DecodeConfig(ahead=1, hint="l1")
    chosen, tried, complete = tune.search(measure, max_tile_tokens=6, rounds=2, start=xeon)
    assert complete and (chosen.rows, chosen.ahead, chosen.hint) == (2, 4, "l2"), str(chosen)
    assert len(tried) <= 30  # coordinate passes, not the 90-configuration grid


def test_search_without_the_best_configuration_finds_another():
    measure, _ = _fake_machine(best_rows=4, best_ahead=2, best_hint="l2", best_split="block", best_tile=(4, 0))
    chosen, _, _ = tune.search(measure, max_tile_tokens=6, rounds=2)
    assert chosen == DecodeConfig()  # the defaults are this fake machine's best
    chosen, tried, _ = tune.search(measure, max_tile_tokens=6, rounds=2, exclude=[{"ahead": 2}])
    assert chosen.ahead != 2 and all(c.ahead != 2 for c, _ in tried)
    assert chosen.rows == 4 and chosen.split == "block"  # the other fields' best values still found
    with pytest.raises(ValueError, match="every configuration is excluded"):
        tune.search(measure, 6, exclude=[{}])


def test_the_forced_configuration_parses_and_bad_ones_are_clear_errors(monkeypatch):
    assert tune.parse("default") == DecodeConfig()
    assert tune.parse("rows=8, ahead=2,hint=nta,split=interleave,tile=2x3") == DecodeConfig(8, 2, "nta",
                                                                                            "interleave", 2, 3)
    assert tune.parse("rows=2") == DecodeConfig(rows=2)
    assert tune.parse(str(DecodeConfig(8, 0, "l2", "block", 2, 5))) == DecodeConfig(8, 0, "l2", "block", 2, 5)
    for bad, what in (("rows=3", "bad rows=3"), ("colour=red", "unknown field 'colour'"),
                      ("rows", "bad field 'rows'"), ("hint=l3", "bad hint=l3"), ("tile=4x9", "bad tile tokens 9")):
        with pytest.raises(ValueError, match=what):
            tune.parse(bad)
    monkeypatch.setenv(tune.ENV, "rows=9")
    with pytest.raises(ValueError, match="NATIVELAB_DECODE_CONFIG='rows=9': decode config: bad rows=9"):
        tune.forced()


def test_the_choice_is_cached_and_redone_when_the_cpu_changes(monkeypatch, tmp_path):
    searches = []

    def fake_search(measure, max_tile_tokens, **kw):
        searches.append(cpu_info.model())
        return DecodeConfig(rows=8 if len(searches) == 1 else 2), {(DecodeConfig(rows=8), 1): 1e-3}, True

    monkeypatch.setattr(tune, "search", fake_search)
    monkeypatch.setattr(cpu_info, "model", lambda: "Intel(R) Xeon(R) Processor")
    key = lambda: tune.cache_key("nativelab_decode_avx512-0123", 2, "bfloat16", (8, 576, 576, 192, 1536, 32000))
    assert tune.config_for(object(), key(), 6) == DecodeConfig(rows=8)
    tune._chosen.clear()  # a new process
    assert tune.config_for(object(), key(), 6) == DecodeConfig(rows=8)  # from the cache: no second search
    assert len(searches) == 1
    (entry,) = (tmp_path / "tune").glob("decode-*.json")
    stored = json.loads(entry.read_text())
    assert stored["key"]["cpu"] == "Intel(R) Xeon(R) Processor" and stored["config"]["rows"] == 8
    assert not list((tmp_path / "tune").glob("*.tmp"))  # written whole (files.write_atomic)
    other_threads = tune.cache_key("nativelab_decode_avx512-0123", 1, "bfloat16", (8, 576, 576, 192, 1536, 32000))
    assert tune.cached(other_threads) is None

    monkeypatch.setattr(cpu_info, "model", lambda: "AMD EPYC 9R14 96-Core Processor")
    assert tune.config_for(object(), key(), 6) == DecodeConfig(rows=2)  # another CPU: measured again
    assert searches == ["Intel(R) Xeon(R) Processor", "AMD EPYC 9R14 96-Core Processor"]
    assert len(list((tmp_path / "tune").glob("decode-*.json"))) == 2

    entry.write_text("{not json")  # a damaged entry is measured again, not an error
    monkeypatch.setattr(cpu_info, "model", lambda: "Intel(R) Xeon(R) Processor")
    tune._chosen.clear()
    tune.config_for(object(), key(), 6)
    assert len(searches) == 3

    monkeypatch.setenv(tune.ENV, "rows=2,ahead=0")  # forced: no cache, no search
    assert tune.config_for(object(), key(), 6) == DecodeConfig(rows=2, ahead=0)
    assert len(searches) == 3


# ---- on the real kernels ----

def _ext():
    ext = build.extension()
    if ext is None:
        pytest.skip("no C++ toolchain")
    return ext


def _every_config(most):
    """Every value of every field: the decode step's fields in all their combinations (the default tile), every
    tile with the default step and with the step's least default one (rows 8, no prefetch, interleaved)."""
    for rows, ahead, hint, split in itertools.product((2, 4, 8), (0, 1, 2), tune.HINTS, ("block", "interleave")):
        yield DecodeConfig(rows, ahead, hint, split)
    for tile_rows, tile_tokens in itertools.product((2, 4), range(1, most + 1)):
        yield DecodeConfig(tile_rows=tile_rows, tile_tokens=tile_tokens)
        yield DecodeConfig(8, 0, "l1", "interleave", tile_rows, tile_tokens)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_configuration_computes_the_same_tokens(dtype):
    """A prompt's prefill (odd length, so the tiles have tails), greedy steps and a top-p draw on a DecodePlan
    (an odd-sized GQA model whose row counts leave tails for every rows-per-call): the logits, the tokens and
    the caches are bit-for-bit the default configuration's under every configuration, on 1 and 2 threads."""
    from test_cpu_kernels import _decoder, _plan_args

    ext = _ext()
    a = _decoder(dtype, n_layers=2, dim=72, n_heads=6, n_kv=2, ffn=100, vocab=131, seq=16)
    w, rest = _plan_args(a)
    plan = ext.DecodePlan(w.named(), *rest)
    most = ext.max_tile_tokens()

    def run():
        for c in (*a["k_caches"], *a["v_caches"]):
            c.zero_()
        logits = torch.empty(131, dtype=dtype)
        seed, out = torch.tensor([3, 0]), torch.empty(1, dtype=torch.int64)
        plan.greedy(torch.tensor([[5, 17, 2, 99, 41, 7, 63]]), torch.arange(7), seed, logits, out)
        got = [logits.clone()]
        for p in range(7, 10):
            plan.greedy(out.view(1, 1).clone(), torch.tensor([p]), seed, logits, out)
            got.append(logits.clone())
        plan.draw(out.view(1, 1).clone(), torch.tensor([10]), seed, logits, out, 0.8, 0, 0.9)
        return torch.stack(got), out.item(), [c.clone() for c in (*a["k_caches"], *a["v_caches"])]

    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            plan.configure(*DecodeConfig().args(most))
            ref_logits, ref_token, ref_caches = run()
            for config in _every_config(most):
                plan.configure(*config.args(most))
                assert plan.tuning() == config.args(most)
                logits, token, caches = run()
                assert torch.equal(logits, ref_logits) and token == ref_token, (n, str(config))
                assert all(torch.equal(c, r) for c, r in zip(caches, ref_caches)), (n, str(config))
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(RuntimeError, match="rows per call must be 2, 4 or 8"):
        plan.configure(3, 1, 3, False, 4, 1)


@pytest.mark.slow
def test_the_bound_step_tunes_at_its_first_step_and_keeps_the_tokens(monkeypatch, tmp_path):
    """The plan the kernel interface binds measures at its first step (its caches as they were after), caches
    the choice, and gives the tokens that the default configuration, forced, gives."""
    from test_cpu_kernels import _decoder, _plan_args

    _ext()
    a = _decoder(torch.bfloat16)
    w, rest = _plan_args(a)

    def generate():
        for c in (*a["k_caches"], *a["v_caches"]):
            c.zero_()
        step = decode.transformer_tkg_token.bind(*w.flat(), *rest)
        logits, out, seed = torch.empty(131, dtype=torch.bfloat16), torch.empty(1, dtype=torch.int64), torch.zeros(
            2, dtype=torch.int64)
        step(torch.tensor([[5, 17, 2]]), torch.arange(3), seed, 0.0, 0, 1.0, logits, out)
        tokens = [out.item()]
        for p in range(3, 8):
            step(out.view(1, 1).clone(), torch.tensor([p]), seed, 0.8 if p % 2 else 0.0, 0, 0.9, logits, out)
            tokens.append(out.item())
        return step, tokens, [c.clone() for c in (*a["k_caches"], *a["v_caches"])]

    measured = []
    real = tune.search
    # no time limit: a loaded test machine would cut a search short, which is then (rightly) not cached
    monkeypatch.setattr(tune, "search", lambda *x, **kw: measured.append(1) or real(*x, **kw, limit=float("inf")))
    step, tuned, tuned_caches = generate()
    # at the first step: this thread count's, and the device's fewest and most threads' (not in a timed run later)
    n = torch.get_num_threads()
    counts = {1, n} if n == threads.ceiling() else {n}
    assert len(measured) == len(counts) and len(list((tmp_path / "tune").glob("decode-*.json"))) == len(counts)
    tuned_config = step.plan.tuning()
    generate()
    assert len(measured) == len(counts)  # the second plan takes the cached choices
    monkeypatch.setenv(tune.ENV, "default")
    step, untuned, untuned_caches = generate()
    assert step.plan.tuning() == DecodeConfig().args(build.extension().max_tile_tokens())
    assert tuned == untuned and all(torch.equal(t, u) for t, u in zip(tuned_caches, untuned_caches)), tuned_config


def test_choose_stops_after_two_rounds_past_its_deadline_and_at_once_past_its_limit():
    readings = []
    chosen, _ = tune.choose(["a", "b"], lambda c: readings.append(c) or 1.0, rounds=5, deadline=0.0)
    assert chosen == "a" and readings == ["a", "b"] * 2
    readings.clear()
    chosen, best = tune.choose(["a", "b"], lambda c: readings.append(c) or 1.0, rounds=5, limit=0.0)
    assert chosen == "a" and readings == ["a"] and best == {"a": 1.0}


def test_a_search_cut_short_on_a_loaded_machine_is_used_but_not_cached(monkeypatch, tmp_path):
    """Each reading 0.3 s (a step with a descheduled thread): the search stops at its limit, the plan runs the
    best found so far, and the next plan measures again rather than trust it."""
    clock = [0.0]
    monkeypatch.setattr(tune.time, "perf_counter", lambda: clock[0])

    class SlowPlan:
        def configure(self, *args):
            self.args = args

        def measure(self, n_tok, calls):
            clock[0] += 0.3
            return 0.3 if self.args[0] != 2 else 0.1  # rows=2 is the fastest

    config, tried, complete = tune.search(tune.plan_measure(SlowPlan(), 6), 6, limit=2.0)
    assert not complete and config.rows == 2 and len(tried) == 3  # the rows field only, 7 readings
    key = tune.cache_key("b", 2, "bfloat16", (1,))
    assert tune.config_for(SlowPlan(), key, 6).rows == 2
    assert tune.cached(key) is None and not list((tmp_path / "tune").glob("decode-*.json"))
    clock[0] = 0.0
    assert tune.config_for(SlowPlan(), key, 6).rows == 2 and clock[0] == 0.0  # this process searched once


def test_a_choice_made_while_other_processes_kept_the_machine_busy_is_not_cached(monkeypatch, tmp_path):
    monkeypatch.setattr(tune, "search", lambda *a, **kw: (DecodeConfig(rows=8), {}, True))
    key = tune.cache_key("b", 2, "bfloat16", (1,))
    monkeypatch.setattr(threads, "others", lambda prev, now: 1.2)  # another process on 1.2 cores meanwhile
    assert tune.config_for(object(), key, 6) == DecodeConfig(rows=8) and tune.cached(key) is None
    monkeypatch.setattr(threads, "others", lambda prev, now: 0.1)
    tune._chosen.clear()  # a new process
    assert tune.config_for(object(), key, 6) == DecodeConfig(rows=8) and tune.cached(key) == DecodeConfig(rows=8)
