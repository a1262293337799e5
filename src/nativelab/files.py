"""Files for every layer, written whole or not at all (the compile cache, distributed checkpoints, saved
models, the profiler's outputs): a reader finds the old file or the new one, never a torn one. Where the
caches live is a setting (`settings.py`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    """Make the directory's entries (a rename into it, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, prefix: str | None = None, sync_dir: bool = False) -> Path:
    """Write a whole file or nothing: a temporary file in the same directory, fsync, rename over `path`
    (and with `sync_dir`, fsync the directory, so the rename itself survives a crash)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=prefix or f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if sync_dir:
        fsync_dir(path.parent)
    return path
