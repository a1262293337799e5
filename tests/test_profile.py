"""nativelab.profile: traffic accounting against hand-computed byte counts, fallbacks and transfers, the trace,
the plots, Dynamo graph breaks, the guide's Step 6 and the `nativelab profile` command."""

import json
import os

import pytest
import torch

import nativelab
from nativelab.device import observe, queue
from nativelab.kernels import wrap_kernel
from nativelab.models.llama import Generator, Llama, Sampling
from nativelab.profile import Session, plots, report, trace
from nativelab.apps.profile import parse_args
from conftest import recorded, run_python

F32 = 4  # bytes per float32 element
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def dev(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype).to("neuron")


def test_eager_elementwise_traffic_is_inputs_read_and_outputs_written():
    a, b = dev(4, 4), dev(4, 4)
    out = torch.empty(4, 4, device="neuron")
    with Session() as s:
        c = a + b  # reads 2 x 16 floats, writes 16
        c.add_(a)  # in place: reads c and a, writes c
        torch.mul(a, b, out=out)  # out=: reads a and b, only writes out
        d = c * 2  # the scalar is an immediate, not memory traffic
        torch.neuron.Event(enable_timing=True).record()  # a marker on the queue: no device work
        c.clone()  # a device-to-device copy (clone is empty + copy_)
    ops = s.summary()["ops"]
    assert "event_record" not in ops
    assert (ops["aten::copy_"]["read"], ops["aten::copy_"]["written"]) == (16 * F32, 16 * F32)  # clone = copy_
    assert (ops["aten::add.Tensor"]["read"], ops["aten::add.Tensor"]["written"]) == (2 * 16 * F32, 16 * F32)
    assert (ops["aten::add_.Tensor"]["read"], ops["aten::add_.Tensor"]["written"]) == (2 * 16 * F32, 16 * F32)
    assert (ops["aten::mul.out"]["read"], ops["aten::mul.out"]["written"]) == (2 * 16 * F32, 16 * F32)
    assert (ops["aten::mul.Tensor"]["read"], ops["aten::mul.Tensor"]["written"]) == (16 * F32, 16 * F32)
    assert s.traffic() == (8 * 16 * F32, 5 * 16 * F32)
    torch.testing.assert_close(d.cpu(), ((a.cpu() + b.cpu()) + a.cpu()) * 2)
    assert not observe.watched() and observe.run is None  # off again: zero cost outside a session


def test_hand_written_host_kernels_are_counted_as_kernels():
    """A kernel's host code is device work of kind 'kernel' (it was dropped as a marker when the profiler guessed
    an entry's kind from its function)."""
    def add_one(x, out):
        torch.add(x, 1, out=out)

    def host_add_one(x, out):
        torch.add(x, 1, out=out)

    host_add_one.accepts = lambda x, out: True
    kernel = wrap_kernel(add_one, targets={"host": host_add_one})
    a, out = dev(4, 4), torch.empty(4, 4, device="neuron")
    with Session() as s:
        kernel(a, out)
        kernel(out, out)
    st = s.ops[f"kernel:{kernel.name}"]
    assert (st.kind, st.calls) == ("kernel", 2) and st.seconds > 0
    torch.testing.assert_close(out.cpu(), a.cpu() + 2)


def test_scatter_into_a_cache_writes_only_the_scattered_values():
    cache = torch.zeros(2, 8, 4, device="neuron")
    pos = torch.tensor([3], dtype=torch.int32).to("neuron")
    k = dev(2, 1, 4)
    with Session() as s:
        cache.index_copy_(1, pos, k)  # the KV-cache write of a decode step
    st = s.ops["aten::index_copy_"]
    assert st.written == 2 * 4 * F32  # the new row, not the 256-byte cache
    assert st.read == 4 + 2 * 4 * F32  # the int32 position and the values
    torch.testing.assert_close(cache.cpu()[:, 3:4], k.cpu())


