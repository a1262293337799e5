"""NKI launches in `nativelab profile` and `nativelab check`: a session (and a check, whose watch is one) sees
each launch with the estimate of nki/cost.py, in its summary, its table, and its Chrome trace's engine lanes.
The expected figures are computed here from the cost model's published rules, not read from it."""

import json

import pytest
import torch

from nativelab import nki
from nativelab.nki import language as nl
from nativelab.profile import Session

P, F = 128, 512
HBM_SHARE = 2.9e12 / 8  # a core's share of the chip's HBM bandwidth, bytes/s
DMA_LATENCY = 600e-9  # per DGE DMA
VECTOR_HZ = 0.96e9


@nki.jit
def profiled_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


def _expected():
    """Two loads share the DMA bandwidth one after another; the add (max(2F, 64) Vector cycles: two input
    tiles, "roughly 2N cycles" in AWS's Vector Engine cost model) waits for both; the store for the add."""
    tile = P * F * 4 / HBM_SHARE
    vector = max(2 * F, 64) / VECTOR_HZ
    total = (2 * tile + DMA_LATENCY) + vector + (tile + DMA_LATENCY)
    return total, {"dma": 3 * tile, "vector": vector}


def _args(device="cpu"):
    return torch.randn(P, F).to(device), torch.randn(P, F).to(device)


def test_a_session_reports_nki_launches_with_their_estimate(tmp_path):
    from nativelab.profile import report, trace

    total, busy = _expected()
    a, b = _args()
    with Session("nki") as s:
        for _ in range(3):
            torch.testing.assert_close(nki.simulate(profiled_add)(a, b), a + b)
    k = s.summary()["nki_kernels"]["profiled_add"]
    assert k["calls"] == 3
    assert k["est_trn2_us"] == pytest.approx(total * 1e6)
    assert k["bound"] == "dma"
    assert k["busy_us"] == pytest.approx({e: v * 1e6 for e, v in busy.items()})
    assert k["instructions"] == 4

    import io

    from rich.console import Console

    out = io.StringIO()
    report.print_report(s, console=Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "NKI kernels" in text and "profiled_add" in text and f"{total * 1e6:,.2f}" in text

    path = tmp_path / "trace.json"
    trace.write_trace(path, [s])
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    engine_lanes = {tid: name for tid, name in lanes.items() if "NeuronCore-v3" in name}
    assert len(engine_lanes) == 5 and any("tensor" in n for n in engine_lanes.values())
    nki_events = [e for e in events if e.get("cat") == "nki"]
    assert [e["name"] for e in nki_events] == ["nl.load", "nl.load", "nl.add", "nl.store"] * 3
    first = nki_events[:4]
    assert {lanes[e["tid"]] for e in first} == {"NeuronCore-v3 dma (NKI, estimated)",
                                                "NeuronCore-v3 vector (NKI, estimated)"}
    assert first[2]["dur"] == pytest.approx(busy["vector"] * 1e6)
    assert first[3]["ts"] + first[3]["dur"] - first[0]["ts"] == pytest.approx(total * 1e6)
    for prev, nxt in zip(nki_events[3::4], nki_events[4::4]):  # launches do not overlap on the lanes
        assert nxt["ts"] >= prev["ts"] + prev["dur"] - 1e-6


def test_check_lists_the_nki_kernels_launched_with_their_estimate():
    from nativelab.check import Check

    total, _ = _expected()
    a, b = _args()
    with Check("nki") as c:
        nki.simulate(profiled_add)(a, b)
        nki.simulate(profiled_add)(a, b)
    r = c.report()
    k = r.as_dict()["nki_kernels"]["profiled_add"]
    assert k["calls"] == 2 and k["est_trn2_us"] == pytest.approx(total * 1e6) and k["bound"] == "dma"
    text = r.text()
    assert "NKI kernels launched" in text and "profiled_add" in text and f"{total * 1e6:,.2f}" in text
    assert f"| `profiled_add` | 2 | {total * 1e6:,.2f} | dma |" in r.markdown()


def test_without_nki_launches_no_section():
    with Session("plain") as s:
        (torch.ones(4).to("neuron") + 1).cpu()
    assert s.summary()["nki_kernels"] == {}


def test_checks_estimate_prices_an_nki_launch_at_its_own_estimate(tmp_path, monkeypatch):
    """Compiled launches on the device are seen as kernels with their estimate, and `nativelab check`'s
    Trainium2 estimate takes each NKI launch's time from the cost model (the figure computed here from the
    published rules), not the generic per-instruction figure and roofline; each launch on its own is one
    graph launch and one kernel boundary."""
    from nativelab.check import Check

    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    total, _ = _expected()
    a, b = _args("neuron")
    profiled_add(a, b)  # compiled outside the check
    with Check("nki") as c:
        outs = [profiled_add(a, b) for _ in range(2)]
    torch.testing.assert_close(outs[1].cpu(), (a + b).cpu())
    assert "kernel:profiled_add" in c.watch.ops
    k = c.watch.nki_kernels()["profiled_add"]
    assert k["calls"] == 2 and k["est_trn2_us"] == pytest.approx(total * 1e6)
    est = c.report().as_dict()["estimate"]
    assert est["parts"]["kernels"] == pytest.approx(2 * total)  # the estimate only: not priced twice
    hw = c.hardware
    assert est["parts"]["graph launches"] == pytest.approx(2 * hw.graph_launch_s)
    assert est["parts"]["kernel boundaries"] == pytest.approx(2 * hw.kernel_boundary_s)
    assert est["counts"]["nki_launches"] == 2
    assert est["by_work"]["kernel:profiled_add"] == pytest.approx(2 * total)
