"""Argument checks shared by the kernels: bad input fails before any work is queued, naming the argument."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16)


def check_rank(name: str, t: torch.Tensor, rank: int) -> None:
    if t.dim() != rank:
        raise ValueError(f"{name}: expected a {rank}-d tensor, got shape {tuple(t.shape)}")


def check_dim(name: str, t: torch.Tensor, dim: int, size: int, what: str) -> None:
    if t.shape[dim] != size:
        raise ValueError(f"{name}: dimension {dim} must be {size} ({what}), got shape {tuple(t.shape)}")


def check_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: dtype must be float32 or bfloat16, got {t.dtype}")


def check_same(names: str, *tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"{names}: all on one device expected, got {sorted(map(str, devices))}")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise ValueError(f"{names}: one dtype expected, got {sorted(map(str, dtypes))}")
