"""torch._dynamo's device interface for neuron, registered when Dynamo is imported (not by `import torch`)."""

import torch

from conftest import run_python


def test_interface_answers_from_the_device():
    from torch._dynamo.device_interface import get_interface_for_device

    di = get_interface_for_device("neuron")
    assert get_interface_for_device(torch.device("neuron", 2)) is di
    assert di.is_available() and di.device_count() == torch.neuron.device_count()
    prev = di.exchange_device(2)
    assert prev == 0 and di.current_device() == 2 == torch.neuron.current_device()
    di.set_device(0)
    e = di.Event(enable_timing=True)
    assert isinstance(e, torch.Event) and e.device.type == "neuron"
    assert di.current_stream() == torch.neuron.current_stream()
    assert di.get_device_properties(0).total_memory == torch.neuron.get_device_properties(0).total_memory
    di.synchronize()


def test_import_torch_does_not_import_dynamo():
    out = run_python("import sys, torch; torch.ones(1, device='neuron'); print('torch._dynamo' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_device_capability():
    caps = torch.accelerator.get_device_capability()
    assert {torch.float32, torch.bfloat16, torch.int32}.issubset(caps["supported_dtypes"])


def test_dynamo_fake_tensors_keep_a_device_tensors_backend_metadata():
    # What torch._utils.set_tensor_metadata gave the device tensor is on Dynamo's fake copy of it, as on OpenReg;
    # a tensor without any, and a CPU tensor (CPU keeps no such metadata), give {} on both.
    captured = []

    def capture(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                captured.append(torch._utils.get_tensor_metadata(node.meta["example_value"]))
        return gm.forward

    @torch.compile(backend=capture, fullgraph=True)
    def fn(x, y, z):
        return x + y + z.to(x.device)

    x, y, z = torch.empty(3, device="neuron"), torch.empty(3, device="neuron"), torch.empty(3)
    flags = {"version_number": True, "format_number": False}
    torch._utils.set_tensor_metadata(x, flags)
    torch._utils.set_tensor_metadata(z, flags)
    fn(x, y, z)
    assert captured == [torch._utils.get_tensor_metadata(t) for t in (x, y, z)] == [flags, {}, {}]
