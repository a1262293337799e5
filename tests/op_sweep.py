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


# ---------------------------------------------------------------------------------------------------------
# Layout, out= and warning variants of the same samples (issue 24's siblings): each op on channels_last and
# non-contiguous inputs, with out= arguments of every kind CPU accepts or refuses, and the warnings it gives,
# against CPU PyTorch on the same inputs.

LAYOUTS = ("channels_last", "noncontiguous")


def _in_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """`t` (same values) laid out as `layout`, on t's device: channels_last(_3d) for 4-d (5-d) tensors, a
    strided view with gaps for any tensor with elements; other tensors unchanged."""
    if t.layout != torch.strided:
        return t
    if layout == "channels_last":
        if t.dim() == 4:
            return t.contiguous(memory_format=torch.channels_last)
        if t.dim() == 5:
            return t.contiguous(memory_format=torch.channels_last_3d)
        return t
    if t.numel() <= 1 or t.dim() == 0:
        return t
    big = torch.zeros((*t.shape, 2), dtype=t.dtype, device=t.device)
    big[..., 1] = t
    return big[..., 1]


def _map_tensors(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(y, fn) for y in x)
    if isinstance(x, dict):
        return {k: _map_tensors(v, fn) for k, v in x.items()}
    return x


def _changes(x, layout) -> bool:
    found = []
    _map_tensors(x, lambda t: found.append(t.layout == torch.strided and _in_layout(t, layout).stride() != t.stride()) or t)
    return any(found)


def _messages(seen) -> list[str]:
    """Warnings as CPU gives them: the device's own notices (fallbacks, the dtype policy) left out."""
    out = []
    for w in seen:
        text = str(w.message).split(" (Triggered internally")[0]
        if "fell back to CPU" in text or "Neuron backend does not support" in text:
            continue
        out.append(text)
    return sorted(set(out))


