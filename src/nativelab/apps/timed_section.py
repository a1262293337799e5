"""The timed section of a benchmark: what must not land inside it is kept out, or reported when it cannot be.

A timed generation should measure decoding and nothing else. Three things can land inside one unseen:
- a pass of Python's cyclic garbage collector. After the tiers' compiles the heap holds millions of objects,
  and a full pass took 0.41 s on a 2-core Xeon (`nativelab run --model all --compile --greedy`, cold caches),
  about twice a whole 50-token core generation (0.23 s). The decode loop allocates enough objects for the
  collector to run now and then, so on an unlucky run a full pass lands in the one timed generation. Kept out
  as `timeit` does: one collection before the section, none during it.
- a compile: a Dynamo recompile, a graph lowered for a new parameter set, a C++ extension built on first use.
  The warm-ups exist to do all of them; counted, so a report can say if one happened anyway.
- other processes keeping cores busy (2 cores: a neighbour costs the device's thread team 2-3x). Measured
  from /proc as the device's thread policy does, and reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc

from .. import cpp_build
from ..compiler import metrics
from ..device import threads
from ..profile import dynamo_counters

# Average cores other processes kept busy during the section from which a figure is called disturbed: the
# machine's own daemons stay far below it (~0.02 cores here).
BUSY_CORES = 0.25


def compile_counts() -> dict[str, int]:
    """Counters that move when something is compiled in this process."""
    s = metrics.current()
    dynamo = dynamo_counters().get("stats", {})
    return {
        "dynamo graphs": dynamo.get("unique_graphs", 0),  # also counts Inductor-backend (CUDA) compiles
        "device graphs": s.graphs,  # graphs handed to the neuron backend
        "device partitions": s.partitions,  # subgraphs lowered (compiled or loaded from the cache)
        "C++ extensions built": cpp_build.builds,
    }


@dataclasses.dataclass
class Section:
    """What happened inside one timed section (filled when it ends)."""

    compiled: dict[str, int] = dataclasses.field(default_factory=dict)  # counters that moved, by how much
    others_cores: float | None = None  # average cores other processes kept busy; None where /proc is absent

    def warnings(self) -> list[str]:
        out = []
        if self.compiled:
            what = ", ".join(f"{n} {k}" for k, n in self.compiled.items())
            out.append(f"something compiled inside the timed runs ({what}): the figure includes it")
        if self.others_cores is not None and self.others_cores >= BUSY_CORES:
            out.append(f"other processes kept {self.others_cores:.2f} cores busy during the timed runs: "
                       f"the figure is low")
        return out

    def as_dict(self) -> dict:
        return {"compiled": self.compiled, "others_cores": self.others_cores, "warnings": self.warnings()}


@contextlib.contextmanager
def timed_section():
    """Run the block with the garbage collector collected and then off (restored after); yields a `Section`
    that says, once the block ends, what compiled inside it and how busy the other processes kept the cores."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    section = Section()
    before, load0 = compile_counts(), threads.cpu_sample()
    try:
        yield section
    finally:
        if enabled:
            gc.enable()
        after, load1 = compile_counts(), threads.cpu_sample()
        section.compiled = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        if load0 is not None and load1 is not None:
            section.others_cores = round(threads.others(load0, load1), 3)
