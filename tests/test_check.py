"""nativelab check: small scripts that each carry one known porting problem; the report must name it, at its
line, with its count per step and its fix (the lines are found in the scripts' text, not hard-coded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import nativelab
from nativelab.apps import check as check_cli
from nativelab.check import Check, step
from nativelab.check.collect import propose_buckets
from nativelab.device import observe
from nativelab.profile import Session
from conftest import recorded

SCRIPTS = os.path.join(os.path.dirname(__file__), "check_scripts")
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _script(name: str) -> str:
    return os.path.join(SCRIPTS, name)


def _line(name: str, text: str) -> int:
    """The 1-based line of the first line of a script containing `text`."""
    with open(_script(name)) as f:
        for i, line in enumerate(f, 1):
            if text in line:
                return i
    raise AssertionError(f"{text!r} not in {name}")


def _check(tmp_path, *argv) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    code = check_cli.main(["--quiet", "--json", str(out), *argv])
    return code, json.loads(out.read_text())


def _find(report, kind, line=None, **details):
    hits = [f for f in report["findings"] if f["kind"] == kind and (line is None or f["line"] == line)
            and all(f["details"].get(k) == v for k, v in details.items())]
    assert hits, f"no {kind} finding at line {line} in {[(f['kind'], f['line'], f['title']) for f in report['findings']]}"
    return hits[0]


def test_training_step_fallbacks_and_syncs(tmp_path):
    name = "train_fallbacks.py"
    code, r = _check(tmp_path, _script(name))
    assert code == 0
    assert r["step_kind"] == "optimizer" and r["steps"] == 4
    sort = _find(r, "fallback", _line(name, "torch.argsort"))
    assert sort["details"]["op"].startswith("aten::sort")
    assert sort["count"] == 4 and sort["per_step"] == 1.0
    assert sort["details"]["bytes_to_host"] >= 32 * 4  # the 32 fp32 scores went to the host, every step
    assert "topk" in sort["fix"]
    mask = _find(r, "sync", _line(name, "pred[keep]"))
    assert mask["count"] == 8 and mask["per_step"] == 2.0  # pred[keep] and y[keep]
    assert "torch.where" in mask["fix"]
    item = _find(r, "sync", _line(name, "{loss.item()"), sync="item")
    assert item["count"] == 4 and item["per_step"] == 1.0
    assert "every N steps" in item["fix"]
    assert r["fallback_ops"] == ["aten::sort.values_stable"]


def test_int64_and_int_fp32_overflow(tmp_path):
    name = "int_overflow.py"
    code, r = _check(tmp_path, "--fail-on", "int64-overflow", _script(name))
    assert code == 1
    add = _find(r, "int64-overflow", _line(name, "+ 2**31"))
    assert add["severity"] == "error" and add["details"]["max_abs"] == 2**31
    mul = _find(r, "int64-overflow", _line(name, "ids * 3"))
    assert mul["details"]["max_abs"] == 2**31  # 2^31 wrapped to -2^31 by the cast above
    sc = _find(r, "int-fp32", _line(name, "scatter_add_"))
    assert sc["severity"] == "error" and sc["details"]["max_abs"] == 2 * (2**24 + 1)  # index 1 gets two values
    # and the device computed it as the CPU does (the dtype policy's written-argument path)
    assert not any(f["kind"] == "int64-overflow" and f["line"] == _line(name, "scatter_add_") for f in r["findings"])


def test_int64_and_int_fp32_overflow_inside_compiled_graphs(tmp_path):
    name = "int_overflow_compiled.py"
    code, r = _check(tmp_path, "--fail-on", "int64-overflow", _script(name))
    assert code == 1 and r["notes"] == []
    ids = torch.arange(8)  # the script's values, computed here in int64 on the CPU
    add = _find(r, "int64-overflow", _line(name, "far = ids + 2**31"), op="aten::add.Tensor")
    assert add["severity"] == "error" and add["count"] == 3
    assert add["details"]["max_abs"] == int((ids + 2**31).abs().max())
    total = _find(r, "int64-overflow", _line(name, "return far.sum()"), op="aten::sum")
    assert total["details"]["max_abs"] == int((ids + 2**31).sum())
    sc = _find(r, "int-fp32", _line(name, "out.scatter_add"))
    want = torch.zeros(4, dtype=torch.int64).scatter_add(0, torch.tensor([0, 1, 1, 2]), torch.full((4,), 2**24 + 1))
    assert sc["severity"] == "error" and sc["count"] == 3 and sc["details"]["max_abs"] == int(want.max())
    inp = _find(r, "int64-cast", _line(name, "far = ids + 2**31"), op="compiled graph input")
    assert inp["severity"] == "info" and inp["details"]["max_abs"] == 7


def test_bf16_drift_blames_the_op_that_adds_it(tmp_path):
    name = "bf16_drift.py"
    code, r = _check(tmp_path, "--bf16-drift", _script(name))
    assert code == 0
    (f,) = [f for f in r["findings"] if f["kind"] == "bf16-drift"]  # mean, div, tanh, mul only round (~2^-9)
    assert f["line"] == _line(name, "centred = x - mean") and f["count"] == 2
    torch.manual_seed(0)
    x = (1002 + torch.randn(4096)).bfloat16()  # the script's values, on the CPU
    want = x.float() - x.float().mean()
    got = (x - x.mean()).float()
    assert f["details"]["max_relative_error"] == pytest.approx(float((got - want).norm() / want.norm()), rel=1e-3)
    assert f["details"]["max_relative_error"] > 0.5
    _, r = _check(tmp_path, _script(name))  # off by default
    assert not [f for f in r["findings"] if f["kind"] == "bf16-drift"]


def test_clean_script_passes_every_gate(tmp_path):
    for gate in ("fallback", "sync", "int64-overflow", "recompile", "memory", "fallback,sync,int64-overflow,recompile"):
        code, r = _check(tmp_path, "--fail-on", gate, _script("clean.py"))
        assert code == 0, gate
        assert r["findings"] == []
    assert r["memory"]["0"]["peak_bytes"] > 0


def test_fail_on_lists_the_findings(tmp_path, capsys):
    code, r = _check(tmp_path, "--fail-on", "fallback", _script("train_fallbacks.py"))
    assert code == 1
    err = capsys.readouterr().err
    assert f"train_fallbacks.py:{_line('train_fallbacks.py', 'torch.argsort')}" in err
    assert "fail --fail-on fallback" in err
    code, _ = _check(tmp_path, "--fail-on", "int64-overflow", _script("train_fallbacks.py"))
    assert code == 0  # its int64 index values fit


def test_bad_fail_on_is_an_error(capsys):
    with pytest.raises(SystemExit):
        check_cli.main(["--fail-on", "fallbacks", _script("clean.py")])
    assert "unknown ['fallbacks']" in capsys.readouterr().err


def test_markdown_and_terminal_outputs(tmp_path, capsys):
    md = tmp_path / "report.md"
    assert check_cli.main(["--markdown", str(md), _script("train_fallbacks.py")]) == 0
    text = md.read_text()
    line = _line("train_fallbacks.py", "{loss.item()")
    assert f"train_fallbacks.py:{line}`" in text and "| severity | finding |" in text
    out = capsys.readouterr().out
    assert "aten::sort.values_stable falls back to the CPU" in out and "Trainium2 first-order estimate" in out
    assert "pred[keep]" in out  # the source line, not eaten as markup


def test_cuda_script_under_device_from(tmp_path, capsys):
    name = "cuda_train.py"
    code, r = _check(tmp_path, "--device-from", "cuda", _script(name))
    assert code == 0
    assert "ran on neuron" in capsys.readouterr().out
    item = _find(r, "sync", _line(name, "print(\"loss\""), sync="item")
    assert item["count"] == 3 and item["per_step"] == 1.0
    assert torch.cuda.is_available() == (torch.cuda.device_count() > 0)  # the mapping is undone


def test_api_marked_steps():
    x = torch.ones(8).to("neuron")
    with Check("api") as c:
        for _ in range(5):
            y = torch.argsort(x)
            step()
            step.__doc__  # noqa: B018
    r = c.report()
    assert r.steps == 5 and r.step_kind == "marked"
    (fb,) = [f for f in r.findings if f.kind == "fallback"]
    assert fb.per_step == 1.0 and fb.line is not None
    assert y.device.type == "neuron"
    assert observe.collective is None and observe.dispatch is None  # unhooked: the device pays one None test


def _ported_step(x, w):
    """Queued ops, a host -> device copy, a CPU fallback (argsort) and device -> host reads."""
    y = x @ w + torch.arange(4.0).to("neuron")
    order = torch.argsort(y[:, 0])
    return y[order].sum().item()


def _findings(c: Check) -> list:
    return sorted((f.kind, f.line, f.count, f.details.get("op"), f.details.get("sync"))
                  for f in c.report().findings if f.kind in ("fallback", "sync"))


def test_a_check_and_a_profile_session_nest_either_way_and_each_sees_every_event():
    x, w = torch.randn(4, 4).to("neuron"), torch.randn(4, 4).to("neuron")
    _ported_step(x, w)  # first calls of each signature (they run through Python once, watched or not)
    with Session("alone") as alone:
        _ported_step(x, w)
    with Check("alone") as checked_alone:
        _ported_step(x, w)
    with Session("outer") as outer:
        with Check("inside") as inside:
            assert observe.observers() == (outer, inside.watch)
            _ported_step(x, w)
    with Check("outside") as outside:
        with Session("inner") as inner:  # a script that profiles itself, checked
            assert observe.observers() == (outside.watch, inner)
            _ported_step(x, w)
    assert not observe.watched()
    want = recorded(alone)
    (sort,) = want["fallbacks"]
    assert sort.startswith("aten::sort") and want["ops"][sort][2] == 1
    assert want["transfer_calls"] == {"host_to_device": 2, "device_to_host": 2}  # arange + sort back; sort in, item
    for s in (outer, inner, checked_alone.watch, inside.watch, outside.watch):
        assert recorded(s) == want, s.name
    assert _findings(inside) == _findings(outside) == _findings(checked_alone)
    assert ("fallback", _ported_step.__code__.co_firstlineno + 3, 1, sort, None) in _findings(checked_alone)


def test_checks_nest():
    x = torch.arange(8.0).flip(0).to("neuron")
    real_compile = torch.compile

    def two_steps():
        for _ in range(2):
            torch.argsort(x)
            step()
        torch.compile(torch.nn.Identity(), backend="neuron")  # recorded as torch.compile runs (never called)

    two_steps()
    with Check("alone") as alone:
        two_steps()
    with Check("outer") as outer:
        with Check("inner") as inner:
            two_steps()
    assert not observe.watched() and torch.compile is real_compile
    for c in (alone, outer, inner):
        assert c.watch.steps == 2 and c.watch.step_kind == "marked"
        assert [call["backend"] for call in c.watch.compile_calls] == ["neuron"]
    assert recorded(inner.watch) == recorded(outer.watch) == recorded(alone.watch)
    assert _findings(inner) == _findings(outer) == _findings(alone)
    assert [f[:3] for f in _findings(alone)] == [("fallback", two_steps.__code__.co_firstlineno + 2, 2)]


def test_nested_checks_and_a_check_in_a_session_record_the_same_compile_calls_and_graph_launches():
    """torch.compile is never replaced (compile_calls.py): a module's compile call is seen as torch.compile runs,
    a function's at its first frame compile, by every check watching, each at the line of its torch.compile; the
    graphs' launches are each observer's `run` events and the runtime's one count (`graph:<name>`)."""
    from nativelab.device import tracking

    real_compile = torch.compile
    x = torch.randn(4, 8).to("neuron")
    model = torch.nn.Linear(8, 8).to("neuron")

    def compile_and_run():
        compiled = torch.compile(model, backend="neuron", dynamic=False)
        for _ in range(3):
            compiled(x)
        torch.neuron.synchronize()

    @torch.compile(backend="neuron", fullgraph=True)
    def double(t):
        return t * 2

    compile_and_run()  # Dynamo compiles it here; below the same graphs are served from its cache
    before = tracking.executed_counts()
    with Check("alone") as alone:
        compile_and_run()
    with Check("outer") as outer:
        with Check("inner") as inner:
            compile_and_run()
            assert torch.compile is real_compile
            double(x)  # its first call: Dynamo compiles its frame, both checks watching
    with Session("profile") as profile:
        with Check("inside") as inside:
            compile_and_run()
    assert torch.compile is real_compile and not observe.watched()
    module_call = {"site": (__file__, compile_and_run.__code__.co_firstlineno + 1), "backend": "neuron",
                   "dynamic": False, "mode": None, "options": None, "fullgraph": False}
    function_call = {"site": (__file__, double.__wrapped__.__code__.co_firstlineno), "backend": "neuron", "dynamic": None,
                     "mode": None, "options": None, "fullgraph": True}
    calls = lambda c: [{**call, "site": (call["site"].file, call["site"].line)} for call in c.watch.compile_calls]
    assert calls(alone) == calls(inside) == [module_call]
    assert calls(outer) == calls(inner) == [module_call, function_call]
    graphs = lambda s: {n: st.calls for n, st in s.ops.items() if st.kind == "graph"}
    launched = graphs(alone.watch)
    assert launched and all(n.startswith("graph:") and k % 3 == 0 for n, k in launched.items()), launched
    assert graphs(inside.watch) == graphs(profile) == launched
    doubled = {n: k for n, k in graphs(inner.watch).items() if n not in launched}  # double's one launch
    assert graphs(outer.watch) == graphs(inner.watch) == {**launched, **doubled} and list(doubled.values()) == [1]
    after = tracking.executed_counts()  # the device's one count: each launch once, however many watched it
    assert {n: after[n] - before.get(n, 0) for n in launched} == {n: 3 * k for n, k in launched.items()}
    assert not hasattr(tracking, "graphs")


