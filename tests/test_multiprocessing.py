"""Spawned subprocesses get their own device (the entry point registers it in each one)."""

import torch
import torch.multiprocessing as mp

import subprocess
import sys


def _run_script(tmp_path, code: str, timeout: int):
    # A file, not `python -c`: spawned children import the parent's __main__ to find the functions they run.
    script = tmp_path / "main.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout)


def _worker(rank, q):
    import torch

    x = torch.full((4,), float(rank + 1)).to(f"neuron:{rank}")
    y = (x * 10).sum()
    q.put((rank, str(y.device), y.item(), torch.neuron.device_count()))


def test_spawned_workers_use_the_device():
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(q,), nprocs=2, start_method="spawn", join=True)
    results = sorted(q.get() for _ in range(2))
    assert results == [(0, "neuron:0", 40.0, 4), (1, "neuron:1", 80.0, 4)]


def test_device_tensors_are_passed_to_workers_as_host_copies_back():
    # Device tensors cross process boundaries by value through the host, like CUDA tensors without IPC.
    x = torch.arange(6.0).to("neuron")
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        out = pool.apply(torch.mul, (x.cpu(), 2))
    assert torch.equal(out, torch.arange(6.0) * 2)


# Device tensors cannot be shared across processes (the emulated device's memory is not shared memory): every
# way of sending one fails at once with the same clear error, in a bounded time, never a hang.
SEND = """
import time, torch, torch.multiprocessing as mp

def receive(q, out):
    try:
        out.put(("received", str(q.get(timeout=60))))
    except Exception as e:
        out.put((type(e).__name__, str(e)))

def make_on_device():
    return torch.ones(2, device="neuron")

if __name__ == "__main__":
    x = torch.arange(4.0).to("neuron")
    ctx = mp.get_context("spawn")
    # multiprocessing.Queue pickles in a feeder thread: the receiver's get() raises
    q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=receive, args=(q, out))
    p.start()
    q.put(x)
    kind, msg = out.get(timeout=90)
    p.join(30)
    print("queue", kind, "cannot be sent to another process" in msg and "t.cpu()" in msg)
    # Pool: the sender raises, for arguments and for results
    with ctx.Pool(1) as pool:
        for fn, args in ((torch.mul, (x, 2)), (make_on_device, ())):
            try:
                pool.apply(fn, args)
                print("pool", "no error")
            except Exception as e:
                print("pool", "cannot be sent to another process" in str(e))
        # The documented way: a CPU tensor there, results back on the host
        print("cpu", torch.equal(pool.apply(torch.mul, (x.cpu(), 2)), torch.arange(4.0) * 2))
    # A pipe pickles in the caller: raises there
    a, b = ctx.Pipe()
    try:
        a.send(x.untyped_storage())
        print("pipe", "no error")
    except Exception as e:
        print("pipe", type(e).__name__)
"""


def test_sending_a_device_tensor_fails_at_once_with_a_clear_error(tmp_path):
    out = _run_script(tmp_path, SEND, timeout=240)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()[-5:]
    assert lines == ["queue SharingError True", "pool True", "pool True", "cpu True", "pipe SharingError"], out.stdout


# CUDA's rule: a child forked after the parent initialised the device cannot use it; before, it can.
FORK = """
import torch, multiprocessing as mp

def use_device(out):
    try:
        out.put(("ok", (torch.ones(3).to("neuron") * 2).cpu().tolist()))
    except Exception as e:
        out.put((type(e).__name__, str(e)))

def cpu_only(out):
    out.put(("ok", (torch.ones(3) * 2).tolist()))

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    for initialise in (False, True):
        if initialise:
            (torch.ones(2, device="neuron") + 1).cpu()
        for fn in (use_device, cpu_only):
            out = ctx.Queue()
            p = ctx.Process(target=fn, args=(out,))
            p.start()
            kind, res = out.get(timeout=60)
            p.join(30)
            print(initialise, fn.__name__, kind,
                  res if kind == "ok" else ("forked subprocess" in res and "'spawn' start method" in res))
"""


def test_forked_child_of_an_initialised_device_gets_cudas_error(tmp_path):
    out = _run_script(tmp_path, FORK, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-4:] == [
        "False use_device ok [2.0, 2.0, 2.0]",
        "False cpu_only ok [2.0, 2.0, 2.0]",
        "True use_device RuntimeError True",
        "True cpu_only ok [2.0, 2.0, 2.0]",
    ], out.stdout


# OpenReg's test_device_poison_fork: init() in the parent, then init() in a forked child raises CUDA's error.
FORK_INIT = """
import torch, multiprocessing as mp

def child(out):
    was = torch.neuron.is_initialized()
    try:
        torch.neuron.init()
        out.put((was, "ok", torch.neuron.is_initialized()))
    except Exception as e:
        out.put((was, type(e).__name__, str(e).startswith(CUDAS.replace("CUDA", "neuron"))))

if __name__ == "__main__":
    import inspect, re, torch.cuda
    # CUDA's sentence as torch.cuda raises it (code and OpenReg's test match the text with the device's name)
    src = inspect.getsource(torch.cuda._lazy_init)
    CUDAS = "".join(re.findall(r'"([^"]*)"', src[src.index("Cannot re-initialize CUDA") - 1:].split(")")[0]))
    assert CUDAS.startswith("Cannot re-initialize CUDA in forked subprocess") and "'spawn'" in CUDAS, CUDAS
    ctx = mp.get_context("fork")
    for initialise in (False, True):
        if initialise:
            torch.neuron.init()
        out = ctx.Queue()
        p = ctx.Process(target=child, args=(out,))
        p.start()
        print(initialise, *out.get(timeout=60), torch.neuron.is_initialized())
        p.join(30)
"""


def test_init_in_a_child_forked_after_init_raises_cudas_error(tmp_path):
    out = _run_script(tmp_path, FORK_INIT, timeout=180)
    assert out.returncode == 0, out.stderr
    # Before: the child initialises. After: is_initialized() is False in the child and init() raises; the
    # parent stays initialised.
    assert out.stdout.splitlines()[-2:] == ["False False ok True False", "True False RuntimeError True True"], (
        out.stdout)


# torch.neuron._is_in_bad_fork(): what torch.manual_seed / torch.seed ask before seeding the device (CUDA's too).
BAD_FORK = """
import torch, multiprocessing as mp

def child(out):
    torch.manual_seed(0)  # asks torch.neuron._is_in_bad_fork() before seeding the device
    out.put((torch.neuron._is_in_bad_fork(), torch.rand(3).tolist()))

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    torch.manual_seed(0)
    ref = torch.rand(3).tolist()
    for initialise in (False, True):
        if initialise:
            (torch.ones(2, device="neuron") + 1).cpu()
        out = ctx.Queue()
        p = ctx.Process(target=child, args=(out,))
        p.start()
        bad, drawn = out.get(timeout=60)
        p.join(30)
        print(initialise, bad, drawn == ref, torch.neuron._is_in_bad_fork())
"""


def test_is_in_bad_fork_in_a_child_forked_after_device_use(tmp_path):
    out = _run_script(tmp_path, BAD_FORK, timeout=180)
    assert out.returncode == 0, out.stderr
    # child forked before any device use: fine; after: bad. The parent never is; CPU seeding works in both.
    assert out.stdout.splitlines()[-2:] == ["False False True False", "True True True False"], out.stdout
