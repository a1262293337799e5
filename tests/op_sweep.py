"""Run PyTorch's OpInfo sample inputs on the device and on CPU and compare (used by test_op_sweep.py)."""

from __future__ import annotations

import sys
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

SAMPLES_PER_OP = 3


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(y, device) for y in x)
    if isinstance(x, dict):
        return {k: (device if k == "device" else _to(v, device)) for k, v in x.items()}
    return x


# fp32: the device runs the same CPU kernels, so results agree to within reordering. bf16: PyTorch's default
# bf16 tolerance (torch.testing), as OpInfo tests use for a device against CPU.
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=1e-5, rtol=1.6e-2)}


def _compare(dev_out, cpu_out, tol=TOLERANCE[torch.float32]):
    if isinstance(cpu_out, torch.Tensor):
        if not isinstance(dev_out, torch.Tensor):
            raise AssertionError(f"expected a tensor, got {type(dev_out)}")
        if dev_out.device.type != "neuron":
            raise AssertionError(f"output on {dev_out.device}, expected neuron")
        torch.testing.assert_close(dev_out.cpu(), cpu_out, equal_nan=True, **tol)
    elif isinstance(cpu_out, (list, tuple)):
        assert len(dev_out) == len(cpu_out)
        for d, c in zip(dev_out, cpu_out):
            _compare(d, c, tol)
    elif isinstance(cpu_out, (int, float, bool)):
        assert dev_out == cpu_out or (dev_out != dev_out and cpu_out != cpu_out), f"{dev_out} != {cpu_out}"


# Sample inputs whose CPU result is not a function of the input (random, uninitialised memory).
NONDETERMINISTIC = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal", "rand_like",
    "randint_like", "randn_like", "uniform", "empty", "empty_like", "new_empty", "new_empty_strided",
    "empty_strided", "empty_permuted", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.rrelu", "randint", "randn", "rand", "torch.randint", "normal.number_mean",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "bernoulli_",
    "nn.functional.multi_head_attention_forward", "sparse.sampled_addmm", "nn.functional.scaled_dot_product_attention",
}


# Ops that make a tensor from nothing: the sample says nothing about the device, so we ask for it.
FACTORIES = {
    "arange", "eye", "full", "linspace", "logspace", "ones", "zeros", "scalar_tensor",
    "signal.windows.bartlett", "signal.windows.blackman", "signal.windows.cosine",
    "signal.windows.exponential", "signal.windows.gaussian", "signal.windows.general_cosine",
    "signal.windows.general_hamming", "signal.windows.hamming", "signal.windows.hann",
    "signal.windows.kaiser", "signal.windows.nuttall",
}


def sweep(dtype=torch.float32, ops=None, trace=False):
    """Return (passed, failed: {name: error}, skipped: {name: why})."""
    passed, failed, skipped = [], {}, {}
    for info in op_db:
        name = info.name + (("." + info.variant_test_name) if info.variant_test_name else "")
        if ops is not None and name not in ops:
            continue
        if trace:
            print("OP", name, file=sys.stderr, flush=True)
        if info.name in NONDETERMINISTIC or name in NONDETERMINISTIC:
            skipped[name] = "nondeterministic output"
            continue
        if dtype not in info.supported_dtypes("cpu"):
            skipped[name] = "dtype not supported on CPU"
            continue
        try:
            samples = list(info.sample_inputs("cpu", dtype, requires_grad=False))[:SAMPLES_PER_OP]
        except Exception as e:  # noqa: BLE001 - the OpInfo itself can fail to build samples
            skipped[name] = f"no samples: {e}"
            continue
        err = None
        ran = 0
        for s in samples:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    expected = info(s.input, *s.args, **s.kwargs)
            except Exception:  # noqa: BLE001 - CPU rejects the sample: nothing to compare
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    kwargs = _to(s.kwargs, "neuron")
                    if info.name in FACTORIES:
                        kwargs["device"] = "neuron"
                    got = info(_to(s.input, "neuron"), *_to(s.args, "neuron"), **kwargs)
                    _compare(got, expected, TOLERANCE[dtype])
                ran += 1
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                break
        if err is not None:
            failed[name] = err
        elif ran == 0:
            skipped[name] = "CPU rejected every sample"
        else:
            passed.append(name)
    return passed, failed, skipped


if __name__ == "__main__":
    import time

    import nativelab  # noqa: F401

    t0 = time.time()
    p, f, s = sweep(torch.bfloat16 if "--bf16" in sys.argv else torch.float32, trace="--trace" in sys.argv)
    print(f"passed {len(p)} failed {len(f)} skipped {len(s)} in {time.time() - t0:.0f}s")
    for k, v in sorted(f.items()):
        print("FAIL", k, v)
    if "-v" in sys.argv:
        for k, v in sorted(s.items()):
            print("SKIP", k, v)
