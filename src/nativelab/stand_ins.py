"""Stand-ins: `import torch_neuronx` (or `import nki`) served by a nativelab module when the real package is
absent, so that code written for the real stack (accelerate and transformers probe
`importlib.util.find_spec("torch_neuronx")`; the guide calls `torch_neuronx.get_fallback_ops()`) runs here.

A stand-in never shadows the real package: its finder sits at the *end* of `sys.meta_path` and, before it
answers, asks every finder placed after it (the ones before it have already said no). `real_spec(name)` is the
question "is the real one installed?" with the stand-in left out; `is_stand_in(module)` tells them apart.

    install("torch_neuronx", "nativelab.device.neuronx")   # `torch_neuronx` and `torch_neuronx.<sub>` now
                                                           # resolve to nativelab.device.neuronx[.<sub>]
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types

_targets: dict[str, str] = {}  # stand-in top-level name -> the nativelab module that serves it


class _Loader(importlib.abc.Loader):
    """Fills a fresh module with the target module's public names (one set of state: the target's)."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        target = importlib.import_module(self.target)
        names = getattr(target, "__all__", None) or [n for n in vars(target) if not n.startswith("_")]
        for name in names:
            setattr(module, name, getattr(target, name))
        module.__doc__ = target.__doc__
        module.__version__ = getattr(target, "__version__", None) or _version()
        module.__stand_in_for__ = self.target
        module.__getattr__ = lambda name: _forward(target, module, name)


def _forward(target: types.ModuleType, module: types.ModuleType, name: str):
    try:
        return getattr(target, name)
    except AttributeError:
        raise AttributeError(f"module {module.__name__!r} (nativelab's stand-in, {target.__name__}) has no "
                             f"attribute {name!r}") from None


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("nativelab") + "+nativelab"  # PEP 440, and says what it is
    except importlib.metadata.PackageNotFoundError:  # a source tree on PYTHONPATH
        return "0+nativelab"


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self._local = threading.local()  # `asking`: this thread is asking the other finders (answer nothing)

    def find_spec(self, fullname, path=None, target=None):
        top, _, rest = fullname.partition(".")
        if top not in _targets or getattr(self._local, "asking", False):
            return None
        if rest:  # a submodule: only below our own stand-in, never below a real package
            parent = sys.modules.get(fullname.rpartition(".")[0])
            if parent is None or not is_stand_in(parent):
                return None
        elif _later_spec(self, fullname, path, target) is not None:
            return None  # someone after us provides the real one
        dotted = _targets[top] + (f".{rest}" if rest else "")
        try:
            served = importlib.util.find_spec(dotted)
        except ModuleNotFoundError:  # the target is no package: `name.sub` does not exist
            return None
        if served is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _Loader(dotted), origin=served.origin,
                                              is_package=served.submodule_search_locations is not None)
        spec.has_location = served.has_location  # __file__ names the nativelab file that serves it
        return spec


def _later_spec(finder: _Finder, fullname, path, target):
    """What the finders after ours say (those before it were asked first by the import system)."""
    try:
        later = sys.meta_path[sys.meta_path.index(finder) + 1:]
    except ValueError:
        later = []
    return _ask(finder, later, fullname, path, target)


def _ask(finder: _Finder, finders, fullname, path=None, target=None):
    finder._local.asking = True
    try:
        for f in finders:
            find = getattr(f, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                return spec
        return None
    finally:
        finder._local.asking = False


_finder = _Finder()


def install(name: str, target: str) -> None:
    """Serve `import name` (and its submodules) from the nativelab module `target` when no real `name` exists."""
    if "." in name:
        raise ValueError(f"stand-ins serve top-level packages; {name!r} is a submodule")
    if _targets.get(name, target) != target:
        raise ValueError(f"a stand-in for {name!r} is already served by {_targets[name]}")
    _targets[name] = target
    if _finder not in sys.meta_path:
        sys.meta_path.append(_finder)


def is_stand_in(module: types.ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return isinstance(getattr(spec, "loader", None), _Loader)


def real_spec(name: str):
    """The spec of the real, installed `name`, or None; a nativelab stand-in does not count."""
    mod = sys.modules.get(name)
    if mod is not None and not is_stand_in(mod):
        return getattr(mod, "__spec__", None) or importlib.machinery.ModuleSpec(name, None)
    if mod is None:
        spec = importlib.util.find_spec(name)
        return None if spec is None or isinstance(spec.loader, _Loader) else spec
    # The stand-in is imported (sys.modules answers find_spec with it): ask the finders themselves.
    return _ask(_finder, [f for f in sys.meta_path if f is not _finder], name)
