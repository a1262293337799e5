"""How the device is registered: autoload with `import torch`, opt-out, standing aside for the real stack."""

import os
import textwrap

from conftest import run_python


def test_plain_import_torch_registers_the_device():
    r = run_python("import torch; t = torch.randn(2, 2).to('neuron'); print(t.device, hasattr(torch, 'neuron'))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "neuron:0 True"


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
        """
    )
    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = run_python(code, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "privateuseone"]
