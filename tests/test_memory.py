"""Device memory: host-backed, accounted per core against a capacity, freed with the tensor, OOM errors."""

import gc

import torch

from conftest import run_python


def test_allocation_is_accounted_and_freed_with_the_tensor():
    gc.collect()
    before = torch.neuron.memory_allocated(1)
    t = torch.empty(1000, 250, dtype=torch.float32, device="neuron:1")
    assert torch.neuron.memory_allocated(1) - before == 1000 * 250 * 4
    assert torch.neuron.memory_allocated(0) == torch.neuron.memory_allocated(0)  # other cores untouched
    v = t[10:20]  # a view shares the storage: no new bytes
    assert torch.neuron.memory_allocated(1) - before == 1000 * 250 * 4
    del t
    assert torch.neuron.memory_allocated(1) - before == 1000 * 250 * 4  # the view keeps it alive
    del v
    assert torch.neuron.memory_allocated(1) == before


def test_peak_and_reset():
    torch.neuron.reset_peak_memory_stats(2)
    base = torch.neuron.memory_allocated(2)
    t = torch.zeros(1 << 20, dtype=torch.uint8, device="neuron:2")
    del t
    assert torch.neuron.max_memory_allocated(2) >= base + (1 << 20)
    torch.neuron.reset_peak_memory_stats(2)
    assert torch.neuron.max_memory_allocated(2) == torch.neuron.memory_allocated(2)


def test_memory_stats_and_mem_get_info_agree():
    t = torch.ones(4096, device="neuron:3")
    stats = torch.neuron.memory_stats(3)
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_allocated(3) >= 4096 * 4
    free, total = torch.neuron.mem_get_info(3)
    assert total == 24 * (1 << 30) and free == total - torch.neuron.memory_allocated(3)
    assert torch.accelerator.memory_allocated(0) == torch.neuron.memory_allocated(0)
    assert torch.accelerator.get_memory_info(3) == torch.neuron.mem_get_info(3)
    del t
    torch.neuron.empty_cache()


def test_out_of_memory_names_sizes_and_device_stays_usable():
    r = run_python(
        "import torch, nativelab\n"
        "keep = torch.empty(1 << 20, dtype=torch.uint8, device='neuron')\n"
        "try:\n"
        "    torch.empty(2 << 20, dtype=torch.uint8, device='neuron')\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM', e)\n"
        "print('allocated', torch.neuron.memory_allocated())\n"
        "x = torch.ones(10, device='neuron') * 2\n"
        "print('sum', x.sum().item())\n",
        {"NATIVELAB_CORE_MEMORY_GB": str(2.5 / 1024)},  # 2.5 MiB per core
    )
    assert r.returncode == 0, r.stderr
    assert "OOM neuron:0 out of memory: tried to allocate 2097152 bytes" in r.stdout
    assert "1048576 bytes" in r.stdout and "capacity of 2621440 bytes" in r.stdout
    assert "allocated 1048576" in r.stdout  # the failed request left nothing behind
    assert "sum 20.0" in r.stdout


def test_storage_resize_and_set_keep_accounting_right():
    t = torch.ones(10, device="neuron")
    t.resize_(100)
    assert t.shape == (100,)
    assert t[:10].cpu().tolist() == [1.0] * 10  # old contents survive a growing resize
    u = torch.empty(0, device="neuron")
    u.set_(t.untyped_storage(), 0, (10, 10), (10, 1))
    assert u.data_ptr() == t.data_ptr() and u.shape == (10, 10)


def test_untyped_storage_resize_in_place_frees_and_reallocates():
    """FSDP2's free/re-allocate of parameters: `untyped_storage().resize_(n)` in place, accounted."""
    ref = torch.arange(6.0)
    t = ref.to("neuron")
    view = t[2:]
    assert view.cpu().tolist() == ref[2:].tolist()  # caches a host view that must follow the resize
    st = t.untyped_storage()
    before = torch.neuron.memory_allocated()
    st.resize_(0)
    assert st.nbytes() == 0 and t.untyped_storage().nbytes() == 0
    assert torch.neuron.memory_allocated() == before - 24
    st.resize_(24)
    assert t.untyped_storage().nbytes() == 24 and torch.neuron.memory_allocated() == before
    t.copy_(ref * 10)
    assert t.cpu().tolist() == (ref * 10).tolist() and view.cpu().tolist() == (ref * 10)[2:].tolist()
    st.resize_(8)  # shrinking keeps the first bytes, as on CPU
    cpu = (ref * 10).untyped_storage()
    cpu.resize_(8)
    assert torch.empty(0, device="neuron").set_(st).cpu().tolist() == torch.empty(0).set_(cpu).tolist()
    assert torch.neuron.memory_allocated() == before - 16


def test_untyped_storage_resize_waits_for_queued_writes():
    t = torch.zeros(4, device="neuron")
    t.add_(3)  # queued
    t.untyped_storage().resize_(32)
    assert torch.empty(0, device="neuron").set_(t.untyped_storage(), 0, (4,), (1,)).cpu().tolist() == [3.0] * 4
