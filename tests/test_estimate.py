"""The Trainium2 estimate's model of a token's time (check/estimate.py, figures in check/hardware.py): each term
against its formula and its cited figure, and the model's predictions of the guide's Lab 2 figures."""

from __future__ import annotations

import pytest
import torch

from nativelab.check import Check, Trainium2
from nativelab.check.estimate import estimate, fit, graph_work
from nativelab.models.llama import Generator, Llama, Sampling

PROMPT = [1, 15043, 29892, 590, 1024, 338]


def test_the_figures_are_their_published_measurements():
    hw = Trainium2()
    assert hw.graph_launch_s == pytest.approx((170e-6 + 190e-6) / 2)  # aws-neuron-sdk#1370: 170-190 us
    assert hw.eager_launch_s == pytest.approx(214.762e-6, rel=2e-3)  # pytorch/xla#3306: median 214.762 us
    assert hw.dma_fixed_s == 1.3e-6  # nki-dma-bandwidth-guide: ~1300 ns semaphore-to-start
    assert hw.kernel_boundary_s == 2 * hw.dma_fixed_s  # an HBM write and a load, a DMA each
    assert hw.instruction_s == pytest.approx(264 / 1.4e9, rel=5e-3)  # nki_perf_guide: 264 cycles, 189 ns
    assert hw.host_round_trip_s == pytest.approx(((439 - 378) + (272 - 186)) / 2 * 1e-6)  # nki.benchmark on trn2
    assert hw.host_link_bytes_per_s == pytest.approx(16e9 * 16 * 128 / 130 / 8, rel=1e-3)  # PCIe 4.0 x16
    # one fitted constant, named with its measurement
    assert Trainium2.FITTED == "host_step_s" and Trainium2.FITTED in Trainium2.OUTSIDE_KERNELS
    assert hw.as_dict()["fitted"] == {"host_step_s": "fitted: the guide's core tier, 435.3 tok/s "
                                                      "(bench/check_estimate.py)"}


def _compiled_steps(n: int):
    x = torch.arange(64, dtype=torch.float32).to("neuron")
    f = torch.compile(lambda t: (t * 2 + 1).relu(), backend="neuron")
    f(x)  # compiled outside the check
    with Check("graph") as c:
        for _ in range(n):
            y = f(x)
        torch.neuron.synchronize()
    assert torch.equal(y.cpu(), (torch.arange(64.0) * 2 + 1).relu())
    return c


def test_a_compiled_graph_costs_a_launch_and_a_boundary_per_kernel():
    c = _compiled_steps(4)
    e, hw = c.report().estimate, c.hardware
    graphs = [(name, st) for name, st in c.watch.ops.items() if st.kind == "graph"]
    assert [st.calls for _, st in graphs] == [4]
    kernels, _ = graph_work(c.watch.sources[graphs[0][0]][0], False)
    assert kernels == 3  # mul, add, relu: each a kernel whose result goes to HBM
    assert e["counts"]["launches"] == 4 and e["counts"]["kernel_boundaries"] == 4 * 3
    assert e["parts"]["graph launches"] == pytest.approx(4 * hw.graph_launch_s)
    assert e["parts"]["kernel boundaries"] == pytest.approx(4 * 3 * 2 * hw.dma_fixed_s)
    st = graphs[0][1]
    roofline = (st.read + st.written) / (hw.hbm_bytes_per_s * hw.lnc / hw.physical_cores)  # no matmul FLOPs
    assert e["parts"]["kernels"] == pytest.approx(4 * 3 * hw.instruction_s + roofline)
    assert e["parts"]["host loop"] == 0  # steps that are not tokens have no host loop figure


def test_a_cpu_fallback_costs_a_round_trip_its_bytes_and_its_cpu_time():
    x = torch.randn(1000).to("neuron")
    with Check("fallback") as c:
        for _ in range(3):
            values, indices = torch.sort(x, stable=True)
        torch.neuron.synchronize()
    assert torch.equal(values.cpu(), torch.sort(x.cpu(), stable=True).values)
    e, hw = c.report().estimate, c.hardware
    (ev,) = c.watch.fallback_sites.values()
    assert ev.count == 3
    assert ev.to_host == 3 * x.nbytes and ev.to_device == 3 * (values.nbytes + indices.nbytes)
    # the CPU sort itself, as the emulator ran it on this host: each call at the fastest one's time
    assert 0 < ev.fastest <= ev.seconds / 3
    assert e["parts"]["CPU fallbacks"] == pytest.approx(
        3 * hw.host_round_trip_s + 3 * (x.nbytes + values.nbytes + indices.nbytes) / hw.host_link_bytes_per_s
        + 3 * ev.fastest)


