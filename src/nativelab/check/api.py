"""`with nativelab.check.Check() as c: ...; c.report()`: check any code on the emulated device."""

from __future__ import annotations

import contextlib
import warnings

from ..device import is_registered
from ..kernels.cpu.build import host_kernels
from ..models.llama.generate import counting_tokens
from . import collect
from .estimate import estimate
from .hardware import Trainium2
from .report import Report
from .watch import Watch

_active: list = []


class Check:
    """Watches the device while active; `report()` gives the findings and the Trainium2 estimate.

    steps: optimizer steps count as steps by themselves; `nativelab.check.step()` marks them by hand (and then
    only marked steps count); `tokens=True` counts the tokens every Llama `Generator.generate` returns;
    `bf16_drift=True` compares bf16 eager results with float32 shadows (slow: every bf16 op runs twice).
    """

    def __init__(self, name: str = "check", hardware: Trainium2 | None = None, tokens: bool = False,
                 bf16_drift: bool = False, files=None):
        self.name = name
        self.files = list(files or ())  # the program's source files: what chose the CPU, if nothing reached neuron
        self.error: BaseException | None = None  # how the program ended: an exception, a non-zero exit status
        self.exit_status = 0
        self.bf16_drift = bf16_drift
        self.hardware = hardware or Trainium2()
        self.tokens = tokens
        self.watch: Watch | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "Check":
        if not is_registered():
            raise RuntimeError("nativelab check watches nativelab's emulated device, which is not registered here "
                               "(the real torch_neuronx serves 'neuron': use its own tools on the chip)")
        self.watch = Watch(self.name, drift=self.bf16_drift)
        # The device's one-time "fell back to CPU" warnings would point into the check's hook; the report names
        # every fallback with its line instead.
        self._stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=r"Operator '.*' fell back to CPU")
        # Library kernels run their traced path while checked: the estimate counts the ops a kernel performs
        # from its traced graph; a hand-written host implementation is opaque to it.
        self._stack.enter_context(host_kernels(False))
        self._stack.enter_context(self.watch)
        if self.tokens:
            self._stack.enter_context(_counting_tokens(self.watch))
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if isinstance(exc[1], Exception):
            self.error = exc[1]
        try:
            self._stack.close()
        finally:
            _active.remove(self)

    def step(self) -> None:
        self.watch.step("marked")

    def ended(self, error: BaseException | None = None, exit_status: int = 0) -> None:
        """How the checked program ended, for the report (`with Check()` records an exception by itself)."""
        self.error, self.exit_status = error, exit_status

    def report(self, reference: dict | None = None) -> Report:
        w = self.watch
        if w is None:
            raise RuntimeError("Check.report(): the check has not run (use it as `with Check() as c:`)")
        hw = self.hardware
        per = w.steps or None
        est = estimate(w, hw, per)
        found = collect.all_findings(w, hw, est, self.files, self.error, self.exit_status)
        return Report(
            name=self.name, findings=found, estimate=est, steps=w.steps,
            step_kind=w.step_kind, wall_seconds=w.wall_seconds, compile_seconds=w.compile_seconds(),
            fallback_ops=w.fallback_ops(), reference=reference, memory=collect.memory_summary(w, hw),
            notes=[f"int64 values of a compiled graph not read ({e})" for e in w.probe_errors],
            nki_kernels=w.nki_kernels(),
        )


def step() -> None:
    """Mark one step of your program (a training or decode step) for per-step counts, in every active check (checks
    nest: a checked script may check itself); a no-op outside a check."""
    for c in _active:
        c.step()


def _counting_tokens(watch: Watch):
    """Each token every Llama `Generator.generate` returns is a step (tokens per second on Trainium2)."""

    def add(n: int) -> None:
        for _ in range(n):
            watch.step("token")

    return counting_tokens(add)
