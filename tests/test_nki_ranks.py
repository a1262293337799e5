"""nki.multi_rank_simulate and nki.collectives across ranks, checked against NumPy computed from each rank's inputs.

The rules are AWS's pages: nki.multi_rank_simulate (Neuron SDK 2.34, "Run a kernel across multiple ranks in one
CPU process": per_rank_inputs a sequence in rank order or a mapping rank -> (args, kwargs); arrays may differ in
value but not in shape or dtype; other arguments are static and equal on every rank; each rank's result returned)
and the nki.collectives pages (all_reduce, all_gather along collective_dim, reduce_scatter split along
collective_dim, all_to_all, collective_permute's (source, target) pairs, the implicit ring with
collective_permute_implicit_current_processing_rank_id: this rank's own id at iteration 0, then the ids of the data
received from its predecessors). The kernels are our own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nki  # nativelab's stand-in (tests/conftest.py imports nativelab, which installs it)
import nki.collectives as ncc
import nki.isa as nisa
import nki.language as nl


@nki.jit
def _all_reduce(x, replica_group):
    # AWS's example on the nki.multi_rank_simulate page
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.private_hbm)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.all_reduce(srcs=[src], dsts=[out], replica_group=replica_group, op=nl.add)
    return out


def test_awss_example_every_rank_gets_the_sum_of_all_ranks_inputs():
    inputs = [np.full((128, 512), rank, dtype=np.float32) for rank in range(2)]
    group = ncc.ReplicaGroup([[0, 1]])
    results = nki.multi_rank_simulate(_all_reduce, world_size=2,
                                      per_rank_inputs=[((x,), {"replica_group": group}) for x in inputs])
    assert len(results) == 2
    for out in results:
        np.testing.assert_allclose(out, inputs[0] + inputs[1])


def test_rank_lists_reduce_independently_and_per_rank_inputs_may_be_a_mapping():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(4)]
    group = ncc.ReplicaGroup([[0, 2], [1, 3]])  # ranks 0 and 2 reduce together, 1 and 3 together
    results = nki.multi_rank_simulate(_all_reduce, world_size=4,
                                      per_rank_inputs={r: ((xs[r], group), {}) for r in range(4)})
    for r, out in enumerate(results):
        partner = {0: 2, 2: 0, 1: 3, 3: 1}[r]
        np.testing.assert_allclose(out, xs[r] + xs[partner], rtol=1e-6)


@nki.jit
def _gather_scatter_exchange(x, replica_group, ranks: int):
    rows, cols = x.shape
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    gathered = nl.ndarray((ranks * rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_gather(srcs=[src], dsts=[gathered], replica_group=replica_group, collective_dim=0)
    scattered = nl.ndarray((rows // ranks, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.reduce_scatter(srcs=[src], dsts=[scattered], replica_group=replica_group, op=nl.maximum, collective_dim=0)
    exchanged = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_to_all(srcs=[src], dsts=[exchanged], replica_group=replica_group, collective_dim=0)
    return gathered, scattered, exchanged


def test_all_gather_reduce_scatter_and_all_to_all_over_three_ranks():
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((6, 4)).astype(np.float32) for _ in range(3)]
    group = ncc.ReplicaGroup([[0, 1, 2]])
    results = nki.multi_rank_simulate(_gather_scatter_exchange, world_size=3,
                                      per_rank_inputs=[((x, group, 3), {}) for x in xs])
    top = np.maximum(np.maximum(xs[0], xs[1]), xs[2])
    for r, (gathered, scattered, exchanged) in enumerate(results):
        np.testing.assert_array_equal(gathered, np.concatenate(xs))  # rank order along dim 0
        np.testing.assert_array_equal(scattered, top[2 * r:2 * r + 2])  # rank r's part of the reduction
        # rank r gets part r of every rank's source, in rank order (the page's example: rank 0 keeps its
        # input[0] and gets rank 1's input[0])
        np.testing.assert_array_equal(exchanged, np.concatenate([x[2 * r:2 * r + 2] for x in xs]))


@nki.jit
def _ring_all_gather(x, replica_group, ranks: int):
    """An all-gather by ring: at each step, pass on what arrived last step, and place the chunk by the rank
    collective_permute_implicit_current_processing_rank_id says it came from."""
    rows, cols = x.shape
    out = nl.ndarray((ranks * rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    bufs = [nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm) for _ in range(2)]
    nisa.dma_copy(dst=bufs[0], src=x)
    for step in range(ranks):
        owner = ncc.collective_permute_implicit_current_processing_rank_id(
            iteration_id=step, replica_group=replica_group)
        nisa.dma_copy(dst=out[int(owner) * rows:(int(owner) + 1) * rows, :], src=bufs[step % 2])
        if step + 1 < ranks:
            ncc.collective_permute_implicit(srcs_by_channel=[[bufs[step % 2]]], dsts_by_channel=[[bufs[(step + 1) % 2]]],
                                            replica_group=replica_group)
    return out


def test_a_ring_all_gather_places_each_chunk_by_the_rank_it_came_from():
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(4)]
    group = ncc.ReplicaGroup([[0, 1, 2, 3]])
    results = nki.multi_rank_simulate(_ring_all_gather, world_size=4, per_rank_inputs=[((x, group, 4), {}) for x in xs])
    for out in results:
        np.testing.assert_array_equal(out, np.concatenate(xs))


@nki.jit
def _permute(x, pairs):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)  # a rank that receives nothing keeps this
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.collective_permute(srcs=[src], dsts=[out], source_target_pairs=pairs)
    return out


def test_collective_permute_sends_along_its_pairs_and_an_untargeted_rank_keeps_its_destination():
    xs = [np.full((2, 3), r, dtype=np.float32) for r in range(3)]
    pairs = [(0, 1), (1, 0), (2, 2)]  # 0 and 1 swap, 2 keeps its own
    results = nki.multi_rank_simulate(_permute, world_size=3, per_rank_inputs=[((x, pairs), {}) for x in xs])
    for r, want in enumerate([1, 0, 2]):
        np.testing.assert_array_equal(results[r], xs[want])
    results = nki.multi_rank_simulate(_permute, world_size=3, per_rank_inputs=[((x, [(0, 1)]), {}) for x in xs])
    np.testing.assert_array_equal(results[1], xs[0])
    np.testing.assert_array_equal(results[2], xs[2])  # no pair targets rank 2


@nki.jit
def _rank_rows(table):
    """Each rank copies its own row of `table` (ranks, 1, W): rank_id as a dynamic offset, as on the chip."""
    _, one, w = table.shape
    out = nl.ndarray((one, w), dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=table.ap(pattern=[[w, one], [1, w]], scalar_offset=ncc.rank_id(), indirect_dim=0))
    return out


def test_rank_id_is_each_ranks_own_and_an_lnc2_launch_runs_on_every_rank():
    table = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    for r, out in enumerate(nki.multi_rank_simulate(_rank_rows, world_size=3, per_rank_inputs=[((table,), {})] * 3)):
        np.testing.assert_array_equal(out, table[r])
    xs = [np.full((128, 64), r + 1, dtype=np.float32) for r in range(2)]
    group = ncc.ReplicaGroup([[0, 1]])
    with pytest.warns(nki.HazardWarning, match="equal values"):  # both cores of a rank write the same result
        results = nki.multi_rank_simulate(_all_reduce[2], world_size=2, per_rank_inputs=[((x, group), {}) for x in xs])
    for out in results:
        np.testing.assert_array_equal(out, xs[0] + xs[1])


@nki.jit
def _accumulate_into(x, acc, replica_group):
    """Writes its argument `acc`: the sum over ranks, added to what each rank's acc held."""
    total = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    ncc.all_reduce(srcs=[src], dsts=[total], replica_group=replica_group, op=nl.add)
    a = nl.load(acc)
    t = nl.load(total)
    nl.store(acc, nl.add(a, t))


