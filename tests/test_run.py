"""`nativelab run` (the Lab 2 benchmark) on the tiny model: the guide's report and the tier table."""

import json

import pytest
from conftest import run_python

from nativelab.apps.run import DEFAULT_PROMPT


def _check_the_report(text: str, results: list, tokens: int) -> None:
    """The guide's report and the tier table of a tiny fp32 `run --model all --greedy`."""
    for line in ("Model   : base — Baseline (pure PyTorch ops, RoPE, static KV cache)", "Size    : tiny",
                 "Compile : False", f"Tokens  : {tokens}", "Params  : 102,720  (0.4 MB float32)", "Warmup...",
                 "Timing...", f"Tokens generated: {tokens}", f"Tokens: every tier gives the same {tokens} tokens"):
        assert line in text, line
    assert "CPU fallback ops: [" not in text  # the guide's Step 6 adds that line to run.py (tests/test_lab2.py)
    assert [x["model"] for x in results] == ["base", "core", "experimental"]
    assert [x["fallback_ops"] for x in results] == [["aten::argmax.out"], [], []]  # the table's column
    assert "['aten::argmax.out']" in text.split("CPU fallback ops")[-1]
    assert all(x["tok_per_s"][0] > 0 for x in results)
    # 2 layers x (4096 + 2048 + 2048 + 4096 attention + 3 x 64 x 160 MLP + 2 x 64 norms) + 256 x 64 tied
    # embedding + 64 final norm = 102,720: the LM head shares the embedding, also on the device
    assert len({tuple(x["generated"]) for x in results}) == 1  # fp32: every tier says the same
    # the traffic column: eager base round-trips every intermediate, the fused tiers do not. Experimental's NKI step
    # takes the prompt a token a launch (each launch reading every weight), so it is compared per launch: one for
    # each prompt token and one for each generated token after the first
    assert "Device MB/token" in text
    assert results[0]["device_bytes_per_token"] > results[1]["device_bytes_per_token"] > 0
    launches = len(DEFAULT_PROMPT) + tokens - 1
    assert results[0]["device_bytes_per_token"] > results[2]["device_bytes_per_token"] * tokens / launches > 0


def test_run_prints_the_tier_table_in_process(tmp_path, capsys):
    """The fast tier's run: the three tiers eager, 4 tokens, in this process."""
    from nativelab.cli import main

    out, png = tmp_path / "r.json", tmp_path / "tiers.png"
    assert main(["run", "--model", "all", "--size", "tiny", "--greedy", "--tokens", "4", "--warmup", "1",
                 "--dtype", "float32", "--json", str(out), "--plot", str(png)]) in (0, None)
    text = capsys.readouterr().out
    results = json.loads(out.read_text())
    _check_the_report(text, results, 4)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "Plot: " in text
    # --model all estimates by default: the table's est. trn2 column and where each tier's token goes
    assert "est. trn2 tok/s" in text and "est. trn2 ms/token" in text
    for x in results:
        assert x["est_trn2_tok_per_s"] == pytest.approx(1e3 / sum(x["est_trn2_ms_per_token"].values()))


def test_estimate_is_on_for_the_tier_table_and_off_for_one_tier():
    from nativelab.apps.run import parse_args

    assert parse_args(["--model", "all"]).estimate is True
    assert parse_args(["--model", "all", "--no-estimate"]).estimate is False
    assert parse_args(["--model", "core"]).estimate is False
    assert parse_args(["--model", "core", "--estimate"]).estimate is True


