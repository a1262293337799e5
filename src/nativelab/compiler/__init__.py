"""The `neuron` graph compiler: `torch.compile(model, backend="neuron")`.

Dynamo finds it through the `torch_dynamo_backends` entry point, so `import torch` is enough; the entry point
hands over to the real backend when `torch_neuronx` is installed. `register()` is for a source checkout that
is not pip-installed (no entry point).
"""

from __future__ import annotations

from .cache import cache_dir
from .metrics import reset_stats, stats

__all__ = ["stats", "reset_stats", "cache_dir", "register"]


def register() -> bool:
    """Register the backend with Dynamo by hand; False if a `neuron` backend is already known."""
    from ..device import real_neuron_installed

    if real_neuron_installed():
        return False
    from torch._dynamo.backends.registry import list_backends, register_backend

    if "neuron" in list_backends(exclude_tags=()):
        return False
    from .backend import neuron_backend

    register_backend(compiler_fn=neuron_backend, name="neuron")
    return True
