"""PyTorch private APIs the checker reads, each in one place (canaries in tests/test_private_apis.py)."""

from __future__ import annotations

from torch._ops import OpOverload  # noqa: F401 - the type of an ATen operator overload, as graph nodes target


def is_mutating(op: OpOverload) -> bool:
    """The overload writes one of its arguments (in place, out=)."""
    return op._schema.is_mutable


def dynamo_compilation_metrics() -> list:
    """Dynamo's record of its recent frame compilations (`CompilationMetrics`: compile_id, co_name, co_filename,
    co_firstlineno, recompile_reason, restart_reasons, entire_frame_compile_time_s), oldest first; a bounded
    deque (64), so the checker reads it at every compile start."""
    from torch._dynamo import utils

    return list(utils._compilation_metrics)


def scalar_args(op: OpOverload) -> tuple[frozenset, frozenset]:
    """(positions, names) of the overload's value arguments, `Scalar` or `Tensor` (a Python number reaches a
    Tensor argument as a wrapped number: `x + 2**31`): values the op computes with, unlike its `int` arguments
    (dims, sizes, `ignore_index`, `reduction`)."""
    args = op._schema.arguments
    kinds = [str(a.type) in ("number", "Optional[number]", "Tensor", "Optional[Tensor]") for a in args]
    return (frozenset(i for i, (a, k) in enumerate(zip(args, kinds)) if k and not a.kwarg_only),
            frozenset(a.name for a, k in zip(args, kinds) if k))


# nn.Module's one conversion method: .to, .double, .float, .half, .cuda and .type all call it with the function
# that converts each parameter and buffer (the checker wraps it to see which line made float64 parameters).
MODULE_APPLY = "_apply"
