"""Running a user's program under observation (`nativelab profile`, `nativelab check`) exactly as `python` would:
`script.py args...` or `-m module args...`, with the script's folder first on `sys.path` (or the working
directory for `-m`), `__name__ == "__main__"`, an absolute `__file__` and the program's own `sys.argv`."""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys


def target_error(argv: list[str]) -> str | None:
    """What is wrong with a program to run (`script.py ...` or `-m module ...`), or None."""
    if not argv:
        return "give a script (script.py [args...]) or a module (-m module [args...])"
    if argv[0] == "-m":
        if len(argv) < 2:
            return "-m needs a module name"
        try:
            spec = _with_path(os.getcwd(), lambda: importlib.util.find_spec(argv[1]))
        except (ImportError, ValueError) as e:
            return f"module {argv[1]!r} not found ({e})"
        if spec is None:
            return f"module {argv[1]!r} not found"
        return None
    if not argv[0].endswith(".py"):
        return f"{argv[0]!r} is not a .py script"
    if not os.path.isfile(argv[0]):
        return f"script {argv[0]!r} not found"
    return None


def is_program(argv: list[str]) -> bool:
    """A script or `-m module` (not a nativelab command)."""
    return bool(argv) and (argv[0] == "-m" or argv[0].endswith(".py"))


def program_root(argv: list[str]) -> tuple[str | None, str]:
    """(the program's file, its folder) of `script.py ...` or `-m module ...`."""
    if argv[0] == "-m":
        spec = _with_path(os.getcwd(), lambda: importlib.util.find_spec(argv[1]))
        path = spec.origin if spec is not None and spec.origin and spec.origin.endswith(".py") else None
        return path, os.path.dirname(path) if path else os.getcwd()
    path = os.path.abspath(argv[0])
    return path, os.path.dirname(path)


def run_script(argv: list[str]) -> int:
    """Run `argv` (`script.py args...` or `-m module args...`) as `__main__`; its exit status (an exception
    propagates). What the run changes in `sys.path`, `sys.argv` and the modules it imported from the program's
    own folder is undone after, so programs run one after another in one process do not see each other's."""
    saved_argv, saved_path, before = sys.argv, list(sys.path), set(sys.modules)
    if argv[0] == "-m":
        root, run = os.getcwd(), lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        sys.argv = [argv[1], *argv[2:]]  # run_module(alter_sys=True) sets argv[0] to the module's file
    else:
        path = os.path.abspath(argv[0])
        root, run = os.path.dirname(path), lambda: runpy.run_path(path, run_name="__main__")
        sys.argv = list(argv)
    sys.path.insert(0, root)
    try:
        run()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        _forget_modules(before, root, saved_path)
    return 0


def _with_path(root: str, fn):
    sys.path.insert(0, root)
    try:
        return fn()
    finally:
        sys.path.remove(root)


def _forget_modules(before: set, root: str, path: list) -> None:
    """Drop the modules the run imported from its own folder (`model`, `data`): another program's are not these.
    Only those found through the folder the run put first: a module also reachable from the path as it was
    (nativelab itself, run from its checkout) stays."""
    inside = os.path.join(root, "")
    others = tuple(os.path.join(os.path.abspath(p or os.getcwd()), "") for p in path)
    for name in set(sys.modules) - before:
        f = getattr(sys.modules.get(name), "__file__", None) or ""
        if f.startswith(inside) and not f.startswith(others):
            del sys.modules[name]


def split_module(argv: list[str], takes_value: set[str]) -> tuple[list[str], list[str] | None]:
    """(the tool's own arguments, `-m module args...`) where `-m` is the first word that is not an option's value;
    `takes_value`: the tool's options that take one (argparse cannot take `-m` into a positional remainder)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--" or (not a.startswith("-")):
            return argv, None  # a script, a command, or `--`: argparse handles the rest
        if a == "-m":
            return argv[:i], argv[i:]
        i += 2 if (a in takes_value and "=" not in a) else 1
    return argv, None