def test_arrays_a_rank_writes_are_written_back_once_not_once_per_replay():
    xs = [np.full((4, 8), r + 1, dtype=np.float32) for r in range(2)]
    accs = [np.full((4, 8), 10 * (r + 1), dtype=np.float32) for r in range(2)]
    group = ncc.ReplicaGroup([[0, 1]])
    nki.multi_rank_simulate(_accumulate_into, world_size=2,
                            per_rank_inputs=[((x, acc, group), {}) for x, acc in zip(xs, accs)])
    np.testing.assert_array_equal(accs[0], np.full((4, 8), 13, dtype=np.float32))  # 10 + (1 + 2), not 10 + 2 x 3
    np.testing.assert_array_equal(accs[1], np.full((4, 8), 23, dtype=np.float32))
    # torch tensors are taken as arrays too
    accs = [torch.full((4, 8), 10.0 * (r + 1)) for r in range(2)]
    nki.multi_rank_simulate(_accumulate_into, world_size=2, per_rank_inputs=[
        ((torch.from_numpy(x), acc, group), {}) for x, acc in zip(xs, accs)])
    assert torch.equal(accs[0], torch.full((4, 8), 13.0)) and torch.equal(accs[1], torch.full((4, 8), 23.0))


@nki.jit
def _only_rank_zero_reduces(x, replica_group):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    if not ncc.rank_id():  # a condition on a register: rank 0 only
        ncc.all_reduce(srcs=[src], dsts=[out], replica_group=replica_group, op=nl.add)
    return out


