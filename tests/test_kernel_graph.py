"""A compiled graph that is one kernel op runs the op itself (compiler/kernel_graph.py), with the same results as
eager and plain CPU PyTorch; anything more keeps the ordinary path; weights changed after compiling are seen."""

import pytest
import torch

import nativelab.compiler as compiler
from nativelab.device import tracking
from nativelab.kernels import kernel_op, wrap_kernel

pytestmark = pytest.mark.slow  # compiles


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    torch._dynamo.reset()
    compiler.reset_stats()
    yield


def _host_scale_acc(x, w, acc, out):  # hand-written host code: no generated code to compile
    torch.mul(x, w, out=out)
    acc.add_(out)


_host_scale_acc.accepts = lambda *args: True


@wrap_kernel(targets={"host": _host_scale_acc})
def scale_acc_kernel(x, w, acc, out):
    out.copy_(x * w)
    acc.add_(x * w)


@kernel_op("kernel_graph_test::scale_acc", mutates_args=("acc",))
def scale_acc(x: torch.Tensor, w: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """out = x * w, and acc += out."""
    out = torch.empty_like(x)
    scale_acc_kernel(x, w, acc, out)
    return out


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)


def test_a_graph_of_one_kernel_op_runs_the_op_itself_with_eager_results():
    x, w, acc = _inputs()
    xd, wd, accd = (t.to("neuron") for t in (x, w, acc))
    f = torch.compile(lambda x, w, acc: scale_acc(x, w, acc), backend="neuron")
    before = tracking.executed_counts().get("kernel:scale_acc_kernel", 0)
    with torch.no_grad():
        outs = [f(xd, wd, accd).cpu() for _ in range(3)]
    st = compiler.stats()
    assert st["kernel_graphs"] == 1 and st["partitions"] == 0  # no generated code
    assert tracking.executed_counts().get("kernel:scale_acc_kernel", 0) - before == 3  # one kernel launch per call
    for o in outs:
        torch.testing.assert_close(o, x * w)
    torch.testing.assert_close(accd.cpu(), acc + 3 * x * w)  # the mutation reached the input each call
    eager_acc = acc.to("neuron")
    with torch.no_grad():
        for _ in range(3):
            eager = scale_acc(xd, wd, eager_acc)
    torch.testing.assert_close(eager.cpu(), outs[-1], rtol=0, atol=0)
    torch.testing.assert_close(eager_acc.cpu(), accd.cpu(), rtol=0, atol=0)


def test_more_than_the_kernel_op_keeps_the_ordinary_path():
    x, w, acc = _inputs()
    xd, wd, accd = (t.to("neuron") for t in (x, w, acc))
    f = torch.compile(lambda x, w, acc: scale_acc(x, w, acc) * 2, backend="neuron")
    with torch.no_grad():
        got = f(xd, wd, accd).cpu()
    st = compiler.stats()
    assert st["kernel_graphs"] == 0 and st["partitions"] >= 1
    torch.testing.assert_close(got, 2 * x * w)
    torch.testing.assert_close(accd.cpu(), acc + x * w)


def test_a_mutated_view_of_an_input_keeps_the_ordinary_path():
    x, w, acc = _inputs()
    xd, wd, accd = (t.to("neuron") for t in (x, w, acc))
    f = torch.compile(lambda x, w, acc: scale_acc(x[1:], w[1:], acc[1:]), backend="neuron")
    with torch.no_grad():
        got = f(xd, wd, accd).cpu()
    assert compiler.stats()["kernel_graphs"] == 0
    torch.testing.assert_close(got, x[1:] * w[1:])
    want = acc.clone()
    want[1:] += x[1:] * w[1:]
    torch.testing.assert_close(accd.cpu(), want)  # row 0 untouched


def test_the_compiled_one_kernel_decode_step_follows_replaced_and_updated_weights():
    """The experimental tier's compiled decode step (one transformer_tkg_token) after compiling: a weight
    replaced by a new parameter and one written in place give the tokens of an eager model with those weights."""
    from nativelab.models.llama import Generator, Llama, Sampling

    src = Llama.random("tiny", seed=1)
    m = src.copy_as("experimental", torch.float32, "neuron")
    g = Generator(m, Sampling(greedy=True)).compile()
    prompt = [5, 9, 3]
    with torch.inference_mode():
        first = g.generate(prompt, 8)
    assert compiler.stats()["kernel_graphs"] >= 1
    with torch.no_grad():
        up = m.layers[0].mlp.up_proj
        up.weight = torch.nn.Parameter(up.weight.flip(0).clone(), requires_grad=False)
        m.layers[1].self_attn.o_proj.weight.mul_(-1.5)
        ref = Llama(src.cfg, "base")
        ref.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
        ref = ref.eval().to("neuron")
        ref.setup_cache()
    with torch.inference_mode():
        second = g.generate(prompt, 8)
        want = Generator(ref, Sampling(greedy=True)).generate(prompt, 8)
        was = Generator(src.copy_as("base", torch.float32, "neuron"), Sampling(greedy=True)).generate(prompt, 8)
    assert first == was
    assert second == want and second != first
