"""A Python file loaded as a module by its path: a sibling bench script (bench/ is not a package, and putting it on
sys.path would let bench/nki.py shadow the `nki` package), or a public kernel file from a checkout outside the
repository, run as it is."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def load(path, name: str) -> types.ModuleType:
    """The file at `path` as the module `name`, registered in sys.modules as an import would (a dataclass in it
    looks its module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sibling(name: str) -> types.ModuleType:
    """bench/<name>.py."""
    return load(Path(__file__).with_name(f"{name}.py"), f"_bench_{name}")
