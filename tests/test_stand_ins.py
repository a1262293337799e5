"""Stand-ins (`nativelab.stand_ins`): `import torch_neuronx` where the real package is absent, never over it."""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import textwrap

import pytest
from conftest import run_python

from nativelab import stand_ins


@pytest.fixture
def fresh_name(request):
    """A top-level name no package has, served by nativelab.files (a module with known public names)."""
    name = f"nl_standin_{request.node.name}"
    stand_ins.install(name, "nativelab.kernels")
    yield name
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def test_a_stand_in_serves_the_target_modules_names_and_submodules(fresh_name):
    import nativelab.kernels
    import nativelab.kernels.ops

    assert stand_ins.real_spec(fresh_name) is None
    mod = importlib.import_module(fresh_name)
    assert stand_ins.is_stand_in(mod)
    assert mod.wrap_kernel is nativelab.kernels.wrap_kernel  # the target's objects: one set of state
    assert mod.__file__ == nativelab.kernels.__file__
    sub = importlib.import_module(f"{fresh_name}.ops")
    assert sub.reference_rmsnorm is nativelab.kernels.ops.reference_rmsnorm
    with pytest.raises(ModuleNotFoundError, match=f"{fresh_name}.no_such_module"):
        importlib.import_module(f"{fresh_name}.no_such_module")
    with pytest.raises(AttributeError, match="stand-in"):
        mod.no_such_name
    assert stand_ins.real_spec(fresh_name) is None  # imported, still not the real one


def test_the_real_package_on_sys_path_wins_and_keeps_its_submodules(fresh_name, tmp_path, monkeypatch):
    (tmp_path / fresh_name).mkdir()
    (tmp_path / fresh_name / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert stand_ins.real_spec(fresh_name).origin == str(tmp_path / fresh_name / "__init__.py")
    mod = importlib.import_module(fresh_name)
    assert mod.REAL and not stand_ins.is_stand_in(mod)
    with pytest.raises(ModuleNotFoundError):  # no stand-in submodules below a real package
        importlib.import_module(f"{fresh_name}.ops")


def test_a_finder_added_after_the_stand_ins_still_wins(fresh_name, monkeypatch):
    # Finders appended to sys.meta_path later (an editable install's, a plugin's) come after ours.
    real = importlib.machinery.ModuleSpec(fresh_name, None)

    class LateFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            return real if fullname == fresh_name else None

    monkeypatch.setattr(sys, "meta_path", sys.meta_path + [LateFinder()])
    assert importlib.util.find_spec(fresh_name) is real
    assert stand_ins.real_spec(fresh_name) is real


def test_a_stand_in_cannot_be_a_submodule_or_change_target():
    with pytest.raises(ValueError, match="submodule"):
        stand_ins.install("a.b", "nativelab.kernels")
    stand_ins.install("nl_standin_twice", "nativelab.kernels")
    with pytest.raises(ValueError, match="already served by nativelab.kernels"):
        stand_ins.install("nl_standin_twice", "nativelab.files")


def test_torch_neuronx_is_the_devices_tracking_api():
    code = textwrap.dedent("""
        import importlib.util, warnings
        import torch
        import nativelab
        spec = importlib.util.find_spec("torch_neuronx")  # what accelerate and transformers ask
        print(spec is not None, nativelab.device.real_neuron_installed())
        import torch_neuronx
        torch_neuronx.clear_op_tracking()
        warnings.simplefilter("ignore")
        x = torch.arange(6.0).flip(0).to("neuron")
        torch.sort(x, stable=True).values.cpu()
        print(torch_neuronx.get_fallback_ops() == nativelab.get_fallback_ops() != [])
        print("aten::copy_" in torch_neuronx.get_executed_ops())
        torch_neuronx.clear_op_tracking()
        print(nativelab.get_fallback_ops())
    """)
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "True", "True", "[]"]


def test_no_stand_in_without_the_emulated_device():
    # A CUDA machine keeps its accelerator (see test_registration): then nothing may look like Neuron.
    code = ("import importlib.util, torch\n"
            "torch.cuda.is_available = lambda: True\n"
            "import nativelab\n"
            "print(nativelab.device.is_registered(), importlib.util.find_spec('torch_neuronx'))\n")
    r = run_python(code, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "None"]


@pytest.mark.slow  # a fresh interpreter importing transformers
def test_accelerate_and_the_trainer_choose_neuron():
    code = textwrap.dedent("""
        import torch
        from accelerate import Accelerator
        from transformers import TrainingArguments
        args = TrainingArguments(output_dir="/nonexistent", report_to=[])
        print(args.device, Accelerator().device, torch.accelerator.current_accelerator())
        compiled = TrainingArguments(output_dir="/nonexistent", report_to=[], torch_compile=True)
        print(compiled.torch_compile_backend)  # the Trainer's torch_compile=True picks the device's backend
    """)
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["neuron:0", "neuron", "neuron", "neuron"]
