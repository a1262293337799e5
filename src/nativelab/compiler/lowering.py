"""Lowering a device subgraph to generated CPU code (Inductor's C++ backend) that works on device memory,
through the persistent cache of compiled graphs."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
import warnings

import torch
import torch.fx

from ..device import cpu_info, gemm_policy, memory, queue, threads
from ..device.config import DEVICE_NAME
from . import _private, cache, dtype_policy, gemm, metrics, random_ops
from .runtime import DeviceGraph

COMPILER_VERSION = "nativelab-neuron-cc 4"  # bump when the lowering changes what it generates (3: fp32 GEMMs, 4: run-time thread counts)
DEVICE = DEVICE_NAME


def lower(gm: torch.fx.GraphModule, name: str, options: dict) -> DeviceGraph:
    """Compile (or load from the cache) one device subgraph.

    options["freeze"]: the graph's parameters are constants to prepack (Inductor freezing). Inductor cannot
    serialize frozen graphs, so those are compiled in each process (its kernel cache still helps)."""
    freeze = bool(options.get("freeze"))
    source = gm  # the graph as the program wrote it (nativelab check reads its int64 values from it)
    gm = dtype_policy.follow_policy(gm)  # int64 / float64 computed narrower where eager ops are (in the key: its code)
    examples = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    cpu_gm = _retarget_to_cpu(gm)
    cpu_inputs = [_cpu_example(v) for v in examples]
    key = None if freeze else _key(cpu_gm, cpu_inputs, options)
    out_specs, aliasing, single = _outputs(gm)
    t0 = time.perf_counter()
    artifact, how = compile_cached(cpu_gm, cpu_inputs, key, freeze)
    seconds = time.perf_counter() - t0
    metrics.current().partitions += 1
    n_ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    metrics.log.info("neuron: %s %s (%d ops, key %s) in %.2fs", how, name, n_ops, (key or "-")[:12], seconds)
    return DeviceGraph(f"graph:{name}", artifact, out_specs, aliasing, single, source=source,
                       random=random_ops.draws_random(gm))


def compile_cached(cpu_gm: torch.fx.GraphModule, cpu_inputs: list, key: str | None, freeze: bool = False):
    """Inductor-compile a CPU graph, going through the on-disk cache under `key` (None: do not cache).
    Returns (callable artifact, "cache hit" | "compiled" | ...) and keeps the compile statistics."""
    _private.install_cpp_source_filter()  # before any kernel is built or loaded (see its docstring)
    s = metrics.current()
    t0 = time.perf_counter()
    artifact, how = None, "compiled"
    payload = cache.read(key) if key is not None else None
    if payload is not None:
        try:
            artifact, how = _load(payload), "cache hit"
            s.cache_hits += 1
        except Exception as e:  # noqa: BLE001 - a payload that passed its checksum but will not load
            warnings.warn(f"nativelab: cached graph {key[:12]} failed to load ({e}); recompiling")
            s.cache_corrupt += 1
    if artifact is None:
        with torch.no_grad() if freeze else contextlib.nullcontext(), _quiet_unsaveable():
            artifact = _private.standalone_compile(gemm.with_fp32_gemms(cpu_gm, cpu_inputs), cpu_inputs, freeze)
        if key is None:
            how = "compiled (frozen weights, not cached)" if freeze else "compiled (not cached)"
        else:
            s.cache_misses += 1
            if artifact.is_saveable():
                cache.write(key, _save(artifact))
            else:
                how = "compiled (not saveable: not cached)"
    s.compile_seconds += time.perf_counter() - t0
    return artifact, how


@contextlib.contextmanager
def _quiet_unsaveable():
    """Inductor warns when it cannot serialize a compiled graph (frozen weights; a graph of no ops, as Dynamo
    hands over around a graph break); we skip the disk cache for it and say so in our own log line."""
    logger = logging.getLogger(_private.STANDALONE_COMPILE_LOGGER)
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def _retarget_to_cpu(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The same graph with `device=neuron` arguments and device constants moved to the CPU: the generated
    code runs on host views of device memory."""
    cpu_gm = torch.fx.GraphModule(gm, gm.graph)  # a copy we may edit
    graph = torch.fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        new = graph.node_copy(node, lambda n: env[n])
        new.args = _cpu_args(new.args)
        new.kwargs = _cpu_args(new.kwargs)
        env[node] = new
    cpu_gm.graph = graph
    queue.drain()  # constants are read now
    for name, buf in list(cpu_gm.named_buffers()) + list(cpu_gm.named_parameters()):
        if buf.device.type == DEVICE:
            _set_attr(cpu_gm, name, memory.host_view(buf.detach()))
    for node in graph.nodes:
        if node.op == "get_attr":
            val = _get_attr(cpu_gm, node.target)
            if isinstance(val, torch.Tensor) and val.device.type == DEVICE:
                _set_attr(cpu_gm, node.target, memory.host_view(val.detach()))
    cpu_gm.recompile()
    return cpu_gm


