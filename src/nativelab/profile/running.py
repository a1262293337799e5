"""Running a user's program under observation (`nativelab profile`, `nativelab check`): a script as `__main__`
with its own `sys.argv`, and the tokens every Llama `Generator.generate` returns, counted as they come."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def on_tokens(callback):
    """Call `callback(n)` with the number of tokens each `Generator.generate` returns while active."""
    from ..models.llama import Generator

    original = Generator.generate

    def generate(self, *a, **k):
        out = original(self, *a, **k)
        callback(len(out))
        return out

    Generator.generate = generate
    try:
        yield
    finally:
        Generator.generate = original