def _run(fn, *args, **kwargs):
    """(result or exception, warnings), with every warning recorded."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            res = fn(*args, **kwargs)
            if isinstance(res, torch.Tensor) and res.device.type == DEVICE or isinstance(res, (list, tuple)):
                torch.neuron.synchronize()  # a queued failure belongs to this call
        except Exception as e:  # noqa: BLE001
            res = e
    return res, _messages(seen)


def _strides(x):
    if isinstance(x, torch.Tensor):
        return [x.stride()] if x.layout == torch.strided and x.numel() > 1 else []
    if isinstance(x, (list, tuple)):
        return [s for y in x for s in _strides(y)]
    return []


def _check(name, got, want, got_w, want_w, tol, what):
    """None if the device agrees with CPU on the value, the strides, the error and the warnings; else why."""
    if isinstance(want, Exception):
        if not isinstance(got, Exception):
            return f"{what}: CPU raises {type(want).__name__}: {str(want).splitlines()[0][:120]}, the device does not"
        if type(got) is not type(want) and not isinstance(got, type(want)):
            return f"{what}: CPU raises {type(want).__name__}, the device {type(got).__name__}: {str(got)[:120]}"
        return None
    if isinstance(got, Exception):
        return f"{what}: the device raises {type(got).__name__}: {str(got).splitlines()[0][:160]}"
    try:
        _compare(got, want, tol)
    except Exception as e:  # noqa: BLE001
        return f"{what}: values: {str(e).splitlines()[0][:160]}"
    if _strides(got) != _strides(want):
        return f"{what}: strides {_strides(got)[:3]} where CPU's are {_strides(want)[:3]}"
    extra = [w for w in got_w if w not in want_w]  # (a warn-once warning CPU gave first may be missing)
    if extra:
        return f"{what}: warns {extra[:2]} where CPU does not"
    return None


def _out_variants(want):
    """out= arguments to try, as (label, maker(device)): the right shape, empty (to be sized), too small
    with elements (resized, with CPU's warning), and the wrong dtype (CPU refuses or casts)."""
    if not isinstance(want, torch.Tensor):
        return []
    wrong = torch.int64 if want.dtype.is_floating_point or want.dtype.is_complex else torch.float64
    return [
        ("out=right shape", lambda d: torch.zeros_like(want, device=d)),  # zeros: CPU reads some outs (fft)
        ("out=empty", lambda d: torch.empty(0, dtype=want.dtype, device=d)),
        ("out=too small", lambda d: torch.zeros(1, dtype=want.dtype, device=d)),
        ("out=wrong dtype", lambda d: torch.zeros_like(want, dtype=wrong, device=d)),
    ]


def sweep_variants(dtype=torch.float32, ops=None, samples=1, trace=False):
    """Return (passed, failed: {name: why}): each op's first `samples` samples in LAYOUTS and with out=
    arguments, against CPU on the same inputs (values, output strides, errors, warnings)."""
    tol = TOLERANCE[dtype]
    passed, failed = [], {}
    for info in op_db:
        name = info.name + (("." + info.variant_test_name) if info.variant_test_name else "")
        if ops is not None and name not in ops:
            continue
        if info.name in NONDETERMINISTIC or name in NONDETERMINISTIC or info.name in FACTORIES:
            continue
        if dtype not in info.supported_dtypes("cpu"):
            continue
        if trace:
            print("OP", name, file=sys.stderr, flush=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dev_samples = list(itertools.islice(info.sample_inputs(DEVICE, dtype, requires_grad=False), samples))
        except Exception:  # noqa: BLE001 - building samples is the plain sweep's business
            continue
        try:
            why, ran = _variants_of(info, name, dev_samples, tol)
        except Exception as e:  # noqa: BLE001 - the sweep's own trouble with a sample: that op fails, not the sweep
            why, ran = f"sweep: {type(e).__name__}: {str(e).splitlines()[0][:160]}", 0
        if why:
            failed[name] = why
        elif ran:
            passed.append(name)
    return passed, failed


def _variants_of(info, name, dev_samples, tol):
    """Samples built on the device as PyTorch's device tests build them; each variant's CPU reference is copied
    from the device tensors keeping their layout (_CpuCopy), OpInfo's CPU arguments stay CPU tensors."""
    why, ran = None, 0
    for s in dev_samples:
        sample = (s.input, list(s.args), dict(s.kwargs))
        on_device = lambda t: t.device.type == DEVICE  # noqa: E731
        cases = [(layout, lambda t, layout=layout: _in_layout(t, layout) if on_device(t) else t)
                 for layout in LAYOUTS if _changes(sample, layout)]
        cases.append(("contiguous", lambda t: t))
        for what, lay in cases:
            dev = _map_tensors(sample, lay)
            if info.name in FACTORIES:
                dev[2]["device"] = DEVICE
            cin, cargs, ckw = _CpuCopy()(dev)
            want, want_w = _run(info, cin, *cargs, **ckw)
            if what != "contiguous" and isinstance(want, Exception):
                continue
            got, got_w = _run(info, dev[0], *dev[1], **dev[2])
            why = why or _check(name, got, want, got_w, want_w, tol, what)
            ran += 1
            if what != "contiguous" or not info.supports_out or isinstance(want, Exception):
                continue
            for label, make in _out_variants(want):
                cout = make("cpu")
                want_o, want_ow = _run(info, cin, *cargs, out=cout, **ckw)
                dout = make(DEVICE)
                got_o, got_ow = _run(info, dev[0], *dev[1], out=dout, **dev[2])
                why = why or _check(name, got_o, want_o, got_ow, want_ow, tol, label)
                if why is None and not isinstance(want_o, Exception):
                    why = _check(name, dout, cout, [], [], tol, label + " (the out tensor)")
        if why:
            break
    return why, ran


def sweep_error_inputs(ops=None, trace=False):
    """Return (passed, failed: {name: why}): OpInfo's error inputs (the checks every device makes at the call:
    shapes, dtypes, out= arguments) on the device. Each must raise its error at the call, as on CPU and CUDA,
    not at the next sync."""
    import re

    passed, failed = [], {}
    for info in op_db:
        name = info.name + (("." + info.variant_test_name) if info.variant_test_name else "")
        if ops is not None and name not in ops or info.error_inputs_func is None:
            continue
        if trace:
            print("OP", name, file=sys.stderr, flush=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cases = list(info.error_inputs(DEVICE))
        except Exception:  # noqa: BLE001 - OpInfo could not build them for this device
            continue
        why, ran = None, 0
        for e in cases:
            s = e.sample_input
            try:  # CPU's own behaviour decides: an error input CPU does not refuse says nothing about the device
                cpu = _CpuCopy()((s.input, list(s.args), dict(s.kwargs)))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    info(cpu[0], *cpu[1], **cpu[2])
                continue
            except Exception:  # noqa: BLE001
                pass
            at_call = None
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    info(s.input, *s.args, **s.kwargs)
            except Exception as err:  # noqa: BLE001
                at_call = err
            try:
                torch.neuron.synchronize()
                late = None
            except Exception as err:  # noqa: BLE001
                late = err
            ran += 1
            if at_call is None:
                why = why or (f"{e.error_type.__name__} ({e.error_regex[:60]}) " +
                              (f"only at the sync: {str(late)[:120]}" if late else "never raised"))
            elif not isinstance(at_call, e.error_type) or not re.search(e.error_regex, str(at_call)):
                why = why or f"raises {type(at_call).__name__}: {str(at_call)[:120]}, expected {e.error_regex[:60]}"
        if why:
            failed[name] = why
        elif ran:
            passed.append(name)
    return passed, failed
