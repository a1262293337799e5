"""Which line of the user's code caused something: the innermost frame outside PyTorch and nativelab's
machinery (device, compiler, kernels, distributed, profile, check) and the standard library.

nativelab's models, fine-tuning and apps count as user code: they are what a user writes (the Lab 2 fallbacks
are reported at their lines in the model code). Inside a compiled graph the Python stack only shows the call
of the compiled function, so the graph compiler hands over the stack trace Dynamo recorded for the node.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import sys
import sysconfig

import torch

from ..device import observe

def _wrapper_modules():
    try:
        import typing_extensions
    except ImportError:
        return ()
    return (typing_extensions,)


_NATIVELAB = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INTERNAL_DIRS = tuple(
    os.path.join(d, "") for d in (
        os.path.dirname(os.path.abspath(torch.__file__)),
        *(os.path.join(_NATIVELAB, p) for p in ("device", "compiler", "kernels", "distributed", "profile", "check")),
        sysconfig.get_paths()["stdlib"],
    )
)
# Wrappers PyTorch's own calls go through (typing_extensions.deprecated wraps torch.distributed's
# all_gather_into_tensor and reduce_scatter_tensor): their frames are not the user's.
_INTERNAL_FILES = tuple(os.path.splitext(m.__file__)[0] for m in _wrapper_modules())
_internal: dict = {}  # file -> bool


@dataclasses.dataclass(frozen=True)
class Site:
    file: str
    line: int
    func: str = ""

    def __str__(self) -> str:
        return f"{short_path(self.file)}:{self.line}"

    def code(self) -> str:
        return linecache.getline(self.file, self.line).strip()


def _is_internal(code) -> bool:
    # Cached by file, all it depends on: code objects hash their constants (Dynamo's code for `model.compile()`
    # holds a dict: unhashable) and compare equal across files.
    f = code.co_filename
    hit = _internal.get(f)
    if hit is None:
        hit = _internal[f] = _is_internal_path(f) or f.endswith("nativelab/__init__.py")
    return hit


def _is_internal_path(path: str) -> bool:
    return path.startswith(_INTERNAL_DIRS) or path.startswith("<") or \
        (path.endswith((".py", ".pyc")) and os.path.splitext(path)[0] in _INTERNAL_FILES)


def user_site(depth: int = 2) -> Site | None:
    """The innermost user frame of the current stack (or of the compiled graph node running now)."""
    compiled = observe.compiled_source
    if compiled:
        site = parse_stack_trace(compiled)
        if site is not None:
            return site
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    while f is not None:
        if not _is_internal(f.f_code):
            return Site(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


_LIBRARY_DIRS = tuple(os.path.join(d, "") for d in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})


def is_library_path(path: str) -> bool:
    """An installed package's file (site-packages: transformers, accelerate), not the program's own."""
    return path.startswith(_LIBRARY_DIRS)


def program_site(depth: int = 2) -> Site | None:
    """The innermost frame of the program's own code: outside PyTorch and nativelab's machinery, and outside
    installed packages (where a library such as the HF Trainer made the call, the program's line that called it)."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    while f is not None:
        if not _is_internal(f.f_code) and not is_library_path(f.f_code.co_filename):
            return Site(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def compiled_call_sites(depth: int = 2) -> tuple[Site | None, Site | None]:
    """(the compiled function's def, the user's call of it), while Dynamo compiles a function or a compiled
    function runs: the innermost user frame is then the function at its def line (its body has not started),
    the next one the line that called it. Elsewhere (a backward compiled at loss.backward()): (None, that line)."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None, None
    found = []
    while f is not None and len(found) < 2:
        if not _is_internal(f.f_code):
            found.append(Site(f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    if not found:
        return None, None
    if found[0].code().startswith(("def ", "async def ", "@")):
        return found[0], found[1] if len(found) > 1 else None
    return None, found[0]


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def parse_stack_trace(text: str) -> Site | None:
    """The innermost user frame of a Dynamo stack trace (the last 'File ..., line N, in f' that is not internal)."""
    found = None
    for m in _FRAME.finditer(text):
        path = m.group(1)
        if not _is_internal_path(path):
            found = Site(path, int(m.group(2)), m.group(3))
    return found


def short_path(path: str) -> str:
    """Relative to the working directory when below it; nativelab's own files from the package root."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = path
    if not rel.startswith(".."):
        return rel
    if path.startswith(_NATIVELAB):
        return "nativelab/" + os.path.relpath(path, _NATIVELAB)
    return path


# PyTorch library code that reads device values on the host by itself, named for the report: a sync inside it is
# the library's doing, not the user line's that called it.
_LIBRARIES = (
    (os.path.join("torch", "optim", ""), "optimizer"),
    (os.path.join("torch", "serialization.py"), "save"),
)


def library_call(depth: int = 2) -> tuple[str, str] | None:
    """(kind, name) of the outermost PyTorch library function between the current frame and the innermost user
    frame: ("optimizer", "torch.optim.LBFGS.step") inside an optimizer's step, ("save", "torch.save") inside
    torch.save; None when the user's line made the sync itself."""
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    found = None
    while f is not None and _is_internal(f.f_code):
        path = f.f_code.co_filename
        for part, kind in _LIBRARIES:
            if part not in path:
                continue
            if kind == "save" and f.f_code.co_name in ("save", "load"):
                found = (kind, f"torch.{f.f_code.co_name}")
            elif kind == "optimizer" and not path.endswith(("optimizer.py", "_functional.py")):
                owner = f.f_locals.get("self")
                name = type(owner).__name__ if owner is not None else os.path.basename(path)[:-3]
                found = (kind, f"torch.optim.{name}.{f.f_code.co_name}")
        f = f.f_back
    return found
