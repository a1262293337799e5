"""CPU fallback for ops the real device lacks, and the op-tracking API (the guide's Lab 2 Step 6)."""

import warnings

import torch

import nativelab
from nativelab.device import schema


def test_native_op_list_ships_with_the_package():
    assert len(schema.NATIVE_OPS) == 396
    assert "aten::topk" in schema.NATIVE_OPS and "aten::mm" in schema.NATIVE_OPS
    assert not any(n.startswith(("aten::argmax", "aten::sort", "aten::multinomial")) for n in schema.NATIVE_OPS)


def test_op_base_name_is_the_schema_name_without_the_overload():
    """The one name the device list, the partitioner and the checker use for an op, against the schema's own."""
    for op in (torch.ops.aten.add.Tensor, torch.ops.aten.mm.default, torch.ops.aten.scatter_add_.default,
               torch.ops.aten.max.dim_max):
        assert schema.op_base_name(op) == str(op._schema).split("(")[0].split(".")[0]
    assert schema.op_base_name(torch.ops.aten.add.Tensor) == "aten::add"


def test_greedy_and_sampling_fallbacks_match_the_guide():
    logits = torch.randn(1, 100).to("neuron")
    logits.argmax(-1).cpu()
    assert nativelab.get_fallback_ops() == ["aten::argmax.out"]
    nativelab.clear_op_tracking()
    probs = torch.softmax(logits, -1)
    sorted_probs, idx = torch.sort(probs, descending=True, stable=True)
    torch.multinomial(sorted_probs, 1).cpu()
    assert nativelab.get_fallback_ops() == ["aten::sort.values_stable", "aten::multinomial"]
    assert "aten::_softmax" in nativelab.get_executed_ops()


def test_device_ops_are_tracked_and_counted():
    x = torch.ones(4, device="neuron")
    for _ in range(3):
        x = x * 2
    counts = nativelab.get_op_counts()
    assert counts["device"]["aten::mul.Tensor"] == 3
    assert counts["fallback"] == {}
    nativelab.clear_op_tracking()
    assert nativelab.get_executed_ops() == [] and nativelab.get_fallback_ops() == []


def test_topk_is_native_sort_is_not():
    x = torch.randn(50).to("neuron")
    torch.topk(x, 5)
    assert nativelab.get_fallback_ops() == []
    torch.sort(x)
    assert nativelab.get_fallback_ops() == ["aten::sort.values_stable"]


def test_fallback_warns_once_per_op_and_views_never_warn():
    x = torch.randn(6, 4).to("neuron")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        x.t().reshape(24).view(4, 6)[1:3].unsqueeze(0).expand(2, 2, 6)
        torch.cumprod(x, 0)
        torch.cumprod(x, 0)
        torch.cumprod(x, 1)
    texts = [str(m.message) for m in w]
    assert texts.count("Operator 'aten::cumprod.out' fell back to CPU") <= 1  # once per process
    assert not any("view" in t or "expand" in t or "unsqueeze" in t for t in texts)
    assert nativelab.get_op_counts()["fallback"]["aten::cumprod.out"] == 3
    assert all("view" not in n and "expand" not in n for n in nativelab.get_fallback_ops())


def test_fallback_result_matches_cpu_and_stays_on_the_device():
    a = torch.randn(5, 7)
    n = a.to("neuron:2")
    got = torch.cumprod(n, 1)
    assert got.device == torch.device("neuron", 2)
    torch.testing.assert_close(got.cpu(), torch.cumprod(a, 1))
    med = n.median(dim=1)
    assert med.values.device.index == 2
    torch.testing.assert_close(med.values.cpu(), a.median(dim=1).values)


