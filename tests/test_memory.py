"""Device memory: host-backed, accounted per core against a capacity, freed with the tensor, OOM errors."""

import gc

import pytest
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


# PyTorch's own paths through the device's C++ allocator (c10::GetAllocator(PrivateUse1) and the resize hook):
# no Python patch of torch.UntypedStorage or its resize_ stands in between.


def test_untyped_storage_constructor_is_pytorchs_and_accounted_on_its_core():
    assert not hasattr(torch.UntypedStorage.resize_, "__wrapped__")
    assert torch.UntypedStorage.__new__ is torch._C.StorageBase.__new__
    gc.collect()
    before = [torch.neuron.memory_allocated(i) for i in range(4)]
    st = torch.UntypedStorage(16, device="neuron:1")
    assert st.device == torch.device("neuron", 1) and st.nbytes() == 16
    with torch.neuron.device(2):  # no index: the current core, as CUDA's
        st2 = torch.UntypedStorage(24, device="neuron")
    assert st2.device == torch.device("neuron", 2)
    after = [torch.neuron.memory_allocated(i) for i in range(4)]
    assert [a - b for a, b in zip(after, before)] == [0, 16, 24, 0]
    del st, st2
    assert [torch.neuron.memory_allocated(i) for i in range(4)] == before


def test_empty_on_core_one_is_accounted_there_by_the_formula():
    gc.collect()
    before0, before1 = torch.neuron.memory_allocated(0), torch.neuron.memory_allocated(1)
    size, stride = (3, 5, 7), (70, 1, 10)  # bytes = (1 + sum((n - 1) * s)) * itemsize
    t = torch.empty_strided(size, stride, dtype=torch.float16, device="neuron:1")
    u = torch.empty(6, 4, dtype=torch.int64, device="neuron:1")
    expected = (1 + sum((n - 1) * s for n, s in zip(size, stride))) * 2 + 6 * 4 * 8
    assert t.untyped_storage().nbytes() == torch.empty_strided(size, stride, dtype=torch.float16).untyped_storage().nbytes()
    assert torch.neuron.memory_allocated(1) - before1 == expected
    assert torch.neuron.memory_allocated(0) == before0
    del t, u
    assert torch.neuron.memory_allocated(1) == before1


def test_tensor_resize_grows_the_storage_in_place_as_cpu_does():
    """CPU's resize_: a growing resize enlarges the tensor's storage itself, so its other tensors see the new
    size; the old elements survive; the new bytes are counted on the tensor's core (not the current one)."""
    gc.collect()
    results = {}
    for device in ("cpu", "neuron:1"):
        base = torch.neuron.memory_allocated(1)
        t = torch.arange(6.0).to(device)
        other = t.view(2, 3)
        t.resize_(4, 5)
        results[device] = (
            t.shape, t.stride(), t.flatten()[:6].cpu().tolist(), other.untyped_storage().nbytes(),
            other.untyped_storage().data_ptr() == t.untyped_storage().data_ptr(), other.cpu().tolist(),
        )
        if device != "cpu":
            assert t.device == torch.device("neuron", 1)
            assert torch.neuron.memory_allocated(1) - base == 20 * 4
            assert torch.neuron.memory_allocated(0) == torch.neuron.memory_allocated(0)
        t.resize_(2)  # shrinking keeps the storage
        assert t.untyped_storage().nbytes() == 80
    assert results["neuron:1"] == results["cpu"]


def test_resize_with_a_memory_format_gives_cpus_strides():
    for fmt in (torch.channels_last, torch.contiguous_format):
        d = torch.empty(2, 3, device="neuron").resize_(2, 3, 4, 5, memory_format=fmt)
        c = torch.empty(2, 3).resize_(2, 3, 4, 5, memory_format=fmt)
        assert d.shape == c.shape and d.stride() == c.stride()
    errors = []
    for t in (torch.empty(2), torch.empty(2, device="neuron")):
        try:
            t.resize_(3, memory_format=torch.preserve_format)
        except RuntimeError as e:
            errors.append(str(e))
    assert len(errors) == 2 and errors[0] == errors[1]  # CPU refuses preserve_format: so does the device


