"""bf16 drift (`nativelab check --bf16-drift`, off by default): which bf16 op makes results differ badly from
float32.

Every bf16 device tensor an eager op produces gets a float32 shadow: the same op run on the host on the float32
shadows of its inputs (a tensor without one: its own value, upcast). Compared op by op with the same inputs, a
bf16 op only rounds its output (~2^-9); what goes wrong is drift that an op amplifies (a mean subtracted from
values much larger than their spread, a variance, a long chain of residual updates). So each op's error is the
relative distance of its output from its shadow (||out - shadow|| / ||shadow||), and the op is blamed for the
error it adds beyond the largest error of its inputs.

Costs a float32 copy of every bf16 result and a second run of every bf16 op on the host; eager ops only
(compiled graphs run as one unit). Ops that write their inputs (in place, out=) drop the written tensor's
shadow: its drift restarts from its bf16 value.
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

BF16 = torch.bfloat16
LIMIT = 2**-5  # an op that adds more than ~3% relative error (8x bf16's rounding of 2^-8) is reported


@dataclasses.dataclass
class DriftSite:
    count: int = 0  # bf16 results compared at this line
    max_error: float = 0.0  # the largest relative error of a result from its float32 shadow
    max_added: float = 0.0  # the largest error an op added beyond its inputs' errors


def _to_host_args(a, fn):
    if isinstance(a, torch.Tensor):
        return fn(a)
    if isinstance(a, torch.device) and a.type != "cpu":
        return torch.device("cpu")
    if a is BF16:
        return torch.float32
    if isinstance(a, (list, tuple)):
        return type(a)(_to_host_args(x, fn) for x in a)
    if isinstance(a, dict):
        return {k: _to_host_args(v, fn) for k, v in a.items()}
    return a


class Shadows:
    """float32 shadows of live bf16 device tensors (dropped with the tensor), and the drift per source line."""

    def __init__(self, host_view, drain, device: str):
        self._host_view = host_view
        self._drain = drain
        self._device = device
        self._shadow: dict[int, tuple] = {}  # id(tensor) -> (weakref, float32 host tensor, its relative error)
        self.sites: dict = {}  # (op name, Site) -> DriftSite

    def _get(self, t):
        hit = self._shadow.get(id(t))
        return hit if hit is not None and hit[0]() is t else None

    def _set(self, t, shadow, err) -> None:
        key = id(t)
        ref = weakref.ref(t, lambda _, key=key: self._shadow.pop(key, None))
        self._shadow[key] = (ref, shadow, err)

    def after(self, name: str, op, args, kwargs, res, site, written) -> None:
        """An eager op ran on the device: shadow its bf16 results and measure their drift. `written`: the
        arguments it wrote (in place, out=)."""
        if written:
            for t in _flat(written):
                self._shadow.pop(id(t), None)
            return
        outs = [r for r in _flat(res) if r.dtype is BF16 and r.device.type == self._device]
        if not outs or torch.Tag.nondeterministic_seeded in op.tags:
            return
        self._drain()
        in_err = [0.0]

        def shadow_of(t):
            if t.device.type != self._device:
                return t.float() if t.dtype is BF16 else t
            hit = self._get(t)
            if hit is not None:
                in_err.append(hit[2])
                return hit[1]
            h = self._host_view(t)
            return h.float() if h.dtype is BF16 else h

        with torch.inference_mode():
            ref = op(*_to_host_args(args, shadow_of), **_to_host_args(kwargs, shadow_of))
            refs = [r for r in _flat(ref)]
            if len(refs) != len(list(_flat(res))):
                return
            pairs = [(o, r) for o, r in zip(_flat(res), refs) if o.dtype is BF16 and o.device.type == self._device]
            base = max(in_err)
            for out, shadow in pairs:
                if op.is_view:
                    self._set(out, shadow, base)
                    continue
                shadow = shadow.float()
                err = _relative(self._host_view(out).float(), shadow)
                if err is None:
                    continue
                self._set(out, shadow, err)
                s = self.sites.get((name, site))
                if s is None:
                    s = self.sites[(name, site)] = DriftSite()
                s.count += 1
                s.max_error = max(s.max_error, err)
                s.max_added = max(s.max_added, err - base)


def _relative(out, ref) -> float | None:
    norm = float(ref.norm())
    if not norm or norm != norm or norm == float("inf") or out.shape != ref.shape:
        return None
    return float((out - ref).norm()) / norm


def _flat(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flat(y)
