"""torch.distributed on the `neuron` device: the `neuron` process-group backend (gloo over device memory),
rank-to-core binding, and crash-safe distributed checkpoints.

`register()` runs when nativelab registers the device (so with `import torch`): afterwards
`init_process_group()` picks the `neuron` backend for the device by default, and `backend="neuron"` or
`"cpu:gloo,neuron:neuron"` name it explicitly.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from . import process_group
from .process_group import NeuronProcessGroup

__all__ = ["register", "bind_local_rank", "NeuronProcessGroup", "BACKEND"]

BACKEND = "neuron"


def register() -> None:
    """Make `neuron` a torch.distributed backend and the default one for `neuron` tensors."""
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    # "cpu" too: one neuron group also serves CPU tensors (object collectives, barriers); CPU's own
    # default backend stays gloo
    dist.Backend.register_backend(BACKEND, process_group.create, devices=[BACKEND, "cpu"])


def bind_local_rank() -> torch.device:
    """Bind this process to `neuron:{LOCAL_RANK}` (torchrun sets LOCAL_RANK; 0 without it)."""
    raw = os.environ.get("LOCAL_RANK", "0")
    try:
        local_rank = int(raw)
    except ValueError:
        raise ValueError(f"LOCAL_RANK={raw!r}: expected an integer") from None
    count = torch.neuron.device_count()
    if not 0 <= local_rank < count:
        raise RuntimeError(
            f"LOCAL_RANK={local_rank} needs neuron:{local_rank}, but this host has {count} logical NeuronCores "
            f"(NEURON_RT_NUM_CORES={os.environ.get('NEURON_RT_NUM_CORES', 'unset')}, "
            f"NEURON_RT_VIRTUAL_CORE_SIZE={os.environ.get('NEURON_RT_VIRTUAL_CORE_SIZE', 'unset')}): "
            f"run at most {count} processes per node"
        )
    torch.neuron.set_device(local_rank)
    return torch.device(BACKEND, local_rank)
