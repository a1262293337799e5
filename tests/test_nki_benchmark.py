"""AWS's standalone NKI decorators, answered by the estimate (issue 48 item 1): nki.benchmark's
benchmark_result.nc_latency.get_latency_percentile(p) is kernel.estimate's time in microseconds, nki.profile
writes the estimate's Perfetto trace where AWS writes its NTFF, nki.baremetal runs the kernel on NumPy arrays;
each warns once per process that its figures are Trainium2 estimates. The pages (signatures, defaults):
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.benchmark.html
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.profile.html
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.baremetal.html"""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import nki  # nativelab's stand-in (tests/conftest.py imports nativelab, which installs it)
import nki.isa as nisa
import nki.language as nl
from nativelab.nki import standalone

# The kernel of the nki.profile page's "Listing 15 An Example" (nki.profile.html above), as printed there,
# under the decorator line of AWS's nki.benchmark example (aws-neuron-sdk nki/examples/prof-kernel-benchmark.py,
# the kernel the "Profiling NKI kernels" guide benchmarks).
AWS_BENCHMARK_EXAMPLE = '''
from neuronxcc import nki
import neuronxcc.nki.language as nl

@nki.benchmark(save_neff_name='file.neff', save_trace_name='profile.ntff')
def nki_tensor_tensor_add(a_tensor, b_tensor):
  c_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)

  a = nl.load(a_tensor)
  b = nl.load(b_tensor)

  c = a + b

  nl.store(c_tensor, c)

  return c_tensor
'''

# The nki.profile page's Listing 15 as printed, but for its working_directory ("/home/ubuntu/profiles"),
# which the test points at its own temporary directory.
AWS_PROFILE_EXAMPLE = AWS_BENCHMARK_EXAMPLE.replace(
    "@nki.benchmark(save_neff_name='file.neff', save_trace_name='profile.ntff')",
    "@nki.profile(working_directory=WORKING_DIRECTORY, save_neff_name='file.neff', save_trace_name='profile.ntff')")


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch, tmp_path):
    """Each test as a new process would see it (no warning given yet), in a directory of its own."""
    monkeypatch.setattr(standalone, "_warned", set())
    monkeypatch.chdir(tmp_path)


def _add(a_tensor, b_tensor):  # the same kernel, for the call forms
    c_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    nl.store(c_tensor, nl.load(a_tensor) + nl.load(b_tensor))
    return c_tensor


