"""nativelab: the PyTorch-native Neuron lab stack, runnable without a Trainium chip.

Importing nativelab registers the emulated `neuron` device (unless the real `torch_neuronx` is installed).
"""

from __future__ import annotations

from . import device
from .device import clear_op_tracking, get_executed_ops, get_fallback_ops, get_op_counts

__version__ = "0.1.0"
__all__ = ["device", "get_fallback_ops", "get_executed_ops", "get_op_counts", "clear_op_tracking"]

if device.register():
    from . import distributed

    distributed.register()
