"""How the device is registered: autoload with `import torch`, opt-out, standing aside for the real stack."""

import os
import textwrap

import pytest

from conftest import run_python


def test_plain_import_torch_registers_the_device():
    r = run_python("import torch; t = torch.randn(2, 2).to('neuron'); t = t + t; print(t.device, hasattr(torch, 'neuron'))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "neuron:0 True"
    # Registering the device's kernels says nothing (a kernel registered twice made the dispatcher warn
    # "Overriding a previously registered kernel" at every start).
    assert r.stderr == "", r.stderr


def test_autoload_opt_out_then_import_nativelab():
    code = (
        "import torch\n"
        "print(hasattr(torch, 'neuron'))\n"
        "import nativelab\n"
        "print(torch.ones(1).to('neuron').device)\n"
    )
    r = run_python(code, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "neuron:0"]


def test_notice_is_printed_once_on_first_use_and_can_be_silenced():
    code = "import torch\nprint('imported')\nx = torch.ones(2).to('neuron')\ny = torch.ones(2).to('neuron')\n"
    r = run_python(code, {"NATIVELAB_QUIET": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("emulated on the host CPU") == 1
    r = run_python(code, {"NATIVELAB_QUIET": "1"})
    assert "emulated" not in r.stderr


def test_stands_aside_on_a_cuda_machine_unless_asked():
    # A registered PrivateUse1 backend becomes torch's accelerator and breaks CUDA backward, so a machine with
    # a GPU keeps CUDA as its accelerator. No GPU here: pretend one is present.
    code = (
        "import torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "import nativelab\n"
        "print(nativelab.device.is_registered(), hasattr(torch, 'neuron'))\n"
    )
    r = run_python(code, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]
    r = run_python(code, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "NATIVELAB_EMULATE": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]


def test_stands_aside_when_the_real_neuron_stack_is_installed(tmp_path):
    fake = tmp_path / "torch_neuronx"
    fake.mkdir()
    (fake / "__init__.py").write_text("REAL = True\n")
    code = textwrap.dedent(
        """
        import torch, nativelab
        print(nativelab.device.is_registered(), nativelab.device.real_neuron_installed())
        print(torch._C._get_privateuse1_backend_name())
        import torch_neuronx
        print(torch_neuronx.REAL)
        """
    )
    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = run_python(code, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "privateuseone", "True"]


CPU_ONLY_PROGRAM = textwrap.dedent("""
    import warnings
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    warnings.simplefilter("ignore")  # plain PyTorch warns that no accelerator can pin memory
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(6, 3), torch.arange(6))
    for xb, yb in DataLoader(data, batch_size=4, shuffle=True, pin_memory=True):  # Hugging Face Trainer's default
        print("batch", xb.tolist(), yb.tolist(), xb.device)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2))
    holder = torch.nn.ModuleDict({"net": model, "head": model[2]})  # a shared submodule, moved with the model
    holder.to("cpu").to(torch.float64).to(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(torch.randn(5, 3))
    print("autocast", y.dtype, y.float().tolist())
    print("same parameter", holder["head"].weight is model[2].weight)
    print("default device", torch.get_default_device(), "cuda", torch.cuda.is_available())
    print("autocast dtype", torch.get_autocast_dtype("cpu"), torch.amp.is_autocast_available("cpu"))
    print("swap on conversion", torch.__future__.get_swap_module_params_on_conversion())
    print("rng", torch.rand(3).tolist(), torch.initial_seed())
""")


@pytest.mark.slow  # two fresh interpreters
def test_a_program_that_never_uses_the_device_runs_as_without_nativelab():
    plain = run_python(CPU_ONLY_PROGRAM, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    with_nativelab = run_python(CPU_ONLY_PROGRAM)  # `import torch` registers the device
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert with_nativelab.returncode == 0, with_nativelab.stderr[-2000:]
    loaded = run_python("import torch; print(torch.neuron.is_available())")
    assert loaded.stdout.strip() == "True", loaded.stderr[-2000:]  # the second run did have the device
    assert with_nativelab.stdout == plain.stdout
