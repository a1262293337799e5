"""nativelab's environment variables (src/nativelab/settings.py): parsed and validated in one place, one clear
error for a bad value, modes as overrides of this process that child processes do not inherit, and child
processes (a plain interpreter, torchrun's workers) reading the environment they were started with."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_python
from nativelab import settings
from nativelab.kernels.cpu import build

ROOT = Path(__file__).resolve().parents[1]

# variable -> (a bad value, the allowed values its error names): written out here, not read from settings.py
BAD = {
    "NEURON_RT_VIRTUAL_CORE_SIZE": ("4", "1 or 2"),
    "NEURON_RT_NUM_CORES": ("four", "an integer >= 1"),
    "NEURON_PLATFORM_TARGET_OVERRIDE": ("trn1", "trn2, gen3, trn3 or gen4"),
    "LOCAL_RANK": ("-1", "an integer >= 0"),
    "NATIVELAB_CORE_MEMORY_GB": ("-1", "a number of GB > 0"),
    "NATIVELAB_SYNC": ("maybe", "0 or 1"),
    "NATIVELAB_DTYPE_POLICY": ("2", "0 or 1"),
    "NATIVELAB_FAST_PATH": ("fast", "0 or 1"),
    "NATIVELAB_QUIET": ("shh", "0 or 1"),
    "NATIVELAB_STRICT": ("very", "0 or 1"),
    "NATIVELAB_EMULATE": ("y", "0 or 1"),
    "NATIVELAB_THREADS": ("0", "auto or a thread count >= 1"),
    "NATIVELAB_BF16_GEMM": ("fast", "auto, bf16 or fp32"),
    "NATIVELAB_CPU_KERNELS": ("2", "0 or 1"),
    "NATIVELAB_NKI_PROFILE": ("loud", "0 or 1"),
    "NATIVELAB_NKI_HAZARDS": ("warn", "off, auto, full or strict"),
    "NATIVELAB_NKI_FIRST_CALL": ("later", "interpret or compile"),
    "NATIVELAB_NKI_LOWER": ("host", "0 or 1"),
}
OPEN = {"NATIVELAB_DECODE_CONFIG",  # its fields are the tuner's (tests/test_decode_tuning.py checks them)
        "NATIVELAB_CACHE_DIR", "NATIVELAB_CPP_CACHE_DIR", "NATIVELAB_TUNE_CACHE_DIR"}  # any directory


def test_every_variable_has_a_bad_value_case_or_takes_any_text():
    assert {v.name for v in settings.VARIABLES} == set(BAD) | OPEN


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_one_error_naming_the_variable_and_the_allowed_values(name, monkeypatch):
    bad, allowed = BAD[name]
    var = next(v for v in settings.VARIABLES if v.name == name)
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError) as e:
        var.get()
    assert str(e.value) == f"{name}={bad!r}: expected {allowed}"
    with pytest.raises(ValueError, match=re.escape(f"{name}={bad!r}")):  # an override is checked the same way
        with var.set(bad):
            pass


@pytest.mark.parametrize("name,value,probe,seen", [
    ("NATIVELAB_THREADS", "3", "nativelab.device.threads.ceiling()", "3"),
    ("NATIVELAB_BF16_GEMM", "fp32", "nativelab.device.gemm_policy.min_rows()", "4"),  # upcast from 4 rows
    ("NATIVELAB_CORE_MEMORY_GB", "0.5", "torch.neuron.get_device_properties(0).total_memory", str(1 << 29)),
])
def test_a_setting_read_at_registration_reaches_the_device_and_a_bad_one_stops_the_import(name, value, probe,
                                                                                         seen):
    code = f"import torch, nativelab, nativelab.device.threads, nativelab.device.gemm_policy; print({probe})"
    r = run_python(code, {name: value})
    assert r.returncode == 0 and r.stdout.strip() == seen, r.stderr
    bad, allowed = BAD[name]
    r = run_python(code, {name: bad})
    assert r.returncode != 0 and f"{name}={bad!r}: expected {allowed}" in r.stderr


def test_values_defaults_and_blank():
    env = {"NATIVELAB_THREADS": "3", "NATIVELAB_BF16_GEMM": " FP32 ", "NATIVELAB_CPU_KERNELS": "off",
           "NATIVELAB_CORE_MEMORY_GB": "1.5", "NEURON_RT_VIRTUAL_CORE_SIZE": "1", "NATIVELAB_CACHE_DIR": "/x/neff",
           "XDG_CACHE_HOME": "/xdg"}
    with pytest.MonkeyPatch.context() as m:
        for k, v in env.items():
            m.setenv(k, v)
        m.setenv("NATIVELAB_SYNC", "  ")  # blank: the default
        m.delenv("NEURON_RT_NUM_CORES", raising=False)
        m.delenv("NATIVELAB_CPP_CACHE_DIR", raising=False)
        assert settings.THREADS.get() == 3 and settings.BF16_GEMM.get() == "fp32"
        assert settings.CPU_KERNELS.get() is False and settings.SYNC.get() is False
        assert settings.CORE_MEMORY_GB.get() == 1.5
        assert settings.NUM_CORES.get() == 8  # LNC=1: every physical core is a logical one
        assert settings.CACHE_DIR.get() == Path("/x/neff")
        assert settings.CPP_CACHE_DIR.get() == Path("/xdg/nativelab/cpp")
        m.setenv("NEURON_RT_VIRTUAL_CORE_SIZE", "2")
        m.delenv("NATIVELAB_CORE_MEMORY_GB")
        assert (settings.NUM_CORES.get(), settings.CORE_MEMORY_GB.get()) == (4, 24.0)  # trn2: 96 GB over 4


def test_a_mode_is_an_override_of_this_process_restored_after_the_block(monkeypatch):
    monkeypatch.setenv("NATIVELAB_CPU_KERNELS", "1")
    before = dict(os.environ)
    with build.host_kernels(False):
        assert build.enabled() is False
        assert dict(os.environ) == before  # nothing written to the environment
        with build.host_kernels(True):
            assert build.enabled() is True
        assert build.enabled() is False
    assert build.enabled() is True
    with pytest.raises(KeyError):
        with build.host_kernels(False):
            raise KeyError("inside")
    assert build.enabled() is True
    monkeypatch.setenv("NATIVELAB_CPU_KERNELS", "0")
    assert build.enabled() is False  # the environment is read at each launch, as documented


@pytest.mark.slow  # child interpreters
def test_a_child_started_inside_a_mode_sees_the_environment_not_the_mode(monkeypatch):
    """host_kernels(False) used to write NATIVELAB_CPU_KERNELS=0 into os.environ, so every process started
    inside the block (a compile worker, a torchrun job, subprocess.run) ran without the kernels too."""
    monkeypatch.delenv("NATIVELAB_CPU_KERNELS", raising=False)
    code = "from nativelab.kernels.cpu import build; print(build.enabled())"
    with build.host_kernels(False):
        assert build.enabled() is False
        r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
    r = run_python(code, {"NATIVELAB_CPU_KERNELS": "0"})  # and the environment does reach it
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


WORKER = """
import sys
import torch, nativelab
from nativelab import settings
from nativelab.device import threads
from nativelab.kernels.cpu import build
gib = torch.neuron.get_device_properties(0).total_memory / (1 << 30)
line = (f"worker {settings.NUM_CORES.name}={torch.neuron.device_count()} memory={gib} "
        f"kernels={build.enabled()} threads={threads.ceiling()}\\n")
