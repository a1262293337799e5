"""The `neuron` graph compiler: `torch.compile(model, backend="neuron")`.

Registered for Dynamo through the `torch_dynamo_backends` entry point (so `import torch` is enough) and, when
this package is imported, directly; neither happens when the real `torch_neuronx` stack is installed.
"""

from __future__ import annotations

from .cache import cache_dir
from .metrics import reset_stats, stats

__all__ = ["stats", "reset_stats", "cache_dir", "register"]


def register() -> bool:
    from ..device import real_neuron_installed

    if real_neuron_installed():
        return False
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    from .backend import neuron_backend

    if _COMPILER_FNS.get("neuron") is not neuron_backend:
        _COMPILER_FNS.pop("neuron", None)
        register_backend(compiler_fn=neuron_backend, name="neuron")
    return True


register()
