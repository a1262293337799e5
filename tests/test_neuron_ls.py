"""`neuron-ls` (Lab 0 step 0-1) for the emulated device: the cores and memory the runtime serves under the
guide's variables, and AWS's own tool wherever it exists. The guide's command as typed: tests/test_guide.py."""

import os
import re
import stat
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import run_python
from nativelab.apps import neuron_ls

ROOT = Path(__file__).resolve().parents[1]
MAIN = "import sys; from nativelab.apps.neuron_ls import main; sys.exit(main(sys.argv[1:]))"
GIB_PER_LOGICAL_CORE = {2: 24, 1: 12}  # trn2.3xlarge: 96 GB of HBM over 8 physical cores, LNC physical per core


def neuron_ls_row(env: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_")} | env
    r = run_python(MAIN, env)
    assert r.returncode == 0, r.stderr
    row = next(ln for ln in r.stdout.splitlines() if re.match(r"^\| 0 ", ln))
    return [c.strip() for c in row.strip("|").split("|")]


def test_default_is_the_guides_four_logical_cores_and_96_gb_on_this_processs_cpus():
    row = neuron_ls_row({})
    assert row[:4] == ["0", "4", "0-3", "96 GB"]
    cpus = sorted(os.sched_getaffinity(0))
    if cpus == list(range(cpus[0], cpus[-1] + 1)):  # contiguous, as on CI's VM (a gap reads "0-3,8-11")
        assert row[5] == (f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0]))
    assert neuron_ls.ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and neuron_ls.ranges([]) == "-"


@pytest.mark.slow  # a fresh interpreter per setting
def test_cores_follow_neuron_rt_num_cores_and_virtual_core_size():
    assert neuron_ls_row({"NEURON_RT_NUM_CORES": "2"})[:4] == ["0", "2", "0-1", f"{2 * GIB_PER_LOGICAL_CORE[2]} GB"]
    assert neuron_ls_row({"NEURON_RT_VIRTUAL_CORE_SIZE": "1"})[:4] == ["0", "8", "0-7", "96 GB"]
    # the memory column is what the runtime accounts per core, summed
    assert neuron_ls_row({"NEURON_RT_NUM_CORES": "3", "NATIVELAB_CORE_MEMORY_GB": "1.5"})[1:4] == ["3", "0-2",
                                                                                                 "4.5 GB"]


@pytest.mark.slow  # a fresh interpreter per case
def test_bad_settings_and_arguments_get_one_clear_error():
    r = run_python(MAIN, {"NEURON_RT_NUM_CORES": "four"})
    assert r.returncode != 0 and "NEURON_RT_NUM_CORES='four': expected an integer" in r.stderr
    r = run_python(MAIN.replace("sys.argv[1:]", "['--topology']"))
    assert r.returncode == 2 and "takes no arguments" in r.stderr


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_aws_neuron_ls_on_path_runs_instead_and_another_copy_of_ours_is_skipped(tmp_path):
    # a console script pip wrote for nativelab elsewhere (another venv) comes first on PATH: not AWS's tool
    _script(tmp_path / "other-venv" / "neuron-ls",
            f"#!{sys.executable}\nimport sys\nfrom nativelab.apps.neuron_ls import main\nsys.exit(main())\n")
    _script(tmp_path / "aws" / "neuron-ls", '#!/bin/sh\necho "AWS neuron-ls $*"\n')
    path = os.pathsep.join([str(tmp_path / "other-venv"), str(tmp_path / "aws"), os.environ["PATH"]])
    r = run_python(MAIN.replace("sys.argv[1:]", "['--json-output']"), {"PATH": path})
    assert r.returncode == 0 and r.stdout == "AWS neuron-ls --json-output\n", (r.stdout, r.stderr)


def test_real_tool_is_its_install_location_then_path(tmp_path, monkeypatch):
    monkeypatch.setattr(neuron_ls, "AWS_TOOL", str(tmp_path / "absent"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert neuron_ls.real_tool() is None
    _script(tmp_path / "neuron-ls", "#!/bin/sh\n")
    assert neuron_ls.real_tool() == str(tmp_path / "neuron-ls")
    _script(tmp_path / "opt" / "neuron-ls", "#!/bin/sh\n")
    monkeypatch.setattr(neuron_ls, "AWS_TOOL", str(tmp_path / "opt" / "neuron-ls"))
    assert neuron_ls.real_tool() == str(tmp_path / "opt" / "neuron-ls")  # its install location comes first


def test_pip_install_provides_the_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, func = scripts["neuron-ls"].partition(":")
    assert module == neuron_ls.__name__ and callable(getattr(neuron_ls, func))


def test_a_reader_that_left_is_no_traceback():
    """`neuron-ls | head -1`: when the pipe's reader has gone, the tool exits 0 without a BrokenPipe traceback."""
    import subprocess

    read, write = os.pipe()
    os.close(read)  # the reader left before the tool writes: its first write meets a closed pipe
    r = subprocess.run([sys.executable, "-c", MAIN], stdout=write, stderr=subprocess.PIPE, text=True,
                       env={k: v for k, v in os.environ.items() if not k.startswith("NEURON_RT_")})
    os.close(write)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
