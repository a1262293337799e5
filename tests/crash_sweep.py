"""Every OpInfo op on the device in one process, as a test suite or a long training job runs them: the first sample
of each op, forward and (where the op supports autograd) backward, in fp32 and bf16, with its inputs built two
ways: by OpInfo on the device (`op.sample_inputs("neuron", dtype)`, as PyTorch's device tests build them) and on
the CPU then moved (`.to("neuron")`, as users move their tensors); the two reach different paths (device-built
samples are views, non-contiguous and conjugated tensors made on the device; moved ones are compact copies).

Used by test_crash_sweep.py, which only asks that the process ends normally: an exception from an op is fine
(it is the op sweep's business, tests/op_sweep.py), a signal is not. `--compare` also checks the moved samples'
forward results against CPU and prints those that differ (for a person to read, not asserted anywhere).
"""

from __future__ import annotations

import sys
import time
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

from op_sweep import NONDETERMINISTIC

DEVICE = "neuron"
DTYPES = (torch.float32, torch.bfloat16)
BUILDS = ("device", "moved")
stats = {"forward": 0, "backward": 0}  # cases that ran that far


def _names_device(x) -> bool:
    return isinstance(x, torch.device) or (isinstance(x, str) and x.split(":")[0] == DEVICE)


def _first(samples):
    return next(iter(samples), None)


def _sample(info, dtype, build: str, grad: bool):
    if build == "device":
        return _first(info.sample_inputs(DEVICE, dtype, requires_grad=grad))
    s = _first(info.sample_inputs("cpu", dtype, requires_grad=grad))
    if s is None:
        return None

    def move(t):
        if isinstance(t, torch.Tensor):
            return t.detach().to(DEVICE).requires_grad_(t.requires_grad)
        if isinstance(t, torch.device) or t == "cpu":
            return torch.device(DEVICE)  # a device argument (to(), factories) names the device
        return t

    s.input, s.args, s.kwargs = tree_map(move, (s.input, s.args, s.kwargs))
    return s


def _read(x) -> None:
    """Read every device tensor in x back (what makes a bad pointer crash, if one is there)."""
    for t in tree_flatten(x)[0]:
        if isinstance(t, torch.Tensor) and t.device.type == DEVICE and t.layout == torch.strided:
            t.detach().cpu()


def run_one(info, dtype, build: str, compare: bool = False):
    """Forward and backward of the op's first sample; returns what differed from CPU when `compare`."""
    grad = info.supports_autograd and dtype.is_floating_point
    s = _sample(info, dtype, build, grad)
    if s is None:
        return None
    cpu_in = tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t,
                      (s.input, s.args, s.kwargs)) if compare else None
    out = info(s.input, *s.args, **s.kwargs)
    _read(out)
    stats["forward"] += 1
    if grad:
        leaves = [t for t in tree_flatten((s.input, s.args, s.kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf]
        outs = [o for o in tree_flatten(out)[0]
                if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point]
        if leaves and outs:
            grads = torch.autograd.grad([o.float().sum() for o in outs], leaves, allow_unused=True)
            _read(grads)
            stats["backward"] += 1
    if compare:
        if info.name in NONDETERMINISTIC:
            return None
        inp, args, kwargs = tree_map(lambda x: torch.device("cpu") if _names_device(x) else x, cpu_in)
        want = info(inp, *args, **kwargs)
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-2, rtol=1.6e-2)
        for w, g in zip(tree_flatten(want)[0], tree_flatten(out)[0]):
            if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and w.layout == torch.strided:
                try:
                    torch.testing.assert_close(g.detach().cpu(), w.detach(), equal_nan=True, check_stride=False, **tol)
                except AssertionError as e:
                    return str(e).splitlines()[0][:160]
    return None


def sweep(dtypes=DTYPES, builds=BUILDS, ops=None, compare: bool = False, progress=sys.stderr):
    """Run everything; returns (runs, raised, differed: {case: what}). Progress lines name each case before it
    runs, so a crash's last line says which one it was."""
    runs, raised, differed = 0, 0, {}
    for dtype in dtypes:
        for info in op_db:
            name = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
            if (ops is not None and name not in ops) or dtype not in info.supported_dtypes("cpu"):
                continue
            for build in builds:
                case = f"{name} {str(dtype)[6:]} {build}"
                print("CASE", case, file=progress, flush=True)
                runs += 1
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        diff = run_one(info, dtype, build, compare)
                        torch.neuron.synchronize()
                    if diff:
                        differed[case] = diff
                except Exception as e:  # noqa: BLE001 - an op may refuse its sample on the device: not a crash
                    raised += 1
                    print("RAISED", case, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
                          file=progress, flush=True)
                    try:
                        torch.neuron.synchronize()  # a failure left queued surfaces here, not in the next case
                    except Exception:  # noqa: BLE001
                        pass
    return runs, raised, differed


if __name__ == "__main__":
    import nativelab  # noqa: F401

    t0 = time.time()
    dtypes = tuple(d for d in DTYPES if str(d)[6:] in sys.argv) or DTYPES
    only = [a[len("--op="):] for a in sys.argv if a.startswith("--op=")] or None
    runs, raised, differed = sweep(dtypes, compare="--compare" in sys.argv, ops=only,
                                   progress=sys.stderr if "--trace" in sys.argv else open("/dev/null", "w"))
    for case, what in sorted(differed.items()):
        print("DIFF", case, what)
    print(f"crash sweep: {runs} cases ({stats['forward']} forward, {stats['backward']} backward), {raised} raised, "
          f"{len(differed)} differed, {time.time() - t0:.0f} s")
