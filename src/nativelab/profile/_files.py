"""Output files (JSON, traces, plots) written atomically, as readable ordinary files."""

from __future__ import annotations

import os
from pathlib import Path

from ..files import write_atomic as _write_atomic


def write_atomic(path, data: bytes) -> Path:
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: directory {parent} does not exist")
    _write_atomic(path, data)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # the temporary file was private (0600); an output is an ordinary file
    return path
