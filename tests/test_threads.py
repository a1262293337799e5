"""The host thread policy: the team shrinks by the cores other processes keep busy, and its knobs."""

import pytest
import torch

from nativelab.device import cpu_info, state, threads


@pytest.fixture
def fresh_policy(monkeypatch):
    saved = torch.get_num_threads()
    monkeypatch.setattr(threads, "_state", {"most": None, "next": 0.0, "last": None, "others": 0.0})
    yield
    torch.set_num_threads(saved)


def test_target_leaves_the_busy_cores_to_others():
    assert threads.target(2, 0.0) == 2
    assert threads.target(2, 0.4) == 2  # a mostly idle neighbour costs no thread
    assert threads.target(2, 0.6) == 1
    assert threads.target(2, 3.0) == 1  # never below one
    assert threads.target(8, 2.5) == 5


def test_others_subtracts_this_process():
    tick = threads._TICK
    # 1 s: the machine used 1.5 cores, this process 0.5 of them -> others used 1.0
    assert threads.others((0.0, 0, 0), (1.0, int(1.5 * tick), int(0.5 * tick))) == pytest.approx(1.0, abs=0.02)
    assert threads.others((0.0, 0, 0), (1.0, 0, 10)) == 0.0


def test_team_follows_the_load_and_restores_the_users_count(fresh_policy, monkeypatch):
    monkeypatch.setattr(state.device, "threads", "auto")
    monkeypatch.setattr(threads, "_cores", lambda: 2)
    torch.set_num_threads(2)
    tick = threads._TICK
    samples = iter([(0.0, 0, 0), (1.0, 2 * tick, tick), (2.0, 2 * tick + 1, tick + 1)])
    monkeypatch.setattr(threads, "cpu_sample", lambda: next(samples))
    seen = []
    for _ in range(3):
        threads._state["next"] = 0.0  # the next look is due
        with threads.team():
            seen.append(torch.get_num_threads())
        assert torch.get_num_threads() == 2  # what the user's code (and Dynamo's guards) see
    assert seen == [2, 1, 2]  # quiet; others kept one core busy; quiet again


def test_fixed_thread_count(fresh_policy):
    torch.set_num_threads(2)
    with state.device.mode(threads=1):
        assert threads.ceiling() == 1
        with threads.team():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    assert state.device.threads == "auto"  # NATIVELAB_THREADS unset


def test_device_work_runs_with_the_policys_team(fresh_policy, monkeypatch):
    monkeypatch.setattr(state.device, "threads", 1)
    torch.set_num_threads(2)
    x = torch.ones(4).to("neuron")
    seen = []
    from nativelab.device import queue

    queue.launch("op", "probe", lambda: seen.append(torch.get_num_threads()))
    torch.neuron.synchronize()
    assert seen == [1] and torch.get_num_threads() == 2
    assert x.sum().item() == 4


@pytest.mark.parametrize("bad", ["0", "two", "-3"])
def test_bad_thread_setting_is_an_error(bad):
    with pytest.raises(ValueError, match=f"NATIVELAB_THREADS='{bad}': expected auto or a thread count >= 1"):
        state.device.set(threads=bad)
    assert state.device.threads == "auto"



def test_describe_names_cpu_and_isa():
    text = threads.describe()
    assert cpu_info.isa() in text and cpu_info.model() in text


def test_a_reaped_child_counts_as_this_process():
    """A compiler this process ran (and waited for) is its own load, not another process's: the window over
    it must not shrink the team once it is over."""
    import subprocess
    import sys

    prev = threads.cpu_sample()
    # spins until it has used 0.5 s of CPU (not of wall time: on a loaded machine half a second of wall time
    # gave the child 0.15 s of CPU)
    busy = "import os\nwhile sum(os.times()[:2]) < 0.5: pass\nprint(sum(os.times()[:2]))"
    child_cpu = float(subprocess.run([sys.executable, "-c", busy], capture_output=True, text=True,
                                     check=True).stdout)  # the child's own account of its CPU time
    now = threads.cpu_sample()
    assert child_cpu > 0.3
    assert (now[2] - prev[2]) / threads._TICK >= 0.9 * child_cpu  # ours: in this process's ticks


def test_the_users_thread_count_caps_the_next_device_work_as_it_does_the_next_cpu_op(fresh_policy, monkeypatch):
    """ATen's reductions split their partial sums by the thread count, so device work must run on the count the
    calling thread has now, as CPU's next op does: a team sized from a count cached up to 0.25 s earlier (or read
    in another thread: a DataLoader's pin-memory thread sets its own to 1) sums 128 x 784 floats to other bits
    than CPU's (1 ulp in pytorch/examples' VAE loss)."""
    from nativelab.device import queue

    monkeypatch.setattr(state.device, "threads", "auto")
    monkeypatch.setattr(threads, "_cores", lambda: 2)
    monkeypatch.setattr(threads, "cpu_sample", lambda: None)  # a quiet machine: no other process's load
    monkeypatch.setattr(threads, "INTERVAL", 1e9)  # no fresh look at the machine between the calls below
    x = torch.rand(128, 784, generator=torch.Generator().manual_seed(1))
    want = {}
    for n in (2, 1):
        torch.set_num_threads(n)
        want[n] = x.sum()
        seen = []
        queue.launch("op", "probe", lambda: seen.append(torch.get_num_threads()))
        got = x.to("neuron").sum().cpu()
        assert seen == [n]
        assert torch.equal(got, want[n]), (n, got.item(), want[n].item())
    if torch.equal(want[1], want[2]):  # the bits this CPU's kernel gives at 1 and 2 threads told apart above
        pytest.skip("this CPU's sum kernel gives the same bits on 1 and 2 threads")