def test_fallback_keeps_the_shape_of_an_empty_tensor_it_writes():
    """An in-place fallback on an empty (2, 0, 3) tensor left it 1-D (0,): the host copy for an empty mutable
    argument (there for out= arguments the CPU kernel resizes) had dropped its shape. OpInfo's linalg and glu
    samples, built on the device (make_tensor fills with uniform_), met it as wrong-dimension errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for make in (lambda t: t.uniform_(), lambda t: t.normal_(), lambda t: torch.randn_like(t)):
            t = make(torch.empty(2, 0, 3, device="neuron"))
            assert t.shape == (2, 0, 3) and t.shape == make(torch.empty(2, 0, 3)).shape
        out = torch.empty(0, device="neuron")  # an out= argument is still sized by the CPU kernel
        torch.cumprod(torch.full((2, 3), 2.0, device="neuron"), 1, out=out)
        assert out.shape == (2, 3) and torch.equal(out.cpu(), torch.cumprod(torch.full((2, 3), 2.0), 1))


def test_fallback_sees_queued_work_first():
    x = torch.zeros(10, device="neuron")
    x.add_(3)  # queued
    assert torch.cumprod(x, 0).cpu()[-1].item() == 3.0**10
    assert nativelab.get_fallback_ops() == ["aten::cumprod.out"]


def test_layer_norm_is_native_forward_and_backward():
    """native_layer_norm is in the real device's list; PyTorch's composite version of it would go through
    native_batch_norm, which is not (a CPU fallback)."""
    torch.manual_seed(0)
    cpu = [torch.randn(4, 8), torch.randn(8), torch.randn(8)]
    ref_in = [t.clone().requires_grad_() for t in cpu]
    dev_in = [t.to("neuron").requires_grad_() for t in cpu]
    nativelab.clear_op_tracking()
    ref = torch.nn.functional.layer_norm(ref_in[0], (8,), ref_in[1], ref_in[2])
    out = torch.nn.functional.layer_norm(dev_in[0], (8,), dev_in[1], dev_in[2])
    ref.pow(2).sum().backward()
    out.pow(2).sum().backward()
    torch.testing.assert_close(out.cpu(), ref)
    for d, r in zip(dev_in, ref_in):
        torch.testing.assert_close(d.grad.cpu(), r.grad)
    assert nativelab.get_fallback_ops() == []


def test_eager_and_compiled_graphs_ask_one_fallback_decision():
    """compiler/partition.py asks schema.route, the decision eager dispatch makes (OpRecord.route): a graph node
    is a fallback exactly when route(graph=True) says so, and nothing the device computes eagerly falls back
    in a graph (the graph compiler lowers every overload of an op it knows, and data movement)."""
    import torch.fx

    from nativelab.compiler import partition

    for name in ("argmax", "mm", "clone", "add", "sort", "topk", "empty_like", "multinomial", "view"):
        packet = getattr(torch.ops.aten, name)
        for ov in packet.overloads():
            assert schema.record_for(getattr(packet, ov)).route == schema.route(getattr(packet, ov))
    packets = [getattr(torch.ops.aten, n) for n in dir(torch.ops.aten) if not n.startswith("__")]
    ops = [getattr(p, ov) for p in packets if isinstance(p, torch._ops.OpOverloadPacket) for ov in p.overloads()]
    assert len(ops) > 2000
    assert not [op for op in ops if schema.route(op, graph=True) == "fallback" and schema.route(op) != "fallback"]
    g = torch.fx.Graph()
    x = g.placeholder("x")
    nodes = [g.call_function(op, (x,) + extra) for op, extra in (
        (torch.ops.aten.argmax.default, ()), (torch.ops.aten.mm.default, (x,)), (torch.ops.aten.clone.default, ()),
        (torch.ops.aten.sort.default, ()), (torch.ops.aten.mul.Scalar, (2,)))]
    assert [partition.is_fallback(n) for n in nodes] == [True, False, False, True, False]
    assert schema.route(torch.ops.aten.clone.default) == "fallback"  # eager: the runtime's own kernel answers it
    assert schema.route(torch.ops.aten.clone.default, graph=True) == "native"