def test_storage_resize_follows_cpu_and_the_account():
    gc.collect()
    data = bytes(range(10))
    cpu = torch.UntypedStorage.from_buffer(data, dtype=torch.uint8)
    dev = torch.UntypedStorage(10, device="neuron:2")
    dev.copy_(cpu)
    before = torch.neuron.memory_allocated(2)
    keep = 10
    for n in (25, 4, 0, 7):
        cpu.resize_(n)
        assert dev.resize_(n) is dev and dev.nbytes() == n and dev.device == torch.device("neuron", 2)
        assert torch.neuron.memory_allocated(2) == before - 10 + n
        keep = min(keep, n)  # the bytes every resize so far kept
        assert list(dev.cpu())[:keep] == list(cpu)[:keep] == list(data)[:keep]


def test_storage_resize_out_of_memory_leaves_the_storage_as_it_was():
    r = run_python(
        "import torch, nativelab\n"
        "st = torch.UntypedStorage(1 << 20, device='neuron')\n"
        "t = torch.empty(0, dtype=torch.uint8, device='neuron').set_(st)\n"
        "t.fill_(7)\n"
        "try:\n"
        "    st.resize_(4 << 20)\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM', e)\n"
        "print('after', st.nbytes(), torch.neuron.memory_allocated(), int(t.sum()))\n"
        "print('ooms', torch.accelerator.memory_stats()['num_ooms'])\n",
        {"NATIVELAB_CORE_MEMORY_GB": str(2.5 / 1024)},
    )
    assert r.returncode == 0, r.stderr
    assert "OOM neuron:0 out of memory: tried to allocate 4194304 bytes" in r.stdout
    assert f"after {1 << 20} {1 << 20} {7 << 20}" in r.stdout
    assert "ooms 1" in r.stdout


def test_the_allocator_pytorch_reads_reports_the_account():
    """torch.accelerator's memory queries reach the C++ allocator (a c10::DeviceAllocator): CUDA's names."""
    gc.collect()
    torch.accelerator.reset_peak_memory_stats(3)
    base = torch.accelerator.memory_stats(3)
    t = torch.empty(1000, dtype=torch.uint8, device="neuron:3")
    u = torch.empty(24, dtype=torch.uint8, device="neuron:3")
    s = torch.accelerator.memory_stats(3)
    assert s["allocated_bytes.all.current"] == base["allocated_bytes.all.current"] + 1024
    assert s["allocated_bytes.all.current"] == torch.neuron.memory_allocated(3) == torch.accelerator.memory_allocated(3)
    assert s["reserved_bytes.all.current"] == s["allocated_bytes.all.current"]  # nothing cached
    assert s["allocation.all.current"] == base["allocation.all.current"] + 2
    assert s["num_device_alloc"] == base["num_device_alloc"] + 2
    del t
    s2 = torch.accelerator.memory_stats(3)
    assert s2["allocated_bytes.all.current"] == s["allocated_bytes.all.current"] - 1000
    assert s2["allocated_bytes.all.peak"] == s["allocated_bytes.all.current"]
    assert s2["allocated_bytes.all.freed"] == s["allocated_bytes.all.freed"] + 1000
    assert s2["num_device_free"] == s["num_device_free"] + 1
    del u


# PrivateUse1HooksInterface::getDeviceFromPtr: the core that holds a pointer, from the allocator's table. Nothing
# public in Python reaches it (DLPack names the index), so the test goes through at::from_blob without an index,
# the C++ path that asks it (the runtime's `from_blob` entry).