def test_frames_of_code_dynamo_made_with_an_unhashable_constant_are_placed():
    """`model.compile()` compiles nn.Module's _call_impl into code whose constants include a dict: the check's
    frame walk (which line is the user's) raised 'unhashable type: dict' inside Dynamo's compile callback. Code
    objects also compare equal across files: a cache by code placed the second file's as the first's."""
    from nativelab.check import source

    user = compile("y = 1", __file__, "exec")
    for code, internal in ((user, False), (user.replace(co_filename=torch.__file__), True)):
        odd = code.replace(co_consts=(*code.co_consts, {"a": 1}))
        with pytest.raises(TypeError):
            hash(odd)
        assert source._is_internal(odd) is source._is_internal(code) is internal


def test_a_script_that_profiles_itself_checked(tmp_path):
    name = "profiles_itself.py"
    env = dict(os.environ, NATIVELAB_QUIET="1", PYTHONPATH=SRC)
    p = subprocess.run([sys.executable, _script(name), str(tmp_path / "alone.json")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    code, r = _check(tmp_path, _script(name), str(tmp_path / "checked.json"))
    assert code == 0
    alone, checked = (json.loads((tmp_path / f).read_text()) for f in ("alone.json", "checked.json"))
    untimed = lambda d: {n: {k: v for k, v in st.items() if k not in ("seconds", "fastest")}
                         for n, st in d["fallbacks"].items()}
    assert untimed(checked) == untimed(alone) and checked["transfers"] == alone["transfers"]
    ((op, st),) = alone["fallbacks"].items()
    fb = _find(r, "fallback", _line(name, "torch.argsort"))
    assert fb["details"]["op"] == op and fb["count"] == st["calls"] == 3
    assert fb["details"]["bytes_to_host"] == st["to_host"] == 3 * 8 * 4  # x + step, fp32, to the host each step
    item = _find(r, "sync", _line(name, ".item()"), sync="item")
    assert item["count"] == 3
    assert alone["transfers"]["calls"]["device_to_host"] == 3 + 3  # the fallback's input and .item(), per step
    assert r["fallback_ops"] == [op]


def test_eager_ops_cost_the_eager_launch_not_the_graph_launch():
    x = torch.ones(64).to("neuron")
    with Check("eager") as c:
        y = (x * 2 + 1).sum()
        torch.neuron.synchronize()
    e = c.report().estimate
    hw = c.hardware
    assert e["counts"]["eager_ops"] == 3 and e["counts"]["launches"] == 0  # mul, add, sum: one launch each
    assert e["parts"]["eager op launches"] == pytest.approx(3 * hw.eager_launch_s) and e["parts"]["graph launches"] == 0
    assert e["parts"]["kernel boundaries"] == 0  # an eager op's launch figure is all of its cost outside the work
    assert y.item() == 192.0


def test_an_extra_host_sync_per_step_costs_exactly_the_sync_term():
    """The same steps with one more device -> host read per step (a 4-byte .item() of a value both runs compute)
    are estimated slower by exactly one round trip plus those bytes over the host link per step, nothing else."""
    x = torch.ones(64).to("neuron")

    def run(read: bool):
        with Check("sync") as c:
            for _ in range(5):
                s = (x * 2).sum()
                if read:
                    s.item()
                step()
            torch.neuron.synchronize()
        return c.report().estimate, c.hardware

    (plain, hw), (reading, _) = run(False), run(True)
    extra = reading["seconds_per"] - plain["seconds_per"]
    assert extra == pytest.approx(hw.host_round_trip_s + 4 / hw.host_link_bytes_per_s, rel=1e-9)
    assert reading["counts"]["sync_calls"] - plain["counts"]["sync_calls"] == 5
    assert {k: v for k, v in reading["parts_per"].items() if k != "host syncs"} == \
        {k: v for k, v in plain["parts_per"].items() if k != "host syncs"}


def test_strict_mode_raises_at_the_line():
    name = "strict_argsort.py"
    env = dict(os.environ, NATIVELAB_STRICT="1", NATIVELAB_QUIET="1", PYTHONPATH=SRC)
    p = subprocess.run([sys.executable, _script(name)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "FallbackError" in p.stderr and "aten::sort" in p.stderr
    assert f'strict_argsort.py", line {_line(name, "torch.argsort")}' in p.stderr
    assert "not reached" not in p.stdout


def test_propose_buckets_waste():
    lengths = [17, 60, 130, 250, 400, 512]
    buckets, waste = propose_buckets(lengths)
    assert buckets == [128, 256, 512]
    padded = 128 + 128 + 256 + 256 + 512 + 512
    assert waste == pytest.approx((padded - sum(lengths)) / padded)


@pytest.mark.slow
def test_compile_dynamic_flagged_with_shapes_and_buckets(tmp_path):
    name = "compile_dynamic.py"
    code, r = _check(tmp_path, "--fail-on", "recompile", _script(name))
    assert code == 1
    opt = _find(r, "compile-option", _line(name, "compiled = torch.compile("), option="dynamic")
    assert "rejected" in opt["fix"] and "awsdocs-neuron" in opt["fix"]
    shapes = _find(r, "recompile", _line(name, "out = compiled(batch, w)"))  # per compiled function, at its call
    assert shapes["details"]["def_site"].endswith(f"{name}:{_line(name, 'def score')}")
    assert shapes["details"]["distinct_shapes"] == 6
    assert shapes["details"]["buckets"] == [128, 256, 512]
    assert shapes["details"]["padding_waste"] == pytest.approx(propose_buckets([17, 60, 130, 250, 400, 512])[1])


@pytest.mark.slow
def test_default_backend_on_the_device_says_trainium_needs_backend_neuron(tmp_path):
    name = "compile_default.py"
    code, r = _check(tmp_path, _script(name))
    found = _find(r, "compile-option", _line(name, "model = torch.compile(model)"), option="backend")
    assert found["severity"] == "error" and "backend='neuron'" in found["fix"]


def test_recompile_points_at_the_call(tmp_path):
    name = "recompile.py"
    code, r = _check(tmp_path, "--fail-on", "recompile", _script(name))
    assert code == 1
    (f,) = [f for f in r["findings"] if f["kind"] == "recompile"]
    assert f["line"] == _line(name, "y = compiled(x, k)") and "k == 2" in f["title"]
    assert f["details"]["def_site"].endswith(f"{name}:{_line(name, 'def scale')}")


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["base", "core"])
def test_lab2_tiers(tmp_path, tier):
    code, r = _check(tmp_path, "--", "run", "--model", tier, "--size", "tiny", "--compile", "--greedy",
                     "--tokens", "4", "--warmup", "1")
    assert code == 0 and r["step_kind"] == "token"
    fallbacks = [f for f in r["findings"] if f["kind"] == "fallback"]
    if tier == "base":
        generate = os.path.join(os.path.dirname(nativelab.__file__), "models", "llama", "generate.py")
        with open(generate) as f:
            line = next(i for i, s in enumerate(f, 1) if "logits.argmax(-1)" in s)
        (fb,) = fallbacks
        assert fb["details"]["op"] == "aten::argmax.out" and fb["line"] == line and fb["per_step"] == 1.0
    else:
        assert fallbacks == []
    assert r["estimate"]["rate_per_s"] > 0


def _two_ranks(tmp_path, *script_args) -> list[dict]:
    """The collectives script checked in two processes, one rank each (a `neuron` group over TCP, no torchrun);
    one JSON report per rank through --json's {rank}."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   NATIVELAB_QUIET="1", OMP_NUM_THREADS="1", PYTHONPATH=SRC)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "nativelab.check", "--quiet", "--json", str(tmp_path / "r{rank}.json"),
             _script("collectives.py"), *script_args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
    return [json.loads((tmp_path / f"r{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow  # collectives over a process group
def test_collectives_per_step_with_lines_and_time(tmp_path):
    name = "collectives.py"
    # A rank's collective bandwidth from the published figures (trainium2.html: 3.5 TB/s DMA; HBM 2.9 TB/s, each
    # byte read and written): its 2/8 share of the chip; ring all_reduce sends 2(n-1)/n of the buffer, the others
    # (n-1)/n of the full buffer, broadcast the buffer; 20 us per call.
    bw = min(3.5e12, 2.9e12 / 2) * 2 / 8
    want = {  # collective: (line, bytes over 3 steps, bytes sent per byte)
        "all_reduce": (_line(name, "dist.all_reduce(grad)"), 3 * 4096, 1.0),
        "all_gather": (_line(name, "dist.all_gather_into_tensor"), 3 * 2 * 256 * 4, 0.5),
        "reduce_scatter": (_line(name, "dist.reduce_scatter_tensor"), 3 * 2 * 256 * 4, 0.5),
        "broadcast": (_line(name, "dist.broadcast"), 3 * 4096, 1.0),
        "barrier": (_line(name, "dist.barrier()"), 0, 0.0),
    }
    for r in _two_ranks(tmp_path):
        assert r["step_kind"] == "marked" and r["steps"] == 3
        total = 0.0
        for kind, (line, nbytes, factor) in want.items():
            f = _find(r, "collective", line, collective=kind)
            assert f["count"] == 3 and f["per_step"] == 1.0
            assert f["details"]["bytes"] == nbytes and f["details"]["world_size"] == 2
            assert f["cost_s"] == pytest.approx(3 * 20e-6 + nbytes * factor / bw)
            total += f["cost_s"]
        assert r["estimate"]["parts"]["collectives"] == pytest.approx(total)


@pytest.mark.slow  # FSDP2 over a process group
def test_fsdp2_collectives_at_the_users_lines(tmp_path):
    name = "collectives.py"
    for r in _two_ranks(tmp_path, "fsdp"):
        assert r["step_kind"] == "optimizer" and r["steps"] == 2
        gather = _find(r, "collective", _line(name, "loss = (model(x)"), collective="all_gather")
        assert gather["per_step"] >= 1.0 and gather["details"]["bytes"] > 0
        scatter = _find(r, "collective", _line(name, "loss.backward()"), collective="reduce_scatter")
        assert scatter["per_step"] >= 1.0 and scatter["details"]["bytes"] > 0


def test_float64_findings_count_only_what_the_device_narrows():
    """The check asks the device's policy (policy.plan / is_narrowed) which inputs compute as float32: float64
    device tensors that are not 0-d, in ops the device computes. Complex tensors compute as they are, a 0-d
    float64 exactly, and a CPU fallback (cummax) in float64; none of those is reported."""
    c64 = torch.randn(16, dtype=torch.complex64).to("neuron")
    c128 = torch.randn(16, dtype=torch.complex128).to("neuron")
    f64 = torch.randn(16, dtype=torch.float64).to("neuron")
    with Check("dtypes") as c:
        (c64 * c64).sum()
        (c128 * c128).sum()
        (f64[0] * 2).cpu()
        torch.cummax(f64, 0)
        z = f64 * 3  # the only op the device computes in float32
    (finding,) = [f for f in c.report().findings if f.kind == "float64"]
    assert finding.details["dtypes"] == ["float64"]
    assert finding.count == 1 and finding.details["ops"] == ["aten::mul.Tensor"]
    torch.testing.assert_close(z.cpu(), (f64.cpu().float() * 3).double())
