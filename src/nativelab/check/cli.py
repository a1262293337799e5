"""`nativelab check` / `python -m nativelab.check`: run a script (or a nativelab command) on the emulated device and report what would break
or be slow on Trainium, with source lines, counts per step, fixes and a Trainium2 estimate.

    nativelab check train.py --epochs 1
    nativelab check -m mypackage.train --epochs 1
    nativelab check --device-from cuda train_cuda.py
    nativelab check --json report.json --markdown report.md --fail-on fallback,sync train.py
    nativelab check -- run --model base --compile --greedy
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from ..profile.running import is_program, run_script, split_module, target_error
from . import findings as F
from .api import Check
from .hardware import Trainium2
from .report import write
from .runner import device_from

COMMANDS = ("run", "finetune")  # nativelab commands that can be checked (the apps pass them in: `nativelab check`)
# The guide's measured Lab 2 throughput on trn2 (compiled, greedy), printed beside the estimate.
GUIDE_TOK_S = {"base": 359.0, "core": 435.3, "experimental": 537.4}


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="nativelab check",
        description="What in a PyTorch program would break or be slow on Trainium: CPU fallbacks, host syncs, "
                    "graph breaks and recompiles, int64/fp32 value risks, memory; with the user's source lines, "
                    "counts per step, fixes, and a first-order Trainium2 estimate.",
        epilog="examples: nativelab check train.py | nativelab check --device-from cuda train.py | "
               "nativelab check --fail-on fallback,sync train.py | nativelab check -- run --model base --compile",
    )
    ap.add_argument("--device-from", default=None, choices=["cuda"],
                    help="map cuda (device='cuda', .cuda(), torch.cuda.*) to the emulated neuron device")
    ap.add_argument("--json", default=None, help="write the report as JSON to this file ({rank}: the torch.distributed "
                    "rank, for one report per rank under torchrun)")
    ap.add_argument("--markdown", default=None, help="write the report as Markdown to this file (CI artifact, PR; "
                    "{rank} as for --json)")
    ap.add_argument("--fail-on", default="", help=f"exit 1 when findings of these kinds exist "
                    f"(comma-separated: {','.join(F.FAIL_ON)})")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a Trainium2 parameter of the estimate (graph_launch_s, host_step_s, host_round_trip_s, ...)")
    ap.add_argument("--bf16-drift", action="store_true",
                    help="report bf16 ops whose results drift from a float32 shadow computation (eager ops; slow)")
    ap.add_argument("--quiet", action="store_true", help="no terminal report (with --json / --markdown)")
    ap.add_argument("target", nargs=argparse.REMAINDER,
                    help="a Python script and its arguments (or -m module ...), or after --: a nativelab command "
                         "(run ...)")
    own, module = split_module(list(argv), {o for a in ap._actions if a.nargs != 0 for o in a.option_strings})
    args = ap.parse_args(own)
    if module is not None:
        args.target = module
    if args.target and args.target[0] == "--":
        args.target = args.target[1:]
    if not args.target:
        ap.error("give a script to check (script.py [args...] or -m module [args...]) or a nativelab command "
                 "after -- (-- run ...)")
    t0 = args.target[0]
    if t0 not in COMMANDS and not is_program(args.target):
        ap.error(f"{t0!r} is neither a nativelab command ({', '.join(COMMANDS)}) nor a .py script or -m module")
    problem = None if t0 in COMMANDS else target_error(args.target)
    if problem:
        ap.error(problem)
    args.fail_on = [x.strip() for x in args.fail_on.split(",") if x.strip()]
    bad = set(args.fail_on) - set(F.FAIL_ON)
    if bad:
        ap.error(f"--fail-on: unknown {sorted(bad)} (known: {', '.join(F.FAIL_ON)})")
    params = {}
    for p in args.param:
        name, eq, value = p.partition("=")
        try:
            params[name.strip()] = float(value)
        except ValueError:
            ap.error(f"--param {p!r}: expected NAME=NUMBER")
        if not eq:
            ap.error(f"--param {p!r}: expected NAME=NUMBER")
    try:
        args.hardware = Trainium2().with_params(params)
    except ValueError as e:
        ap.error(f"--param: {e}")
    for flag in ("json", "markdown"):
        path = getattr(args, flag)
        if path and not os.path.isdir(os.path.dirname(path) or "."):
            ap.error(f"--{flag}: directory {os.path.dirname(path)!r} does not exist")
    return args


MAX_FILES = 50


def program_files(target: list[str]) -> list[str]:
    """The program's own source files: the script (or -m module) and the .py files beside it."""
    from ..profile.running import program_root

    path, root = program_root(target)
    files = [path] if path else []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return files
    files += [os.path.join(root, n) for n in names if n.endswith(".py") and os.path.join(root, n) != path]
    return files[:MAX_FILES]


def _reference(target: list[str]) -> dict | None:
    """The guide's measured tok/s for a checked Lab 2 tier (`-- run --model X --compile [--greedy]`)."""
    if target[0] != "run" or "--compile" not in target:
        return None
    model = target[target.index("--model") + 1] if "--model" in target[:-1] else "base"
    if model in GUIDE_TOK_S:
        return {f"guide, measured on trn2 ({model}, compiled)": f"{GUIDE_TOK_S[model]} tok/s"}
    return None


def _per_rank(path: str) -> str:
    """`{rank}` in a report path -> this process's rank (RANK, set by torchrun; 0 without one)."""
    return path.replace("{rank}", os.environ.get("RANK", "0"))


def main(argv=None, commands: dict | None = None) -> int:
    """`commands`: name -> function(argv) -> exit status, for `-- run ...` (given by `nativelab check`; the
    check layer cannot reach the apps itself, so `python -m nativelab.check` checks scripts)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    target = args.target
    is_command = target[0] in COMMANDS
    if is_command and (commands is None or target[0] not in commands):
        print(f"nativelab check: checking the '{target[0]}' command needs the nativelab CLI: "
              f"nativelab check -- {' '.join(target)}", file=sys.stderr)
        return 2
    check = Check(" ".join(target), hardware=args.hardware, tokens=is_command and target[0] == "run",
                  bf16_drift=args.bf16_drift, files=None if is_command else program_files(target))
    code, error = 0, None
    with check, device_from(args.device_from):
        try:
            if is_command:
                code = commands[target[0]](list(target[1:])) or 0
            else:
                code = run_script(target)
        except Exception as e:  # noqa: BLE001 - the program's error is reported, then the findings so far
            error = e
            traceback.print_exc()
            code = 1
    code = code if isinstance(code, int) else 1
    check.ended(error, code)
    report = check.report(reference=_reference(target))
    if not args.quiet:
        report.print()
    if args.json:
        write(_per_rank(args.json), report.json())
    if args.markdown:
        write(_per_rank(args.markdown), report.markdown())
    if error is not None:
        print(f"nativelab check: the program failed ({type(error).__name__}: {error}); findings above are up to "
              f"that point", file=sys.stderr)
    if code == 0 and any(f.kind == "no-device" for f in report.findings):
        print("nativelab check: nothing ran on the neuron device, so nothing was checked (see the no-device "
              "finding)", file=sys.stderr)
        code = 1
    failing = report.failing(args.fail_on) if args.fail_on else []
    if failing:
        print(f"nativelab check: {len(failing)} finding(s) fail --fail-on {','.join(args.fail_on)}:", file=sys.stderr)
        for f in failing:
            print(f"  {f.severity}: {f.site or '-'}: {f.title} (x{f.count})", file=sys.stderr)
        return 1
    return code