def _exp_matmul(a_t, b):
    """exp(a_t).T @ b for a_t [K, M], b [K, N] (K, M <= 128, N <= 512): TensorE, ScalarE and DMA work."""
    K, M = a_t.shape
    N = b.shape[1]
    s = nl.ndarray((K, M), dtype=a_t.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=a_t)
    e = nl.ndarray((K, M), dtype=a_t.dtype, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=s)
    m = nl.ndarray((K, N), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=m, src=b)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=e, moving=m)
    res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def _inputs(shape=(128, 512), seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


def _estimate_us(fn, *arrays):
    """The independent reference: kernel.estimate on the same values as CPU tensors, in microseconds."""
    return nki.jit(fn).estimate(*(torch.from_numpy(a) for a in arrays)).seconds * 1e6


def test_aws_benchmark_example_runs_and_prints_a_percentile_with_the_warning(capsys):
    scope = {}
    exec(AWS_BENCHMARK_EXAMPLE, scope)
    a, b = _inputs()
    bench_func = scope["nki_tensor_tensor_add"]
    with pytest.warns(nki.EstimateWarning, match="nki.benchmark: .*estimates.*not measurements"):
        bench_func(a, b)
    # AWS's readout, as aws-neuron-sdk nki/examples/attention/test_attention.py prints it
    latency_res = bench_func.benchmark_result.nc_latency
    p99 = latency_res.get_latency_percentile(50)
    print(bench_func.__name__, ":", p99, "usec")
    out = capsys.readouterr().out
    assert "latency (usec): p0" in out and "Trainium2 estimate, not a measurement" in out
    assert f"nki_tensor_tensor_add : {p99} usec" in out
    assert p99 == pytest.approx(_estimate_us(_add, a, b), rel=1e-12) and 1 < p99 < 100
    trace = json.loads((Path.cwd() / "profile.ntff").read_text())  # save_trace_name, from the cwd
    assert any(e["ph"] == "X" for e in trace["traceEvents"])


@pytest.mark.parametrize("p", [0, 1, 50, 99, 99.9, 100])
def test_every_percentile_is_the_estimate_in_microseconds(p):
    a_t = np.random.default_rng(1).standard_normal((128, 128)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((128, 512)).astype(np.float32)
    k = nki.benchmark(_exp_matmul, warmup=5, iters=10)
    with pytest.warns(nki.EstimateWarning):
        assert k(a_t, b) is None  # nothing ran: there is no output to return
    got = k.benchmark_result.nc_latency.get_latency_percentile(p)
    assert got == pytest.approx(_estimate_us(_exp_matmul, a_t, b), rel=1e-12)
    # the estimate moves with the inputs: a quarter of the columns is a smaller figure
    k(a_t, b[:, :128])
    assert k.benchmark_result.nc_latency.get_latency_percentile(p) < got


def _all_forms(api, fn, **kw):
    """@nki.<api>, @nki.<api>(...), nki.<api>(kernel, ...) and nki.<api>(an @nki.jit kernel) as AWS's are used."""
    deco = getattr(nki, api)
    forms = {"call": deco(fn, **kw), "decorator with arguments": deco(**kw)(fn), "jit kernel": deco(nki.jit(fn), **kw)}
    if not kw:  # the bare decorator takes no arguments
        forms["bare decorator"] = deco(fn)
    return forms


def test_decorator_and_call_forms():
    a, b = _inputs()
    ref = _estimate_us(_add, a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nki.EstimateWarning)
        for api, kw in (("benchmark", {}), ("benchmark", {"warmup": 2, "iters": 3}), ("baremetal", {}),
                        ("profile", {"working_directory": str(Path.cwd() / "p"), "overwrite": True})):
            for form, k in _all_forms(api, _add, **kw).items():
                got = k(a, b)
                if api == "benchmark":
                    assert k.benchmark_result.nc_latency.get_latency_percentile(50) == pytest.approx(ref), form
                elif api == "baremetal":
                    np.testing.assert_array_equal(got, a + b, err_msg=form)
                else:
                    assert got is None and (Path.cwd() / "p" / "profile.ntff").exists(), form
    # kernel[grid](...), as an @nki.jit kernel is launched over a grid
    launched = nki.benchmark(_add)[1]
    launched(a, b)
    assert launched.kernel.grid == (1,)
    assert launched.benchmark_result.nc_latency.get_latency_percentile(50) == pytest.approx(ref)


def test_each_warns_once_per_process():
    a, b = _inputs()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            nki.benchmark(_add)(a, b)
            nki.benchmark(_exp_matmul)(a[:, :128], b)
            nki.baremetal(_add)(a, b)
            nki.profile(working_directory=str(Path.cwd()), overwrite=True)(_add)(a, b)
    said = [str(w.message).split(":")[0] for w in seen if issubclass(w.category, nki.EstimateWarning)]
    assert sorted(said) == ["nki.baremetal", "nki.benchmark", "nki.profile"]


def test_profile_writes_a_perfetto_trace_where_aws_writes_its_ntff(tmp_path):
    scope = {"WORKING_DIRECTORY": str(tmp_path / "profiles")}
    exec(AWS_PROFILE_EXAMPLE, scope)
    a, b = _inputs()
    with pytest.warns(nki.EstimateWarning, match="nki.profile: .*estimates"):
        assert scope["nki_tensor_tensor_add"](a, b) is None  # [profile]: "Returns: None"
    path = tmp_path / "profiles" / "profile.ntff"  # working_directory / save_trace_name
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert all(e["ph"] in ("M", "X") and isinstance(e["pid"], int) for e in events)
    spans = [e for e in events if e["ph"] == "X"]
    lanes = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"tensor", "vector", "scalar", "gpsimd", "dma"} <= lanes
    assert len(spans) == 4 and all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)  # 2 loads, the add, the store
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(_estimate_us(_add, a, b))
    # overwrite=False (the default) keeps an existing profile, and says so; overwrite=True replaces it
    with pytest.raises(FileExistsError, match="overwrite=True"):
        scope["nki_tensor_tensor_add"](a, b)
    nki.profile(working_directory=str(tmp_path / "profiles"), overwrite=True, save_trace_name="v2.ntff")(_add)(a, b)
    assert json.loads((tmp_path / "profiles" / "v2.ntff").read_text())["traceEvents"]


