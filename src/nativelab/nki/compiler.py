"""nki.compiler (the neuronxcc.nki API's module, `import neuronxcc.nki.compiler as ncc`): its kernel decorators,
from the page https://awsdocs-neuron.readthedocs-hosted.com/en/v2.26.1/_sources/nki/api/nki.compiler.rst
("Kernel Decorators": skip_middle_end_transformations, enable_stack_allocator(func=None, log_level=50),
force_auto_alloc; used as `@nki.compiler.enable_stack_allocator` over `@nki.jit`, or with arguments).

They tell neuronx-cc how to compile and allocate the kernel: which passes to skip, which SBUF / PSUM allocator
to use. Here there is no neuronx-cc and SBUF / PSUM are counted by live range (nki/limits.py) whichever is asked
for, so each returns the kernel it is given, unchanged: it runs and is estimated as without the decorator.

The page's allocation control (sbuf.alloc / mod_alloc / auto_alloc, psum.alloc / ...: tensors placed at
addresses the kernel gives) is not served: `ncc.sbuf` / `ncc.psum` are an AttributeError; allocate with
`nl.ndarray(..., buffer=nl.sbuf)` instead."""

from __future__ import annotations

__all__ = ["skip_middle_end_transformations", "enable_stack_allocator", "force_auto_alloc"]


def _passthrough(name: str, func, options: dict):
    for key in options:
        if key != "log_level":
            raise TypeError(f"nki.compiler.{name}() got an unexpected keyword argument {key!r}")
    if func is None:
        return lambda f: _passthrough(name, f, {})
    if not callable(func):
        raise TypeError(f"nki.compiler.{name}: expects a kernel, got {func!r}")
    return func


def skip_middle_end_transformations(func=None):
    """Skip neuronx-cc's middle-end transformations on the kernel: no compiler here, the kernel as given."""
    return _passthrough("skip_middle_end_transformations", func, {})


def enable_stack_allocator(func=None, log_level=50):
    """Allocate the kernel's SBUF / PSUM tensors with neuronx-cc's stack allocator: here they are counted by live
    range either way (nki/limits.py); the kernel as given."""
    return _passthrough("enable_stack_allocator", func, {"log_level": log_level})


def force_auto_alloc(func=None):
    """Let neuronx-cc allocate every tensor, ignoring direct allocation: the kernel as given."""
    return _passthrough("force_auto_alloc", func, {})

