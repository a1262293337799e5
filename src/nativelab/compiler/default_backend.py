"""`torch.compile(model)` with the default backend (Inductor) on `neuron` tensors.

Inductor generates code for the devices it has a scheduling backend for (CPU, CUDA, XPU, ...) and asserts on
any other (`assert scheduling_ctor`). nativelab's own backend is Inductor's CPU code generation run as device
work (queued, on host views of device memory, fallbacks recorded), so a graph handed to the default backend
whose tensors are on `neuron` is compiled by `backend="neuron"` instead, with a one-time warning: on
Trainium the default backend does not compile for the device, and the program should say `backend="neuron"`
(`nativelab check` reports the call). Graphs on other devices go to Inductor unchanged.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

from ..device import dispatch
from ..device.config import DEVICE_NAME
from . import _private, metrics

_warned = False


def on_device(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """The graph takes or makes `neuron` tensors (inputs, or values made inside it: `torch.ones(3)` under
    `torch.set_default_device('neuron')` has no input at all)."""
    if any(isinstance(x, torch.Tensor) and x.device.type == DEVICE_NAME for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        val = node.meta.get("example_value", node.meta.get("val"))
        for v in val if isinstance(val, (tuple, list)) else (val,):
            if isinstance(v, torch.Tensor) and v.device.type == DEVICE_NAME:
                return True
    return False


def route(gm: torch.fx.GraphModule, example_inputs, config_patches):
    """The neuron backend's compiled graph for a device graph; None for Inductor to compile."""
    global _warned
    if not on_device(gm, example_inputs):
        return None
    from .backend import neuron_backend

    metrics.current().default_backend_graphs += 1
    if not _warned:
        _warned = True
        ignored = f" (Inductor options not applied: {sorted(config_patches)})" if config_patches else ""
        warnings.warn(
            f"torch.compile: the default backend (Inductor) generates no code for the '{DEVICE_NAME}' device; "
            f"nativelab compiled this graph with backend='{DEVICE_NAME}'{ignored}. On Trainium, pass "
            f"torch.compile(model, backend='{DEVICE_NAME}')", UserWarning, stacklevel=_user_stacklevel())
    return neuron_backend(gm, example_inputs)


def _user_stacklevel() -> int:
    """The warning's stacklevel that names the user's line (the call that compiled), past Dynamo and us."""
    inside = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)
    frame, level = sys._getframe(2), 2  # route()'s caller is stacklevel 2
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def install() -> None:
    """Route the default backend's device graphs here (when Inductor is first imported; nothing before)."""
    _private.route_default_backend(route, dispatch.after_import)
