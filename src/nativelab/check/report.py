"""The porting report: findings sorted by estimated cost, the Trainium2 estimate, and its three outputs
(a rich terminal report, JSON, Markdown for a CI artifact or a PR comment)."""

from __future__ import annotations

import dataclasses
import io
import json
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..profile._files import write_atomic
from ..profile.report import nki_table
from . import findings as F
from .hardware import CITATIONS

_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


@dataclasses.dataclass
class Report:
    name: str
    findings: list  # of Finding, sorted
    estimate: dict
    steps: int
    step_kind: str | None  # "optimizer", "marked", "token" or None (figures are per run)
    wall_seconds: float
    compile_seconds: float
    fallback_ops: list
    reference: dict | None = None  # measured figures to print beside the estimate (e.g. the guide's tok/s)
    memory: dict = dataclasses.field(default_factory=dict)  # logical core -> peak, usable, top tensors
    notes: list = dataclasses.field(default_factory=list)  # what the check could not see (e.g. a graph's values)
    nki_kernels: dict = dataclasses.field(default_factory=dict)  # NKI kernel -> launches and per-launch estimate

    # -- gating --------------------------------------------------------------------------------------------

    def failing(self, fail_on) -> list:
        """Findings that fail a CI gate: `fail_on` names kinds (fallback, sync, int64-overflow, recompile,
        memory); int64-overflow and memory count only at error level."""
        wanted = set(fail_on)
        unknown = wanted - set(F.FAIL_ON)
        if unknown:
            raise ValueError(f"--fail-on: unknown {sorted(unknown)} (known: {', '.join(F.FAIL_ON)})")
        out = []
        for f in self.findings:
            gate = F.KINDS.get(f.kind)
            if gate not in wanted:
                continue
            if gate in ("int64-overflow", "memory") and f.severity != "error":
                continue
            out.append(f)
        return out

    # -- figures -------------------------------------------------------------------------------------------

    @property
    def unit(self) -> str:
        return {"optimizer": "step", "marked": "step", "token": "token"}.get(self.step_kind, "run")

    def rate(self) -> float | None:
        """Estimated tokens (or steps) per second on Trainium2."""
        s = self.estimate["seconds_per"]
        return 1.0 / s if s > 0 and self.step_kind else None

    def bottlenecks(self, n: int = 3) -> list:
        per_step = (f for f in self.findings if f.cost_s > 0 and not f.details.get("one_time"))
        return sorted(per_step, key=lambda f: -f.cost_s)[:n]

    def as_dict(self) -> dict:
        return {
            "name": self.name, "steps": self.steps, "step_kind": self.step_kind, "unit": self.unit,
            "wall_seconds": self.wall_seconds, "compile_seconds": self.compile_seconds,
            "fallback_ops": self.fallback_ops,
            "counts": {sev: sum(1 for f in self.findings if f.severity == sev) for sev in F.SEVERITIES},
            "findings": [f.as_dict() for f in self.findings],
            "estimate": {**self.estimate, "rate_per_s": self.rate()},
            "top_bottlenecks": [f.as_dict() for f in self.bottlenecks()],
            "memory": self.memory, "reference": self.reference, "citations": CITATIONS, "notes": self.notes,
            "nki_kernels": self.nki_kernels,
        }

    # -- outputs -------------------------------------------------------------------------------------------

    def json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, default=str)

    def print(self, console: Console | None = None) -> None:
        console = console or (Console(stderr=False) if sys.stdout.isatty() else Console(width=160))
        head = Table(title=escape(f"nativelab check: {self.name}"), show_header=False)
        head.add_column(style="bold")
        head.add_column()
        counts = self.as_dict()["counts"]
        head.add_row("findings", f"{counts['error']} errors, {counts['warning']} warnings, {counts['info']} info")
        head.add_row("steps", f"{self.steps} ({self.step_kind or 'none marked: figures are per run'})")
        head.add_row("emulator wall time", f"{self.wall_seconds:.2f} s (compile {self.compile_seconds:.2f} s)")
        head.add_row("CPU fallback ops", escape(str(self.fallback_ops)))
        console.print(head)
        if self.findings:
            t = Table(title="findings (errors first, then by estimated Trainium2 cost)")
            for col in ("severity", "finding", "where", "count", f"per {self.unit}", "est. ms", "fix"):
                t.add_column(col, overflow="fold")
            for f in self.findings:
                per = "-" if f.per_step is None else f"{f.per_step:.2f}"
                where = f.site or "-"
                if f.code:
                    where += f"\n  {f.code[:70]}"
                t.add_row(f"[{_STYLE[f.severity]}]{f.severity}[/]", escape(f.title), escape(where), str(f.count), per,
                          f"{f.cost_s * 1e3:.2f}" if f.cost_s else "-", escape(f.fix))
            console.print(t)
        for i, m in self.memory.items():
            title = (f"neuron:{i} peak {m['peak_bytes'] / 2**30:.3f} GiB of {m['usable_bytes'] / 2**30:.2f} GiB usable "
                     f"({m['capacity_bytes'] / 2**30:.0f} GiB per logical core minus the runtime's "
                     f"{m['runtime_reserve_bytes'] / 2**20:.0f} MiB); largest tensors alive at the peak")
            mt = Table(title=escape(title))
            for col in ("MiB", "allocated at"):
                mt.add_column(col)
            for x in m["top_tensors"][:5]:
                mt.add_row(f"{x['bytes'] / 2**20:,.1f}", escape(f"{x['site'] or '-'}  {x['code'][:70]}"))
            console.print(mt)
        console.print(self._estimate_table())
        if self.nki_kernels:
            console.print(nki_table(self.nki_kernels, "NKI kernels launched (nki/cost.py's estimate per launch on one "
                                                      "NeuronCore-v3)"))
        for i, f in enumerate(self.bottlenecks(), 1):
            console.print(escape(f"top bottleneck {i}: {f.title} at {f.site}: {f.fix}"))
        for n in self.notes:
            console.print(escape(f"note: {n}"))

    def _estimate_table(self) -> Table:
        return estimate_table(self.estimate, self.unit, self.rate(), self.reference)

    def text(self) -> str:
        buf = io.StringIO()
        self.print(Console(file=buf, width=160, color_system=None))
        return buf.getvalue()

    def markdown(self) -> str:
        lines = [f"## nativelab check: `{self.name}`", ""]
        c = self.as_dict()["counts"]
        lines += [f"{c['error']} errors, {c['warning']} warnings, {c['info']} info; {self.steps} steps "
                  f"({self.step_kind or 'per run'}); CPU fallback ops: `{self.fallback_ops}`", ""]
        if self.findings:
            lines += [f"| severity | finding | where | count | per {self.unit} | est. ms | fix |",
                      "|---|---|---|---|---|---|---|"]
            for f in self.findings:
                per = "-" if f.per_step is None else f"{f.per_step:.2f}"
                where = f"`{f.site}`" if f.site else "-"
                lines.append(f"| {f.severity} | {_md(f.title)} | {where} | {f.count} | {per} | "
                             f"{f.cost_s * 1e3:.2f} | {_md(f.fix)} |")
            lines.append("")
        e = self.estimate
        lines += [f"**Trainium2 estimate** (first-order, one logical core): {e['seconds_per'] * 1e3:.3f} ms per "
                  f"{self.unit}" + (f", {self.rate():,.1f} {self.unit}s/s" if self.rate() else ""), ""]
        lines += ["| part | ms | share |", "|---|---|---|"]
        total = e["seconds_per"] or 1e-12
        for k, v in e["parts_per"].items():
            if v:
                lines.append(f"| {k} | {v * 1e3:.3f} | {v / total:.0%} |")
        once = e.get("one_time") or {}
        if once.get("calls"):
            lines.append(f"| + one-time host work, whole run ({once['calls']} calls; not per {self.unit}) | "
                         f"{once['seconds'] * 1e3:.3f} | |")
        if self.reference:
            lines += [""] + [f"- {k}: {v}" for k, v in self.reference.items()]
        if self.nki_kernels:
            lines += ["", "NKI kernels launched (estimated per launch on one NeuronCore-v3):", "",
                      "| kernel | launches | est. trn2 us | bound | busy us per engine |", "|---|---|---|---|---|"]
            for name, k in self.nki_kernels.items():
                busy = ", ".join(f"{e} {v:,.2f}" for e, v in k["busy_us"].items())
                lines.append(f"| `{name}` | {k['calls']} | {k['est_trn2_us']:,.2f} | {k['bound']} | {busy} |")
        b = self.bottlenecks()
        if b:
            lines += ["", "Top bottlenecks:"] + [f"{i}. {_md(f.title)} at `{f.site}`: {_md(f.fix)}"
                                                 for i, f in enumerate(b, 1)]
        return "\n".join(lines) + "\n"


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def write(path: str, text: str) -> None:
    """A report file, written whole or not at all."""
    write_atomic(path, text.encode())


def estimate_table(e: dict, unit: str, rate: float | None = None, reference: dict | None = None) -> Table:
    """The Trainium2 estimate by part (check/estimate.py's parts, per step or token), its total and rate: the
    table `nativelab check` and `nativelab profile` print."""
    t = Table(title=f"Trainium2 first-order estimate (one logical core; per {unit})")
    t.add_column("part")
    t.add_column(f"ms / {unit}", justify="right")
    t.add_column("share", justify="right")
    total = e["seconds_per"] or 1e-12
    for k, v in e["parts_per"].items():
        if v:
            t.add_row(k, f"{v * 1e3:.3f}", f"{v / total:.0%}")
    t.add_row("[bold]total[/]", f"[bold]{e['seconds_per'] * 1e3:.3f}[/]", "100%")
    if rate:
        t.add_row(f"{unit}s / s", f"{rate:,.1f}", "")
    once = e.get("one_time") or {}
    if once.get("calls"):
        t.add_row(f"+ one-time host work, whole run ({once['calls']} calls; not per {unit})",
                  f"{once['seconds'] * 1e3:.3f}", "")
    for k, v in (reference or {}).items():
        t.add_row(k, str(v), "")
    return t
