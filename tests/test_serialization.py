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
