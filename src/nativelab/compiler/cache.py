"""The persistent cache of compiled device graphs (the guide's NEFF cache).

One file per entry, `<dir>/<key[:2]>/<key>.neff`: a magic line, the SHA-256 of the payload, the payload (an
Inductor `CompiledArtifact` in its binary format). Entries are written to a temporary file in the same
directory and renamed into place, so a reader sees a whole entry or none, and two processes that compile the
same graph at once both succeed (the last rename wins; both wrote the same thing). A damaged entry is
detected by its checksum, removed with a warning, and compiled again. The checksum catches damage, not a
forged entry: entries are read only from a directory this user alone can write (`private_dir.py`); another
user's, or one group or others can write, is refused with a warning and a private directory used instead.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

from .. import settings
from ..files import write_atomic
from ..private_dir import CacheDir, make_private

MAGIC = b"NATIVELAB-NEFF-1\n"
ENV = settings.CACHE_DIR.name
CACHE = CacheDir(settings.CACHE_DIR, "compiled graphs")


def cache_dir() -> Path:
    """$NATIVELAB_CACHE_DIR, else $XDG_CACHE_HOME/nativelab/neff, else ~/.cache/nativelab/neff (or a private
    directory instead of one other users can write)."""
    return CACHE.root()


def entry_path(key: str) -> Path:
    return CACHE.path(key[:2], f"{key}.neff")


def read(key: str) -> bytes | None:
    """The payload stored under `key`, or None if absent; a damaged entry is removed (with a warning)."""
    path = entry_path(key)
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    payload = _verify(blob)
    if payload is None:
        warnings.warn(f"nativelab: compiled-graph cache entry {path} is damaged; removing it and recompiling")
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        return None
    return payload


def _verify(blob: bytes) -> bytes | None:
    if not blob.startswith(MAGIC):
        return None
    rest = blob[len(MAGIC):]
    digest, sep, payload = rest.partition(b"\n")
    if not sep or len(digest) != 64:
        return None
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        return None
    return payload


def write(key: str, payload: bytes) -> Path:
    """Store `payload` under `key` atomically (temporary file + fsync + rename)."""
    path = entry_path(key)
    make_private(path.parent)
    blob = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    return write_atomic(path, blob, prefix=f".{key[:16]}.")


def entries() -> list[Path]:
    root = cache_dir()
    return sorted(root.glob("*/*.neff")) if root.exists() else []
