"""The device's C++ runtime (`csrc/`), built on first import and cached (see `nativelab.cpp_build`).

It registers what PyTorch reads from C++ only: the device guard (current device per thread, streams,
events), the PrivateUse1 hooks (availability, device count, generators, pinned host memory). The per-op
policy stays Python (schema.py, policy.py, dispatch.py), decided once per op overload and call signature;
the per-call work of the common case (allocation on a core, host views, the work queue) is C++ (ops.cpp,
memory.cpp, queue.cpp).
"""

from __future__ import annotations

from pathlib import Path

from .. import cpp_build

NAME = "nativelab_device"
SOURCES = sorted((Path(__file__).parent / "csrc").glob("*.cpp"))
HEADERS = sorted((Path(__file__).parent / "csrc").glob("*.h"))
CFLAGS = ("-O2",)
_module = None


def loaded():
    """The runtime module if it has been loaded in this process, else None (nothing is built)."""
    return _module


def load():
    """The compiled runtime module (built once per machine: about 10 s on 2 cores, then cached)."""
    global _module
    if _module is None:
        _module = cpp_build.load_extension(NAME, SOURCES, extra_cflags=CFLAGS, depends=HEADERS)
    return _module
