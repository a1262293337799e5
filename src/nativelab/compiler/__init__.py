"""The `neuron` graph compiler: `torch.compile(model, backend="neuron")`.

Dynamo finds it through the `torch_dynamo_backends` entry point, so `import torch` is enough; the entry point
hands over to the real backend when `torch_neuronx` is installed. `register()` is for a source checkout that
is not pip-installed (no entry point).
"""

from __future__ import annotations

from ..device.config import DEVICE_NAME
from .cache import cache_dir
from .metrics import reset_stats, stats

__all__ = ["stats", "reset_stats", "cache_dir", "register", "route_default_backend"]


def route_default_backend() -> None:
    """`torch.compile(model)` (Inductor) on `neuron` tensors compiles through this backend (default_backend.py).
    Called when the emulated device registers."""
    from . import default_backend

    default_backend.install()


def register() -> bool:
    """Register the backend with Dynamo by hand; False if a `neuron` backend is already known."""
    from ..device import real_neuron_installed

    if real_neuron_installed():
        return False
    from ._private import dynamo_backend_known, register_dynamo_backend

    if dynamo_backend_known(DEVICE_NAME):
        return False
    from .backend import neuron_backend

    register_dynamo_backend(DEVICE_NAME, neuron_backend)
    return True
