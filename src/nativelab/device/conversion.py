"""`module.to('neuron')` (and back) keeps each Parameter: the same objects, moved, so tied weights stay tied.

PyTorch's `Module._apply` moves a parameter in place (`param.data = moved`) only when the old and new tensors
are "shallow-copy compatible" (CPU, CUDA, ...: dense tensors of the built-in backends). A PrivateUse1 tensor
is not, so each module would get a new Parameter: a tied embedding and LM head become two tensors and train
apart, and an optimizer built before `.to()` holds stale ones. For a conversion that crosses the device
boundary we enter a TorchFunctionMode (`_SwapIntoParameters`) for that call: it answers `_apply`'s "in
place?" with yes, and does the in-place step (`param.data = moved`, then the gradient's) by swapping the
moved tensor into the existing Parameter. PyTorch keeps a mode stack per thread, so nothing another thread
sees changes: no torch function is replaced and `torch.__future__`'s swap setting stays the user's (when
they turn it on, PyTorch's own swap runs instead). A program that never uses `neuron` converts exactly as
before. PyTorch's swap refuses a parameter an autograd graph still holds (the guide's
`expected = model(x); model.to('neuron')`); ours swaps it and makes backward through that old graph an error
(`_private.swap_tensors_held_by_autograd`). Only a Python weak reference still refuses it.
"""

from __future__ import annotations

import functools
import itertools
import warnings

import torch
from torch.overrides import TorchFunctionMode

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
    try:
        with _SwapIntoParameters():
            return method(self, *args, **kwargs)
    except _SwapRefused as e:
        # A parameter held by a Python weak reference (a compiled model's guards) cannot be swapped. Convert
        # the rest as PyTorch does without swapping; parameters already moved are not moved twice.
        name = next((n for n, p in self.named_parameters(remove_duplicate=False) if p is e.tensor), "a parameter")
        warnings.warn(
            f"nativelab: couldn't swap {type(self).__name__}.{name} ({e.__cause__}); the module gets new "
            "Parameter objects: tied parameters come apart and an optimizer made before .to() holds the old "
            "ones (tie again / make the optimizer after .to())", stacklevel=4,
        )
        return method(self, *args, **kwargs)


def _crosses(old: torch.Tensor, new: torch.Tensor) -> bool:
    return old.device.type != new.device.type and DEVICE in (old.device.type, new.device.type)


class _SwapRefused(RuntimeError):
    def __init__(self, tensor: torch.Tensor):
        super().__init__("couldn't swap a parameter")
        self.tensor = tensor


class _SwapIntoParameters(TorchFunctionMode):
    """One conversion's view of `Module._apply`, in the converting thread only: a move across the device
    boundary is "in place", and the in-place step swaps. `_apply` moves a parameter with `param.data = moved`,
    then its gradient with `param.grad.data = moved_grad`; the gradient is taken off the parameter while the
    parameter moves (a CPU gradient cannot sit on a neuron parameter) and `param.grad` answers it until it
    has moved too and is put back."""

    def __init__(self):
        super().__init__()
        self._grads: dict[int, torch.Tensor] = {}  # id(parameter) -> its gradient, not yet moved
        self._owners: dict[int, torch.Tensor] = {}  # id(gradient) -> the parameter it goes back to

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _private.is_shallow_copy_check(func):
            return func(*args) or _crosses(*args)
        if _private.is_data_setter(func) and _crosses(*args):
            return self._swap(*args)
        if _private.is_grad_getter(func) and id(args[0]) in self._grads:
            return self._grads[id(args[0])]
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc):
        super().__exit__(*exc)
        if self._grads and exc[0] is None:
            raise RuntimeError("nativelab: Module._apply moved a parameter but not its gradient; the conversion "
                               "no longer matches PyTorch's (see tests/test_private_apis.py)")

    def _swap(self, old: torch.Tensor, moved: torch.Tensor) -> None:
        owner = self._owners.pop(id(old), None)
        if owner is not None:  # a gradient: its parameter has moved, it follows
            _private.swap_tensors_held_by_autograd(old, moved.requires_grad_(old.requires_grad))
            del self._grads[id(owner)]
            owner.grad = old
            return
        grad = old.grad
        if grad is not None:
            old.grad = None
        if isinstance(old, torch.nn.Parameter):
            moved = torch.nn.Parameter(moved, requires_grad=old.requires_grad)
        try:
            _private.swap_tensors_held_by_autograd(old, moved)
        except RuntimeError as e:
            if grad is not None:
                old.grad = grad
            raise _SwapRefused(old) from e
        if grad is not None:
            self._grads[id(old)], self._owners[id(grad)] = grad, old


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
