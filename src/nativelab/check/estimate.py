"""A first-order estimate of the checked run on Trainium2, from what the emulated device executed.

    device work   per launch of a compiled graph: launch_s; of an eager op: eager_launch_s
    NKI kernel    per launch: nki/cost.py's estimate of that launch on a NeuronCore-v3 (its engines, DMA queues
                  and dependencies), in place of kernel_s and the roofline
                  per kernel (one op of a compiled graph, or one library-kernel call): kernel_s
                  + max(bytes / HBM bandwidth, FLOPs / TensorEngine peak) of each unit of work
    CPU fallback  host_round_trip_s + its bytes over the host link, each call
    host sync     host_round_trip_s + its bytes over the host link (the host waits for the device)
    collective    collective_latency_s + the ring algorithm's bytes / a rank's collective bandwidth

Bandwidth and FLOPs are one logical core's share of the chip (2 of 8 physical cores at LNC=2). Compile time
is reported apart (it is paid once per shape). Figures and parameters: `hardware.Trainium2`.
"""

from __future__ import annotations

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
    (or per-token) figures."""
    hw = hw or Trainium2()
    bw, peak = hw.core_bytes_per_s, hw.core_flops
    launches = eager = kernels = 0
    roof = mem_s = flop_s = 0.0
    by_name: dict[str, float] = {}
    nki = getattr(watch, "nki", {})  # NKI kernel -> its launches' nki/cost.py estimates (a profile Session's)
    nki_graphs = {gm for gm, name in getattr(watch, "kernel_names", {}).items() if name in nki}
    for name, st in watch.ops.items():
        if st.kind not in ("op", "graph", "kernel"):
            continue
        src, is_kernel = watch.sources.get(name, (None, False))
        if st.kind == "kernel" and (src in nki_graphs or name.removeprefix("kernel:") in nki):
            continue  # an NKI launch: priced below by its own estimate
        if src is not None:
            k, f = graph_work(src, is_kernel)
        else:
            k, f = 1, 0
        n_launch = st.calls if st.kind == "graph" else 0
        n_eager = st.calls if st.kind == "op" else 0
        byte_s = (st.read + st.written) / bw
        fl_s = f * st.calls / peak
        t = n_launch * hw.launch_s + n_eager * hw.eager_launch_s + k * st.calls * hw.kernel_s + max(byte_s, fl_s)
        launches += n_launch
        eager += n_eager
        kernels += k * st.calls
        mem_s += byte_s
        flop_s += fl_s
        roof += max(byte_s, fl_s)
        by_name[name] = t
    # A library-kernel call counted one kernel in the graph (or queue entry) that ran it; it performs its traced
    # ops, each an engine instruction sequence like an op of a compiled graph (fusion saves the HBM round trips
    # between them, which the roofline already leaves out, and the launches).
    for gm, calls in watch.kernel_runs.items():
        if gm in nki_graphs:
            continue
        k, f = graph_work(gm, False)
        kernels += (k - 1) * calls
        fl_s = f * calls / peak
        flop_s += fl_s
    # Work done within one step of several (a checkpoint's copies, an evaluation) is reported apart, not spread
    # over the steps.
    one_time = _one_time(watch)
    fb = [ev for ev in watch.fallback_sites.values() if not one_time(ev)]
    fb_calls = sum(ev.count for ev in fb)
    fb_bytes = sum(ev.to_host + ev.to_device for ev in fb)
    fallback_s = fb_calls * hw.host_round_trip_s + fb_bytes / hw.host_link_bytes_per_s
    sy = [ev for ev in watch.sync_sites.values() if not one_time(ev)]
    sync_calls = sum(ev.count for ev in sy)
    sync_s = sync_calls * hw.host_round_trip_s + sum(ev.to_host for ev in sy) / hw.host_link_bytes_per_s
    once = [ev for ev in (*watch.fallback_sites.values(), *watch.sync_sites.values()) if one_time(ev)]
    once_s = sum(ev.count for ev in once) * hw.host_round_trip_s + \
        sum(ev.to_host + ev.to_device for ev in once) / hw.host_link_bytes_per_s
    nki_s = sum(st.est_seconds for st in nki.values())
    for name, st in nki.items():
        by_name[f"kernel:{name}"] = st.est_seconds
    coll_s = sum(hw.collective_seconds(kind, c.bytes, c.world, c.calls) for (kind, _), c in watch.collective_sites.items())
    parts = {
        "graph launch": launches * hw.launch_s,
        "eager op launch": eager * hw.eager_launch_s,
        "kernels": kernels * hw.kernel_s,  # the kernels' FLOPs are in flop_s; their bytes in the graph's
        "device roofline": roof,
        "NKI kernels": nki_s,  # nki/cost.py's estimate of each launch
        "CPU fallbacks": fallback_s,
        "host syncs": sync_s,
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
        "counts": {"launches": launches, "eager_ops": eager, "kernels": kernels, "fallback_calls": fb_calls,
                   "sync_calls": sync_calls, "nki_launches": sum(st.calls for st in nki.values()),
                   "collective_calls": sum(c.calls for c in watch.collective_sites.values()),
                   "device_bytes": sum(st.read + st.written for st in watch.ops.values()
                                       if st.kind in ("op", "graph", "kernel")),
                   "flops_seconds": flop_s, "bytes_seconds": mem_s},
        "one_time": {"seconds": once_s, "calls": sum(ev.count for ev in once)},
        "by_work": dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:10]),
        "hardware": hw.as_dict(),
    }


def _one_time(watch):
    test = getattr(watch, "one_time", None)  # a profiling session has no steps: nothing is one-time
    return test if test is not None else (lambda ev: False)


def fit(watch, param: str, measured_seconds_per: float, per: int, hw: Trainium2 | None = None) -> float:
    """The one fitted constant: the value of `param` (the estimate is linear in each parameter) that makes this
    run's estimate per step / token equal a measured time."""
    hw = hw or Trainium2()
    at0 = estimate(watch, hw.with_params({param: 0.0}), per)["seconds_per"]
    at1 = estimate(watch, hw.with_params({param: 1.0}), per)["seconds_per"]
    if at1 - at0 <= 0:
        raise ValueError(f"the estimate does not depend on {param} for this run")
    return max((measured_seconds_per - at0) / (at1 - at0), 0.0)