def test_lookups_read_only_the_rows_they_return():
    table = dev(100, 8)
    ids = torch.tensor([3, 7, 7], dtype=torch.int32).to("neuron")
    with Session() as s:
        rows = torch.nn.functional.embedding(ids, table)
    st = s.ops["aten::embedding"] if "aten::embedding" in s.ops else s.ops["aten::index_select"]
    assert (st.read, st.written) == (3 * 8 * F32 + 3 * 4, 3 * 8 * F32)  # 3 rows and 3 int32 ids, not the table
    torch.testing.assert_close(rows.cpu(), table.cpu()[[3, 7, 7]])


def test_fallback_counts_bytes_and_host_syncs():
    x = dev(4, 16)
    with Session() as s:
        for _ in range(3):
            idx = x.argmax(-1)  # a CPU fallback: 256 bytes to the host, 4 int64 results back
        host = idx.cpu()
        val = x[0, 0].item()
        y = torch.ones(8).to("neuron")
    assert s.fallback_ops() == ["aten::argmax.out"]
    fb = s.summary()["fallbacks"]["aten::argmax.out"]
    assert fb["calls"] == 3
    assert fb["to_host"] == 3 * 4 * 16 * F32 and fb["to_device"] == 3 * 4 * 8
    tr = s.summary()["transfers"]
    assert tr["bytes"]["device_to_host"] == 3 * 256 + 4 * 8 + F32  # fallback inputs, .cpu(), .item()
    assert tr["bytes"]["host_to_device"] == 3 * 32 + 8 * F32  # fallback results, .to('neuron')
    assert s.host_syncs() == 5  # 3 fallbacks + .cpu() + .item()
    assert s.traffic() == (0, 0)  # nothing ran on the device itself
    assert torch.equal(host, x.cpu().argmax(-1)) and val == x.cpu()[0, 0].item() and y.sum().item() == 8


@pytest.mark.slow
def test_compiled_graph_traffic_counts_inputs_weights_and_outputs():
    a, b = dev(4, 4), dev(4, 4)
    add = torch.compile(lambda x, y: x + y, backend="neuron")
    add(a, b)  # compile outside the session
    lin = torch.nn.Linear(4, 8, bias=False).to("neuron").eval()
    proj = torch.compile(lin, backend="neuron")
    x = dev(1, 4)
    with torch.no_grad():
        proj(x)
        with Session() as s:
            c = add(a, b)
            y = proj(x)
    graphs = {n: st for n, st in s.ops.items() if st.kind == "graph"}
    assert sorted((st.read, st.written) for st in graphs.values()) == sorted([
        (2 * 16 * F32, 16 * F32),  # a + b as one graph, as eager
        (4 * F32 + 8 * 4 * F32, 8 * F32),  # x and the frozen weight baked into the graph; y
    ])
    torch.testing.assert_close(c.cpu(), a.cpu() + b.cpu())
    torch.testing.assert_close(y.cpu(), x.cpu() @ lin.weight.detach().cpu().T)


@pytest.mark.slow
def test_kernel_launch_traffic():
    @wrap_kernel
    def add_kernel(a, b, out):
        torch.add(a, b, out=out)

    a, b, out = dev(4, 4), dev(4, 4), torch.empty(4, 4, device="neuron")
    add_kernel(a, b, out)
    with Session() as s:
        add_kernel(a, b, out)
    st = s.ops["kernel:test_kernel_launch_traffic.<locals>.add_kernel"]
    assert (st.kind, st.calls, st.read, st.written) == ("kernel", 1, 2 * 16 * F32, 16 * F32)  # out: only written
    torch.testing.assert_close(out.cpu(), a.cpu() + b.cpu())


