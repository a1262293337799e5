"""Compiled graphs follow the device's dtype policy (int64 as int32, float64 as float32) as eager ops do:
torch.compile(backend="neuron") and eager agree on the same device tensors, and both differ from plain CPU
float64 / int64 as the narrowing formula says."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import nativelab.compiler as compiler
from nativelab.compiler import dtype_policy
from nativelab.device import policy, schema

aten = torch.ops.aten
TINY = 2.0**-30  # lost when a value near 1 is rounded to float32 (24-bit significand), kept by float64
WRAP = 2**32  # lost when an int64 is narrowed to int32


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    torch._dynamo.reset()
    compiler.reset_stats()


def _both(fn, *args):
    """fn eager and compiled on the device (results on the host)."""
    dev = [a.to("neuron") for a in args]
    eager = fn(*dev)
    compiled = torch.compile(fn, backend="neuron")(*dev)
    return eager.cpu(), compiled.cpu()


def _float64(*shape):
    g = torch.Generator().manual_seed(0)
    return torch.randint(1, 5, shape, generator=g).double() + TINY  # small integers: float32 sums are exact


def _floats(t, a, b):
    arith = (t * 3.0 - 3.0) * 1e12
    reductions = t.sum(1) + t.amax(0).sum() - t.mean()
    return arith, reductions, a @ b + a.sum()


def _floats_narrowed(t, a, b):  # the narrowing formula: each op in float32, results kept as float64
    t, a, b = t.float(), a.float(), b.float()
    reductions = t.sum(1) + t.amax(0).sum().double().float() - t.mean().double().float()
    return [r.double() for r in ((t * 3.0 - 3.0) * 1e12, reductions, a @ b + a.sum().double().float())]


def _ints(t, x, i):
    index = x[i] * 2 + x.index_select(0, i + WRAP)  # int64 indices, narrowed too (i + 2**32 is i in int32)
    bounded = t.clamp(-(2**40), 2**40)  # bounds beyond int32 saturate to it, as eager's do
    return t * 2 + 1, index, torch.cumsum(t, 0) + torch.arange(WRAP, WRAP + 3, device=t.device), bounded


def _ints_narrowed(t, x, i):
    t, x, i = t.int(), x.float(), i.int()
    return [(t * 2 + 1).long(), (x[i] * 2 + x.index_select(0, i)).double(),
            (torch.cumsum(t, 0) + torch.arange(3).int()).long(), t.long()]


CASES = {
    # name: (function, inputs, the narrowing formula on the CPU)
    "float64: arith, reductions, matmul": (_floats, (_float64(4, 3), _float64(4, 5), _float64(5, 3)), _floats_narrowed),
    "int64: arith, indices, arange + cumsum": (_ints, (torch.tensor([WRAP + 5, 3, -WRAP - 2]), _float64(6, 2),
                                                       torch.tensor([4, 0, 5])), _ints_narrowed),
}


@pytest.mark.parametrize("name", CASES)
def test_compiled_equals_eager_and_both_narrow(name):
    fn, args, formula = CASES[name]
    dev = [a.to("neuron") for a in args]
    eager = [r.cpu() for r in fn(*dev)]
    compiled = [r.cpu() for r in torch.compile(fn, backend="neuron")(*dev)]
    for e, c, expected in zip(eager, compiled, formula(*args)):
        assert c.dtype == e.dtype == expected.dtype  # reported as CPU reports it (int64 / float64)
        assert torch.equal(c, e), (c, e)  # bitwise: small integers and exact float32 steps
        assert torch.equal(e, expected), (e, expected)
    try:
        wide = fn(*args)
    except IndexError:  # plain CPU: i + 2**32 is out of range
        return
    for w, expected in zip(wide, formula(*args)):
        assert not torch.equal(w, expected)  # plain CPU computes the wide type: the policy did something


@pytest.mark.slow  # compiles a forward and a backward
def test_float64_model_forward_and_backward_compiled_equals_eager():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)).double()
    x = torch.randn(5, 6, dtype=torch.float64)

    y = torch.tensor([0, 1, 1, 0, 1])

    def step(model, x, y):  # cross_entropy's backward: 0-d float64 operands follow the narrowed input
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]

    results = []
    for compile_it in (False, True):
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)).double().to("neuron")
        model.load_state_dict(ref.state_dict())
        fn = torch.compile(step, backend="neuron") if compile_it else step
        loss, grads = fn(model, x.to("neuron"), y.to("neuron"))
        assert loss.dtype == torch.float64 and all(g.dtype == torch.float64 for g in grads)
        results.append([loss.cpu(), *(g.cpu() for g in grads)])
    narrow = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    narrow.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    wide_loss, wide_grads = step(ref, x, y)
    narrow_loss, narrow_grads = step(narrow, x.float(), y)
    for eager, compiled, wide, f32 in zip(*results, [wide_loss, *wide_grads], [narrow_loss, *narrow_grads]):
        # float32 kernels in another order (Inductor's reductions, addmm as mm + bias): float32's rounding apart
        torch.testing.assert_close(compiled, eager, rtol=2e-6, atol=1e-7)
        torch.testing.assert_close(compiled, f32.double(), rtol=2e-6, atol=1e-7)
    # ... and both far from float64's answer, which agrees with itself to ~1e-16
    assert (results[1][0] - wide_loss).abs().item() > 1e-12


# In a graph, a node narrows what the eager call of the same op narrows (policy.graph_plan); checked against
# eager on the device, op by op, with a value that float32 cannot hold.
_V = 1 + TINY
_PLAN_CASES = {
    "mul.Tensor": (aten.mul.Tensor, lambda x: (x, x)),
    "sum.default": (aten.sum.default, lambda x: (x,)),
    "cat": (aten.cat.default, lambda x: ([x, x],)),
    "index.Tensor": (aten.index.Tensor, lambda x: (x, [torch.tensor([0, 1], device=x.device)])),
    "masked_fill.Scalar": (aten.masked_fill.Scalar, lambda x: (x, x > 3, 0.5)),
    "constant_pad_nd": (aten.constant_pad_nd.default, lambda x: (x, [0, 1], 0.0)),
    "repeat": (aten.repeat.default, lambda x: (x, [2])),
    "_to_copy": (aten._to_copy.default, lambda x: (x,)),
    "slice_backward": (aten.slice_backward.default, lambda x: (x, [6], 0, 0, 4, 1)),
    "convolution": (aten.convolution.default,
                    lambda x: (x.view(1, 1, 4), x.new_ones(1, 1, 1), None, [1], [0], [1], False, [0], 1)),
}


@pytest.mark.parametrize("name", _PLAN_CASES)
def test_graph_plan_narrows_where_eager_does(name):
    op, make_args = _PLAN_CASES[name]
    x = torch.tensor([_V, 2.0, 3.0, 4.0], dtype=torch.float64)
    out = op(*make_args(x.to("neuron")))
    eager_narrowed = out.cpu().flatten()[0].item() != _V
    rec = schema.record_for(op)
    plan = policy.graph_plan(rec, rec.normalise(make_args(x), {}))
    assert bool(plan is not None and plan.narrow) == eager_narrowed


def test_graphs_without_a_narrowed_dtype_are_left_alone():
    """bf16 / fp32 graphs (Lab 2's) come back as they are: the pass costs one walk of the graph."""
    f = lambda a, b: (a @ b).relu().sum(1)  # noqa: E731
    gm = make_fx(f, tracing_mode="fake")(torch.randn(3, 4, dtype=torch.bfloat16), torch.randn(4, 2).bfloat16())
    assert dtype_policy.follow_policy(gm) is gm
    gm = make_fx(f, tracing_mode="fake")(torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 2).double())
    narrowed = dtype_policy.follow_policy(gm)
    converts = [n for n in narrowed.graph.nodes if n.target is torch.ops.prims.convert_element_type.default]
    # both operands narrowed once, the product taken as float32 by relu, sum's result cast back
    assert [n.args[1] for n in converts] == [torch.float32, torch.float32, torch.float64]
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    assert torch.equal(narrowed(a, b), f(a.float(), b.float()).double())
