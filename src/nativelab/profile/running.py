"""Running a user's program under observation (`nativelab profile`, `nativelab check`): a script as `__main__`
with its own `sys.argv`."""

from __future__ import annotations

import runpy
import sys


def run_script(argv: list[str]) -> int:
    """Run `argv[0]` as `__main__` with `argv` as its sys.argv; its exit status (an exception propagates)."""
    saved = sys.argv
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0
