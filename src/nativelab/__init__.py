"""nativelab: the PyTorch-native Neuron lab stack, runnable without a Trainium chip.

Importing nativelab registers the emulated `neuron` device (unless the real `torch_neuronx` is installed).
If this PyTorch is not one the emulator supports (it reaches into private APIs), registration fails with a
warning and no `neuron` device, while everything that runs on CUDA or the CPU keeps working.
"""

from __future__ import annotations

import warnings

from . import device
from .device import clear_op_tracking, get_executed_ops, get_fallback_ops, get_op_counts

__version__ = "0.1.0"
__all__ = ["device", "get_fallback_ops", "get_executed_ops", "get_op_counts", "clear_op_tracking"]


def _register_device() -> None:
    try:
        if device.register():
            from . import compiler, distributed

            distributed.register()
            compiler.route_default_backend()
    except ValueError:
        raise  # a bad setting (NEURON_RT_NUM_CORES=four, ...): the user's to fix, not a reason to go on
    except Exception as e:  # noqa: BLE001 - PyTorch's private APIs differ: it only costs the emulated device
        import torch

        warnings.warn(f"nativelab: the emulated neuron device is unavailable on torch {torch.__version__} "
                      f"({type(e).__name__}: {e}); CUDA and CPU runs are unaffected", RuntimeWarning, stacklevel=2)


_register_device()
