"""The `neuron` process-group backend, FSDP2 / DDP on the device, DCP checkpoints and torchrun behaviour.

Multi-process tests run real torchrun jobs (ranks in tests/distributed_worker.py or the lab script) on free
ports and are marked slow; the rest run in this process with a one-rank group."""

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import nativelab.distributed as nd
from conftest import run_python
from nativelab.distributed import checkpoint

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_worker.py"
LAB = ROOT / "labs" / "lab1" / "distributed_fsdp.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, nproc: int, env=None, timeout: int = 180, extra=()) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), *extra]
    if "--rdzv_endpoint" not in extra:
        cmd += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"localhost:{free_port()}"]
    full_env = dict(os.environ, NATIVELAB_QUIET="1", OMP_NUM_THREADS="1", **(env or {}))
    start = time.perf_counter()
    r = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, env=full_env, timeout=timeout)
    return r, time.perf_counter() - start


def losses(out: str) -> dict[int, float]:
    return {int(i): float(v) for i, v in re.findall(r"^Iteration (\d+)/\d+, Loss: ([0-9.]+)$", out, re.M)}


# -- registration and a one-rank group in this process ---------------------------------------------------------


def test_neuron_is_a_registered_backend_and_the_device_default():
    assert "neuron" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["neuron"] == "neuron"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # CPU's own default is left alone
    cfg = dist.distributed_c10d.BackendConfig(dist.Backend.UNDEFINED)
    assert cfg.get_device_backend_map() == {"neuron": "neuron"}
    cfg = dist.distributed_c10d.BackendConfig("cpu:gloo,neuron:neuron")
    assert cfg.get_device_backend_map() == {"cpu": "gloo", "neuron": "neuron"}


@pytest.fixture
def one_rank_group():
    dist.init_process_group(backend="neuron", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_one_rank_group_by_explicit_name(one_rank_group):
    assert isinstance(one_rank_group, nd.NeuronProcessGroup) and one_rank_group.name() == "neuron"
    x = torch.arange(6.0).reshape(2, 3)
    t = x.to("neuron:0") * 2  # still queued when the collective starts
    dist.all_reduce(t)
    assert t.device == torch.device("neuron", 0) and torch.equal(t.cpu(), x * 2)
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    assert work.wait() and torch.equal(t.cpu(), x * 2)
    out = torch.empty(2, 3, device="neuron")
    dist.all_gather_into_tensor(out, t)
    assert torch.equal(out.cpu(), x * 2)
    cpu = torch.ones(3)
    dist.all_reduce(cpu)  # the same group serves CPU tensors
    assert torch.equal(cpu, torch.ones(3))
    with pytest.raises(ValueError, match="AVG needs floating-point"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32, device="neuron"), op=dist.ReduceOp.AVG)
    with pytest.raises(ValueError, match="PREMUL_SUM is not supported"):
        dist.reduce_scatter_tensor(out[0], t, op=dist._make_nccl_premul_sum(0.5))


def test_collectives_write_device_memory_in_place(one_rank_group):
    t = torch.arange(4.0, device="neuron")
    ptr = t.data_ptr()
    dist.broadcast(t, src=0)
    dist.all_reduce(t)
    assert t.data_ptr() == ptr and t.untyped_storage().data_ptr() == ptr


def test_a_collective_is_device_work_of_its_own_kind_in_a_trace(one_rank_group, tmp_path):
    import json

    from torch.profiler import ProfilerActivity, profile

    t = torch.arange(6.0, device="neuron")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        u = t * 2  # still queued: the collective runs after it
        dist.all_reduce(u)
        host = u.cpu()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    work = sorted((e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"),
                  key=lambda e: e["ts"])
    assert [(e["name"], e["args"]["kind"]) for e in work] == [
        ("neuron::mul.Tensor", "op"), ("neuron::all_reduce", "collective"), ("neuron::memcpy_device_to_host", "copy")]
    assert torch.equal(host, torch.arange(6.0) * 2)


def test_bound_device_subgroups_and_device_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("neuron", 0))
    try:
        assert isinstance(dist.group.WORLD, nd.NeuronProcessGroup)  # the device's default backend
        sub = dist.new_group([0])
        assert isinstance(sub, nd.NeuronProcessGroup)
        t = torch.full((2,), 3.0, device="neuron")
        dist.all_reduce(t, group=sub)
        assert t.cpu().tolist() == [3.0, 3.0]
        assert init_device_mesh("neuron", (1,)).device_type == "neuron"
    finally:
        dist.destroy_process_group()


