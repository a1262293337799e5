"""What `import torch_neuronx` gives where the real package is absent (served by `nativelab.stand_ins`): the
device's op tracking under the real backend's names. Importing it also means the `neuron` device is there,
as importing the real one registers it."""

from __future__ import annotations

from .tracking import clear_op_tracking, get_executed_ops, get_fallback_ops, get_op_counts

__all__ = ["get_fallback_ops", "get_executed_ops", "clear_op_tracking", "get_op_counts"]
