"""`module.to('neuron')` (and back) keeps each Parameter: the same objects, moved, so tied weights stay tied.

PyTorch's `Module._apply` moves a parameter in place (`param.data = moved`) only when the old and new tensors
are "shallow-copy compatible" (CPU, CUDA, ...: dense tensors of the built-in backends). A PrivateUse1 tensor
is not, so each module would get a new Parameter: a tied embedding and LM head become two tensors and train
apart, and an optimizer built before `.to()` holds stale ones. With PyTorch's own swap mode
(`torch.__future__.set_swap_module_params_on_conversion`) `_apply` swaps the moved tensor into the existing
Parameter instead. We turn it on for conversions that cross the device boundary only: a program that never
uses `neuron` converts exactly as before. PyTorch's swap refuses a parameter an autograd graph still holds
(the guide's `expected = model(x); model.to('neuron')`); ours swaps it and makes backward through that old
graph an error (`_private.swap_tensors_held_by_autograd`). Only a Python weak reference still refuses it.
"""

from __future__ import annotations

import functools
import itertools
import warnings

import torch

from . import _private
from .config import DEVICE_NAME as DEVICE

_future = torch.__future__
_installed: dict = {}


def _crosses_device(module: torch.nn.Module, device) -> bool:
    """Whether moving `module` to `device` moves tensors onto or off the neuron device."""
    if device is None:
        return False  # a dtype conversion: moved in place already
    if torch.device(device).type == DEVICE:
        return True
    return any(t.device.type == DEVICE for t in itertools.chain(module.parameters(), module.buffers()))


def _set_aside_uninitialized(module: torch.nn.Module) -> list:
    """Take a lazy module's uninitialized parameters and buffers out of the modules for the conversion:
    they hold no data, swapping one fails (`view_as` on an uninitialized parameter), and PyTorch's non-swap path
    would replace it with an ordinary empty Parameter, which the lazy module then never initializes."""
    taken = []
    for m in module.modules():
        for table in _private.own_tensor_tables(m):
            for name, t in table.items():
                if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
                    taken.append((table, name, t))
                    table[name] = None  # _apply skips None entries
    return taken


def _put_back_uninitialized(taken: list, device, dtype) -> None:
    """Each set-aside tensor goes back as itself, moved: the same object, now uninitialized on `device` (in
    `dtype` if the conversion changes floating dtypes), as a CUDA conversion leaves it."""
    for table, name, t in taken:
        table[name] = t
        if device is None and dtype is None:
            continue
        to_dtype = dtype if dtype is not None and (t.dtype.is_floating_point or t.dtype.is_complex) else t.dtype
        where = dict(device=device if device is not None else t.device, dtype=to_dtype)
        if isinstance(t, torch.nn.Parameter):
            where["requires_grad"] = t.requires_grad
        torch.utils.swap_tensors(t, type(t)(**where))


def _keeping_parameters(method, target_of, dtype_of):
    @functools.wraps(method)
    def convert(self, *args, **kwargs):
        if _future.get_swap_module_params_on_conversion() or not _crosses_device(self, target_of(*args, **kwargs)):
            return method(self, *args, **kwargs)
        taken = _set_aside_uninitialized(self)
        try:
            return _converting(self, method, args, kwargs)
        finally:
            _put_back_uninitialized(taken, target_of(*args, **kwargs), dtype_of(*args, **kwargs))

    convert.__wrapped__ = method
    return convert


def _converting(self, method, args, kwargs):
    _future.set_swap_module_params_on_conversion(True)
    swap, torch.utils.swap_tensors = torch.utils.swap_tensors, _private.swap_tensors_held_by_autograd
    try:
        return method(self, *args, **kwargs)
    except RuntimeError as e:
        if "Couldn't swap" not in str(e):
            raise
        # A parameter held by a Python weak reference (a compiled model's guards): PyTorch refuses to swap
        # it. Convert the rest as PyTorch does without swapping; moved parameters are not moved twice.
        warnings.warn(
            f"nativelab: {e} ({e.__cause__}); the module gets new Parameter objects: tied parameters come "
            "apart and an optimizer made before .to() holds the old ones (tie again / make the optimizer "
            "after .to())", stacklevel=4,
        )
        _future.set_swap_module_params_on_conversion(False)
        return method(self, *args, **kwargs)
    finally:
        torch.utils.swap_tensors = swap
        _future.set_swap_module_params_on_conversion(False)


def _to_target(*args, **kwargs):
    return _private.parse_to(*args, **kwargs)[0]


def _to_dtype(*args, **kwargs):
    return _private.parse_to(*args, **kwargs)[1]


def _no_dtype(*args, **kwargs):
    return None


def install() -> None:
    """Wrap `Module.to`, `.cpu`, `.to_empty` and the generated `.neuron` (called once, at registration)."""
    if _installed:
        return
    cls = torch.nn.Module
    targets = {
        "to": (_to_target, _to_dtype),
        "cpu": (lambda *a, **k: torch.device("cpu"), _no_dtype),
        "to_empty": (lambda *, device, recurse=True: device, _no_dtype),
        DEVICE: (lambda *a, **k: DEVICE, _no_dtype),
    }
    for name, (target_of, dtype_of) in targets.items():
        method = getattr(cls, name, None)
        if method is not None:
            _installed[name] = method
            setattr(cls, name, _keeping_parameters(method, target_of, dtype_of))
