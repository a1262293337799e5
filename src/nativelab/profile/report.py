"""Terminal tables (rich) and the JSON report of one or more profiling sessions."""

from __future__ import annotations

import json

import sys

from rich.console import Console
from rich.table import Table

from ..nki.cost import ENGINES
from ._files import write_atomic
from .categories import CATEGORIES


def _mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:,.3f}"


def _ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:,.2f}"


def make_console() -> Console:
    """Rich's console; wide when writing to a file or pipe (rich would wrap at 80 columns)."""
    return Console() if sys.stdout.isatty() else Console(width=160)


def print_report(session, console: Console | None = None, top: int = 15) -> None:
    """One session: summary, time by category, the busiest device work, CPU fallbacks."""
    console = console or make_console()
    s = session.summary()
    tok = s["tokens"]
    read, written = s["device_bytes"]["read"], s["device_bytes"]["written"]
    head = Table(title=f"nativelab profile: {s['name']}", show_header=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("wall time", f"{s['wall_seconds']:.3f} s")
    head.add_row("decoded tokens", str(tok) if tok else "- (not a generation)")
    head.add_row("device memory traffic", f"{_mb(read)} MB read, {_mb(written)} MB written")
    if tok:
        head.add_row("traffic per token", f"{_mb(s['device_bytes_per_token'])} MB")
    tr = s["transfers"]
    head.add_row("host <-> device", f"{_mb(tr['bytes'].get('device_to_host', 0))} MB to host, "
                 f"{_mb(tr['bytes'].get('host_to_device', 0))} MB to device")
    head.add_row("host syncs", f"{s['host_syncs']} (queue drains: {s['queue_drains']})")
    head.add_row("CPU fallback ops", str(s["fallback_ops"]))
    d = s["dynamo"]
    head.add_row("Dynamo", f"{d['compiles']} compiles, {d['recompiles']} recompiles, {d['graph_breaks']} graph breaks")
    for reason, n in d["graph_break_reasons"].items():
        head.add_row("  graph break", f"{n}x {reason.splitlines()[0]}")
    console.print(head)

    cats = Table(title="time by category")
    for col in ("category", "ms", "ms / token", "share"):
        cats.add_column(col, justify="left" if col == "category" else "right")
    by = s["seconds_by_category"]
    total = sum(v for k, v in by.items() if k != "compile") or 1.0
    for k in CATEGORIES:
        v = by.get(k, 0.0)
        if v:
            once = k == "compile"  # paid once, not per token nor a share of the device's time
            share = "" if once else f"{100 * v / total:.1f}%"
            cats.add_row(k, _ms(v), _ms(v / tok) if tok and not once else "-", share)
    console.print(cats)

    ops = Table(title=f"device work (top {top} by time)")
    for col in ("name", "category", "calls", "ms", "MB read", "MB written"):
        ops.add_column(col, justify="left" if col in ("name", "category") else "right")
    device = sorted((x for x in s["ops"].items() if x[1]["kind"] in ("op", "graph", "kernel")),
                    key=lambda x: -x[1]["seconds"])
    for name, st in device[:top]:
        ops.add_row(name, st["category"], str(st["calls"]), _ms(st["seconds"]), _mb(st["read"]), _mb(st["written"]))
    console.print(ops)

    if s["nki_kernels"]:
        console.print(nki_table(s["nki_kernels"]))

    if s["fallbacks"]:
        fb = Table(title="CPU fallbacks")
        for col in ("op", "calls", "ms", "MB to host", "MB back to device"):
            fb.add_column(col, justify="left" if col == "op" else "right")
        for name, st in s["fallbacks"].items():
            fb.add_row(name, str(st["calls"]), _ms(st["seconds"]), _mb(st["to_host"]), _mb(st["to_device"]))
        console.print(fb)


def nki_table(kernels: dict, title: str = "NKI kernels (estimated per launch on one NeuronCore-v3)") -> Table:
    """Per NKI kernel: launches, est. trn2 us per launch, the bounding engine and each engine's busy us."""
    engines = [e for e in ENGINES if any(k["busy_us"].get(e) for k in kernels.values())]
    t = Table(title=title)
    for col in ("kernel", "launches", "est. trn2 us", "bound", *(f"{e} us" for e in engines), "instructions"):
        t.add_column(col, justify="left" if col in ("kernel", "bound") else "right")
    for name, k in sorted(kernels.items(), key=lambda x: -x[1]["est_trn2_seconds_total"]):
        t.add_row(name, str(k["calls"]), f"{k['est_trn2_us']:,.2f}", k["bound"],
                  *(f"{k['busy_us'].get(e, 0.0):,.2f}" for e in engines), str(k["instructions"]))
    return t


def compare_rows(sessions) -> list[dict]:
    """Per session (or its `summary()`, e.g. read back from the JSON), the per-token figures the comparison
    table and plots show."""
    rows = []
    for session in sessions:
        s = session if isinstance(session, dict) else session.summary()
        tok = s["tokens"] or 1
        per_cat = {k: v / tok for k, v in s["seconds_by_category"].items() if k != "compile"}
        device = sum(per_cat.values())
        launches = sum(st["calls"] for st in s["ops"].values() if st["kind"] in ("op", "graph", "kernel"))
        rows.append({
            "name": s["name"], "tokens": s["tokens"],
            "ms_per_token": 1e3 * device, "seconds_per_token_by_category": per_cat,
            "read_per_token": s["device_bytes"]["read"] / tok, "written_per_token": s["device_bytes"]["written"] / tok,
            "launches_per_token": launches / tok, "host_syncs": s["host_syncs"], "fallback_ops": s["fallback_ops"],
            "compile_seconds": s["compile_seconds"], "graph_breaks": s["dynamo"]["graph_breaks"],
            "recompiles": s["dynamo"]["recompiles"],
        })
    return rows


def print_compare(rows: list[dict], console: Console | None = None, title: str = "tiers side by side") -> None:
    console = console or make_console()
    t = Table(title=title)
    for col in ("variant", "profiled ms/token", "device MB/token (read+write)", "launches/token", "host syncs",
                "CPU fallback ops", "top category"):
        t.add_column(col, justify="left" if col in ("variant", "CPU fallback ops", "top category") else "right")
    for r in rows:
        cats = r["seconds_per_token_by_category"]
        top = max(cats, key=cats.get) if any(cats.values()) else "-"
        t.add_row(r["name"], f"{r['ms_per_token']:.2f}",
                  f"{(r['read_per_token'] + r['written_per_token']) / 1e6:.3f} "
                  f"({r['read_per_token'] / 1e6:.3f}+{r['written_per_token'] / 1e6:.3f})",
                  f"{r['launches_per_token']:.1f}", str(r["host_syncs"]), str(r["fallback_ops"]),
                  f"{top} ({100 * cats.get(top, 0) / (sum(cats.values()) or 1):.0f}%)")
    console.print(t)


def write_json(path, sessions, extra: list[dict] | None = None) -> None:
    """Each session's summary (with `extra`'s keys, one dict per session: the app's Trainium2 estimate)."""
    data = [{**s.summary(), **(x or {})} for s, x in zip(sessions, extra or [None] * len(sessions))]
    write_atomic(path, json.dumps(data[0] if len(data) == 1 else data, indent=2).encode())
