"""Sparse layouts (COO, CSR/CSC/BSR/BSC) on `neuron`: one clear error, at the first op that reaches them.

PyTorch's sparse tensors are not built from device ops: their constructor, accessors and kernels
(`_sparse_coo_tensor_with_dims_and_tensors`, `_indices`, `_nnz`, sparse `addmm`, ...) are registered per backend
key (SparseCPU, SparseCUDA, SparseMeta), none for a PrivateUse1 device, so every use ended in the
dispatcher's "Could not run ... 'Sparseneuron' backend". Rather than an emulation the real device does not
offer, the Sparse and SparseCsr keys of `neuron` get a fallback that names the limitation and the workaround.
"""

from __future__ import annotations

import torch

from .config import DEVICE_NAME

ADVICE = ("keep the sparse tensor on the CPU and move the result (torch.sparse.mm(adj, x.cpu()).to('neuron')), "
          "or make it dense on the device (adj.to_dense().to('neuron'), then adj @ x)")


class SparseUnsupportedError(NotImplementedError):
    """A sparse tensor reached the `neuron` device."""


def error(op: str) -> SparseUnsupportedError:
    return SparseUnsupportedError(
        f"{op}: sparse tensors (torch.sparse_coo, sparse_csr/csc/bsr/bsc) are not supported on the "
        f"'{DEVICE_NAME}' device (PyTorch registers sparse kernels per backend, and nativelab has none); {ADVICE}")


def _refuse(op, *args, **kwargs):
    raise error(op.name())


def install(lib: torch.library.Library) -> None:
    for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        lib.fallback(_refuse, dispatch_key=key)
