"""Compile statistics, readable from code (`nativelab.compiler.stats()`), and the one-line compile log."""

from __future__ import annotations

import dataclasses
import logging

from ..device import observe

log = logging.getLogger("nativelab.compiler")


@dataclasses.dataclass
class CompileStats:
    graphs: int = 0  # graphs handed to the backend (forward and backward count separately)
    partitions: int = 0  # device subgraphs lowered to generated code
    kernel_graphs: int = 0  # graphs that are one kernel op, run as that op's own launch (kernel_graph.py)
    fallback_nodes: int = 0  # graph nodes that run as CPU fallbacks between device subgraphs
    cache_hits: int = 0
    cache_misses: int = 0
    cache_corrupt: int = 0  # entries found damaged, removed and recompiled
    compile_seconds: float = 0.0  # time spent producing executables (compiling or loading from cache)
    default_backend_graphs: int = 0  # device graphs torch.compile's default backend handed over (default_backend.py)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


_stats = CompileStats()

def note_graph(kind: str, inputs) -> None:
    """A graph the backend is handed (static), or a new concrete shape of a symbolic one: each is a compile on the
    real device, told to the device's observers (nativelab.check counts them)."""
    obs = observe.graph
    if obs is not None:
        obs(kind, tuple(tuple(x.shape) for x in inputs if hasattr(x, "shape")))


def stats() -> dict:
    """A snapshot of this process's compile statistics."""
    return _stats.as_dict()


def reset_stats() -> None:
    global _stats
    _stats = CompileStats()


def current() -> CompileStats:
    return _stats
