"""The profiler's device stubs: device time per op from the runtime's timing events (positive, not more
than the wall time), and no warnings from PyTorch's default stubs."""

import pytest
import torch

from conftest import run_python

# Run in a fresh interpreter: after test_dlpack.py in the same process the legacy profiler recorded aten::mm
# once for five calls (plus the host runs), with no device time (not understood yet; see the issue-15 report).
LEGACY = """
import time, warnings, torch
a = torch.randn(192, 192, device="neuron")
torch.neuron.synchronize()
with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)  # PyTorch's default stubs warn per op
    t0 = time.perf_counter()
    with torch.autograd.profiler.profile(use_device="neuron", use_kineto=False) as prof:
        for _ in range(5):
            a = (a @ a).tanh()
        a.cpu()
    wall_us = (time.perf_counter() - t0) * 1e6
rows = {e.key: e for e in prof.key_averages()}
total = sum(e.self_device_time_total for e in rows.values())
print(rows["aten::mm"].count >= 5, rows["aten::mm"].self_device_time_total > 0, 0 < total <= wall_us * 1.05,
      all(e.self_device_time_total >= 0 for e in rows.values()))
"""


@pytest.mark.slow  # a fresh interpreter
def test_legacy_device_profile_records_device_time():
    out = run_python(LEGACY)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-4:] == ["True"] * 4, out.stdout


def test_kineto_profile_with_the_device_activity_runs_cleanly():
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(64, 64, device="neuron")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        (a @ a).cpu()
    names = {e.key for e in prof.key_averages()}
    assert "aten::mm" in names
    assert all(e.cpu_time_total >= 0 for e in prof.key_averages())
