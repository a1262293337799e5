"""Crash-safe distributed checkpoints with `torch.distributed.checkpoint` (DCP).

Layout under `root`: one directory per saved step (`step_00000012/`, DCP's files from every rank) and a
`LATEST` file naming the newest complete one. A save writes into `.step_XXXXXXXX.tmp/`, and only once every
rank has written (and fsynced) its part does rank 0 rename it into place and then replace `LATEST`
atomically. A job killed mid-write leaves a `.tmp` directory that nothing reads (the next save of that step
clears it): the last good checkpoint is never replaced by a partial one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ..files import fsync_dir, write_atomic

LATEST = "LATEST"


def _step_dir(step: int) -> str:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    return f"step_{step:08d}"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save(state: dict, root: str | os.PathLike, step: int, keep: int = 2) -> Path:
    """Save `state` (DCP's stateful dict: model / optimizer state dicts, plain values) as step `step` on
    every rank (a collective); keep the newest `keep` complete checkpoints. Returns the step directory."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(root)
    name = _step_dir(step)
    tmp, final = root / f".{name}.tmp", root / name
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a save of this step that died earlier
    _barrier()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True))
    _barrier()  # every rank's files are written and fsynced
    if _rank() == 0:
        fsync_dir(tmp)
        if final.exists():  # the same step saved again: the old copy stays valid until the new one is in place
            old = root / f".{name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(root)
        write_atomic(root / LATEST, (name + "\n").encode(), sync_dir=True)
        for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def latest(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under `root`, or None when there is none."""
    root = Path(root)
    try:
        name = (root / LATEST).read_text().strip()
    except FileNotFoundError:
        return None
    path = root / name
    if not (path / ".metadata").is_file():
        raise RuntimeError(f"{root / LATEST} names {name}, but {path} is not a complete checkpoint")
    return path


def load(state: dict, root: str | os.PathLike) -> int | None:
    """Load the newest complete checkpoint under `root` into `state` in place (a collective). Returns its
    step, or None (state untouched) when there is no checkpoint yet."""
    path = latest(root)
    if path is None:
        return None
    dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    return int(path.name.split("_", 1)[1])