def test_trace_is_valid_json_with_device_and_host_tracks(tmp_path):
    a, b = dev(4, 4), dev(4, 4)
    with trace.torch_profiler() as prof:
        with Session("t") as s:
            c = a + b
            c.argmax().item()
    path = tmp_path / "trace.json"
    trace.write_trace(path, [s], trace.torch_trace(prof))
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    ours = [e for e in events if isinstance(e.get("pid"), int) and e["pid"] >= trace._PID0]
    mine = [e for e in ours if e["ph"] == "X"]
    add = next(e for e in mine if e["name"] == "aten::add.Tensor")
    assert add["tid"] == 1 and add["args"] == {"bytes read": 128, "bytes written": 64} and add["dur"] >= 0
    assert any(e["name"] == "aten::argmax.default" or e["name"].startswith("aten::argmax") for e in mine
               if e["tid"] == 2 and e["cat"] == "fallback")
    assert any(e["name"] == "device -> host" and e["tid"] == 2 for e in mine)
    names = {e["args"]["name"] for e in ours if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"neuron device queue", "host: fallbacks, transfers, compiles"}
    # torch.profiler's own CPU events are kept, with the device entry visible to it as neuron::<op> ...
    theirs = next(e for e in events if e.get("name") == "neuron::aten::add.Tensor" and e.get("ph") == "X")
    # ... and our device track sits on its clock
    assert abs(theirs["ts"] - add["ts"]) < 1000


