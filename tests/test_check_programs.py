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