def _gloo_threads() -> int:
    """gloo's worker threads in this process (named by PyTorch), read from the kernel."""
    tasks = Path("/proc/self/task")
    return sum((t / "comm").read_text().strip() == "pt_gloo_runloop" for t in tasks.iterdir())


def test_destroy_joins_gloo_threads_though_the_group_object_lives_on():
    """gloo's threads release finished collectives' tensors (Python objects): one still running when Python
    finalizes aborts the process ("terminate called without an active exception", seen under load). The group
    object can outlive destroy_process_group() (here this test's reference; in a real job the defaults of
    torch.distributed.nn.functional, imported after init), so the backend must go at destroy."""
    before = _gloo_threads()
    dist.init_process_group(backend="neuron", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    t = torch.ones(3, device="neuron") * 2
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).get_future().wait()
    assert _gloo_threads() > before
    dist.destroy_process_group()
    assert _gloo_threads() == before
    with pytest.raises(RuntimeError, match="used after destroy_process_group"):
        group.allreduce([t])


def test_exit_without_destroy_stops_gloo_threads_before_python_finalizes():
    code = (
        "import atexit, os\n"
        "def gloo():  # registered before nativelab's handler, so it runs after it\n"
        "    names = [open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')]\n"
        "    print('gloo threads at exit:', names.count('pt_gloo_runloop'), flush=True)\n"
        "atexit.register(gloo)\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group(backend='neuron', store=dist.HashStore(), rank=0, world_size=1)\n"
        "import torch.distributed.nn  # keeps the world group in its defaults\n"
        "t = torch.ones(3, device='neuron')\n"
        "dist.all_reduce(t)\n"
        "import time\n"
        "def running():\n"
        "    return sum(open(f'/proc/self/task/{t}/comm').read().strip() == 'pt_gloo_runloop'\n"
        "               for t in os.listdir('/proc/self/task'))\n"
        "deadline = time.monotonic() + 10  # a worker names itself once it runs: wait for both names\n"
        "while running() < 2 and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print('running:', running(), flush=True)\n"
    )
    r = run_python(code, env={"NATIVELAB_QUIET": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "running: 2" in r.stdout and "gloo threads at exit: 0" in r.stdout, r.stdout


def test_exit_leaves_a_group_with_a_collective_in_flight_alone():
    """Joining a worker blocked on a peer would hang the exit: such a group is not released."""
    import threading
    from datetime import timedelta

    store, groups = dist.HashStore(), [None, None]

    def make(rank):  # gloo's constructor connects the two ranks: build them concurrently
        groups[rank] = nd.NeuronProcessGroup(store, rank, 2, timedelta(seconds=60))

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    g0, g1 = groups
    got = torch.zeros(2, device="neuron")
    recv = g0.recv([got], 1, 0)  # rank 1 has not sent yet
    assert not g0.release(only_if_idle=True)
    g1.send([torch.tensor([5.0, 6.0], device="neuron")], 0, 0).wait()
    recv.wait()
    assert got.cpu().tolist() == [5.0, 6.0]
    assert g0.release(only_if_idle=True) and g1.release(only_if_idle=True)


def test_bind_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert nd.bind_local_rank() == torch.device("neuron", 2) and torch.neuron.current_device() == 2
    monkeypatch.setenv("LOCAL_RANK", "4")
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=4 needs neuron:4, but this host has 4 logical NeuronCores"):
        nd.bind_local_rank()
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK='x'"):
        nd.bind_local_rank()


# -- checkpoints (one process: DCP runs without a process group) -----------------------------------------------


def test_checkpoint_roundtrip_and_interrupted_write_keeps_the_last_good_one(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    assert checkpoint.load({"w": torch.zeros(3, device="neuron")}, tmp_path) is None  # nothing saved yet
    good = torch.arange(3.0, device="neuron")
    checkpoint.save({"w": good}, tmp_path, 1)

    def die(self, metadata, results):  # the data files are written, the metadata never is
        raise OSError("disk full (simulated)")

    with monkeypatch.context() as m:
        m.setattr(dcp.FileSystemWriter, "finish", die)
        with pytest.raises(dcp.api.CheckpointException) as failed:
            checkpoint.save({"w": good * 100}, tmp_path, 2)
    assert "disk full" in str(failed.value.failures)
    assert (tmp_path / ".step_00000002.tmp").is_dir() and not (tmp_path / "step_00000002").exists()
    state = {"w": torch.zeros(3, device="neuron")}
    assert checkpoint.load(state, tmp_path) == 1 and torch.equal(state["w"].cpu(), torch.arange(3.0))

    checkpoint.save({"w": good * 100}, tmp_path, 2)  # a later save clears the debris
    assert not (tmp_path / ".step_00000002.tmp").exists()
    assert checkpoint.load(state, tmp_path) == 2 and torch.equal(state["w"].cpu(), torch.arange(3.0) * 100)
    checkpoint.save({"w": good}, tmp_path, 3, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "step_00000002", "step_00000003"]


def test_checkpoint_bad_input(tmp_path):
    with pytest.raises(ValueError, match="non-negative int"):
        checkpoint.save({"w": torch.zeros(1)}, tmp_path, -1)
    (tmp_path / "LATEST").write_text("step_00000009\n")
    with pytest.raises(RuntimeError, match="is not a complete checkpoint"):
        checkpoint.load({"w": torch.zeros(1)}, tmp_path)


# -- multi-process: real torchrun jobs ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_collectives_against_single_process_reference(world):
    r, _ = torchrun([WORKER, "collectives"], world)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    for rank in range(world):
        assert f"collectives ok on rank {rank}/{world} (neuron:{rank})" in r.stdout


@pytest.mark.slow
def test_fsdp2_and_ddp_match_single_process_training():
    r, _ = torchrun([WORKER, "train"], 2, env={"TEST_BACKEND": "cpu:gloo,neuron:neuron"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    for mode in ("fsdp", "ddp", "fsdp-bf16"):
        assert f"{mode} matches single-process training" in r.stdout


@pytest.fixture(scope="module")
def uninterrupted():
    """Four FSDP2 iterations on 2 ranks, no checkpoints: the reference for resume and two-node runs."""
    r, _ = torchrun([LAB, "--iterations", 4, "--digits", 8], 2)
    assert r.returncode == 0, r.stderr[-5000:]
    got = losses(r.stdout)
    assert sorted(got) == [1, 2, 3, 4] and got[4] < got[1]
    return got


@pytest.mark.slow
def test_failed_rank_exits_nonzero_then_resume_reproduces_uninterrupted_losses(uninterrupted, tmp_path):
    ckpt = tmp_path / "ckpt"
    run = [LAB, "--iterations", 4, "--digits", 8, "--checkpoint-dir", ckpt]
    r, seconds = torchrun(run + ["--fail-at", 2, "--fail-rank", 1], 2)
    assert r.returncode != 0
    assert "RuntimeError: injected failure on rank 1 after iteration 2" in r.stderr  # that rank's error shown
    assert seconds < 90, f"the failed job took {seconds:.0f} s to exit"
    assert (ckpt / "LATEST").read_text().strip() == "step_00000002"
    assert losses(r.stdout) == {1: uninterrupted[1], 2: uninterrupted[2]}

    r, seconds = torchrun(run + ["--fail-at", 3, "--fail-rank", 0, "--fail-how", "kill"], 2)  # kill -9 rank 0
    assert r.returncode != 0 and "Signal 9 (SIGKILL)" in r.stderr and seconds < 90
    assert "Resumed from iteration 2" in r.stdout and losses(r.stdout) == {3: uninterrupted[3]}

    r, _ = torchrun(run, 2)
    assert r.returncode == 0, r.stderr[-5000:]
    assert "Resumed from iteration 3" in r.stdout
    assert losses(r.stdout) == {4: uninterrupted[4]}  # exactly


@pytest.mark.slow
def test_two_nodes_on_loopback_train_like_one(uninterrupted):
    port = free_port()
    rdzv = ["--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"localhost:{port}", "--rdzv_id", "twonode"]
    env = dict(os.environ, NATIVELAB_QUIET="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", *rdzv,
           str(LAB), "--iterations", "4", "--digits", "8"]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [n.communicate(timeout=180) for n in nodes]
    assert all(n.returncode == 0 for n in nodes), "\n".join(o[1][-3000:] for o in outs)
    out = "".join(o[0] for o in outs)
    assert "[Rank 0/2] Initialized on neuron:0" in out and "[Rank 1/2] Initialized on neuron:0" in out
    assert losses(out) == uninterrupted  # one rank per node: same data, same sums


@pytest.mark.slow
def test_the_guides_command():
    env = {"NEURON_RT_VIRTUAL_CORE_SIZE": "2", "NEURON_RT_NUM_CORES": "4"}
    r, _ = torchrun([LAB], 4, env=env)
    assert r.returncode == 0, r.stderr[-5000:]
    for rank in range(4):
        assert f"[Rank {rank}/4] Initialized on neuron:{rank}" in r.stdout
    got = losses(r.stdout)
    assert sorted(got) == [1, 2, 3, 4, 5]
    assert all(got[i + 1] < got[i] for i in range(1, 5)), got
    assert r.stdout.rstrip().endswith("Training complete!")
