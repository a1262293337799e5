"""`nativelab check`: the porting report (nativelab.check.cli), able to check nativelab's own commands too
(`nativelab check -- run --model base --compile`)."""

from __future__ import annotations

from ..check import cli as check_cli


def _run(argv) -> int:
    from . import run

    run.main(argv)
    return 0


def _finetune(argv) -> int:
    from . import finetune

    return finetune.main(argv)


def main(argv=None) -> int:
    return check_cli.main(argv, commands={"run": _run, "finetune": _finetune})
