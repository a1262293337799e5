"""`nativelab check` and `nativelab profile` on whole programs, as a user runs them: several files, `-m module`,
a program that never reaches the device, one that crashes. Each program is written here, small and fast; what the
report must say is checked against the program's own text (its lines) and against plain `python` runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from nativelab.apps import check as check_cli
from nativelab.apps import profile as profile_cli
from test_check import _check

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _write(folder, files: dict) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _line(path, text: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return i
    raise AssertionError(f"{text!r} not in {path}")


def _kinds(report) -> list:
    return [(f["kind"], f["line"], f["title"]) for f in report["findings"]]


# The program prints what `python` gives it: its folder first on sys.path, __file__, __name__, argv.
TWO_FILES = {
    "prog/main.py": """\
        import os, sys
        import torch
        from helper import scale  # a module beside the script: found only with the script's folder on sys.path

        print("ARGV", sys.argv[1:], "NAME", __name__, "FILE", os.path.abspath(__file__) == __file__,
              "PATH0", sys.path[0] == os.path.dirname(__file__))
        x = torch.ones(4, 4).to("neuron")
        print("SUM", float(scale(x).sum()))
        """,
    "prog/helper.py": """\
        def scale(x):
            return x * 3
        """,
}


@pytest.mark.slow  # a fresh interpreter
def test_a_two_file_program_runs_as_python_runs_it(tmp_path, capsys):
    _write(tmp_path, TWO_FILES)
    script = tmp_path / "prog" / "main.py"
    code, r = _check(tmp_path, str(script), "--flag", "7")
    out = capsys.readouterr().out
    assert code == 0, _kinds(r)
    assert "ARGV ['--flag', '7'] NAME __main__ FILE True PATH0 True" in out and "SUM 48.0" in out
    assert r["counts"]["error"] == 0, _kinds(r)
    # the same program under plain python prints the same
    plain = subprocess.run([sys.executable, str(script), "--flag", "7"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": SRC}, timeout=300)
    assert "ARGV ['--flag', '7'] NAME __main__ FILE True PATH0 True" in plain.stdout, plain.stderr[-2000:]
    # and the run left nothing behind: sys.path and the program's own modules are undone
    assert str(tmp_path / "prog") not in sys.path and "helper" not in sys.modules


def test_modules_reachable_before_the_run_stay_imported(tmp_path, monkeypatch, capsys):
    """Only what the run found through the folder it put first is dropped after: a folder already on the path
    (nativelab's own checkout, run from it) keeps its modules, one copy of each."""
    _write(tmp_path, TWO_FILES)
    monkeypatch.syspath_prepend(str(tmp_path / "prog"))
    monkeypatch.delitem(sys.modules, "helper", raising=False)
    code, _ = _check(tmp_path, str(tmp_path / "prog" / "main.py"))
    assert code == 0 and "helper" in sys.modules
    del sys.modules["helper"]


def test_a_module_runs_with_dash_m(tmp_path, capsys, monkeypatch):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/train.py": """\
        import sys
        import torch
        from pkg import util
        print("ARGV", sys.argv[1:], "NAME", __name__)
        print("SUM", float(util.double(torch.ones(2, 2).to("neuron")).sum()))
        """, "pkg/util.py": "def double(x):\n    return x + x\n"})
    monkeypatch.chdir(tmp_path)  # `python -m pkg.train` finds pkg in the working directory
    code, r = _check(tmp_path, "-m", "pkg.train", "--lr", "0.1")
    out = capsys.readouterr().out
    assert code == 0, _kinds(r)
    assert "ARGV ['--lr', '0.1'] NAME __main__" in out and "SUM 8.0" in out
    assert "pkg.util" not in sys.modules


def test_profile_runs_a_two_file_program_and_a_module(tmp_path, capsys, monkeypatch):
    _write(tmp_path, TWO_FILES)
    assert profile_cli.main([str(tmp_path / "prog" / "main.py"), "a"]) == 0
    assert "ARGV ['a'] NAME __main__ FILE True PATH0 True" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path / "prog")
    assert profile_cli.main(["-m", "main", "b"]) == 0
    assert "ARGV ['b'] NAME __main__" in capsys.readouterr().out


def test_bad_programs_are_refused_by_name(tmp_path, capsys):
    for argv, message in ((["-m"], "-m needs a module name"), (["-m", "no_such_module_xyz"], "not found"),
                          ([str(tmp_path / "missing.py")], "not found")):
        with pytest.raises(SystemExit):
            check_cli.main(argv)
        assert message in capsys.readouterr().err


def test_two_optimizers_stepping_once_each_make_one_step(tmp_path):
    _write(tmp_path, {"gan.py": """\
        import torch
        g, d = torch.nn.Linear(2, 2).to("neuron"), torch.nn.Linear(2, 1).to("neuron")
        og, od = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
        for _ in range(3):
            d(g(torch.ones(1, 2, device="neuron"))).sum().backward()
            od.step()
            og.step()
            print(d.weight.sum().item())  # once per iteration: 1 per step
        """})
    code, r = _check(tmp_path, str(tmp_path / "gan.py"))
    assert code == 0 and r["steps"] == 3
    item = next(f for f in r["findings"] if f["details"].get("sync") == "item")
    assert item["count"] == 3 and item["per_step"] == 1.0


STAYS_ON_CPU = """\
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # no CUDA here: the CPU
    model = torch.nn.Linear(4, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        loss = model(torch.randn(8, 4, device=device)).square().mean()
        loss.backward()
        opt.step()
    print("TRAINED on", device)
    """


def test_a_program_that_stays_on_the_cpu_is_an_error_naming_the_choice(tmp_path, capsys):
    _write(tmp_path, {"cpu.py": STAYS_ON_CPU})
    script = tmp_path / "cpu.py"
    code, r = _check(tmp_path, str(script))
    assert "TRAINED on cpu" in capsys.readouterr().out
    assert code == 1  # it ran, but nothing was checked
    f = next(f for f in r["findings"] if f["kind"] == "no-device")
    assert f["severity"] == "error" and f["line"] == _line(script, "torch.cuda.is_available()")
    assert "torch.cuda.is_available() returned False" in f["title"]
    why = {(int(e["site"].rsplit(":", 1)[1]), e["why"].split(" called at ")[0]) for e in f["details"]["evidence"]}
    assert (_line(script, "Linear(4, 2).to(device)"), "nn.Module.to('cpu')") in why
    assert "torch.device('neuron')" in f["fix"] and "--device-from cuda" in f["fix"]


def test_a_cpu_choice_in_the_text_is_named_when_the_run_shows_none(tmp_path):
    _write(tmp_path, {"cpu2.py": "import torch\ndev = torch.device('cpu')\nx = torch.ones(3, device=dev) * 2\n"})
    code, r = _check(tmp_path, str(tmp_path / "cpu2.py"))
    f = next(f for f in r["findings"] if f["kind"] == "no-device")
    assert code == 1 and f["line"] == 2 and "torch.device('cpu')" in f["title"]


CRASHES = """\
    import torch
    a = torch.ones(2, 3, device="neuron")
    b = torch.ones(4, 5, device="neuron")
    print("BEFORE")
    c = a @ b  # shapes do not match
    print("NEVER")
    """


def test_a_program_that_crashes_reports_the_exception_the_op_and_the_line(tmp_path, capsys):
    _write(tmp_path, {"crash.py": CRASHES, "exits.py": "import sys\nimport torch\ntorch.ones(1).to('neuron')\n"
                                                      "sys.exit(3)\n"})
    script = tmp_path / "crash.py"
    code, r = _check(tmp_path, str(script))
    out = capsys.readouterr()
    assert "BEFORE" in out.out and "NEVER" not in out.out
    assert code == 1
    f = next(f for f in r["findings"] if f["kind"] == "failure")
    assert f["severity"] == "error" and f["line"] == _line(script, "a @ b")
    assert f["details"]["exception"] == "RuntimeError" and f["details"]["op"] == "aten::mm"
    assert "RuntimeError" in f["title"] and "aten::mm" in f["title"]
    assert r["findings"][0]["kind"] == "failure"  # errors first
    code, r = _check(tmp_path, str(tmp_path / "exits.py"))
    assert code == 3 and any(f["kind"] == "failure" and "status 3" in f["title"] for f in r["findings"])


# One program, one problem per block; each test below reads its part of the one report.
MANY = """\
    import os, sys
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file

    dev = "neuron"
    # float64: one cause (the model made float64), however many ops and lines compute on it
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(dev)
    net.double()
    x = torch.randn(16, 3, dtype=torch.float64).to(dev)
    y = torch.randn(16, 1, dtype=torch.float64).to(dev)
    # LBFGS: its own host reads, apart from the closure's
    opt = torch.optim.LBFGS(net.parameters(), max_iter=4)
    for step in range(3):
        def closure():
            opt.zero_grad()
            loss = F.mse_loss(net(x), y)
            loss.backward()
            print("loss", loss.item())
            return loss
        opt.step(closure)
        if step == 1:
            torch.save(net.state_dict(), sys.argv[1])  # one checkpoint in three steps
    # int64 targets of a loss whose ignore_index is -100 (not a value of the targets)
    logits = torch.randn(8, 5, device=dev, requires_grad=True)
    target = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2], device=dev)
    F.cross_entropy(logits, target).backward()
    # an eager convolution and its backward
    conv = torch.nn.Conv2d(1, 2, 3).to(dev)
    conv(torch.randn(1, 1, 6, 6, device=dev)).sum().backward()
    # many small eager ops from one line
    h = torch.zeros(4, 4, device=dev)
    for i in range(150):
        h = h * 0.5 + 1.0
    # safetensors onto the device by name
    path = os.path.join(os.path.dirname(sys.argv[1]), "w.safetensors")
    save_file({"w": torch.ones(2)}, path)
    try:
        load_file(path, device=dev)
    except Exception as e:
        print("SAFETENSORS", type(e).__name__)
    w = {k: v.to(dev) for k, v in load_file(path).items()}
    print("DONE", float(h.sum()), float(w["w"].sum()))
    """


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    d = tmp_path_factory.mktemp("many")
    _write(d, {"many.py": MANY})
    script = d / "many.py"
    code, r = _check(d, str(script), str(d / "ckpt.pt"))
    return code, r, script


def _one(r, kind, **details):
    hits = [f for f in r["findings"] if f["kind"] == kind and all(f["details"].get(k) == v for k, v in details.items())]
    assert len(hits) == 1, (kind, details, _kinds(r))
    return hits[0]


def test_many_runs_to_the_end(many):
    code, r, _ = many
    assert code == 0, _kinds(r)
    assert r["steps"] == 3 and r["step_kind"] == "optimizer"


def test_float64_is_one_finding_at_the_line_that_made_the_model_float64(many):
    _, r, script = many
    f = _one(r, "float64")
    assert f["line"] == _line(script, "net.double()")
    made = f["details"]["made_at"][0]
    assert made["code"] == "net.double()" and made["tensors_made"] == 4  # 2 weights, 2 biases
    # the model's ops, its backward and LBFGS's own arithmetic on the gradients: one cause
    lines = {int(x["site"].rsplit(":", 1)[1]) for x in f["details"]["lines"]}
    assert {_line(script, "F.mse_loss(net(x), y)"), _line(script, "opt.step(closure)")} <= lines
    assert len(f["details"]["ops"]) >= 5


def test_a_fallback_and_its_backward_are_one_finding_with_the_rewrite(many):
    _, r, script = many
    f = _one(r, "fallback", cause="aten::mse_loss")
    assert f["line"] == _line(script, "F.mse_loss(net(x), y)")
    assert {a["op"].split(".")[0] for a in f["details"]["also"]} == {"aten::mse_loss_backward"}
    assert "((a - b) ** 2).mean()" in f["fix"]
    conv = _one(r, "fallback", cause="aten::convolution_overrideable")
    assert conv["line"] == _line(script, "conv(torch.randn")
    assert {a["op"] for a in conv["details"]["also"]} == {"aten::convolution_backward_overrideable"}
    assert "torch.compile" in conv["fix"] and "replace" not in conv["fix"]


def test_lbfgs_syncs_are_the_optimizers_and_the_closures_are_its_own(many):
    _, r, script = many
    lib = _one(r, "sync", sync="optimizer")
    assert lib["line"] == _line(script, "opt.step(closure)") and lib["details"]["library"] == "torch.optim.LBFGS.step"
    assert "LBFGS" in lib["title"] and "max_iter" in lib["fix"]
    item = _one(r, "sync", sync="item")
    assert item["line"] == _line(script, "loss.item()")


def test_one_checkpoint_is_not_per_step_work(many):
    _, r, script = many
    save = _one(r, "sync", sync="save")
    assert save["line"] == _line(script, "torch.save(")
    assert save["per_step"] is None and save["details"]["one_time"] and save["severity"] == "info"
    assert "1 of 3 steps" in save["title"]
    assert all(b["details"].get("sync") != "save" for b in r["top_bottlenecks"])
    # the estimate keeps it (and the other work done in one step: the code after the loop) out of the steps
    once = [f for f in r["findings"] if f["details"].get("one_time")]
    calls = sum(f["count"] + sum(a["count"] for a in f["details"].get("also", ())) for f in once)
    assert r["estimate"]["one_time"]["calls"] == calls > save["count"]


def test_int64_findings_only_for_values_that_exist(many):
    _, r, script = many
    casts = [f for f in r["findings"] if f["kind"] in ("int64-cast", "int64-overflow")]
    assert casts and all(f["count"] > 0 for f in casts)
    # the largest |value| is the targets' 4, not nll_loss's ignore_index=-100
    assert max(f["details"]["max_abs"] for f in casts) == 4, [(f["title"], f["line"]) for f in casts]
    # no int64 finding on the float64 lines (their int arguments, dims, are not values)
    first = _line(script, "logits = torch.randn")
    assert all(f["line"] >= first for f in casts), [(f["title"], f["line"]) for f in casts]


def test_eager_launch_bound_code_names_the_lines_that_launch(many):
    _, r, script = many
    f = _one(r, "eager-launch")
    loop = _line(script, "h = h * 0.5 + 1.0")
    assert any(x["site"].endswith(f":{loop}") and x["ops"] == 300 for x in f["details"]["lines"])
    assert f["details"]["share"] > 0.5 and 'backend="neuron"' in f["fix"]


def test_safetensors_load_onto_the_device_is_flagged_with_the_workaround(many, capsys):
    _, r, script = many
    f = _one(r, "safetensors-device")
    assert f["line"] == _line(script, "load_file(path, device=dev)") and f["severity"] == "error"
    assert "load_file(path).items()" in f["fix"] and ".to('neuron')" in f["fix"]


TRAINER_ON_CPU = """\
    import torch
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), labels)}

    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(8)]
    args = TrainingArguments(output_dir=OUT, use_cpu=True, max_steps=2, per_device_train_batch_size=4,
                             report_to=[], save_strategy="no", logging_strategy="no")
    Trainer(model=Tiny(), args=args, train_dataset=data).train()
    print("TRAINED")
    """


@pytest.mark.slow
def test_a_trainer_kept_on_the_cpu_names_training_arguments_device(tmp_path, capsys):
    pytest.importorskip("transformers")
    _write(tmp_path, {"hf.py": TRAINER_ON_CPU.replace("OUT", repr(str(tmp_path / "out")))})
    script = tmp_path / "hf.py"
    code, r = _check(tmp_path, str(script))
    assert "TRAINED" in capsys.readouterr().out
    f = next(f for f in r["findings"] if f["kind"] == "no-device")
    assert code == 1 and f["line"] == _line(script, "use_cpu=True")  # the choice, in the program's text
    assert "use_cpu=True" in f["title"]
    trainer = [e for e in f["details"]["evidence"] if "TrainingArguments.device ('cpu')" in e["why"]]
    assert trainer and trainer[0]["site"].endswith(f":{_line(script, '.train()')}")  # the run's move, at the call


def test_eager_launches_beside_a_compiled_model_point_at_the_step_not_at_compiling(tmp_path):
    # nanoGPT's shape: the model is compiled, the optimizer's per-parameter ops stay eager. "Compile the model"
    # would be no advice; the compile call is named, and the fused optimizer is.
    script = tmp_path / "compiled.py"
    script.write_text(textwrap.dedent("""\
        import torch
        model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(8)]).to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step = torch.compile(model, backend="neuron")
        x = torch.randn(2, 4).to("neuron")
        for _ in range(3):
            step(x).sum().backward()
            opt.step()
            opt.zero_grad()
        """))
    code, r = _check(tmp_path, str(script))
    assert code == 0
    f = _one(r, "eager-launch")
    assert f["line"] == _line(script, "opt.step()")
    assert f"compiled.py:{_line(script, 'torch.compile(')}" in f["fix"] and "fused=True" in f["fix"]
    assert "compile the model" not in f["fix"]
