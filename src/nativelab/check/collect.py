"""From what a check watched to findings: one function per concern, each returning Finding objects."""

from __future__ import annotations

import os
import re

from . import findings as F
from .drift import LIMIT
from .hardware import Trainium2
from .source import Site, _is_internal_path, is_library_path, short_path
from .watch import FP32_EXACT, INT32_MAX, Watch

GiB = 1 << 30
MEMORY_WARN = 0.8  # a peak above this share of a core's usable memory is a finding


def _per(watch: Watch, n: int, ev=None) -> float | None:
    """Per step; None without steps, or for one-time work (`ev` happened within one step of several)."""
    if ev is not None and watch.one_time(ev):
        return None
    return n / watch.steps if watch.steps else None


def _once(watch: Watch, ev) -> str:
    return f" (in {ev.steps_seen} of {watch.steps} steps, not every step)"


def _cause(op: str) -> str:
    """The forward op a fallback belongs to: `aten::mse_loss_backward.grad_input` -> `aten::mse_loss`,
    `aten::convolution_backward_overrideable` -> `aten::convolution_overrideable`."""
    base = op.split(".", 1)[0]
    base = base.replace("_backward_overrideable", "_overrideable")
    return base[: -len("_backward")] if base.endswith("_backward") else base


def _site(site: Site | None) -> tuple[str | None, int | None, str]:
    return (str(site), site.line, site.code()) if site is not None else (None, None, "")


