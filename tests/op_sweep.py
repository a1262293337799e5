"""Run PyTorch's OpInfo sample inputs on the device and on CPU and compare (used by test_op_sweep.py)."""

from __future__ import annotations

import itertools
import sys
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

SAMPLES_PER_OP = 3


DEVICE = "neuron"


def _on_device(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == DEVICE
    return isinstance(device, str) and device.split(":")[0] == DEVICE


class _CpuCopy:
    """The CPU reference of a sample built on the device, as PyTorch's device tests make one (test_compare_cpu's
    `sample.transform(to_cpu)`) but keeping each device tensor's storage layout: a view stays a view into a copy
    of its whole storage (same offset and strides, shared by every tensor of that storage), where `.to('cpu')`
    would compact it. Tensors the sample built on the CPU stay those CPU tensors; device arguments become 'cpu'."""

    def __init__(self):
        self._storages = {}  # device storage address -> its CPU copy, so aliases stay aliases

    def __call__(self, x):
        if isinstance(x, torch.Tensor):
            return self._tensor(x) if x.device.type == DEVICE else x
        if isinstance(x, torch.device) or (isinstance(x, str) and _on_device(x)):
            return torch.device("cpu") if _on_device(x) else x
        if isinstance(x, (list, tuple)):
            return type(x)(self(y) for y in x)
        if isinstance(x, dict):
            return {k: self(v) for k, v in x.items()}
        return x

    def _tensor(self, t):
        if t.layout != torch.strided or t.is_conj() or t.is_neg():
            return t.detach().to("cpu")
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in self._storages:
            self._storages[key] = storage.cpu()
        return torch.empty(0, dtype=t.dtype).set_(self._storages[key], t.storage_offset(), t.size(), t.stride())


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
        # Built on the device, as PyTorch's device tests build them (op.sample_inputs(device, dtype)): the
        # device tensors, their storage layouts, and the arguments OpInfo keeps on the CPU.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                samples = list(itertools.islice(info.sample_inputs(DEVICE, dtype, requires_grad=False), SAMPLES_PER_OP))
        except Exception as e:  # noqa: BLE001
            try:  # the OpInfo itself can fail to build samples; a device that cannot build them fails
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    next(iter(info.sample_inputs("cpu", dtype, requires_grad=False)), None)
            except Exception as cpu_e:  # noqa: BLE001
                skipped[name] = f"no samples: {cpu_e}"
                continue
            failed[name] = f"building the sample on the device: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            continue
        err = None
        ran = 0
        for s in samples:
            to_cpu = _CpuCopy()
            args, kwargs = s.args, dict(s.kwargs)
            if info.name in FACTORIES:
                kwargs["device"] = DEVICE
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    expected = info(to_cpu(s.input), *to_cpu(args), **to_cpu(kwargs))
            except Exception:  # noqa: BLE001 - CPU rejects the sample: nothing to compare
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = info(s.input, *args, **kwargs)
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
