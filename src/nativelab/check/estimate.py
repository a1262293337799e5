"""A first-order estimate of the checked run on Trainium2, from what the emulated device executed: where a step's
(a token's) time goes, part by part. Every figure is `hardware.Trainium2`'s, cited there; one is fitted.

    kernels            the device work: each unit's max(bytes / HBM bandwidth, FLOPs / TensorEngine peak), plus
                       instruction_s per op (of a compiled graph, of a library kernel, an eager op); an NKI
                       kernel's launch is nki/cost.py's estimate of it on a NeuronCore-v3 instead
    graph launches     graph_launch_s per launch of a compiled graph, and per library kernel launched on its own
    eager op launches  eager_launch_s per op run eagerly
    kernel boundaries  kernel_boundary_s (an HBM write + load, a DMA each) per kernel a graph runs: each op of a
                       compiled graph, each library-kernel call (the ops inside one keep their data on chip)
    CPU fallbacks      host_round_trip_s + bytes over the host link + the CPU op's own time (its fastest call
                       as the emulator ran it: the host runs the same ATen CPU kernel), each call
    host syncs         host_round_trip_s + bytes over the host link (the host waits for the device)
    host loop          host_step_s per generated token (the fitted constant), where the steps are tokens
    collectives        collective_latency_s + the ring algorithm's bytes / a rank's collective bandwidth

Bandwidth and FLOPs are one logical core's share of the chip (2 of 8 physical cores at LNC=2). Compile time
is reported apart (it is paid once per shape).
"""

from __future__ import annotations

import dataclasses
import operator

import torch

from ..device.schema import op_base_name
from ._private import OpOverload
from .hardware import Trainium2

_MATMULS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::addmv",
            "aten::mv", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention"}
_graph_cache: dict = {}


def _shape(n) -> tuple | None:
    if not isinstance(n, torch.fx.Node):
        return None
    v = n.meta.get("val", n.meta.get("tensor_meta"))
    return tuple(v.shape) if v is not None and hasattr(v, "shape") else None


def _node_flops(n) -> int:
    name = op_base_name(n.target) if isinstance(n.target, OpOverload) else ""
    if name not in _MATMULS:
        return 0
    out = _shape(n)
    if out is None:
        return 0
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::mv", "aten::addmv"):
        a = _shape(n.args[1] if name in ("aten::addmm", "aten::baddbmm", "aten::addmv") else n.args[0])
        k = a[-1] if a else 0
        numel = 1
        for d in out:
            numel *= d
        return 2 * numel * k
    if name.startswith("aten::_scaled_dot_product"):
        q, k = _shape(n.args[0]), _shape(n.args[1])
        if q and k:
            return 4 * q[0] * q[1] * q[2] * k[2] * q[3]
    return 0


def graph_work(gm, kernel: bool) -> tuple[int, int]:
    """(kernels, FLOPs) of one launch of a compiled graph (its compute nodes) or of a library kernel (one)."""
    hit = _graph_cache.get(id(gm))
    if hit is not None and hit[0] is gm:
        return hit[1]
    kernels, flops = 0, 0
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        t = n.target
        if isinstance(t, OpOverload) and (t.is_view or op_base_name(t) in _FREE):
            continue
        kernels += 1
        flops += _node_flops(n) if isinstance(t, OpOverload) else 0
    res = (1 if kernel else max(kernels, 1), flops)
    _graph_cache[id(gm)] = (gm, res)
    return res


_FREE = {"aten::_assert_tensor_metadata", "aten::sym_size", "aten::sym_stride", "aten::_assert_scalar",
         "aten::detach", "aten::alias"}


