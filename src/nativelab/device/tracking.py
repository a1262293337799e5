"""Which ATen ops ran on the device and which fell back to the CPU (the real backend's tracking API)."""

from __future__ import annotations

import collections

from . import state

fallback: collections.Counter = collections.Counter()  # op name -> calls that fell back to the CPU
_fallback_order: dict[str, None] = {}  # first-seen order, like the real get_fallback_ops()
_warned: set[str] = set()


# What ran on the device is counted in one place, the C++ runtime (csrc/ops.cpp), whoever launched it: the C++
# kernel, the Python path (dispatch.py, runtime_ops.py), kernels, NKI and compiled-graph launches
# (`count_executed`: `kernel:<name>`, `nki:<name>`, `graph:<name>`).


def count_executed(name: str) -> None:
    """Count one launch of `name` (an ATen op, `kernel:<name>`, `nki:<name>`, `graph:<name>`) that ran on the device."""
    state.device.rt.count_executed(name)


def executed_counts() -> dict[str, int]:
    """{name: launches run on the device}, in the order each was first counted."""
    rt = state.device.rt  # None before registration
    return {} if rt is None else rt.executed_counts()


class FallbackError(RuntimeError):
    """NATIVELAB_STRICT=1 and an op would fall back to the CPU."""


def get_fallback_ops() -> list[str]:
    """De-duplicated names of the ops that fell back to the CPU, in first-seen order."""
    return list(_fallback_order)


def get_executed_ops() -> list[str]:
    """De-duplicated names of the ops that ran on the device."""
    return list(executed_counts())


def get_op_counts() -> dict[str, dict[str, int]]:
    """Per-op call counts: {'device': {...}, 'fallback': {...}}."""
    return {"device": executed_counts(), "fallback": dict(fallback)}


def clear_op_tracking() -> None:
    if state.device.rt is not None:
        state.device.rt.clear_executed()
    fallback.clear()
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
