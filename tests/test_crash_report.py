"""A crash that happens anyway is reported: faulthandler's C-level handler is on for processes that import
nativelab (unless the user set their own), and the runtime names the device work running at the crash."""

from conftest import run_python

# A segfault inside device work: a queued unit that reads address 0 when the queue runs it.
CRASH = (
    "import ctypes, torch, nativelab\n"
    "from nativelab.device import queue\n"
    "x = torch.ones(4, device='neuron')\n"
    "queue.launch('op', 'test::reads_null', lambda t: ctypes.string_at(0), x)\n"
    "torch.neuron.synchronize()\n"
)


def test_faulthandler_is_enabled_on_import():
    r = run_python("import faulthandler, nativelab; print(faulthandler.is_enabled())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def test_a_crash_in_device_work_names_it_and_prints_the_python_stack():
    r = run_python(CRASH)
    assert r.returncode == -11, (r.returncode, r.stderr[-2000:])  # still the signal: the process cannot go on
    assert "nativelab: fatal signal 11 while the device ran op 'test::reads_null' on neuron:0" in r.stderr
    assert "Fatal Python error: Segmentation fault" in r.stderr  # faulthandler's part: the Python stack
    assert 'line 5 in <module>' in r.stderr


def test_the_users_own_faulthandler_is_kept(tmp_path):
    log = tmp_path / "crash.log"
    code = f"import faulthandler\nf = open({str(log)!r}, 'w')\nfaulthandler.enable(file=f)\n" + CRASH
    r = run_python(code)
    assert r.returncode == -11
    assert "Fatal Python error: Segmentation fault" in log.read_text()  # their file, not stderr
    assert "Fatal Python error" not in r.stderr
    assert "while the device ran op 'test::reads_null'" in r.stderr  # the runtime's note, chained before theirs


def test_a_users_signal_handler_is_left_alone():
    code = ("import signal\nsignal.signal(signal.SIGSEGV, lambda *a: None)\n"
            "import faulthandler, nativelab\nprint(faulthandler.is_enabled())")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