def test_device_of_a_pointer_is_the_core_that_holds_it():
    from nativelab.device import runtime

    rt = runtime.load()
    ref = torch.arange(12.0)
    made = {
        1: torch.empty(12, device="neuron:1").copy_(ref),  # the C++ path's own block
        2: ref.to("neuron:2"),  # a block the device adopted from a CPU result
        3: torch.empty(0, device="neuron:3").set_(torch.UntypedStorage(48, device="neuron:3")).copy_(ref),
    }
    torch.neuron.synchronize()
    for core, t in made.items():
        x = rt.from_blob(t.data_ptr() + 2 * 4, [4], torch.float32)  # an interior pointer: elements 2..5
        assert x.device == torch.device("neuron", core)
        assert x.cpu().tolist() == ref[2:6].tolist()
        last = rt.from_blob(t.data_ptr() + 11 * 4, [1], torch.float32)  # the block's last element
        assert last.device == torch.device("neuron", core) and last.cpu().tolist() == [11.0]
    with pytest.raises(RuntimeError, match="not in memory the neuron device holds"):
        rt.from_blob(torch.empty(4).data_ptr(), [4], torch.float32)  # CPU memory
    ptr = made[1].data_ptr()
    del made[1], x, last
    with pytest.raises(RuntimeError, match="not in memory the neuron device holds"):
        rt.from_blob(ptr, [4], torch.float32)  # freed


def test_memory_stats_are_cudas_names_and_pytorchs_numbers():
    """torch.neuron.memory_stats flattens the allocator's statistics as torch.cuda.memory_stats does; PyTorch's
    own path (torch.accelerator.memory_stats: its C++ reading of the allocator, its flattening) agrees."""
    gc.collect()
    before = torch.neuron.memory_stats(2)
    big = torch.empty(2 << 20, dtype=torch.uint8, device="neuron:2")  # CUDA's large pool: over 1 MiB
    small = torch.empty(1000, dtype=torch.uint8, device="neuron:2")
    s = torch.neuron.memory_stats(2)
    assert list(s) == sorted(s) and s == torch.accelerator.memory_stats(2)
    for i in range(4):
        assert torch.neuron.memory_stats(i) == torch.accelerator.memory_stats(i)

    def delta(key):
        return s[key] - before[key]

    assert delta("allocated_bytes.all.current") == (2 << 20) + 1000 == delta("reserved_bytes.all.current")
    assert delta("allocated_bytes.large_pool.current") == 2 << 20
    assert delta("allocated_bytes.small_pool.current") == 1000
    assert delta("allocation.all.current") == 2 and delta("segment.all.current") == 2
    assert s["allocated_bytes.all.current"] == torch.neuron.memory_allocated(2) == torch.neuron.memory_reserved(2)
    del big, small
    torch.neuron.empty_cache()  # nothing cached: a no-op, reserved stays allocated
    after = torch.neuron.memory_stats(2)
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocated_bytes.all.freed"] - s["allocated_bytes.all.freed"] == (2 << 20) + 1000
    torch.neuron.reset_accumulated_memory_stats(2)
    reset = torch.neuron.memory_stats(2)
    assert reset["allocated_bytes.all.allocated"] == reset["allocated_bytes.all.freed"] == 0
    assert reset["allocated_bytes.all.current"] == after["allocated_bytes.all.current"]
    assert torch.neuron.memory_stats_as_nested_dict(2)["allocated_bytes"]["all"]["current"] == (
        reset["allocated_bytes.all.current"]
    )


def test_memory_snapshot_lists_the_live_blocks():
    a = torch.empty(300, dtype=torch.float32, device="neuron:1")
    b = torch.empty(3 << 20, dtype=torch.uint8, device="neuron:3")
    segs = {s["address"]: s for s in torch.neuron.memory_snapshot()}
    sa, sb = segs[a.data_ptr()], segs[b.data_ptr()]
    assert (sa["device"], sa["total_size"], sa["segment_type"]) == (1, 1200, "small")
    assert (sb["device"], sb["total_size"], sb["segment_type"]) == (3, 3 << 20, "large")
    assert sb["blocks"] == [{"address": b.data_ptr(), "size": 3 << 20, "requested_size": 3 << 20,
                             "state": "active_allocated"}]
    ptr = b.data_ptr()
    del b
    assert ptr not in {s["address"] for s in torch.neuron.memory_snapshot()}