def test_the_host_loop_is_charged_once_per_generated_token():
    gen = Generator(Llama.random("tiny", seed=0).copy_as("base", torch.float32, "neuron"), Sampling(greedy=True))
    with Check("tokens", tokens=True) as c:
        out = gen.generate([1, 15, 29], 5)
    e, hw = c.report().estimate, c.hardware
    assert e["counts"]["tokens"] == c.watch.steps == len(out) == 5
    assert e["parts"]["host loop"] == pytest.approx(5 * hw.host_step_s)
    assert e["parts_per"]["host loop"] == pytest.approx(hw.host_step_s)


def test_the_fit_solves_for_the_one_fitted_constant():
    c = _compiled_steps(3)
    w = c.watch
    target = 2 * estimate(w, Trainium2(), 3)["seconds_per"]
    w.step_kind, w.steps = "token", 3  # the same work as three tokens: one host loop each
    value = fit(w, target, 3)
    assert estimate(w, Trainium2(host_step_s=value), 3)["seconds_per"] == pytest.approx(target)
    without = estimate(w, Trainium2(host_step_s=0.0), 3)["seconds_per"]
    assert value == pytest.approx(target - without)


def _lab2_watches(cases, tokens: int = 8):
    import os
    import sys

    from nativelab.models.llama.model import LAB2
    sys.path.insert(0, os.fspath(LAB2))
    source = Llama.random("small", seed=0)
    out = {}
    for tier, sampling in cases:
        gen = Generator(source.copy_as(tier, torch.bfloat16, "neuron"), sampling).compile()
        gen.generate(PROMPT, 8)
        with Check(tier, tokens=True) as c:
            gen.generate(PROMPT, tokens)
        out[tier] = c.watch
    return out


@pytest.mark.slow  # the three tiers of the small model, compiled
def test_the_estimate_predicts_the_guides_lab2_tiers():
    """Fitted on core's 435.3 tok/s (host_step_s), the model predicts base's 359 and experimental's 537.4 within
    20%, and the guide's order: core/base >= 1.15x, experimental/base >= 1.4x."""
    guide = {"base": 359.0, "core": 435.3, "experimental": 537.4}
    # 20 tokens, as the fit (bench/check_estimate.py): the prompt's launches are spread over the tokens generated
    watches = _lab2_watches([(t, Sampling(greedy=True)) for t in guide], tokens=20)
    ests = {t: estimate(w, Trainium2(), w.steps) for t, w in watches.items()}
    rate = {t: 1.0 / e["seconds_per"] for t, e in ests.items()}
    parts = {t: {k: round(v * 1e3, 3) for k, v in e["parts_per"].items()} for t, e in ests.items()}  # for a failure
    assert rate["core"] == pytest.approx(guide["core"], rel=0.05)  # the fit still holds (else refit it)
    for t in ("base", "experimental"):
        assert rate[t] == pytest.approx(guide[t], rel=0.20), (t, rate, parts)
    assert rate["core"] / rate["base"] >= 1.15 and rate["experimental"] / rate["base"] >= 1.4, (rate, parts)


def test_profile_and_check_split_the_same_program_alike():
    """`nativelab profile` prices its session with the check's model: the same launches, kernel boundaries,
    fallbacks and syncs, so every part but the measured CPU time of the fallbacks agrees."""
    from nativelab.check.estimate import estimate as est
    from nativelab.profile import Session

    x = torch.arange(64, dtype=torch.float32).to("neuron")
    f = torch.compile(lambda t: (t * 2 + 1).relu(), backend="neuron")
    f(x)

    def program():
        for _ in range(3):
            y = f(x)
            torch.sort(y, stable=True)  # a fallback
            y.sum().item()  # a sync
        torch.neuron.synchronize()

    with Session("profiled", timeline=False) as s:
        program()
    with Check("checked") as c:
        program()
    hw = Trainium2()
    p, k = est(s, hw), est(c.watch, hw)
    for key in ("launches", "eager_ops", "kernel_boundaries", "fallback_calls", "sync_calls"):
        assert p["counts"][key] == k["counts"][key], key
    assert p["counts"]["launches"] == 3 and p["counts"]["fallback_calls"] == 3 and p["counts"]["sync_calls"] == 3
    for part in ("graph launches", "eager op launches", "kernel boundaries", "host syncs", "host loop"):
        assert p["parts"][part] == pytest.approx(k["parts"][part]), part
