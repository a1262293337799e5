"""The Hugging Face Trainer and accelerate on the device: they choose `neuron` (through the `torch_neuronx`
stand-in) and train as on the CPU: losses, evaluation, gradient accumulation, checkpoint resume, pinned batches,
bf16 mixed precision. Each side runs in its own process (accelerate's state is per process): the Trainer in
tests/hf_trainer_worker.py, a plain accelerate loop below. (fp16 is accelerate's own refusal for neuron.)"""

import pathlib
import subprocess
import sys

import pytest
import torch

WORKER = pathlib.Path(__file__).parent / "hf_trainer_worker.py"


def _crash_part(stderr: str) -> str:
    """What a failed run printed: its last lines, and the lines before the runtime's crash note if it has one."""
    at = stderr.find("nativelab: fatal signal")
    return (stderr[max(0, at - 2000):at + 1000] + "\n...\n" if at >= 0 else "") + stderr[-3000:]


def _run(device: str, tmp_path: pathlib.Path) -> dict:
    result = tmp_path / f"{device}.pt"
    r = subprocess.run([sys.executable, str(WORKER), device, str(result), str(tmp_path / device), "bf16"],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, f"the {device} run failed:\n{_crash_part(r.stderr)}"
    return torch.load(result)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_trainer")
    return _run("neuron", tmp), _run("cpu", tmp)


@pytest.mark.slow
def test_the_trainer_chooses_neuron_and_pins_batches(runs):
    neuron, cpu = runs
    for run in neuron.values():
        assert (run["args_device"], run["param_device"], run["pin_memory"]) == ("neuron:0", "neuron:0", True)
    assert cpu["fp32"]["param_device"] == "cpu"
    assert (neuron["bf16"]["mixed_precision"], neuron["fp32"]["mixed_precision"]) == ("bf16", "no")


@pytest.mark.slow
def test_losses_evaluation_and_weights_equal_the_cpus(runs):
    neuron, cpu = runs
    for kind in ("fp32", "resumed"):
        assert list(neuron[kind]["loss"]) == [1, 2, 3, 4, 5, 6] and list(neuron[kind]["eval_loss"]) == [3, 6]
        for key in ("loss", "eval_loss"):
            torch.testing.assert_close(neuron[kind][key], cpu[kind][key], rtol=2e-6, atol=0)
        torch.testing.assert_close(neuron[kind]["weights"], cpu[kind]["weights"])
    # bf16 autocast rounds matmul inputs; the device and the CPU agree to well within bf16's resolution (2^-8)
    for key in ("loss", "eval_loss"):
        torch.testing.assert_close(neuron["bf16"][key], cpu["bf16"][key], rtol=1e-4, atol=0)
    assert neuron["bf16"]["loss"] != neuron["fp32"]["loss"]  # the bf16 run really ran in bf16


@pytest.mark.slow
def test_resuming_from_a_checkpoint_continues_the_same_run(runs):
    neuron, _ = runs
    assert (neuron["fp32"]["steps_run"], neuron["resumed"]["steps_run"]) == ([1, 2, 3, 4, 5, 6], [4, 5, 6])
    # steps 4-6 after resuming from checkpoint-3 are the uninterrupted run's, bit for bit (optimizer, scheduler
    # and RNG state came back from the checkpoint)
    assert neuron["resumed"]["loss"] == neuron["fp32"]["loss"]
    assert neuron["resumed"]["eval_loss"] == neuron["fp32"]["eval_loss"]
    torch.testing.assert_close(neuron["resumed"]["weights"], neuron["fp32"]["weights"], rtol=0, atol=0)


@pytest.mark.slow
def test_data_parallel_trainer_under_torchrun_equals_the_cpus(tmp_path):
    # accelerate picks the `neuron` process-group backend and one core per rank (neuron:0, neuron:1)
    got = {}
    for device in ("neuron", "cpu"):
        result = tmp_path / f"{device}.pt"
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(WORKER),
                            device, str(result), str(tmp_path / device)], capture_output=True, text=True, timeout=500)
        assert r.returncode == 0, f"the {device} run failed:\n{_crash_part(r.stderr)}"
        got[device] = torch.load(result)
    neuron, cpu = got["neuron"], got["cpu"]
    assert neuron["fp32"]["param_device"] == "neuron:0" and cpu["fp32"]["param_device"] == "cpu"
    for kind in ("fp32", "resumed"):
        for key in ("loss", "eval_loss"):
            torch.testing.assert_close(neuron[kind][key], cpu[kind][key], rtol=2e-6, atol=0)
        torch.testing.assert_close(neuron[kind]["weights"], cpu[kind]["weights"])
    assert neuron["resumed"]["steps_run"] == [4, 5, 6]


ACCELERATE_LOOP = """
import json, sys, warnings
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
warnings.simplefilter("ignore")
acc = Accelerator(mixed_precision=sys.argv[1], cpu=sys.argv[2] == "cpu", gradient_accumulation_steps=2)
set_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))
model, opt, dl = acc.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=4))
losses = []
for x, y in dl:
    with acc.accumulate(model):
        with acc.autocast():
            loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
acc.save_state(sys.argv[3])  # the device's RNG states go in (torch.neuron.get_rng_state_all) and come back
acc.load_state(sys.argv[3])
print(json.dumps({"device": str(acc.device), "batch": str(x.device), "losses": losses}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_an_accelerate_loop_runs_on_neuron_as_on_the_cpu(precision, tmp_path):
    import json

    out = {}
    for device in ("neuron", "cpu"):
        r = subprocess.run([sys.executable, "-c", ACCELERATE_LOOP, precision, device, str(tmp_path / device)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        out[device] = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["neuron"]["device"], out["neuron"]["batch"], out["cpu"]["batch"]) == ("neuron", "neuron:0", "cpu")
    assert len(out["neuron"]["losses"]) == 8
    torch.testing.assert_close(out["neuron"]["losses"], out["cpu"]["losses"], rtol=1e-5, atol=0)