def estimate(watch, hw: Trainium2 | None = None, per: int | None = None) -> dict:
    """Seconds on one Trainium2 logical core for the work the check saw, by part; `per` divides into per-step
    (or per-token) figures. `by_work` names each unit of device work (a compiled graph, a kernel, an eager op)
    with its kernel time."""
    hw = hw or Trainium2()
    bw, peak = hw.core_bytes_per_s, hw.core_flops
    launches = eager = boundaries = ops = 0
    kernel_s = mem_s = flop_s = 0.0
    by_name: dict[str, float] = {}
    nki = getattr(watch, "nki", {})  # NKI kernel -> its launches' nki/cost.py estimates (a profile Session's)
    nki_graphs = {gm for gm, name in getattr(watch, "kernel_names", {}).items() if name in nki}
    for name, st in watch.ops.items():
        if st.kind not in ("op", "graph", "kernel"):
            continue
        src, is_kernel = watch.sources.get(name, (None, False))
        if st.kind == "kernel":  # a library kernel launched on its own: its own NEFF, one kernel
            launches += st.calls
            boundaries += st.calls
            if src in nki_graphs or name.removeprefix("kernel:") in nki:
                continue  # an NKI launch: its time is its own estimate (below)
        k, f = graph_work(src, is_kernel) if src is not None else (1, 0)
        if st.kind == "graph":
            launches += st.calls
            boundaries += k * st.calls
        elif st.kind == "op":
            eager += st.calls
        byte_s = (st.read + st.written) / bw
        fl_s = f * st.calls / peak
        t = k * st.calls * hw.instruction_s + max(byte_s, fl_s)
        ops += k * st.calls
        mem_s += byte_s
        flop_s += fl_s
        kernel_s += t
        by_name[name] = t
    # A library-kernel call counted one op in the graph (or queue entry) that ran it; it performs its traced ops,
    # each an engine instruction sequence, with no HBM round trip between them (no kernel boundary).
    for gm, calls in watch.kernel_runs.items():
        if gm in nki_graphs:
            continue
        k, f = graph_work(gm, False)
        fl_s = f * calls / peak
        inner = (k - 1) * calls
        ops += inner
        flop_s += fl_s
        kernel_s += inner * hw.instruction_s
        name = f"kernel:{watch.kernel_names.get(gm, '?')}"
        by_name[name] = by_name.get(name, 0.0) + inner * hw.instruction_s
    nki_s = sum(st.est_seconds for st in nki.values())
    for name, st in nki.items():
        by_name[f"kernel:{name}"] = st.est_seconds
    kernel_s += nki_s
    # Work done within one step of several (a checkpoint's copies, an evaluation) is reported apart, not spread
    # over the steps.
    one_time = _one_time(watch)
    fallbacks, syncs = _host_events(watch)
    fb = [ev for ev in fallbacks if not one_time(ev)]
    fb_calls = sum(ev.count for ev in fb)
    fb_bytes = sum(ev.to_host + ev.to_device for ev in fb)
    fb_host_s = sum(ev.count * ev.fastest for ev in fb)  # each call at its op's fastest: load cannot inflate it
    fallback_s = fb_calls * hw.host_round_trip_s + fb_bytes / hw.host_link_bytes_per_s + fb_host_s
    sy = [ev for ev in syncs if not one_time(ev)]
    sync_calls = sum(ev.count for ev in sy)
    sync_s = sync_calls * hw.host_round_trip_s + sum(ev.to_host for ev in sy) / hw.host_link_bytes_per_s
    once = [ev for ev in (*fallbacks, *syncs) if one_time(ev)]
    once_s = sum(ev.count for ev in once) * hw.host_round_trip_s + \
        sum(ev.to_host + ev.to_device for ev in once) / hw.host_link_bytes_per_s
    tokens = _tokens(watch)
    collectives = getattr(watch, "collective_sites", {})  # a check's (a profile session does not group them)
    coll_s = sum(hw.collective_seconds(kind, c.bytes, c.world, c.calls) for (kind, _), c in collectives.items())
    parts = {
        "kernels": kernel_s,
        "graph launches": launches * hw.graph_launch_s,
        "eager op launches": eager * hw.eager_launch_s,
        "kernel boundaries": boundaries * hw.kernel_boundary_s,
        "CPU fallbacks": fallback_s,
        "host syncs": sync_s,
        "host loop": tokens * hw.host_step_s,
        "collectives": coll_s,
    }
    total = sum(parts.values())
    d = max(per or 1, 1)
    return {
        "seconds": total,
        "per": per,
        "seconds_per": total / d,
        "parts": parts,
        "parts_per": {k: v / d for k, v in parts.items()},
        "counts": {"launches": launches, "eager_ops": eager, "kernel_boundaries": boundaries, "ops": ops,
                   "fallback_calls": fb_calls, "fallback_host_seconds": fb_host_s, "sync_calls": sync_calls,
                   "tokens": tokens, "nki_launches": sum(st.calls for st in nki.values()),
                   "collective_calls": sum(c.calls for c in collectives.values()),
                   "device_bytes": sum(st.read + st.written for st in watch.ops.values()
                                       if st.kind in ("op", "graph", "kernel")),
                   "flops_seconds": flop_s, "bytes_seconds": mem_s},
        "one_time": {"seconds": once_s, "calls": sum(ev.count for ev in once)},
        "by_work": dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:10]),
        "hardware": hw.as_dict(),
    }


@dataclasses.dataclass
class _HostEvent:
    count: int
    to_host: int
    to_device: int = 0
    fastest: float = 0.0


def _host_events(watch) -> tuple[list, list]:
    """(CPU fallbacks, host syncs), each with its calls, bytes each way and host seconds: a check's, by line; a
    profiling session's, from its fallback ops and its device -> host reads besides the fallbacks' own."""
    if hasattr(watch, "fallback_sites"):
        return list(watch.fallback_sites.values()), list(watch.sync_sites.values())
    fb = [_HostEvent(st.calls, st.to_host, st.to_device, st.fastest) for st in watch.ops.values()
          if st.kind == "fallback"]
    reads = watch.transfer_calls["device_to_host"] - sum(ev.count for ev in fb)
    read_bytes = watch.transfers["device_to_host"] - sum(ev.to_host for ev in fb)
    return fb, [_HostEvent(reads, read_bytes)] if reads > 0 else []


def _tokens(watch) -> int:
    """Generated tokens: a check's steps when they are tokens, a profiling session's counted tokens."""
    if hasattr(watch, "step_kind"):
        return watch.steps if watch.step_kind == "token" else 0
    return getattr(watch, "tokens", 0)


def _one_time(watch):
    test = getattr(watch, "one_time", None)  # a profiling session has no steps: nothing is one-time
    return test if test is not None else (lambda ev: False)


def fit(watch, measured_seconds_per: float, per: int, param: str = Trainium2.FITTED,
        hw: Trainium2 | None = None) -> float:
    """The one fitted constant: the value of `param` (the estimate is linear in each parameter) that makes this
    run's estimate per step / token equal a measured time."""
    hw = hw or Trainium2()
    at0 = estimate(watch, hw.with_params({param: 0.0}), per)["seconds_per"]
    at1 = estimate(watch, hw.with_params({param: 1.0}), per)["seconds_per"]
    if at1 - at0 <= 0:
        raise ValueError(f"the estimate does not depend on {param} for this run")
    return max((measured_seconds_per - at0) / (at1 - at0), 0.0)
