"""`nativelab run` (the Lab 2 benchmark) on the tiny model: the guide's report and the tier table."""

import json


from conftest import run_python


def test_run_prints_the_guides_report_and_fallbacks(tmp_path):
    out = tmp_path / "r.json"
    r = run_python(
        "import sys; from nativelab.cli import main; "
        f"sys.exit(main(['run', '--model', 'all', '--size', 'tiny', '--greedy', '--tokens', '8', '--warmup', '1', "
        f"'--dtype', 'float32', '--json', {str(out)!r}, '--plot', {str(tmp_path / 'tiers.png')!r}]))",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    text = r.stdout
    for line in ("Model   : base — Baseline (pure PyTorch ops, RoPE, static KV cache)", "Size    : tiny",
                 "Compile : False", "Tokens  : 8", "Params  : 102,720  (0.4 MB float32)", "Warmup...", "Timing...",
                 "Tokens generated: 8", "CPU fallback ops: ['aten::argmax.out']", "CPU fallback ops: []",
                 "Same tokens from every tier: True"):
        assert line in text, line
    results = json.loads(out.read_text())
    assert [x["model"] for x in results] == ["base", "core", "experimental"]
    assert all(x["tok_per_s"][0] > 0 for x in results)
    # 2 layers x (4096 + 2048 + 2048 + 4096 attention + 3 x 64 x 160 MLP + 2 x 64 norms) + 256 x 64 tied
    # embedding + 64 final norm = 102,720: the LM head shares the embedding, also on the device
    assert len({tuple(x["generated"]) for x in results}) == 1  # fp32: every tier says the same
    # the traffic column: eager base round-trips every intermediate, the fused tiers do not
    assert "Device MB/token" in text
    assert results[0]["device_bytes_per_token"] > results[1]["device_bytes_per_token"] > 0
    assert results[0]["device_bytes_per_token"] > results[2]["device_bytes_per_token"] > 0
    assert (tmp_path / "tiers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "Plot: " in text


def test_bad_flags_are_clear_errors():
    r = run_python("from nativelab.cli import main; main(['run', '--size', 'huge'])")
    assert r.returncode != 0 and "invalid choice: 'huge'" in r.stderr
    r = run_python("from nativelab.cli import main; main(['run', '--size', 'tiny', '--tokens', '200'])")
    assert r.returncode != 0 and "exceeds the maximum sequence length 64 of size 'tiny'" in r.stderr
    assert "Warmup" not in r.stdout  # refused before any work