def test_baremetal_returns_numpys_values():
    a_t = np.random.default_rng(3).standard_normal((128, 64)).astype(np.float32) * 0.1
    b = np.random.default_rng(4).standard_normal((128, 256)).astype(np.float32)
    with pytest.warns(nki.EstimateWarning, match="nki.baremetal"):
        got = nki.baremetal(save_trace_name="bm.ntff")(_exp_matmul)(a_t, b)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got, np.exp(a_t).T @ b, rtol=1e-4, atol=1e-4)
    a, c = _inputs()
    np.testing.assert_array_equal(nki.baremetal(_add)(a, c), a + c)
    assert json.loads((Path.cwd() / "bm.ntff").read_text())["traceEvents"]


@pytest.mark.parametrize("make, error, name", [
    (lambda: nki.benchmark(_add, iters=0), ValueError, "iters"),
    (lambda: nki.benchmark(warmup=-1), ValueError, "warmup"),
    (lambda: nki.benchmark(_add, iters=2.5), ValueError, "iters"),
    (lambda: nki.benchmark(_add, itters=10), TypeError, "itters"),
    (lambda: nki.baremetal(_add, warmup=1), TypeError, "warmup"),
    (lambda: nki.profile(_add, working_directory="profiles"), ValueError, "working_directory"),
    (lambda: nki.profile(_add), ValueError, "working_directory"),
    (lambda: nki.profile(_add, working_directory="/tmp", profile_nth=0), ValueError, "profile_nth"),
    (lambda: nki.benchmark(_add, save_trace_name=3), TypeError, "save_trace_name"),
    (lambda: nki.benchmark(42), TypeError, "kernel"),
])
def test_a_bad_argument_is_named(make, error, name):
    with pytest.raises(error, match=name):
        make()


def test_a_bad_percentile_is_named():
    a, b = _inputs()
    k = nki.benchmark(_add)
    with pytest.warns(nki.EstimateWarning):
        k(a, b)
    for p in (101, -1, "p99"):
        with pytest.raises(ValueError, match="percentile"):
            k.benchmark_result.nc_latency.get_latency_percentile(p)


# nki.compiler's kernel decorators, from the nki.compiler page of the neuronxcc.nki API
# (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.26.1/_sources/nki/api/nki.compiler.rst: "Kernel Decorators":
# skip_middle_end_transformations, enable_stack_allocator, force_auto_alloc) and enable_stack_allocator's page
# (.../en/latest/nki/api/generated/nki.compiler.enable_stack_allocator.html), whose example stacks them as:
#     from neuronxcc import nki
#     @nki.compiler.enable_stack_allocator
#     @nki.compiler.skip_middle_end_transformations
#     @nki.jit
#     def kernel(...):
# nki-autotune's kernels (awslabs/nki-autotune 36dc1b2, src/kernels.py) `import neuronxcc.nki.compiler as ncc`.
def test_nki_compiler_kernel_decorators_leave_the_kernel_as_it_runs():
    import neuronxcc.nki.compiler as ncc
    from neuronxcc import nki as nxnki

    assert nxnki.compiler is ncc

    @nxnki.compiler.enable_stack_allocator
    @nxnki.compiler.skip_middle_end_transformations
    @nxnki.jit
    def stacked(a_tensor, b_tensor):
        return _add(a_tensor, b_tensor)

    forced = ncc.force_auto_alloc(nki.jit(_add))
    with_args = ncc.enable_stack_allocator(log_level=10)(ncc.skip_middle_end_transformations(nki.jit(_add)))
    a, b = _inputs()
    for k in (stacked, forced, with_args):
        assert isinstance(k, nki.JitKernel)
        with pytest.warns(nki.EstimateWarning):
            np.testing.assert_array_equal(nki.baremetal(k)(a, b), a + b)
        standalone._warned.clear()
        assert k.estimate(torch.from_numpy(a), torch.from_numpy(b)).seconds * 1e6 == pytest.approx(
            _estimate_us(_add, a, b), rel=1e-12)
    with pytest.raises(AttributeError, match="sbuf"):  # the page's allocation control is not served
        ncc.sbuf.alloc
