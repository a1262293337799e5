"""torch.distributed on the `neuron` device: the `neuron` process-group backend (gloo over device memory),
rank-to-core binding, and crash-safe distributed checkpoints.

`register()` runs when nativelab registers the device (so with `import torch`): afterwards
`init_process_group()` picks the `neuron` backend for the device by default, and `backend="neuron"` or
`"cpu:gloo,neuron:neuron"` name it explicitly.
"""

from __future__ import annotations

import torch.distributed as dist

from ..device.config import DEVICE_NAME
from . import process_group
from .local_rank import bind_local_rank, local_rank
from .process_group import NeuronProcessGroup

__all__ = ["register", "bind_local_rank", "local_rank", "NeuronProcessGroup", "BACKEND"]

BACKEND = DEVICE_NAME  # the process-group backend is named after the device


def register() -> None:
    """Make `neuron` a torch.distributed backend and the default one for `neuron` tensors."""
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    # "cpu" too: one neuron group also serves CPU tensors (object collectives, barriers); CPU's own
    # default backend stays gloo
    dist.Backend.register_backend(BACKEND, process_group.create, devices=[BACKEND, "cpu"])