sys.stdout.write(line)  # one write: print() writes text and newline apart, and the two workers share stdout
sys.stdout.flush()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_workers_read_the_environment(tmp_path):
    """Each worker torchrun starts reads the variables in its own process, from the environment it inherits:
    the device's shape and memory at registration, the thread team, the kernels' switch."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, NATIVELAB_QUIET="1", OMP_NUM_THREADS="1", NEURON_RT_NUM_CORES="3",
               NATIVELAB_CORE_MEMORY_GB="1.5", NATIVELAB_CPU_KERNELS="0", NATIVELAB_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
           "--rdzv_endpoint", f"localhost:{_free_port()}", str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("worker")]
    assert lines == ["worker NEURON_RT_NUM_CORES=3 memory=1.5 kernels=False threads=1"] * 2, r.stdout



@pytest.mark.slow
def test_inductor_compile_workers_read_the_environment_not_the_mode(monkeypatch):
    """torch.compile's parallel compile runs in a pool of worker processes started once and kept (Inductor's
    SubprocPool): one started inside a mode used to keep the mode for the rest of the program."""
    from torch._inductor.compile_worker.subproc_pool import SubprocPool

    for env, want in ((None, True), ("0", False)):
        if env is None:
            monkeypatch.delenv("NATIVELAB_CPU_KERNELS", raising=False)
        else:
            monkeypatch.setenv("NATIVELAB_CPU_KERNELS", env)
        with build.host_kernels(False):
            pool = SubprocPool(1)
            try:
                assert pool.submit(build.enabled).result(timeout=120) is want  # read in the worker
            finally:
                pool.shutdown()

def test_readme_lists_every_variable():
    """README.md's settings table is settings.table(): every variable, its values, default and when it is read."""
    readme = (ROOT / "README.md").read_text()
    assert settings.table() in readme, "README.md's settings table differs from settings.table(): paste it in"
