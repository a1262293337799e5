"""Cache directories only this user can write (any layer may use it): native code, compiled graphs and tuning
results are loaded from them, so a directory another user could write would let that user run code here.

`CacheDir(setting, holds)` is one cache: `path(*parts)` is `<the setting's directory>/<parts>` when the
directory (made 0700 if missing) and every directory and file below it down to the entry are this user's (or
root's) and neither group nor others can write them, as ssh asks of `~/.ssh`. Otherwise one warning names the
first that is not, and the entry lives in a private directory instead: the setting's default directory if that
one passes, else a fresh 0700 temporary directory for this process. The program still works; it only caches
less. Directories a cache makes are 0700 (`make_private`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from .settings import Variable

_lock = threading.Lock()
_warned: set[tuple[str, Path]] = set()  # (setting, refused path): one warning each per process
_temporary: dict[str, Path] = {}  # setting -> this process's private directory, when no other passes


def make_private(path: Path) -> Path:
    """`mkdir -p path`, each directory it creates 0700 (whatever the umask)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:  # another process made it meanwhile: checked like any other
            continue
        os.chmod(p, 0o700)
    return path


def why_not_private(path: Path) -> str | None:
    """Why `path` (a directory or file) is not safe to load from, or None: it is this user's or root's and
    neither group nor others can write it."""
    st = os.stat(path)
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        return f"owned by uid {st.st_uid}, not this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _first_unsafe(root: Path, parts: tuple[str, ...]) -> tuple[Path, str] | None:
    """The first of `root` (made if missing) and each existing path below it down to `root/parts` that is not
    private, with why."""
    try:
        make_private(root)
    except OSError as e:
        return root, f"cannot be created ({e.strerror})"
    if not root.is_dir():
        return root, "not a directory"
    for path in (root, *(root.joinpath(*parts[:i]) for i in range(1, len(parts) + 1))):
        try:
            reason = why_not_private(path)
        except FileNotFoundError:
            return None  # not made yet: this user makes it, private
        if reason is not None:
            return path, reason
    return None


class CacheDir:
    """One cache's directory, named by a setting (`settings.CPP_CACHE_DIR`, ...); `holds` says what it holds
    ("C++ extensions"), for the warning."""

    def __init__(self, setting: Variable, holds: str):
        self.setting, self.holds = setting, holds

    def root(self) -> Path:
        return self.path()

    def path(self, *parts: str) -> Path:
        """`<directory>/<parts>`, in the setting's directory if every step to it is private, else in a private
        one (after one warning naming the step that is not)."""
        root = Path(self.setting.get())
        unsafe = _first_unsafe(root, parts)
        if unsafe is None:
            return root.joinpath(*parts)
        instead = self._private_instead(root, parts)
        self._warn(root, *unsafe, instead)
        return instead.joinpath(*parts)

    def _private_instead(self, refused: Path, parts: tuple[str, ...]) -> Path:
        default = Path(self.setting.default() if callable(self.setting.default) else self.setting.default)
        if default != refused and _first_unsafe(default, parts) is None:
            return default
        with _lock:
            tmp = _temporary.get(self.setting.name)
            if tmp is None:
                tmp = _temporary[self.setting.name] = Path(tempfile.mkdtemp(prefix=f"nativelab-{default.name}-"))
                atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        return tmp

    def _warn(self, root: Path, path: Path, reason: str, instead: Path) -> None:
        with _lock:
            if (self.setting.name, path) in _warned:
                return
            _warned.add((self.setting.name, path))
        where = f"{self.setting.name}" if path == root else f"in {self.setting.name}={root}"
        warnings.warn(f"nativelab: not loading {self.holds} from {path} ({where}): {reason}; using the private "
                      f"directory {instead} instead", stacklevel=3)
