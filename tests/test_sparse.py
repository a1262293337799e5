"""Sparse layouts on `neuron`: one clear error naming the limitation and the workaround, wherever a sparse tensor
reaches the device; the workarounds it names give CPU's results (the pytorch/examples gcn layer)."""

import warnings

import pytest
import torch

from nativelab.device.sparse import SparseUnsupportedError


def _adjacency():
    idx = torch.tensor([[0, 0, 1, 2, 3, 3], [1, 3, 0, 2, 0, 1]])
    return torch.sparse_coo_tensor(idx, torch.tensor([0.5, 0.5, 1.0, 1.0, 0.25, 0.75]), (4, 4)).coalesce()


def _module_with_buffer(t):
    m = torch.nn.Module()
    m.register_buffer("adj", t)
    return m


WAYS_IN = {
    "coo.to": lambda: _adjacency().to("neuron"),
    "csr.to": lambda: _adjacency().to_sparse_csr().to("neuron"),  # at the conversion, not at a first use
    "csc.to": lambda: _adjacency().to_sparse_csc().to("neuron:1"),
    "bsr.to": lambda: _adjacency().to_sparse_bsr((2, 2)).to("neuron"),
    "module.to with a csr buffer": lambda: _module_with_buffer(_adjacency().to_sparse_csr()).to("neuron"),
    "sparse_csr_tensor on device": lambda: torch.sparse_csr_tensor(
        torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.ones(2), (2, 2), device="neuron"),
    "sparse_coo_tensor on device": lambda: torch.sparse_coo_tensor(
        torch.tensor([[0, 1], [1, 0]]).to("neuron"), torch.ones(2).to("neuron"), (2, 2)),
    "dense.to_sparse on device": lambda: torch.eye(3).to("neuron").to_sparse(),
    "dense.to_sparse_csr on device": lambda: torch.eye(3).to("neuron").to_sparse_csr(),
    "sparse.mm with a device operand": lambda: torch.sparse.mm(_adjacency(), torch.ones(4, 2).to("neuron")),
}


@pytest.mark.parametrize("way", WAYS_IN)
def test_a_sparse_tensor_on_the_device_is_one_clear_error(way):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # to_sparse's one-time CPU fallback warning
        with pytest.raises(SparseUnsupportedError, match=r"^aten::\w+: sparse tensors .* not supported on the "
                           r"'neuron' device .*torch\.sparse\.mm\(adj, x\.cpu\(\)\)\.to\('neuron'\).*to_dense"):
            WAYS_IN[way]()


def test_sparse_tensors_still_convert_on_the_cpu():
    csr = _adjacency().to_sparse_csr()
    for t in (csr.to(torch.float64), csr.cpu(), _adjacency().to(torch.float64)):
        assert t.layout in (torch.sparse_csr, torch.sparse_coo) and t.device.type == "cpu"
        torch.testing.assert_close(t.to_dense(), _adjacency().to_dense().to(t.dtype))


def test_the_workarounds_give_the_cpus_result():
    adj, x = _adjacency(), torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    w = torch.randn(3, 2, generator=torch.Generator().manual_seed(1))
    want = torch.sparse.mm(adj, x @ w)  # gcn's GraphConvolution: adj @ (x W)
    support = x.to("neuron") @ w.to("neuron")
    on_cpu = torch.sparse.mm(adj, support.cpu()).to("neuron")
    dense = adj.to_dense().to("neuron") @ support
    torch.testing.assert_close(on_cpu.cpu(), want)
    torch.testing.assert_close(dense.cpu(), want)
    assert isinstance(SparseUnsupportedError("x"), NotImplementedError)  # what code probing for support catches
