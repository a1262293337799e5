"""Rank-to-core binding: under torchrun, each process drives the NeuronCore of its LOCAL_RANK."""

from __future__ import annotations

import torch

from .. import settings
from ..device.config import DEVICE_NAME


def local_rank() -> int:
    """This process's rank on its node: torchrun's LOCAL_RANK (settings.LOCAL_RANK), 0 without it."""
    rank = settings.LOCAL_RANK.get()
    return 0 if rank is None else rank


def under_torchrun() -> bool:
    """Whether LOCAL_RANK is set (torchrun sets it for each process it starts)."""
    return settings.LOCAL_RANK.get() is not None


def bind_local_rank() -> torch.device:
    """Bind this process to `neuron:{LOCAL_RANK}` (torchrun sets LOCAL_RANK; 0 without it)."""
    rank = local_rank()
    count = torch.neuron.device_count()
    if not rank < count:
        shape = ", ".join(f"{v.name}={v.raw() or 'unset'}" for v in (settings.NUM_CORES, settings.VIRTUAL_CORE_SIZE))
        raise RuntimeError(
            f"LOCAL_RANK={rank} needs neuron:{rank}, but this host has {count} logical NeuronCores "
            f"({shape}): run at most {count} processes per node"
        )
    torch.neuron.set_device(rank)
    return torch.device(DEVICE_NAME, rank)
