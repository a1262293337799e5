"""Build C++ extensions on first use and cache them on disk (any layer may use it).

`load_extension(name, sources)` compiles `sources` with `torch.utils.cpp_extension.load` into a cache
directory keyed by what changes the binary (the sources' bytes, the flags, torch's and Python's versions),
and imports the result. Later processes import the cached module in milliseconds, compiler or not.

A build runs in a fresh temporary directory and is renamed into place when complete, so a reader finds a
whole build or none; an OS file lock (released by the kernel if the builder dies, unlike PyTorch's own
lock file) makes a second process wait for the first one's build instead of compiling it again. A build is
loaded only from a cache directory this user alone can write (`private_dir.py`): another user's, or one that
group or others can write, is refused with a warning and the extension is built in a private one.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import settings
from .private_dir import CacheDir

ENV = settings.CPP_CACHE_DIR.name
CACHE = CacheDir(settings.CPP_CACHE_DIR, "C++ extensions")
log = logging.getLogger("nativelab.cpp_build")
_loaded: dict[str, object] = {}
builds = 0  # extensions this process compiled (not loaded from the cache): benchmarks check none lands in a timed run


class CppBuildError(RuntimeError):
    """A C++ extension could not be built (no compiler, no ninja, or a compile error)."""


def cache_dir() -> Path:
    """$NATIVELAB_CPP_CACHE_DIR, else $XDG_CACHE_HOME/nativelab/cpp, else ~/.cache/nativelab/cpp (or a private
    directory instead of one other users can write)."""
    return CACHE.root()


def compiler() -> str:
    """The C++ compiler PyTorch's extension builder will call ($CXX, else c++)."""
    return os.environ.get("CXX", "c++")


def check_toolchain(name: str) -> None:
    """One clear line when the machine cannot build C++ at all."""
    cxx = compiler()
    if shutil.which(cxx) is None:
        raise CppBuildError(
            f"nativelab: no C++ compiler '{cxx}' on this machine, needed to build the '{name}' extension "
            f"(install g++, e.g. `apt-get install g++`, or set CXX)"
        )
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        raise CppBuildError(f"nativelab: ninja is needed to build the '{name}' extension (`pip install ninja`)")


def build_key(name: str, sources, extra_cflags=(), extra_ldflags=(), depends=()) -> str:
    import torch

    h = hashlib.sha256()
    for part in (name, torch.__version__, sys.implementation.cache_tag, *extra_cflags, "|",
                 *extra_ldflags):
        h.update(part.encode() + b"\0")
    for src in (*sources, *depends):
        h.update(Path(src).name.encode() + b"\0")
        h.update(Path(src).read_bytes())
    return h.hexdigest()[:20]


def load_extension(name: str, sources, extra_cflags=(), extra_ldflags=(), verbose: bool = False, depends=()):
    """The Python module built from `sources` (C++ files defining `PyInit_<name>`, e.g. with pybind11's
    `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)`), compiled once per machine and cached; `depends` (headers the
    sources include) are part of the cache key too."""
    sources = [str(s) for s in sources]
    extra_cflags, extra_ldflags = list(extra_cflags), list(extra_ldflags)
    key = build_key(name, sources, extra_cflags, extra_ldflags, depends)
    mod = _loaded.get(key)
    if mod is not None:
        return mod
    so = CACHE.path(f"{name}-{key}", f"{name}.so")
    final, root = so.parent, so.parent.parent
    if not so.exists():
        with open(root / f"{name}-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process building the same key: wait for it
            if not so.exists():
                mod = _build(name, sources, extra_cflags, extra_ldflags, root, final, verbose)
    if mod is None:
        mod = _import(name, so)
    mod.__file__ = str(so)  # not the temporary directory it was first loaded from
    _loaded[key] = mod
    return mod


def _build(name, sources, extra_cflags, extra_ldflags, root: Path, final: Path, verbose: bool):
    global builds
    check_toolchain(name)
    from torch.utils import cpp_extension

    builds += 1

    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=root)
    t0 = time.perf_counter()
    try:
        # Imported from the temporary directory: loaded once (a second dlopen from the final path would run
        # the library's static initialisers twice); the mapping survives the rename below.
        mod = cpp_extension.load(
            name, sources, extra_cflags=extra_cflags, extra_ldflags=extra_ldflags, build_directory=tmp,
            verbose=verbose,
        )
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CppBuildError(f"nativelab: building the C++ extension '{name}' failed: {e}") from e
    os.replace(tmp, final) if not final.exists() else shutil.rmtree(tmp, ignore_errors=True)
    log.info("built C++ extension %s in %.1f s (cached in %s)", name, time.perf_counter() - t0, final)
    return mod


def _import(name: str, so: Path):
    spec = importlib.util.spec_from_file_location(name, so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
