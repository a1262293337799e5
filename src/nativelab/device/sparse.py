"""Sparse layouts (COO, CSR/CSC/BSR/BSC) on `neuron`: one clear error, at the call that would put one there.

PyTorch's sparse tensors are not built from device ops: their constructor, accessors and kernels
(`_sparse_coo_tensor_with_dims_and_tensors`, `_indices`, `_nnz`, sparse `addmm`, ...) are registered per backend
key (SparseCPU, SparseCUDA, SparseMeta), none for a PrivateUse1 device, so every use ended in the
dispatcher's "Could not run ... 'Sparseneuron' backend". Rather than an emulation the real device does not
offer, the Sparse and SparseCsr keys of `neuron` get a fallback that names the limitation and the workaround.
A COO tensor meets it at once (`.to('neuron')` and the constructors call the SparsePrivateUse1 constructor). A
compressed one (CSR/CSC/BSR/BSC) is put together from its dense parts by `_sparse_compressed_tensor_unsafe`,
which every conversion and constructor reaches and which is composite (no SparseCsr kernel runs), so it would
have been refused only at its first use: it gets a SparseCsrPrivateUse1 kernel of its own that refuses.
"""

from __future__ import annotations

import torch

from .config import DEVICE_NAME

ADVICE = ("keep the sparse tensor on the CPU and move the result (torch.sparse.mm(adj, x.cpu()).to('neuron')), "
          "or make it dense on the device (adj.to_dense().to('neuron'), then adj @ x)")


LAYOUTS = frozenset((torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc))


class SparseUnsupportedError(NotImplementedError):
    """A sparse tensor reached the `neuron` device."""


def error(op: str) -> SparseUnsupportedError:
    return SparseUnsupportedError(
        f"{op}: sparse tensors (torch.sparse_coo, sparse_csr/csc/bsr/bsc) are not supported on the "
        f"'{DEVICE_NAME}' device (PyTorch registers sparse kernels per backend, and nativelab has none); {ADVICE}")


def _refuse(op, *args, **kwargs):
    raise error(op.name())


def _refuse_compressed(*args, **kwargs):
    raise error("aten::_sparse_compressed_tensor_unsafe")


def install(lib: torch.library.Library, aten_lib: torch.library.Library) -> None:
    for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        lib.fallback(_refuse, dispatch_key=key)
    aten_lib.impl("_sparse_compressed_tensor_unsafe", _refuse_compressed, "SparseCsrPrivateUse1")
