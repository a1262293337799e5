"""Rank-to-core binding: under torchrun, each process drives the NeuronCore of its LOCAL_RANK."""

from __future__ import annotations

import os

import torch

from .. import settings
from ..device.config import DEVICE_NAME


def bind_local_rank() -> torch.device:
    """Bind this process to `neuron:{LOCAL_RANK}` (torchrun sets LOCAL_RANK; 0 without it)."""
    raw = os.environ.get("LOCAL_RANK", "0")
    try:
        local_rank = int(raw)
    except ValueError:
        raise ValueError(f"LOCAL_RANK={raw!r}: expected an integer") from None
    count = torch.neuron.device_count()
    if not 0 <= local_rank < count:
        shape = ", ".join(f"{v.name}={v.raw() or 'unset'}" for v in (settings.NUM_CORES, settings.VIRTUAL_CORE_SIZE))
        raise RuntimeError(
            f"LOCAL_RANK={local_rank} needs neuron:{local_rank}, but this host has {count} logical NeuronCores "
            f"({shape}): run at most {count} processes per node"
        )
    torch.neuron.set_device(local_rank)
    return torch.device(DEVICE_NAME, local_rank)
