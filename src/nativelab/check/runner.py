"""Run a user's script unchanged under a check (`runpy`, its own `sys.argv`), optionally mapping CUDA to the
emulated device (`--device-from cuda`) so a CUDA script can be checked before it is ported."""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

DEVICE = "neuron"


def _map(x, src: str):
    if isinstance(x, torch.device) and x.type == src:
        return torch.device(DEVICE, x.index) if x.index is not None else torch.device(DEVICE)
    if isinstance(x, str) and (x == src or x.startswith(src + ":")):
        return DEVICE + x[len(src):]
    return x


class DeviceFrom(TorchFunctionMode):
    """Rewrites every `device=` naming `src` (a string, a torch.device) and `Tensor.cuda()` to the emulated
    device, for torch functions and tensor methods (nn.Module.cuda()/.to() go through them)."""

    def __init__(self, src: str = "cuda"):
        super().__init__()
        self.src = src

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            t = args[0]
            return t.to(DEVICE, **{k: v for k, v in kwargs.items() if k == "non_blocking"})
        args = tuple(_map(a, self.src) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _map(kwargs["device"], self.src)
        return func(*args, **kwargs)


@contextlib.contextmanager
def device_from(src: str | None):
    """While active: CUDA calls a script makes go to the emulated device (`torch.cuda.is_available()` is True,
    `synchronize` / `device_count` / seeding answer for `neuron`)."""
    if src is None:
        yield
        return
    if src != "cuda":
        raise ValueError(f"--device-from: only 'cuda' is mapped, not {src!r}")
    cuda = torch.cuda
    patched = {"is_available": lambda: True, "synchronize": lambda device=None: torch.neuron.synchronize(),
               "device_count": torch.neuron.device_count, "manual_seed": torch.neuron.manual_seed,
               "manual_seed_all": torch.neuron.manual_seed_all, "current_device": torch.neuron.current_device,
               "set_device": torch.neuron.set_device}
    saved = {k: getattr(cuda, k) for k in patched}
    for k, v in patched.items():
        setattr(cuda, k, v)
    try:
        with DeviceFrom(src):
            yield
    finally:
        for k, v in saved.items():
            setattr(cuda, k, v)
