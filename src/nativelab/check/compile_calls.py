"""The `torch.compile(...)` calls a check reports (the line, backend, dynamic, mode, options, fullgraph), recorded
without replacing `torch.compile`: what torch.compile made says how it was called.

torch.compile wraps its model in a Dynamo context that keeps the backend (with the mode and options it hands
the backend) and the dynamic and fullgraph settings (`_private.compile_settings`). A check sees that context
at two moments, through hooks that each check registers for itself (so nested checks, and a check inside a
profiling session, each see every call):

- `torch.compile(module)`, as the call runs: the wrapper it returns registers the module as its child, and
  nn.Module's global registration hook (a public API) fires inside torch.compile, the user's line on the stack.
  A module compiled and never called is recorded too.
- a compiled function, when Dynamo compiles its first frame (Dynamo's compile-start callback, which profiling
  sessions also use): Python offers no hook while torch.compile(fn) runs (its API-usage log fires once per
  process; sys.monitoring is Python 3.12's), so the line is read from the function's source: a
  `@torch.compile` decorator on it, or the one `torch.compile(<its name>, ...)` call in its file or the file
  that called it; else its def line (the line that called it, for a function of PyTorch's own, as
  `model.compile()` compiles nn.Module's `_call_impl`). A function compiled but never called is not recorded (it never reaches
  the device), nor one Dynamo serves from a cache filled before the check.

Any backend is seen this way (neuron, Inductor, a user's function: its name); Inductor keeps the mode only as the
options it implies, so its `mode` reads None.
"""

from __future__ import annotations

import ast
import functools
import sys

import torch

from . import _private
from .source import Site, _is_internal, user_site


class CompileCalls:
    """Records each torch.compile call into `calls` (dicts: site, backend, dynamic, mode, options, fullgraph)
    between `start()` and `stop()`."""

    def __init__(self, calls: list):
        self.calls = calls
        self._seen: dict[int, object] = {}  # id(Dynamo context) -> it (kept alive, so the id stays its own)
        self._handle = None

    def start(self) -> None:
        self._handle = torch.nn.modules.module.register_module_module_registration_hook(self._registered)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _registered(self, module, name, submodule):
        """A child registered on any module: torch.compile(module) making its wrapper is one."""
        if name == _private.COMPILED_MODULE_CHILD and _private.is_compiled_module(module):
            ctx, _ = _private.dynamo_context_on_stack(sys._getframe(1))
            if ctx is not None:
                self._record(ctx, user_site())
        return None  # keep the child as it is

    def frame_compiling(self, call_site: Site | None) -> None:
        """Dynamo starts compiling a frame (a compiled function's first, or a module's first forward), called
        from `call_site`."""
        ctx, fn = _private.dynamo_context_on_stack(sys._getframe(1))
        if ctx is None or id(ctx) in self._seen:
            return
        code = fn.__code__ if fn is not None else None
        if code is None or _is_internal(code):  # `model.compile()` compiles nn.Module's _call_impl: the user's call
            self._record(ctx, call_site)
            return
        def_site = Site(code.co_filename, code.co_firstlineno, code.co_name)
        self._record(ctx, compile_line(def_site, call_site) or def_site)

    def _record(self, ctx, site: Site | None) -> None:
        if id(ctx) in self._seen:
            return
        self._seen[id(ctx)] = ctx
        self.calls.append({"site": site, **_private.compile_settings(ctx)})


def compile_line(def_site: Site | None, call_site: Site | None) -> Site | None:
    """The line of the torch.compile call that compiled the function defined at `def_site`: its decorator, or the
    only `torch.compile(<name>, ...)` in its file (else in the caller's file); None when not found once."""
    if def_site is None or not def_site.func.isidentifier():
        return None
    files = [def_site.file] + ([call_site.file] if call_site is not None and call_site.file != def_site.file else [])
    for path in files:
        decorated, calls = _compile_calls_in(path)
        if path == def_site.file:
            line = decorated.get((def_site.func, def_site.line))
            if line is not None:
                return Site(path, line, def_site.func)
        lines = calls.get(def_site.func, ())
        if len(lines) == 1:
            return Site(path, lines[0], def_site.func)
    return None


@functools.lru_cache(maxsize=64)
def _compile_calls_in(path: str) -> tuple[dict, dict]:
    """({(function name, a line of its def or decorators): line of its torch.compile decorator},
    {name: lines of `torch.compile(name, ...)` calls}) in one source file."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return {}, {}
    decorated: dict = {}
    calls: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                if _is_torch_compile(dec.func if isinstance(dec, ast.Call) else dec):
                    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                    for line in range(first, node.lineno + 1):  # the frame starts at one of these
                        decorated[(node.name, line)] = dec.lineno
        elif isinstance(node, ast.Call) and _is_torch_compile(node.func):
            target = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "model"), None)
            if isinstance(target, ast.Name):
                calls.setdefault(target.id, []).append(node.lineno)
    return decorated, calls


def _is_torch_compile(expr) -> bool:
    return isinstance(expr, ast.Attribute) and expr.attr == "compile" and isinstance(expr.value, ast.Name) and \
        expr.value.id == "torch"