def test_a_collective_one_rank_never_issues_is_an_error_naming_both_ranks():
    x = np.ones((2, 2), dtype=np.float32)
    group = ncc.ReplicaGroup([[0, 1]])
    with pytest.raises(nki.NkiError, match=r"rank 0 waits for ranks \[0, 1\], but rank 1 finished the kernel"):
        nki.multi_rank_simulate(_only_rank_zero_reduces, world_size=2, per_rank_inputs=[((x, group), {})] * 2)


def test_inputs_that_differ_where_they_must_not_are_errors_naming_the_rank_and_argument():
    group = ncc.ReplicaGroup([[0, 1]])
    a, b = np.ones((2, 2), dtype=np.float32), np.ones((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"argument 0 is an array of one shape and dtype on every rank; rank 1 has \(2, 3\)"):
        nki.multi_rank_simulate(_all_reduce, world_size=2, per_rank_inputs=[((a, group), {}), ((b, group), {})])
    with pytest.raises(ValueError, match=r"argument 'replica_group' is not an array, so it is static"):
        nki.multi_rank_simulate(_all_reduce, world_size=2, per_rank_inputs=[
            ((a,), {"replica_group": group}), ((a,), {"replica_group": ncc.ReplicaGroup([[0], [1]])})])
    with pytest.raises(ValueError, match=r"holds 1 \(args, kwargs\) pairs for world_size=2"):
        nki.multi_rank_simulate(_all_reduce, world_size=2, per_rank_inputs=[((a, group), {})])
    with pytest.raises(nki.NkiError, match=r"names ranks outside the world of 2 rank\(s\)"):
        nki.multi_rank_simulate(_all_reduce, world_size=2, per_rank_inputs=[((a, ncc.ReplicaGroup([[0, 1, 2]])), {})] * 2)


def test_outside_multi_rank_simulate_a_group_of_several_ranks_says_where_to_run_it():
    x = np.ones((2, 2), dtype=np.float32)
    with pytest.raises(nki.NkiError, match=r"runs on one rank \(rank 0\): run it on 2 or more ranks with "
                                           r"nki.multi_rank_simulate"):
        nki.simulate(_all_reduce)(x, ncc.ReplicaGroup([[0, 1]]))
    np.testing.assert_array_equal(nki.simulate(_all_reduce)(x, ncc.ReplicaGroup([[0]])), x)  # a world of one


# -- one rank a process: an initialized torch.distributed group ------------------------------------------------

_WORKER = '''
import os, sys
import numpy as np, torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
import nativelab  # noqa: F401
import nki, nki.collectives as ncc
from test_nki_ranks import _all_reduce, _gather_scatter_exchange

dist.init_process_group(os.environ["NKI_TEST_BACKEND"])
r, n = dist.get_rank(), dist.get_world_size()
everyone = ncc.ReplicaGroup([list(range(n))])
# each process supplies its own rank's inputs only; the sum of 1..n on every rank
out = nki.simulate(_all_reduce)(np.full((4, 8), r + 1, dtype=np.float32), everyone)
np.testing.assert_array_equal(out, np.full((4, 8), n * (n + 1) / 2, dtype=np.float32))
# a launch of the jitted kernel on torch tensors runs interpreted too (a graph cannot wait for other ranks)
got = _all_reduce(torch.full((4, 8), float(r + 1), dtype=torch.bfloat16), everyone)
assert got.dtype == torch.bfloat16 and torch.equal(got, torch.full((4, 8), n * (n + 1) / 2, dtype=torch.bfloat16))
xs = [np.random.default_rng(k).standard_normal((2 * n, 4)).astype(np.float32) for k in range(n)]
gathered, scattered, exchanged = nki.simulate(_gather_scatter_exchange)(xs[r], everyone, n)
np.testing.assert_array_equal(gathered, np.concatenate(xs))
np.testing.assert_array_equal(scattered, np.maximum.reduce(xs)[2 * r:2 * r + 2])
np.testing.assert_array_equal(exchanged, np.concatenate([x[2 * r:2 * r + 2] for x in xs]))
print(f"nki ranks ok on rank {{r}}", flush=True)
dist.destroy_process_group()
'''


@pytest.mark.slow  # two torchrun processes
@pytest.mark.parametrize("backend", ["gloo", "neuron"])
def test_in_a_torch_distributed_group_each_process_is_a_rank_and_collectives_cross_processes(tmp_path, backend):
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    worker = tmp_path / "worker.py"
    worker.write_text(_WORKER.format(tests=str(Path(__file__).resolve().parent)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, NATIVELAB_QUIET="1", OMP_NUM_THREADS="1", NKI_TEST_BACKEND=backend)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--rdzv_backend",
                        "c10d", "--rdzv_endpoint", f"localhost:{port}", str(worker)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "nki ranks ok on rank 0" in r.stdout and "nki ranks ok on rank 1" in r.stdout
