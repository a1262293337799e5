"""state_dict, torch.save / torch.load with map_location='neuron'."""

import io

import torch
import torch.nn as nn


def test_save_device_tensor_and_load_on_cpu_and_device(tmp_path):
    t = torch.randn(5, 3)
    path = tmp_path / "t.pt"
    torch.save(t.to("neuron"), path)
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, t)
    on_dev = torch.load(path, map_location="neuron")
    assert on_dev.device == torch.device("neuron", 0) and torch.equal(on_dev.cpu(), t)
    on_dev2 = torch.load(path, map_location="neuron:2")
    assert on_dev2.device == torch.device("neuron", 2)


def test_state_dict_roundtrip_through_the_device():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8)).to("neuron")
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, map_location="neuron")
    assert all(v.device.type == "neuron" for v in sd.values())
    m2 = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8)).to("neuron")
    m2.load_state_dict(sd)
    x = torch.randn(2, 4).to("neuron")
    assert torch.equal(m(x).cpu(), m2(x).cpu())


def test_views_share_storage_after_load():
    base = torch.arange(10.0).to("neuron")
    buf = io.BytesIO()
    torch.save({"base": base, "view": base[2:5]}, buf)
    buf.seek(0)
    d = torch.load(buf, map_location="neuron")
    d["view"].fill_(-1)
    assert d["base"].cpu()[2:5].tolist() == [-1.0, -1.0, -1.0]


def test_backend_metadata_goes_through_save_and_load_as_on_openreg(tmp_path):
    # torch._utils.set_tensor_metadata / get_tensor_metadata, asserted as OpenReg's serialization test does:
    # flags set on a device tensor are saved and restored on the device, dropped on CPU (which keeps none:
    # a CPU tensor given the same flags still reports {}).
    flags = {"version_number": True, "format_number": False}
    t = torch.randn(3, 3).to("neuron")
    assert torch._utils.get_tensor_metadata(t) == {}
    torch._utils.set_tensor_metadata(t, flags)
    assert torch._utils.get_tensor_metadata(t) == flags
    assert torch._utils.get_tensor_metadata(t.detach()) == flags  # the same tensor's metadata, as on CPU
    assert torch._utils.get_tensor_metadata(t + 1) == {}  # a new tensor starts without
    cpu = torch.randn(3, 3)
    torch._utils.set_tensor_metadata(cpu, flags)
    assert torch._utils.get_tensor_metadata(cpu) == {}
    path = tmp_path / "t.pt"
    torch.save({"t": t, "plain": torch.ones(2).to("neuron")}, path)
    for where in (None, "neuron:2"):
        d = torch.load(path, map_location=where)
        assert d["t"].device.type == "neuron" and torch.equal(d["t"].cpu(), t.cpu())
        assert torch._utils.get_tensor_metadata(d["t"]) == flags
        assert torch._utils.get_tensor_metadata(d["plain"]) == {}
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["t"].is_cpu and torch._utils.get_tensor_metadata(on_cpu["t"]) == {}
    # PyTorch's own flags still travel with ours.
    z = torch.randn(2, dtype=torch.complex64).to("neuron").conj()
    torch._utils.set_tensor_metadata(z, {"version_number": True})
    assert torch._utils.get_tensor_metadata(z) == {"conj": True, "version_number": True}


def test_storage_location_tags_and_restore_locations_name_the_core():
    # OpenReg's test_serialization_storage_location_tag / default_restore_location, as CUDA's "cuda:1".
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device="neuron")) == "neuron:0"
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device="neuron:1")) == "neuron:1"
    cpu = torch.arange(4.0).untyped_storage()
    for i in (0, 3):
        st = torch.serialization.default_restore_location(cpu, f"neuron:{i}")
        assert st.is_neuron and st.device == torch.device("neuron", i)
        assert torch.equal(torch.tensor([], device=st.device).set_(st).cpu(), torch.arange(4.0))