@pytest.mark.slow  # three tiers with --estimate in a fresh interpreter
def test_run_prints_the_guides_report_and_fallbacks(tmp_path):
    out = tmp_path / "r.json"
    r = run_python(
        "import sys; from nativelab.cli import main; "
        f"sys.exit(main(['run', '--model', 'all', '--size', 'tiny', '--greedy', '--tokens', '8', '--warmup', '1', "
        f"'--dtype', 'float32', '--estimate', '--json', {str(out)!r}, '--plot', {str(tmp_path / 'tiers.png')!r}]))",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(out.read_text())
    _check_the_report(r.stdout, results, 8)
    assert "est. trn2 tok/s : " in r.stdout
    assert all(x["est_trn2_tok_per_s"] > 0 for x in results)  # the porting check's estimate, per tier
    for x in results:  # its parts add up to the token's time: 1000 / (tok/s) ms
        assert sum(x["est_trn2_ms_per_token"].values()) == pytest.approx(1e3 / x["est_trn2_tok_per_s"], rel=1e-9)
    assert "est. trn2 ms/token" in r.stdout and "largest work (experimental, ms/token): " in r.stdout
    assert (tmp_path / "tiers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "Plot: " in r.stdout


def test_the_estimate_parts_table_adds_each_tiers_parts(capsys):
    from nativelab.apps.run import print_estimate_parts

    results = [{"model": "base", "est_trn2_ms_per_token": {"graph launch": 1.5, "collectives": 0.0, "kernels": 0.25},
                "est_trn2_top_work_ms_per_token": {"graph:decode": 1.0}},
               {"model": "core", "est_trn2_ms_per_token": {"graph launch": 0.5, "collectives": 0.0, "kernels": 1.0},
                "est_trn2_top_work_ms_per_token": {"kernel:nki_mlp": 0.75, "graph:decode": 0.5}}]
    print_estimate_parts(results)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["est.", "trn2", "ms/token", "base", "core"]
    assert lines[1].split() == ["graph", "launch", "1.500", "0.500"]
    assert lines[2].split() == ["kernels", "0.250", "1.000"]  # collectives: no tier spends time there, left out
    assert lines[3].split() == ["total", "1.750", "1.500"]
    assert lines[4] == "largest work (base, ms/token): graph:decode 1.000"
    assert lines[5] == "largest work (core, ms/token): kernel:nki_mlp 0.750, graph:decode 0.500"


def test_the_last_line_says_how_many_tokens_agree():
    from nativelab.apps.run import token_agreement

    def tiers(dtype, *generated):
        return [{"model": m, "dtype": dtype, "generated": g} for m, g in zip(("base", "core", "experimental"), generated)]

    same = [5, 6, 7, 8]
    assert token_agreement(tiers("float32", same, same, same)) == "Tokens: every tier gives the same 4 tokens"
    assert token_agreement(tiers("bfloat16", same, [5, 6, 7, 1], [5, 9, 7, 8])) == (
        "Tokens: the tiers agree with base for the first 1 of 4 steps (core 3, experimental 1); bf16 rounding "
        "differs between tiers, and a token that differs changes the rest")
    assert "fp32 summation order" in token_agreement(tiers("float32", same, [1, 6, 7, 8], same))


def test_bad_flags_are_clear_errors(capsys):
    from nativelab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "--size", "huge"])
    assert e.value.code != 0 and "invalid choice: 'huge'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["run", "--size", "tiny", "--tokens", "200"])
    # SystemExit(message): the interpreter prints the message to stderr and exits with status 1
    assert "exceeds the maximum sequence length 64 of size 'tiny'" in str(e.value.code)
    assert "Warmup" not in capsys.readouterr().out  # refused before any work


def test_timed_section_keeps_the_garbage_collector_out_and_restores_it():
    import gc
    import weakref

    from nativelab.apps.timed_section import timed_section

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    assert gc.isenabled()
    before = cycle()  # garbage only the cyclic collector frees
    with timed_section() as section:
        assert before() is None  # collected on the way in: the section starts with no pending garbage
        assert not gc.isenabled()
        inside = cycle()
        for _ in range(5000):  # far past the collector's allocation threshold (700)
            cycle()
        assert inside() is not None  # no pass ran inside
    assert gc.isenabled() and section.compiled == {}
    gc.collect()
    assert inside() is None
    gc.disable()
    try:  # a caller that had it off keeps it off
        with timed_section():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_timed_section_reports_other_processes_load(tmp_path):
    import subprocess
    import sys
    import time

    from nativelab.apps.timed_section import BUSY_CORES, timed_section

    # A busy process that is not this one's child (the shell exits at once, so we never reap it): other load.
    # It says when its loop has started, and the section starts only then: on a loaded machine (CI) its start
    # can lag, and a section timed before it ran saw no load at all.
    started = tmp_path / "busy-started"
    busy = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); t = time.time() + 2.5\nwhile time.time() < t: pass"
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{busy}" >/dev/null 2>&1 &'], check=True)
    deadline = time.time() + 60
    while not started.exists():
        assert time.time() < deadline, "the busy process never started"
        time.sleep(0.01)
    with timed_section() as section:
        time.sleep(1.0)
    assert section.others_cores is not None and section.others_cores >= BUSY_CORES
    assert any("other processes kept" in w for w in section.warnings())


@pytest.mark.slow
def test_run_reports_a_compile_inside_the_timed_runs(tmp_path):
    """Without warm-up the compile lands in the timed run, and the report says so; with one warm-up nothing
    compiles inside the timed runs (the timed generation repeats the warm-up's exactly)."""
    cold, warm = tmp_path / "cold.json", tmp_path / "warm.json"
    flags = "'--model', 'core', '--size', 'tiny', '--compile', '--greedy', '--tokens', '4', '--repeat', '2'"
    r = run_python(
        "from nativelab.cli import main; "
        f"main(['run', {flags}, '--warmup', '0', '--json', {str(cold)!r}]); "
        f"main(['run', {flags}, '--warmup', '1', '--json', {str(warm)!r}])",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (cold_run,), (warm_run,) = json.loads(cold.read_text()), json.loads(warm.read_text())
    compiled = cold_run["timed_section"]["compiled"]
    assert compiled.get("dynamo graphs", 0) >= 1 and compiled.get("device graphs", 0) >= 1, compiled
    assert r.stdout.count("Warning         : something compiled inside the timed runs") == 1, r.stdout
    assert warm_run["timed_section"]["compiled"] == {}
    assert len(warm_run["seconds"]) == 2 and "(median of 2 runs)" in r.stdout
