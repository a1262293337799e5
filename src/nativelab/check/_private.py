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


# -- what torch.compile made: its Dynamo context and the wrapper module (check/compile_calls.py) --------------

# The child name under which torch.compile's module wrapper (OptimizedModule) registers the module it compiles.
COMPILED_MODULE_CHILD = "_orig_mod"


def is_compiled_module(module) -> bool:
    """`module` is torch.compile's wrapper of a module (torch._dynamo's OptimizedModule)."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(module, OptimizedModule)


def dynamo_context_on_stack(frame) -> tuple:
    """(the Dynamo context torch.compile made (an OptimizeContext: backend and settings), the function it
    compiles or None) innermost on the stack from `frame` outwards, while torch.compile wraps a module or a
    compiled callable is called; (None, None) if none. They are Dynamo's own frames' `self` and `fn`:
    `_TorchDynamoContext.__call__`'s while it wraps a module, the compiled callable's wrapper (`compile_wrapper`,
    whose closure holds them) while one of its frames compiles."""
    import inspect

    from torch._dynamo import eval_frame

    while frame is not None:
        if frame.f_code.co_filename == eval_frame.__file__:
            local = frame.f_locals
            ctx = local.get("self")
            if isinstance(ctx, eval_frame._TorchDynamoContext):
                if not isinstance(ctx, eval_frame.OptimizeContext):
                    return None, None
                fn = inspect.unwrap(local["fn"]) if callable(local.get("fn")) else None
                return ctx, fn if inspect.isfunction(fn) else None
        frame = frame.f_back
    return None, None


def compile_settings(ctx) -> dict:
    """What torch.compile was given, from its Dynamo context: backend (its name), dynamic, mode and options (as
    handed to the backend: a backend other than Inductor gets them as keyword arguments; Inductor's wrapper keeps
    only the configuration they imply, as options), fullgraph."""
    import torch
    from torch._dynamo.eval_frame import innermost_backend

    backend = innermost_backend(ctx.callback)
    name = getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None) or str(backend)
    if isinstance(backend, torch._TorchCompileWrapper):
        mode, options = backend.kwargs.get("mode"), backend.kwargs.get("options")
    else:
        mode, options = None, dict(getattr(backend, "config", None) or {}) or None
    return {"backend": name, "dynamic": ctx._dynamic, "mode": mode, "options": options, "fullgraph": ctx.fullgraph}
