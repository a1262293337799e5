"""From what a check watched to findings: one function per concern, each returning Finding objects."""

from __future__ import annotations

import re

from . import findings as F
from .drift import LIMIT
from .hardware import Trainium2
from .source import Site, _is_internal_path
from .watch import FP32_EXACT, INT32_MAX, Watch

GiB = 1 << 30
MEMORY_WARN = 0.8  # a peak above this share of a core's usable memory is a finding


def _per(watch: Watch, n: int) -> float | None:
    return n / watch.steps if watch.steps else None


def _site(site: Site | None) -> tuple[str | None, int | None, str]:
    return (str(site), site.line, site.code()) if site is not None else (None, None, "")


def fallbacks(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    out = []
    for (op, site), ev in watch.fallback_sites.items():
        s, line, code = _site(site)
        moved = ev.to_host + ev.to_device
        cost = ev.count * hw.host_round_trip_s + moved / hw.host_link_bytes_per_s
        out.append(F.Finding(
            "fallback", "error" if (watch.steps and ev.count >= watch.steps) else "warning",
            f"{op} falls back to the CPU", s, line, ev.count, F.fallback_fix(op), _per(watch, ev.count), cost, code,
            {"op": op, "bytes_to_host": ev.to_host, "bytes_to_device": ev.to_device,
             "emulator_seconds": ev.seconds,
             "emulator_share": ev.seconds / watch.wall_seconds if watch.wall_seconds else None}))
    return out


_SYNC_TITLES = {"item": ".item() reads a device value on the host", "print": "printing a device tensor",
                "tolist": ".tolist() copies a device tensor to the host", "copy": "a device -> host copy",
                "branch": "a Python branch on a device value"}


def syncs(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    out = []
    for (kind, site), ev in watch.sync_sites.items():
        s, line, code = _site(site)
        if kind.startswith("shape:"):
            op = kind.split(":", 1)[1]
            title, fix, key = f"{op} has a data-dependent output shape (the host waits for the device)", \
                F.SYNC_FIXES["shape"], "shape"
        else:
            title, fix, key = _SYNC_TITLES.get(kind, kind), F.SYNC_FIXES.get(kind, F.SYNC_FIXES["copy"]), kind
        cost = ev.count * hw.host_round_trip_s + ev.to_host / hw.host_link_bytes_per_s
        out.append(F.Finding("sync", "warning", title, s, line, ev.count, fix, _per(watch, ev.count), cost, code,
                             {"sync": key, "bytes_to_host": ev.to_host}))
    return out


def dtypes(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    out = []
    for (op, site), ev in watch.cast_sites.items():
        s, line, code = _site(site)
        over = ev.max_value > INT32_MAX
        out.append(F.Finding(
            "int64-overflow" if over else "int64-cast", "error" if over else "info",
            f"{op}: int64 input cast to int32, largest |value| {ev.max_value:,} "
            f"{'>' if over else '<='} 2^31-1", s, line, ev.count, F.INT64_FIX, _per(watch, ev.count), 0.0, code,
            {"op": op, "max_abs": ev.max_value, "limit": INT32_MAX}))
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
    for (op, site), ev in watch.wide_sites.items():
        s, line, code = _site(site)
        out.append(F.Finding("float64", "warning", f"{op} on {'/'.join(sorted(ev.dtypes))}: computed as float32 "
                             f"(complex is not supported)", s, line, ev.count, F.FLOAT64_FIX, _per(watch, ev.count),
                             0.0, code, {"op": op, "dtypes": sorted(ev.dtypes)}))
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
                             F.GRAPH_BREAK_FIX, None, n * hw.launch_s, site.code(), {"reason": reason}))
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


ALL = (fallbacks, syncs, dtypes, compilation, memory, collectives, drift)


def all_findings(watch: Watch, hw: Trainium2) -> list[F.Finding]:
    found = []
    for fn in ALL:
        found.extend(fn(watch, hw))
    return F.sort(found)

