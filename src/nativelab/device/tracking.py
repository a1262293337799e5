"""Which ATen ops ran on the device and which fell back to the CPU (the real backend's tracking API)."""

from __future__ import annotations

import collections

from . import state

executed: collections.Counter = collections.Counter()  # op name -> calls run on the device
fallback: collections.Counter = collections.Counter()  # op name -> calls that fell back to the CPU
graphs: collections.Counter = collections.Counter()  # compiled graph name -> launches
_fallback_order: dict[str, None] = {}  # first-seen order, like the real get_fallback_ops()
_warned: set[str] = set()


def _merge() -> None:
    """The counts of ops the C++ kernel ran since the last look, merged into `executed` whenever it is read
    through this module (the hot path counts in C++)."""
    rt = state.device.rt  # None before registration
    if rt is not None:
        executed.update(rt.take_executed())


class FallbackError(RuntimeError):
    """NATIVELAB_STRICT=1 and an op would fall back to the CPU."""


def get_fallback_ops() -> list[str]:
    """De-duplicated names of the ops that fell back to the CPU, in first-seen order."""
    return list(_fallback_order)


def get_executed_ops() -> list[str]:
    """De-duplicated names of the ops that ran on the device."""
    _merge()
    return list(executed)


def get_op_counts() -> dict[str, dict[str, int]]:
    """Per-op call counts: {'device': {...}, 'fallback': {...}}."""
    _merge()
    return {"device": dict(executed), "fallback": dict(fallback)}


def clear_op_tracking() -> None:
    _merge()
    executed.clear()
    fallback.clear()
    graphs.clear()
    _fallback_order.clear()


def record_fallback(name: str) -> bool:
    """Count a fallback; True the first time this op falls back in the process (time to warn)."""
    if state.device.strict:  # NATIVELAB_STRICT=1: an error, raised at the call that caused it
        raise FallbackError(
            f"NATIVELAB_STRICT=1: operator '{name}' would fall back to the CPU (on Trainium: a device -> host "
            f"round trip). Replace it with ops the device runs (`nativelab check` names a fix), or unset "
            f"NATIVELAB_STRICT."
        )
    fallback[name] += 1
    _fallback_order.setdefault(name, None)
    if name in _warned:
        return False
    _warned.add(name)
    return True