def test_plots_are_pngs(tmp_path):
    a = dev(8, 8)
    sessions = []
    for name in ("one", "two"):
        with Session(name) as s:
            (a @ a).sum()
        s.tokens = 2
        sessions.append(s)
    rows = report.compare_rows(sessions)
    for fn, path in ((plots.plot_compare, tmp_path / "c.png"), (plots.plot_categories, tmp_path / "k.png"),
                     (plots.plot_traffic, tmp_path / "t.png")):
        fn(rows, path)
        blob = path.read_bytes()
        assert blob[:8] == PNG_MAGIC and len(blob) > 5000
    plots.plot_throughput(["base", "core"], [10.0, 12.5], tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plots.plot_traffic(rows, tmp_path / "missing" / "t.png")
    assert not (tmp_path / "missing").exists()


def test_throughput_plot_stacks_each_tiers_estimated_parts(tmp_path, monkeypatch):
    """The second panel's bars are each tier's parts stacked in order (a part no tier has is left out)."""
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    parts = [{"graph launch": 1.5, "collectives": 0.0, "kernels": 0.25}, {"graph launch": 0.5, "kernels": 1.0}]
    plots.plot_throughput(["base", "core"], [10.0, 12.5], tmp_path / "r.png", est_ms_per_token=parts)
    _, est_ax = figures[0].axes
    bars = [(round(b.get_y(), 6), round(b.get_height(), 6)) for b in est_ax.patches]
    assert bars == [(0.0, 1.5), (0.0, 0.5), (1.5, 0.25), (0.5, 1.0)]  # launch under kernels, per tier
    assert [t.get_text() for t in est_ax.get_legend().get_texts()] == ["graph launch", "kernels"]
    assert [t.get_text() for t in est_ax.texts] == ["1.75 ms", "1.50 ms"]


def test_graph_breaks_and_recompiles_from_dynamo():
    def f(x):
        y = x * 2
        print("a deliberate graph break")
        return y + 1

    g = torch.compile(f, backend="eager")
    with Session() as s:
        g(torch.ones(3))
        g(torch.ones(5))  # a new shape: a recompile
    d = s.summary()["dynamo"]
    assert d["graph_breaks"] >= 1
    assert any("print" in reason for reason in d["graph_break_reasons"])
    assert d["recompiles"] >= 1 and d["compiles"] >= 3
    assert s.seconds_by_category()["compile"] > 0


def _work(a, b):
    """Queued ops, a host -> device copy, a CPU fallback and a device -> host read."""
    c = a * b + 1
    d = torch.arange(16.0).reshape(4, 4).to("neuron")
    idx = (c + d).argmax(-1)  # a CPU fallback
    return idx, (c + d).sum().item()


def test_nested_sessions_both_see_every_event():
    a, b = torch.randn(4, 4, device="neuron"), torch.randn(4, 4, device="neuron")
    _work(a, b)  # first calls of each signature (they run through Python once, alone or not)
    with Session("alone") as alone:
        _work(a, b)
    with Session("outer") as outer:
        with Session("inner") as inner:
            assert observe.observers() == (outer, inner)
            _work(a, b)
        assert observe.observers() == (outer,)
    assert recorded(inner) == recorded(outer) == recorded(alone)
    assert alone.fallback_ops() == ["aten::argmax.out"] and alone.transfer_calls["device_to_host"] == 2
    assert alone.ops["aten::mul.Tensor"].calls == 1


def test_sessions_always_detach():
    with pytest.raises(ValueError):
        with Session():
            raise ValueError("boom")
    assert not observe.watched()
    with Session() as outer:
        with pytest.raises(ValueError):
            with Session():
                raise ValueError("boom")
        assert observe.observers() == (outer,)
    assert not observe.watched()


def _tiny_generator(tier: str, greedy: bool, compile: bool = False) -> Generator:
    if compile:
        torch._dynamo.reset()  # fresh static graphs, whatever other tests compiled before
    model = Llama.random("tiny", tier).eval().to("neuron")
    model.setup_cache()
    gen = Generator(model, Sampling(greedy=greedy))
    return gen.compile() if compile else gen


@pytest.mark.parametrize("tier, greedy, expected", [
    ("base", True, ["aten::argmax.out"]),
    ("base", False, ["aten::sort.values_stable", "aten::multinomial"]),
    pytest.param("core", False, [], marks=pytest.mark.slow),  # compiles the library kernels
    pytest.param("experimental", True, [], marks=pytest.mark.slow),
])
def test_step6_fallbacks_per_tier(tier, greedy, expected):
    gen = _tiny_generator(tier, greedy)
    gen.generate([1, 2, 3], 2)
    with Session(tier) as s:
        s.tokens = len(gen.generate([1, 2, 3], 4))
    assert s.fallback_ops() == expected == nativelab.get_fallback_ops()


@pytest.mark.slow
def test_compiled_base_decode_reads_every_weight_once_per_token():
    gen = _tiny_generator("base", greedy=True, compile=True)
    gen.generate([1, 2, 3], 2)
    with Session() as prefill_only:
        gen.generate([1, 2, 3], 1)
    with Session() as s:
        gen.generate([1, 2, 3], 9)
    assert s.fallback_ops() == ["aten::argmax.out"]
    read_per_decode = (s.traffic()[0] - prefill_only.traffic()[0]) / 8
    size = {n: b.numel() * b.element_size() for n, b in gen.model.named_buffers()}
    weights = sum(p.numel() * p.element_size() for p in gen.model.parameters())
    cache = sum(v for n, v in size.items() if "cache" in n)
    tables = sum(v for n, v in size.items() if "cache" not in n)  # RoPE cos/sin, the causal mask
    # Every weight once per decoded token (the tied embedding as the LM head) and the whole static cache
    # (attention over it). The argmax fallback splits the graph and the cache write-back lands after it, so
    # the updated cache is written out by the first partition and read back by the last: a second cache read.
    assert weights + cache <= read_per_decode <= weights + 2 * cache + tables + 1024


@pytest.mark.slow
def test_profile_command_on_run_a_script_and_compare(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys, torch\nx = torch.ones(4, 4).to('neuron')\nprint('sum', (x + x).sum().item(), sys.argv[1])\n")
    code = f"""
import sys
from nativelab.cli import main
assert main(['profile', '--out', {str(tmp_path / 'run')!r}, '--', 'run', '--model', 'base', '--size', 'tiny',
             '--greedy', '--tokens', '4', '--warmup', '0', '--repeat', '1', '--dtype', 'float32']) == 0
assert main(['profile', '--json', {str(tmp_path / 's.json')!r}, {str(script)!r}, 'arg1']) == 0
assert main(['profile', '--compare', 'base', 'experimental', '--size', 'tiny', '--tokens', '3', '--dtype',
             'float32', '--greedy', '--plot', {str(tmp_path / 'cmp.png')!r}]) == 0
"""
    r = run_python(code, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sum 32.0 arg1" in r.stdout
    prof = json.loads((tmp_path / "run" / "profile.json").read_text())
    assert prof["tokens"] == 4 and prof["fallback_ops"] == ["aten::argmax.out"]
    assert prof["device_bytes_per_token"] > 0
    from nativelab.check import Trainium2
    est = prof["est_trn2_ms_per_token"]  # the check's split of a token's time, per token
    assert est["host loop"] == pytest.approx(Trainium2().host_step_s * 1e3)
    assert est["CPU fallbacks"] > 0 and prof["est_trn2_counts"]["fallback_calls"] >= 4  # argmax, every token
    assert prof["est_trn2_total_ms_per_token"] == pytest.approx(sum(est.values()))
    json.loads((tmp_path / "run" / "trace.json").read_text())
    assert (tmp_path / "run" / "profile.png").read_bytes()[:8] == PNG_MAGIC
    script_prof = json.loads((tmp_path / "s.json").read_text())
    assert script_prof["ops"]["aten::add.Tensor"]["read"] == 128
    assert "Lab 2 tiers profiled" in r.stdout and (tmp_path / "cmp.png").read_bytes()[:8] == PNG_MAGIC
    assert "Trainium2 first-order" in r.stdout and "est. trn2 ms/token" in r.stdout


def test_profile_command_prints_and_writes_the_trn2_estimate(tmp_path, capsys):
    """A profiled script gets the check's Trainium2 split of its run: one graph launch per call of its compiled
    function, a kernel boundary per kernel."""
    from nativelab.apps.profile import main
    from nativelab.check import Trainium2

    script = tmp_path / "s.py"
    script.write_text("import torch\nf = torch.compile(lambda t: t * 2 + 1, backend='neuron')\n"
                      "x = torch.ones(8).to('neuron')\nfor _ in range(3):\n    y = f(x)\nprint(y.sum().item())\n")
    assert main(["--json", str(tmp_path / "s.json"), str(script)]) == 0
    out = capsys.readouterr().out
    assert "Trainium2 first-order" in out and "ms / run" in out and "graph launches" in out
    prof = json.loads((tmp_path / "s.json").read_text())
    hw = Trainium2()
    assert prof["est_trn2_counts"]["launches"] == 3 and prof["est_trn2_counts"]["kernel_boundaries"] == 3 * 2
    assert prof["est_trn2_ms_per_run"]["graph launches"] == pytest.approx(3 * hw.graph_launch_s * 1e3)
    assert prof["est_trn2_ms_per_run"]["kernel boundaries"] == pytest.approx(6 * hw.kernel_boundary_s * 1e3)


def test_profile_command_rejects_bad_input(tmp_path, capsys):
    for argv, message in (
        (["nosuchcommand"], "neither a nativelab command"),
        (["missing_script.py"], "script 'missing_script.py' not found"),
        (["--json", str(tmp_path / "no" / "x.json"), "--compare", "base"], "does not exist"),
        (["--compare", "base", "--", "run"], "either --compare"),
        (["--compare", "fast"], "invalid choice: 'fast'"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # refused before writing anything


@pytest.mark.slow  # a fresh interpreter
def test_profiler_stands_aside_with_the_real_neuron_stack(tmp_path):
    (tmp_path / "torch_neuronx").mkdir()
    (tmp_path / "torch_neuronx" / "__init__.py").write_text("")
    code = """
from nativelab.profile import Session, traffic_per_token
assert traffic_per_token(lambda: [1]) is None
try:
    Session().__enter__()
except RuntimeError as e:
    print(e)
"""
    r = run_python(code, {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch_neuronx serves 'neuron'" in r.stdout
