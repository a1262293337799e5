"""PyTorch private APIs the checker reads, each in one place (canaries in tests/test_private_apis.py)."""

from __future__ import annotations

from torch._ops import OpOverload  # noqa: F401 - the type of an ATen operator overload, as graph nodes target


def op_base_name(op: OpOverload) -> str:
    """An overload's operator name without the overload (`aten::mm` for `aten.mm.default`)."""
    return op._schema.name


def is_mutating(op: OpOverload) -> bool:
    """The overload writes one of its arguments (in place, out=)."""
    return op._schema.is_mutable


def dynamo_compilation_metrics() -> list:
    """Dynamo's record of its recent frame compilations (`CompilationMetrics`: compile_id, co_name, co_filename,
    co_firstlineno, recompile_reason, restart_reasons, entire_frame_compile_time_s), oldest first; a bounded
    deque (64), so the checker reads it at every compile start."""
    from torch._dynamo import utils

    return list(utils._compilation_metrics)
