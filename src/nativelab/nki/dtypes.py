"""The dtype a kernel sees on its tensors: NKI's name for a torch dtype. AWS's NKI prints a tensor's dtype as
its NKI name (`str(t.dtype) == 'bfloat16'`; nki-library's `resolve_dtype_to_nki` compares those strings), while
nativelab's tiles are torch tensors whose dtypes print `torch.bfloat16`. A `KernelDtype` is the torch dtype
under its NKI name: equal to it (and to the `nl.*` names, which are torch dtypes, and to the name as a
string), hashed as it, and accepted wherever the emulator takes a dtype (`torch_dtype` unwraps it).

Only code outside nativelab (the kernel's own source) sees one: the emulator's modules read a tensor's dtype
as the torch dtype itself (tensor.NkiTensor.dtype), so every torch call they make keeps taking it.

Where NumPy asks for a dtype (`np.zeros(4, dtype=nl.bfloat16)`, `a.astype(nl.float32)`) a `KernelDtype` is the
NumPy dtype AWS's NKI has: bf16 and fp8 as ml_dtypes' types (NumPy reads an object's `dtype` attribute)."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import torch

_NAMES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.bool: "bool"}  # the rest: the torch name less "torch."
# the torch dtypes NumPy has only through ml_dtypes (AWS's NKI imports it for these)
_ML_DTYPES = {torch.bfloat16: ml_dtypes.bfloat16, torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
              torch.float8_e5m2: ml_dtypes.float8_e5m2, torch.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu}
_FROM_ML = {np.dtype(v): k for k, v in _ML_DTYPES.items()}


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The NumPy dtype of a torch dtype (TypeError where NumPy has none)."""
    ml = _ML_DTYPES.get(dtype)
    return np.dtype(ml) if ml is not None else torch.empty((), dtype=dtype).numpy().dtype


def to_tensor(a: np.ndarray) -> torch.Tensor:
    """A NumPy array as a CPU tensor (sharing its memory where it is contiguous), ml_dtypes' types included."""
    a = a if a.flags.c_contiguous else np.ascontiguousarray(a)  # (a 0-d array stays 0-d)
    t = _FROM_ML.get(a.dtype)
    if t is None:
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(f"u{a.itemsize}")).view(t)  # the same bits under the torch dtype


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a NumPy array sharing its memory, bf16 / fp8 as ml_dtypes' types."""
    if t.dtype not in _ML_DTYPES:
        return t.numpy()
    carrier = {1: torch.uint8, 2: torch.uint16}[t.dtype.itemsize]
    return t.view(carrier).numpy().view(numpy_dtype(t.dtype))


class KernelDtype:
    """A torch dtype under its NKI name (what `t.dtype` is in a kernel's source)."""

    __slots__ = ("torch", "name")

    def __init__(self, dtype: torch.dtype):
        self.torch = dtype
        self.name = _NAMES.get(dtype, str(dtype).replace("torch.", ""))

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype (what NumPy reads when it takes this object as a dtype)."""
        return numpy_dtype(self.torch)

    def __eq__(self, other):
        if isinstance(other, KernelDtype):
            return self.torch == other.torch
        if isinstance(other, str):
            return other == self.name
        if isinstance(other, np.dtype) or (isinstance(other, type) and issubclass(other, np.generic)):
            try:
                return self.dtype == np.dtype(other)
            except TypeError:  # a torch dtype NumPy does not have
                return False
        return self.torch == other

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(self.torch)  # a dict or set keyed by torch dtypes finds it

    def __str__(self):
        return self.name

    def __repr__(self):
        return self.name

    def __getattr__(self, attr):  # is_floating_point, itemsize, ...: the torch dtype's
        return getattr(self.torch, attr)

    def __reduce__(self):
        return KernelDtype, (self.torch,)


_CACHE: dict = {}


def kernel_dtype(dtype):
    """The dtype as a kernel's source sees it (a torch dtype under its NKI name; other objects unchanged)."""
    if not isinstance(dtype, torch.dtype):
        return dtype
    k = _CACHE.get(dtype)
    if k is None:
        k = _CACHE[dtype] = KernelDtype(dtype)
    return k


def torch_dtype(dtype):
    """A dtype a kernel passed in (maybe one it read off a tensor) as the emulator takes it."""
    return dtype.torch if isinstance(dtype, KernelDtype) else dtype
