"""The `nativelab` command: `nativelab run ...` (Lab 2), `nativelab profile ...` (profiling),
`nativelab finetune ...` (SFT, LoRA or full), `nativelab check ...` (a porting report)."""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: nativelab run [options]       (nativelab run --help for the options)\n"
              "       nativelab profile [options]   (nativelab profile --help)\n"
              "       nativelab finetune [options]  (nativelab finetune --help)\n"
              "       nativelab check [options] script.py [args] | -- run ...  (nativelab check --help)")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "run":
        from .apps import run

        run.main(rest)
        return 0
    if command == "profile":
        from .apps import profile

        return profile.main(rest)
    if command == "finetune":
        from .apps import finetune

        return finetune.main(rest)
    if command == "check":
        from .apps import check

        return check.main(rest)
    print(f"nativelab: unknown command {command!r} (known: run, profile, finetune, check)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