def _cpu_args(x):
    if isinstance(x, torch.device) and x.type == DEVICE:
        return torch.device("cpu")
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu_args(y) for y in x)
    if isinstance(x, dict):
        return {k: _cpu_args(v) for k, v in x.items()}
    return x


def _get_attr(mod, target: str):
    for part in target.split("."):
        mod = getattr(mod, part)
    return mod


def _set_attr(mod, target: str, value) -> None:
    *path, last = target.split(".")
    for part in path:
        mod = getattr(mod, part)
    if isinstance(getattr(mod, last, None), torch.nn.Parameter):
        value = torch.nn.Parameter(value, requires_grad=False)
    setattr(mod, last, value)


def _cpu_example(v):
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)
    return v


def _key(cpu_gm, cpu_inputs, options) -> str:
    h = hashlib.sha256()
    h.update(COMPILER_VERSION.encode())
    h.update(torch.__version__.encode())
    # the host's vector ISA (ATEN_CPU_CAPABILITY can lower it), the bf16 GEMM policy and the thread count
    # decide the generated code: an artifact built for AVX-512 must not serve a run forced to AVX2
    h.update(f"{cpu_info.isa()} {gemm_policy.min_rows()} {threads.ceiling()}".encode())
    h.update(f"fallback_random={_private.inductor_fallback_random()}".encode())  # eager or Inductor random ops
    h.update(repr(sorted(options.items())).encode())
    h.update(cpu_gm.code.encode())
    for name, t in sorted(cpu_gm.state_dict().items()):  # constants baked into the graph
        h.update(name.encode())
        h.update(repr((t.shape, t.dtype)).encode())
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    for x in cpu_inputs:
        h.update(repr((tuple(x.shape), x.stride(), x.dtype) if isinstance(x, torch.Tensor) else x).encode())
    return h.hexdigest()


def _outputs(gm):
    """Per output (shape, stride, dtype, on the host); whether the graph must run at launch (an output shares
    memory with an input, or is a host tensor the caller may read at once: `(x + 1).cpu() * 2`); whether the
    graph returns a single value rather than a tuple."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = out_node.args[0]
    single = not isinstance(outs, (list, tuple))
    outs = (outs,) if single else outs
    inputs = {
        _private.storage_key(n.meta["val"])
        for n in gm.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
    }
    specs, aliasing = [], False
    for o in outs:
        v = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
        if isinstance(v, torch.Tensor):
            on_host = v.device.type != DEVICE
            specs.append((tuple(v.shape), tuple(v.stride()), v.dtype, on_host))
            aliasing = aliasing or on_host or _private.storage_key(v) in inputs
        else:
            specs.append(None)
            aliasing = True  # a non-tensor output: run at launch, return what the code returns
    return specs, aliasing, single


def _save(artifact) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "artifact.bin")
        artifact.save(path=path, format="binary")
        with open(path, "rb") as f:
            return f.read()


def _load(payload: bytes):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "artifact.bin")
        with open(path, "wb") as f:
            f.write(payload)
        return _private.load_artifact(path)
