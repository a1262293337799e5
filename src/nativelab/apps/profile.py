"""`nativelab profile`: profile a nativelab command, a script, or the Lab 2 tiers side by side.

    nativelab profile -- run --model core --compile --greedy
    nativelab profile my_script.py --its-args
    nativelab profile -m mypackage.train --its-args
    nativelab profile --compare base core experimental --compile --greedy --plot tiers.png
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ..check.estimate import estimate
from ..check.hardware import Trainium2
from ..check.report import estimate_table
from ..models.llama import SIZES, TIERS
from ..models.llama.generate import counting_tokens as counting_generated
from ..profile import Session, plots, report, running, trace
from . import profile_tiers, run


def _run_command(argv) -> int:
    run.main(argv)
    return 0


COMMANDS = {"run": _run_command}  # nativelab commands that can be profiled (called directly: no cycle via cli)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="nativelab profile",
        description="Profile device work: CPU fallbacks, device-memory traffic, time by category, host syncs, "
                    "Dynamo graph breaks; tables, JSON, a Chrome/Perfetto trace and PNG plots.",
        epilog="examples: nativelab profile -- run --model core --compile --greedy | nativelab profile script.py | "
               "nativelab profile --compare base core experimental --compile --greedy",
    )
    ap.add_argument("--compare", nargs="+", choices=TIERS, metavar="TIER",
                    help="profile these Lab 2 tiers side by side (base core experimental)")
    ap.add_argument("--size", default="small", choices=sorted(SIZES), help="--compare: model size")
    ap.add_argument("--compile", action="store_true", help='--compare: torch.compile(backend="neuron") the steps')
    ap.add_argument("--greedy", action="store_true", help="--compare: greedy decoding (default: top-p sampling)")
    ap.add_argument("--tokens", type=int, default=50, help="--compare: tokens to generate")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="--compare: weights dtype")
    ap.add_argument("--out", default=None, help="write profile.json, trace.json and profile.png into this directory")
    ap.add_argument("--json", default=None, help="write the measurements to this JSON file")
    ap.add_argument("--trace", default=None, help="write a Chrome/Perfetto trace to this file")
    ap.add_argument("--plot", default=None, help="write the PNG plots (time by category, traffic per token) here")
    ap.add_argument("--torch-profiler", action="store_true",
                    help="also record torch.profiler CPU events and merge them into the trace")
    ap.add_argument("--top", type=int, default=15, help="rows in the device work table")
    ap.add_argument("target", nargs=argparse.REMAINDER,
                    help="after --: a nativelab command (run ...) or a Python script and its arguments")
    argv = sys.argv[1:] if argv is None else list(argv)
    own, module = running.split_module(argv, {o for a in ap._actions if a.nargs != 0 for o in a.option_strings})
    args = ap.parse_args(own)
    if module is not None:
        args.target = module
    if args.target and args.target[0] == "--":
        args.target = args.target[1:]
    if bool(args.compare) == bool(args.target):
        ap.error("give either --compare TIER... or a command to profile (-- run ... | script.py ... | -m module ...)")
    if args.target and args.target[0] not in COMMANDS:
        if not running.is_program(args.target):
            ap.error(f"{args.target[0]!r} is neither a nativelab command ({', '.join(COMMANDS)}) nor a .py script "
                     f"or -m module")
        problem = running.target_error(args.target)
        if problem:
            ap.error(problem)
    if args.tokens < 1:
        ap.error("--tokens must be at least 1")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        args.json = args.json or os.path.join(args.out, "profile.json")
        args.trace = args.trace or os.path.join(args.out, "trace.json")
        args.plot = args.plot or os.path.join(args.out, "profile.png")
    for flag in ("json", "trace", "plot"):
        path = getattr(args, flag)
        if path and not os.path.isdir(os.path.dirname(path) or "."):
            ap.error(f"--{flag}: directory {os.path.dirname(path)!r} does not exist")
    return args


@contextlib.contextmanager
def counting_tokens(session: Session):
    """Count the tokens every `Generator.generate` returns while profiling (for per-token figures)."""

    def add(n: int) -> None:
        session.tokens += n

    with counting_generated(add):
        yield


def _run_target(target: list[str]) -> int:
    if target[0] in COMMANDS:
        return COMMANDS[target[0]](target[1:])
    return running.run_script(target)


def trn2_estimates(sessions) -> list[dict]:
    """Each session's Trainium2 estimate, split as `nativelab check` splits it (check/estimate.py), per
    generated token where the session counted tokens, else for the whole run."""
    hw = Trainium2()
    return [estimate(s, hw, s.tokens or None) for s in sessions]


def _estimate_json(e: dict) -> dict:
    per = "token" if e["per"] else "run"
    return {f"est_trn2_ms_per_{per}": {k: v * 1e3 for k, v in e["parts_per"].items()},
            f"est_trn2_total_ms_per_{per}": e["seconds_per"] * 1e3,
            f"est_trn2_top_work_ms_per_{per}": {k: v * 1e3 / (e["per"] or 1) for k, v in e["by_work"].items()},
            "est_trn2_counts": e["counts"]}


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch_data = None
    with trace.torch_profiler() if args.torch_profiler else contextlib.nullcontext() as prof:
        if args.compare:
            try:
                sessions = profile_tiers.profile_tiers(
                    args.compare, size=args.size, compile=args.compile, greedy=args.greedy, tokens=args.tokens,
                    dtype=args.dtype)
            except ValueError as e:
                print(f"nativelab profile: {e}", file=sys.stderr)
                return 2
            code = 0
        else:
            name = " ".join(args.target)
            with Session(name) as s, counting_tokens(s):
                code = _run_target(args.target)
            sessions = [s]
    if prof is not None:
        torch_data = trace.torch_trace(prof)
    estimates = trn2_estimates(sessions)
    if args.compare:
        rows = report.compare_rows(sessions)
        for r, s in zip(rows, sessions):
            r["compile_seconds"] = s.warmup.compile_seconds()
        mode = f"{args.size}, {args.dtype}, {'compiled' if args.compile else 'eager'}, " \
               f"{'greedy' if args.greedy else 'top-p'}, {args.tokens} tokens"
        report.print_compare(rows, title=f"Lab 2 tiers profiled ({mode})")
        run.print_estimate_parts([{"model": s.name, **{f"est_trn2_{k}": v for k, v in run.per_token(e).items()}}
                                  for s, e in zip(sessions, estimates)])
    else:
        report.print_report(sessions[0], top=args.top)
        e = estimates[0]
        rate = 1.0 / e["seconds_per"] if e["per"] and e["seconds_per"] else None
        report.make_console().print(estimate_table(e, "token" if e["per"] else "run", rate))
        rows = report.compare_rows(sessions)
    if args.json:
        report.write_json(args.json, sessions, [_estimate_json(e) for e in estimates])
    if args.trace:
        trace.write_trace(args.trace, sessions, torch_data)
    if args.plot:
        plots.plot_compare(rows, args.plot, title="nativelab profile" + (f" ({mode})" if args.compare else ""))
    for flag in ("json", "trace", "plot"):
        if getattr(args, flag):
            print(f"{flag}: {getattr(args, flag)}")
    return code
