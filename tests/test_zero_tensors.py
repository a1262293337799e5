"""Zero tensors (PyTorch's ZeroTensor key, `aten._efficientzerotensor`) on the device, with CPU's semantics.

Autograd makes them for gradients a formula knows are zero (sgn's for real inputs, and forward mode's missing
tangents). They have no memory: on the device they used to come back from a CPU fallback as a tensor over a null
pointer, and the first read killed the interpreter (issue 30). Every formula that makes one is listed and run in
tests/zero_tensor_formulas.py (how they were found is written there).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nativelab
from conftest import run_python

SNIPPET = (
    "import torch, nativelab\n"
    "x = torch.randn(3, device='neuron', requires_grad=True)\n"
    "(g,) = torch.autograd.grad(torch.sgn(x).sum(), x)\n"
    "print(g._is_zerotensor(), g.device)\n"
    "print(g.cpu())\n"
    "print(g)\n"
)


@pytest.mark.slow  # a fresh interpreter
@pytest.mark.parametrize("fast", ["1", "0"])
def test_the_issue_snippet_prints_zeros(fast):
    r = run_python(SNIPPET, env={"NATIVELAB_FAST_PATH": fast})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["True neuron:0", "tensor([0., 0., 0.])", "tensor([0., 0., 0.], device='neuron:0')"]


def _semantics(device):
    """What a user can do with zero tensors, as (what, result) pairs comparable across devices."""
    z = torch._efficientzerotensor((2, 3), device=device)
    d = torch.arange(6.0, device=device).reshape(2, 3)
    out = [("is_zero", z._is_zerotensor()), ("shape", tuple(z.shape)), ("stride", z.stride()), ("dtype", z.dtype)]
    for name, r in [
        ("z+d", z + d), ("d-z", d - z), ("z*d", z * d), ("z*2", z * 2), ("z/d", z / (d + 1)), ("z+z", z + z),
        ("z.t()", z.t()), ("z[1]", z[1]), ("z.unfold", z.unfold(1, 2, 1)), ("z.expand", z[None].expand(4, 2, 3)),
        ("z.clone", z.clone()), ("zeros_like", torch.zeros_like(z)), ("z.sum", z.sum()), ("exp(z)", z.exp()),
        ("z@d.t()", z @ d.t()), ("z.to(bf16)", z.to(torch.bfloat16)), ("cat", torch.cat([z, d])),
    ]:
        out.append((name, (r._is_zerotensor(), r.dtype, tuple(r.shape), r.stride() if r._is_zerotensor() else None,
                           r.cpu().clone().tolist())))
    x = torch.ones(2, 3, device=device)
    x.copy_(z)
    out.append(("copy_ from zero", x.cpu().tolist()))
    for name, fn in [("add_", lambda: z.add_(1)), ("copy_ into", lambda: z.copy_(d)), ("zero_", lambda: z.zero_())]:
        try:
            fn()
            out.append((name, "no error"))
        except RuntimeError as e:
            out.append((name, str(e)))
    out.append(("item", torch._efficientzerotensor((), device=device).item()))
    out.append(("repr", repr(z).replace(", device='neuron:0'", "")))
    out.append(("to float64", (z.to(torch.float64)._is_zerotensor(), z.to(torch.float64).cpu().clone().tolist())))
    return out


def test_zero_tensors_behave_as_on_cpu():
    assert _semantics("neuron") == _semantics("cpu")


def test_zero_tensors_are_not_fallbacks_and_take_no_memory():
    """An allocation without memory, as on CUDA: no fallback, no bytes; ops on them fall back only where the
    same op on a materialized tensor would."""
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    z = torch._efficientzerotensor((1024, 1024), device="neuron")
    assert torch.neuron.memory_allocated() == before
    d = torch.ones(1024, 1024, device="neuron")
    r = (z * d + d).sum() + z.clone().sum()
    assert r.item() == 1024 * 1024
    assert repr(z).startswith("tensor([[0., 0., 0.,") and z.cpu().abs().sum().item() == 0
    assert nativelab.get_fallback_ops() == []
    x = torch.randn(5, device="neuron", requires_grad=True)
    (g,) = torch.autograd.grad(torch.sgn(x).sum(), x)
    assert g._is_zerotensor() and "aten::_efficientzerotensor" not in nativelab.get_fallback_ops()


@pytest.fixture(scope="module")
def formulas():
    # as a script: through runpy, OpInfo's sample_inputs (inspect.stack() in torch's common_utils) is ~10x slower
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("zero_tensor_formulas.py"))],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]  # a crash (a signal) in any formula fails here
    return json.loads(r.stdout.strip().splitlines()[-1])


sys.path.insert(0, "tests")
import zero_tensor_formulas  # noqa: E402

CASES = [f"{m}:{n}" + (f".{v}" if v else "") for m, n, v in zero_tensor_formulas.cases()]


@pytest.mark.parametrize("case", CASES)
def test_every_zero_tensor_formula_runs_on_the_device_as_on_cpu(formulas, case):
    """Gradients (reverse, second order) and tangents (forward) on the device equal CPU's, for every formula
    that makes a zero tensor; the CPU run still makes one (else the list is stale)."""
    assert formulas[case] is None, formulas[case]


@pytest.mark.slow
def test_the_formula_lists_are_complete():
    """Re-run the probe that found them (CPU only): PyTorch's formulas that make zero tensors are all listed."""
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("zero_tensor_formulas.py")), "find"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(r.stdout.strip().splitlines()[-1])
    rev, gg, fwd = found["reverse"], found["gradgrad"], found["forward"]
    assert set(rev) <= set(zero_tensor_formulas.REVERSE), rev
    assert set(gg) <= set(zero_tensor_formulas.GRADGRAD), gg
    assert {tuple(x) for x in fwd} <= set(zero_tensor_formulas.FORWARD), fwd


def test_formulas_that_crash_cpu_run_on_the_device_against_their_formula():
    """ldexp's and index_add's forward formulas with a zero tangent for the second input segfault on CPU itself
    (torch 2.13); on the device they run, and their tangents are what the formula says: d ldexp(x, e) = 2**e dx,
    d index_add(x, ...) = dx when the source has no tangent."""
    code = (
        "import json, sys, torch, nativelab\n"
        "sys.path.insert(0, 'tests')\n"
        "import zero_tensor_formulas as z\n"
        "ops, out = z._ops(), {}\n"
        "for name in ('ldexp', 'index_add'):\n"
        "    (t,), made = z._run(ops[(name, '')], 'forward', 'neuron')\n"
        "    torch.manual_seed(0)  # the sample _run made\n"
        "    s = z._first_sample(ops[(name, '')], 'cpu')\n"
        "    want = 2.0 ** s.args[0] if name == 'ldexp' else torch.ones_like(s.input)\n"
        "    out[name] = [made, bool(torch.allclose(t.cpu(), want.to(t.dtype)))]\n"
        "print(json.dumps(out))\n"
    )
    r = run_python(code, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"ldexp": [True, True], "index_add": [True, True]}