def fallbacks(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    """One finding per fallback op and line; its backward (which runs at `loss.backward()`, where the stack shows
    no forward line) joins the forward's finding with the most calls: one cause, one fix."""
    forward: dict = {}
    backward: dict = {}
    for (op, site), ev in watch.fallback_sites.items():
        cause = _cause(op)
        (forward if op.split(".", 1)[0] == cause else backward).setdefault(cause, []).append((op, site, ev))
    groups = [(cause, op, site, [(op, site, ev)]) for cause, evs in forward.items() for op, site, ev in evs]
    for cause, evs in backward.items():
        mine = [g for g in groups if g[0] == cause]
        if mine:
            max(mine, key=lambda g: g[3][0][2].count)[3].extend(evs)
        else:
            groups.extend((cause, op, site, [(op, site, ev)]) for op, site, ev in evs)
    out = []
    for cause, op, site, evs in groups:
        s, line, code = _site(site)
        ev = evs[0][2]
        to_host, to_device = sum(e.to_host for *_, e in evs), sum(e.to_device for *_, e in evs)
        calls = sum(e.count for *_, e in evs)
        seconds = sum(e.seconds for *_, e in evs)
        # as the estimate charges it: a round trip, the bytes over the host link, the CPU op's own time
        cost = calls * hw.host_round_trip_s + (to_host + to_device) / hw.host_link_bytes_per_s + \
            sum(e.count * e.fastest for *_, e in evs)
        once = watch.one_time(ev)
        also = [{"op": o, "site": str(st) if st else None, "count": e.count} for o, st, e in evs[1:]]
        title = f"{op} falls back to the CPU" + (f" (and {', '.join(sorted({a['op'] for a in also}))})"
                                                  if also else "") + (_once(watch, ev) if once else "")
        out.append(F.Finding(
            "fallback", "error" if (watch.steps and ev.count >= watch.steps and not once) else "warning",
            title, s, line, ev.count, F.fallback_fix(op), _per(watch, ev.count, ev), cost, code,
            {"op": op, "cause": cause, "bytes_to_host": to_host, "bytes_to_device": to_device,
             "emulator_seconds": seconds,
             "emulator_share": seconds / watch.wall_seconds if watch.wall_seconds else None, "also": also,
             "one_time": once, "steps_with": ev.steps_seen}))
    return out


_SYNC_TITLES = {"item": ".item() reads a device value on the host", "print": "printing a device tensor",
                "tolist": ".tolist() copies a device tensor to the host", "copy": "a device -> host copy",
                "branch": "a Python branch on a device value"}


def syncs(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    out = []
    for (kind, site), ev in watch.sync_sites.items():
        s, line, code = _site(site)
        once = watch.one_time(ev)
        if kind.startswith("save:"):
            title, fix, key = f"{kind[5:]} copies device tensors to the host ({ev.count} copies, " \
                f"{_size(ev.to_host)})", F.SYNC_FIXES["save"], "save"
        elif kind.startswith("optimizer:"):
            name = kind.split(":", 1)[1]
            title, fix, key = f"{name} reads device values on the host inside the optimizer, not at this line " \
                f"({ev.count} reads)", F.optimizer_sync_fix(name), "optimizer"
        elif kind.startswith("shape:"):
            op = kind.split(":", 1)[1]
            title, fix, key = f"{op} has a data-dependent output shape (the host waits for the device)", \
                F.SYNC_FIXES["shape"], "shape"
        else:
            title, fix, key = _SYNC_TITLES.get(kind, kind), F.SYNC_FIXES.get(kind, F.SYNC_FIXES["copy"]), kind
        cost = ev.count * hw.host_round_trip_s + ev.to_host / hw.host_link_bytes_per_s
        out.append(F.Finding("sync", "info" if once else "warning", title + (_once(watch, ev) if once else ""), s, line,
                             ev.count, fix, _per(watch, ev.count, ev), cost, code,
                             {"sync": key, "bytes_to_host": ev.to_host, "one_time": once, "steps_with": ev.steps_seen,
                              **({"library": kind.split(":", 1)[1]} if key in ("save", "optimizer") else {})}))
    return out


def dtypes(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    out = []
    by_site: dict = {}  # one finding per line: the ops there share the cause (the int64 tensors they read)
    for (op, site), ev in watch.cast_sites.items():
        if ev.count:
            by_site.setdefault(site, []).append((op, ev))
    for site, evs in by_site.items():
        s, line, code = _site(site)
        evs.sort(key=lambda x: -x[1].max_value)
        top = evs[0][1].max_value
        over = top > INT32_MAX
        count = sum(ev.count for _, ev in evs)
        ops = [op for op, _ in evs]
        out.append(F.Finding(
            "int64-overflow" if over else "int64-cast", "error" if over else "info",
            f"{', '.join(ops)}: int64 input cast to int32, largest |value| {top:,} "
            f"{'>' if over else '<='} 2^31-1", s, line, count, F.INT64_FIX, _per(watch, count), 0.0, code,
            {"op": ops[0], "ops": {op: {"count": ev.count, "max_abs": ev.max_value} for op, ev in evs},
             "max_abs": top, "limit": INT32_MAX}))
    for (op, site), ev in watch.graph_int64_sites.items():
        s, line, code = _site(site)
        over = ev.max_value > INT32_MAX
        what = "an int64 input" if op == "compiled graph input" else f"{op}: an int64 value"
        out.append(F.Finding(
            "int64-overflow" if over else "int64-cast", "error" if over else "info",
            f"{what} in a compiled graph, held as int32 on the device, largest |value| {ev.max_value:,} "
            f"{'>' if over else '<='} 2^31-1", s, line, ev.count, F.INT64_FIX, _per(watch, ev.count), 0.0, code,
            {"op": op, "max_abs": ev.max_value, "limit": INT32_MAX, "compiled": True}))
    for (op, site), ev in watch.int_fp32_sites.items():
        s, line, code = _site(site)
        over = ev.max_value > FP32_EXACT
        out.append(F.Finding(
            "int-fp32", "error" if over else "info",
            f"{op} on {'/'.join(sorted(ev.dtypes))}: computed in fp32 on the device, largest |value| "
            f"{ev.max_value:,} {'>' if over else '<='} 2^24", s, line, ev.count, F.INT_FP32_FIX,
            _per(watch, ev.count), 0.0, code, {"op": op, "max_abs": ev.max_value, "limit": FP32_EXACT}))
    out.extend(float64(watch))
    return out


def float64(watch: Watch) -> list[F.Finding]:
    """One finding per cause: ops that compute on float64 tensors made at the same lines (an op reading tensors
    of several such lines joins them: a float64 model fed float64 data is one cause), at the line whose tensors
    the most ops read (a `model.double()`), with every line that made float64 tensors and every op in the
    details. A line is where the check saw float64 values made: a model's conversion, an op making float64 from
    none (a dtype=, a copy), or the first op that read a float64 tensor made where it could not see."""
    parent: dict = {}

    def root(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for ev in watch.wide_sites.values():
        made = list(ev.where)
        for m in made[1:]:
            parent[root(m)] = root(made[0])
    groups: dict = {}
    for (op, site), ev in watch.wide_sites.items():
        if ev.where:
            groups.setdefault(root(next(iter(ev.where))), []).append((op, site, ev))
    out = []
    for entries in groups.values():
        uses: dict = {}
        for *_, ev in entries:
            for m, n in ev.where.items():
                uses[m] = uses.get(m, 0) + n
        # the line to fix first: a model made float64, then the line that made the most float64 tensors
        made = sorted(uses, key=lambda m: (-watch.wide_models[m], -watch.wide_made[m], -uses[m]))
        s, line, code = _site(made[0])
        count = sum(ev.count for *_, ev in entries)
        dtypes = sorted({d for *_, ev in entries for d in ev.dtypes})
        ops = sorted({op for op, *_ in entries})
        lines = sorted(entries, key=lambda e: -e[2].count)
        others = [str(m) for m in made[1:4] if m is not None]
        out.append(F.Finding(
            "float64", "warning", f"{'/'.join(dtypes)} tensors made here" +
            (f" (and at {', '.join(others)}{', ...' if len(made) > 4 else ''})" if others else "") +
            f": {count:,} ops on them ({len(ops)} kinds at {len({e[1] for e in entries})} lines) compute as "
            f"float32 on the device", s, line, count, F.FLOAT64_FIX,
            _per(watch, count), 0.0, code,
            {"op": lines[0][0], "ops": ops, "dtypes": dtypes,
             "made_at": [{"site": str(m) if m else None, "code": m.code() if m else "", "uses": uses[m],
                          "tensors_made": watch.wide_made[m] + watch.wide_models[m]}
                         for m in made[:20]],
             "lines": [{"op": op, "site": str(st) if st else None, "count": ev.count} for op, st, ev in lines[:20]]}))
    return out


_RESUME = re.compile(r"torch_dynamo_resume_in_(\w+)_at_(\d+)")


def compilation(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    out = []
    metrics = [m for m in watch.dynamo_metrics.values() if m.co_filename and not _is_internal_path(m.co_filename)]
    # graph breaks: Dynamo resumes after a break in a function named after the break's line
    breaks: dict = {}
    reasons: dict = {}
    for m in metrics:
        for r in (m.restart_reasons or ()):
            reasons.setdefault((m.co_filename, m.co_name), r)
    for m in metrics:
        hit = _RESUME.match(m.co_name or "")
        if hit:
            key = (m.co_filename, int(hit.group(2)), hit.group(1))
            breaks[key] = breaks.get(key, 0) + 1
    for (path, line, func), n in breaks.items():
        site = Site(path, line, func)
        reason = reasons.get((path, func), "")
        first = reason.strip().splitlines()[0] if reason else "graph break"
        out.append(F.Finding("graph-break", "warning", f"graph break in {func}(): {first}", str(site), line, n,
                             F.GRAPH_BREAK_FIX, None, n * hw.graph_launch_s, site.code(), {"reason": reason}))
    # recompiles: a frame compiled again because a guard failed
    for m in metrics:
        if not m.recompile_reason or _RESUME.match(m.co_name or ""):
            continue
        site = Site(m.co_filename, m.co_firstlineno or 0, m.co_name or "")
        call = watch.compile_sites.get(str(m.compile_id), (None, None))[1]
        where = call or site  # the call that recompiled it; its def in the details
        out.append(F.Finding("recompile", "warning", f"{m.co_name}() recompiled: {m.recompile_reason.strip()}",
                             str(where), where.line, 1, F.RECOMPILE_FIX, None, 0.0, where.code(),
                             {"compile_id": m.compile_id, "seconds": m.entire_frame_compile_time_s,
                              "def_site": str(site), "call_site": str(call) if call else None}))
    # distinct shapes per compiled call site (static graphs: each is a compile on the real device)
    compile_s = [m.entire_frame_compile_time_s or 0.0 for m in metrics]
    for site, seen in watch.compiled_shapes.items():
        shapes = {sh for (kind, sh) in seen if kind != "backward"}
        if len(shapes) < 2:
            continue
        calls = watch.compiled_calls.get(site) or {}
        call = max(calls, key=calls.get) if calls else None  # the call that compiled most shapes
        s, line, code = _site(call or site)
        lengths = _varying_lengths(shapes)
        details = {"distinct_shapes": len(shapes), "shapes": [list(map(list, sh)) for sh in sorted(shapes)][:20],
                   "def_site": str(site) if site else None, "call_sites": sorted(str(c) for c in calls)}
        fix = F.BUCKET_FIX
        if lengths:
            buckets, waste = propose_buckets(lengths)
            details.update(buckets=buckets, padding_waste=waste, lengths=sorted(lengths))
            fix += f": pad to {buckets} ({waste:.0%} of the padded elements are padding)"
        mean_s = sum(compile_s) / len(compile_s) if compile_s else None
        details["mean_compile_seconds_here"] = mean_s
        out.append(F.Finding("recompile", "warning", f"{len(shapes)} distinct input shapes compiled for this function "
                             f"(one static graph each)", s, line, len(shapes), fix, None, 0.0, code, details))
    # torch.compile options the real backend rejects or ignores
    for call in watch.compile_calls:
        s, line, code = _site(call["site"])
        if call["backend"] == "inductor" and watch.compiled_shapes and _default_backend_reached_device():
            out.append(F.Finding(
                "compile-option", "error", "torch.compile() with the default backend (Inductor) on the device: "
                "Trainium needs backend='neuron'", s, line, 1, "torch.compile(model, backend='neuron'): Inductor "
                "generates no code for Neuron devices (nativelab compiled these graphs with its neuron backend)",
                None, 0.0, code, {"option": "backend"}))
        if call["backend"] not in ("neuron",):
            continue
        if call["dynamic"]:
            out.append(F.Finding(
                "compile-option", "warning", "torch.compile(dynamic=True): the real neuron backend rejects it", s, line,
                1, "drop dynamic=True and pad inputs to a few fixed lengths; the Neuron backend reference: "
                "'dynamic=True is rejected during compilation. Shapes that vary between steps run, recompiling per "
                "new shape' (" + _cite("torch_compile") + ")", None, 0.0, code, {"option": "dynamic"}))
        if call["mode"] not in (None, "default"):
            out.append(F.Finding(
                "compile-option", "warning", f"torch.compile(mode={call['mode']!r}) has no effect on the real "
                "neuron backend", s, line, 1, "drop mode=: 'Only default applies. Other modes log a warning and fall "
                "back to default' (" + _cite("torch_compile") + ")", None, 0.0, code, {"option": "mode"}))
    return out


def _default_backend_reached_device() -> bool:
    from ..compiler import stats

    return stats()["default_backend_graphs"] > 0


def _cite(key: str) -> str:
    from .hardware import CITATIONS

    return CITATIONS[key]


def _varying_lengths(shapes) -> list[int]:
    """The lengths along the one dimension that varies between the compiled shapes (padding candidates)."""
    shapes = list(shapes)
    first = shapes[0]
    if any(len(s) != len(first) or any(len(a) != len(b) for a, b in zip(s, first)) for s in shapes):
        return []
    varying = {(i, j) for s in shapes for i, t in enumerate(s) for j, d in enumerate(t) if d != first[i][j]}
    dims = {j for (_, j) in varying}
    if len(dims) != 1:
        return []
    i, j = min(varying)
    return sorted({s[i][j] for s in shapes})


def propose_buckets(lengths: list[int], max_buckets: int = 3) -> tuple[list[int], float]:
    """Powers of two from the longest down (at most `max_buckets`, the smallest covering the shortest), and the
    share of padding they cost when each length is padded to the next bucket (each length counted once)."""
    top = 1 << (max(lengths) - 1).bit_length()
    buckets = [top]
    while len(buckets) < max_buckets and buckets[0] // 2 >= min(lengths):
        buckets.insert(0, buckets[0] // 2)
    padded = sum(next(b for b in buckets if b >= n) for n in lengths)
    return buckets, (padded - sum(lengths)) / padded


def memory_summary(watch: Watch, hw: Trainium2) -> dict:
    """Peak per logical core against its usable capacity (HBM share minus the runtime's documented reserve), and
    the largest tensors alive at the peak with the line that allocated them."""
    usable = hw.core_hbm_bytes - hw.runtime_reserve_bytes
    out = {}
    for i, snap in sorted(watch.peak_snapshot.items()):
        out[i] = {"peak_bytes": watch.peak.get(i, 0), "usable_bytes": usable, "capacity_bytes": hw.core_hbm_bytes,
                  "runtime_reserve_bytes": hw.runtime_reserve_bytes,
                  "top_tensors": [{"bytes": n, "site": str(s) if s else None, "code": s.code() if s else ""}
                                  for n, s in snap.tensors]}
    return out


def memory(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    out = []
    for i, snap in sorted(watch.peak_snapshot.items()):
        peak = watch.peak.get(i, 0)
        cap = hw.core_hbm_bytes - hw.runtime_reserve_bytes
        share = peak / cap
        top = [{"bytes": n, "site": str(s) if s else None, "code": s.code() if s else ""} for n, s in snap.tensors]
        if share < MEMORY_WARN:
            continue  # fits with room to spare: the report's memory line says so, no finding
        sev = "error" if share > 1 else "warning"
        site = snap.tensors[0][1] if snap.tensors else None
        s, line, code = _site(site)
        out.append(F.Finding(
            "memory", sev, f"neuron:{i} peak {peak / GiB:.2f} GiB of {cap / GiB:.2f} GiB usable per logical core "
            f"({share:.0%})", s, line, 1,
            "shard across the logical cores (FSDP2), bf16 weights, activation checkpointing, smaller batches",
            None, 0.0, code,
            {"core": i, "peak_bytes": peak, "capacity_bytes": hw.core_hbm_bytes,
             "runtime_reserve_bytes": hw.runtime_reserve_bytes, "usable_bytes": cap, "top_tensors": top}))
    return out


def collectives(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    """Each collective at each line: calls, bytes, and its Trainium2 time (ring bytes over a rank's share of the
    chip's DMA / NeuronLink bandwidth, plus a fixed cost per call)."""
    out = []
    for (kind, site), c in watch.collective_sites.items():
        s, line, code = _site(site)
        t = hw.collective_seconds(kind, c.bytes, c.world, c.calls)
        per = _per(watch, c.bytes)
        title = f"{kind} over {c.world} ranks: {_size(c.bytes)} in {c.calls} calls" + \
            (f" ({_size(per)} per {'step' if watch.step_kind != 'token' else 'token'})" if per is not None else "")
        out.append(F.Finding(
            "collective", "info", title, s, line, c.calls, F.COLLECTIVE_FIX, _per(watch, c.calls), t, code,
            {"collective": kind, "calls": c.calls, "bytes": c.bytes, "world_size": c.world,
             "link_bytes": hw.collective_link_bytes(kind, c.bytes, c.world),
             "bytes_per_s": hw.collective_bytes_per_s(c.world), "latency_s": hw.collective_latency_s,
             "seconds": t}))
    return out


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def drift(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    """bf16 ops that add more than drift.LIMIT of relative error against their float32 shadow (--bf16-drift)."""
    if watch.shadows is None:
        return []
    out = []
    for (op, site), d in watch.shadows.sites.items():
        if d.max_added <= LIMIT:
            continue
        s, line, code = _site(site)
        out.append(F.Finding(
            "bf16-drift", "warning", f"{op} in bf16 is {d.max_error:.1%} off its float32 computation (this op adds "
            f"{d.max_added:.1%})", s, line, d.count, F.DRIFT_FIX, _per(watch, d.count), 0.0, code,
            {"op": op, "max_relative_error": d.max_error, "max_added": d.max_added, "limit": LIMIT}))
    return out


EAGER_BOUND = 0.5  # eager op launches above this share of the estimate: compiling is the first fix
EAGER_MIN_OPS = 100  # ... in a run of at least this many eager ops (a few ops are no program to compile)


def eager_launches(watch: Watch, hw: Trainium2, est: dict) -> list[F.Finding]:
    """When eager op launches are most of the estimate, the lines that issue most of them."""
    total, eager = est["seconds"], est["parts"]["eager op launches"]
    n = sum(watch.launch_sites.values())
    if not total or eager / total <= EAGER_BOUND or n < EAGER_MIN_OPS:
        return []
    top = watch.launch_sites.most_common(8)
    s, line, code = _site(top[0][0])
    per = _per(watch, n)
    unit = "token" if watch.step_kind == "token" else "step"
    # A program that already compiles its model launches these ops outside its graphs: "compile the model" is no fix
    fix = F.EAGER_COMPILED_FIX.format(site=watch.compile_calls[0]["site"]) if watch.compile_calls else F.EAGER_FIX
    return [F.Finding(
        "eager-launch", "warning", f"eager op launches are {eager / total:.0%} of the Trainium2 estimate: {n:,} "
        f"eager ops" + (f" ({per:,.0f} per {unit})" if per is not None else "") + f", {top[0][1]:,} of them here",
        s, line, top[0][1], fix, per, eager, code,
        {"share": eager / total, "eager_ops": n,
         "lines": [{"site": str(st) if st else None, "code": st.code() if st else "", "ops": k} for st, k in top]})]


# What in a program's text chooses the CPU (scanned only when nothing reached the device).
_CPU_CHOICES = (
    (re.compile(r"""torch\.device\(\s*['"]cpu['"]"""), "torch.device('cpu')"),
    (re.compile(r"""\bdevice\s*=\s*['"]cpu['"]"""), "device = 'cpu'"),
    (re.compile(r"""\b(use_cpu|no_cuda)\s*=\s*True"""), "TrainingArguments(use_cpu=True)"),
    (re.compile(r"""torch\.cuda\.is_available\(\)"""), "torch.cuda.is_available() (False here: no CUDA)"),
    (re.compile(r"""\.to\(\s*['"]cpu['"]\s*\)"""), ".to('cpu')"),
)


_STRONG = {what for _, what in _CPU_CHOICES[:3]}  # choices of the CPU, not questions or copies


def _source_choices(files) -> list[tuple[Site, str]]:
    found = []
    for path in files or ():
        try:
            with open(path, errors="replace") as f:
                lines = f.readlines()
        except OSError:
            continue
        for i, text in enumerate(lines, 1):
            code = text.split("#", 1)[0]
            for pattern, what in _CPU_CHOICES:
                if pattern.search(code):
                    found.append((Site(path, i), what))
                    break
    order = {what: k for k, (_, what) in enumerate(_CPU_CHOICES)}
    return sorted(found, key=lambda x: order[x[1]])


def no_device(watch: Watch, hw: Trainium2, files=None) -> list[F.Finding]:
    """A run in which nothing reached the device checked nothing: an error, with the line that chose the CPU
    where the run or the program's text shows it."""
    if watch.dispatched or watch.allocations or any(st.kind != "compile" for st in watch.ops.values()):
        return []
    evidence = []  # (Site, why)
    asked = [(site, what, asker) for site, (what, answer, asker) in watch.device_choices.items() if answer is False]
    text = _source_choices(files)
    # best first: the program's own question, then a choice of the CPU in its text, then the moves the run made
    # (the HF Trainer's), then a question a library asked (accelerate probing CUDA), then weaker text
    evidence += [(site, f"{what} returned False") for site, what, asker in asked if not is_library_path(asker)]
    evidence += [(site, f"{what} in the program's text") for site, what in text if what in _STRONG]
    for (caller, site), device in watch.module_moves.items():
        if f"{os.sep}transformers{os.sep}" in caller:  # the HF Trainer places the model on TrainingArguments.device
            evidence.append((site, f"the Hugging Face Trainer moved the model to TrainingArguments.device "
                                   f"({device!r}): nn.Module.to({device!r}) called at {short_path(caller)}"))
        else:
            evidence.append((site, f"nn.Module.to({device!r}) called at {short_path(caller)}"))
    evidence += [(site, f"{what} returned False (asked at {short_path(asker)})") for site, what, asker in asked
                 if is_library_path(asker)]
    seen = {site for site, _ in evidence}
    evidence += [(site, f"{what} in the program's text") for site, what in text if what not in _STRONG
                 and site not in seen]
    site = evidence[0][0] if evidence else None
    s, line, code = _site(site)
    why = evidence[0][1] if evidence else "no device was named: tensors and models stay on the CPU unless moved"
    return [F.Finding(
        "no-device", "error", f"nothing ran on the neuron device: the program ran on the CPU ({why})", s, line, 1,
        F.NO_DEVICE_FIX, None, 0.0, code,
        {"evidence": [{"site": str(st) if st else None, "code": st.code() if st else "", "why": w}
                      for st, w in evidence[:10]]})]


def safetensors_loads(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    out = []
    for site, device, error in watch.safetensors_failures:
        s, line, code = _site(site)
        out.append(F.Finding(
            "safetensors-device", "error", f"safetensors.torch.load_file(..., device={device!r}) fails inside "
            f"safetensors ({error.splitlines()[0][:120]})", s, line, 1, F.SAFETENSORS_FIX, None, 0.0, code,
            {"device": device, "error": error[:2000]}))
    return out


_OP = re.compile(r"aten::\w+(?:\.\w+)?")


def failure(watch: Watch, hw: Trainium2, error: BaseException | None, code: int = 0) -> list[F.Finding]:
    """The program failed (an exception, or a non-zero exit status): what, the op and the user's line."""
    if error is None and not code:
        return []
    if error is None:
        return [F.Finding("failure", "error", f"the program exited with status {code}", None, None, 1,
                          "the program's own exit status: see its output", None, 0.0, "", {"exit_status": code})]
    site = None
    tb = error.__traceback__
    while tb is not None:  # the innermost frame of the user's code
        c = tb.tb_frame.f_code
        if not _is_internal_path(c.co_filename) and not c.co_filename.endswith("nativelab/__init__.py"):
            site = Site(c.co_filename, tb.tb_lineno, c.co_name)
        tb = tb.tb_next
    chain, e = [], error
    while e is not None and len(chain) < 5:
        chain.append(e)
        e = e.__cause__ or e.__context__
    op = None
    if watch.failed is not None and any(watch.failed[2] is e for e in chain):
        op = watch.failed[0]
        site = site or watch.failed[1]
    else:
        hit = _OP.search(str(error))
        op = hit.group(0) if hit else None
    s, line, code_text = _site(site)
    message = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    title = f"the program failed: {type(error).__name__}: {message}" + (f" (in {op})" if op else "")
    fix = F.SAFETENSORS_FIX if watch.safetensors_failures else \
        "the findings above are up to the failure; the exception is the program's, at this line"
    return [F.Finding("failure", "error", title, s, line, 1, fix, None, 0.0, code_text,
                      {"exception": type(error).__name__, "message": str(error)[:4000], "op": op})]


ALL = (fallbacks, syncs, dtypes, compilation, memory, collectives, drift, safetensors_loads)


def all_findings(watch: Watch, hw: Trainium2, est: dict | None = None, files=None, error=None,
                 exit_status: int = 0) -> list[F.Finding]:
    """Every finding of a checked run; `est` (the estimate) for the eager-launch finding, `files` (the program's
    source files) to say why a run stayed on the CPU, `error` / `exit_status` how the program ended."""
    found = []
    for fn in ALL:
        found.extend(fn(watch, hw))
    if est is not None:
        found.extend(eager_launches(watch, hw, est))
    found.extend(no_device(watch, hw, files))
    found.extend(failure(watch, hw, error, exit_status))
    return F.sort(found)

