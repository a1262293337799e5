import atexit
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("NATIVELAB_QUIET", "1")
# A kernel's first launch compiles, as the tests of the compiled path expect (the default interprets it and
# compiles at the second: tests/test_nki_first_call.py); subprocesses the tests start inherit it.
os.environ.setdefault("NATIVELAB_NKI_FIRST_CALL", "compile")
# The decode kernels' tuning measures at a plan's first step: what the tests measure, on a loaded machine and
# odd shapes, stays out of the user's cache (kernels/cpu/tune.py).
if "NATIVELAB_TUNE_CACHE_DIR" not in os.environ:  # made once by the first pytest process; xdist's workers inherit it
    os.environ["NATIVELAB_TUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="nativelab-tune-tests-")
    atexit.register(shutil.rmtree, os.environ["NATIVELAB_TUNE_CACHE_DIR"], ignore_errors=True)  # not left in /tmp

import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors (tests/test_triton.py); Triton
# reads this when a kernel is decorated, so it is set before any test module imports one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import nativelab  # noqa: E402,F401  (registers the device, also when autoload is off)


@pytest.fixture(autouse=True)
def _drain_and_reset():
    """Each test starts with an idle device on core 0 and empty op tracking."""
    if not nativelab.device.is_registered():  # e.g. a GPU machine's other torch: CUDA tests only
        yield
        return
    torch.neuron.synchronize()
    torch.neuron.set_device(0)
    nativelab.clear_op_tracking()
    yield
    try:
        torch.neuron.synchronize()
    except RuntimeError:
        pass  # a test that left a failing op queued has already asserted on it


def run_python(code: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (for registration, environment and process-level behaviour)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout
    )


def recorded(session) -> dict:
    """What a profiling session (or a check's Watch) saw, without its times: per-name kind, calls and bytes,
    the transfers and the fallback ops."""
    return {
        "ops": {n: (st.kind, st.category, st.calls, st.read, st.written, st.to_host, st.to_device)
                for n, st in session.ops.items()},
        "transfers": dict(session.transfers), "transfer_calls": dict(session.transfer_calls),
        "fallbacks": session.fallback_ops(),
    }
