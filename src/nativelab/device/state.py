"""The emulated device's state in one object: the C++ runtime handle and every setting of the device, built
once by `register()` from `Config` (`config.load()`, the environment read through `nativelab.settings`).

The modules of device/ read it (`device.rt`, `device.sync`, `device.num_cores`) and keep no copy of their own
(tests/test_layers.py checks it): a setting changed here is the one every module sees. The modes a program may
change while it runs (sync mode, the C++ fast path, strict fallbacks, the thread team) change through `set` or, for a block,
`mode`, which tell the listeners (the C++ kernel turns its fast path off in sync mode); the others are fixed
at registration.
"""

from __future__ import annotations

import contextlib

from .. import settings
from . import runtime
from .config import Config

# What may change after registration, and how a new value is checked
MODES = {"sync": bool, "fast_path": bool, "strict": bool, "threads": lambda v: settings.THREADS.parse_text(str(v))}


class Device:
    __slots__ = ("rt", "num_cores", "core_memory_bytes", "sync", "fast_path", "strict", "quiet", "dtype_policy",
                 "threads", "bf16_gemm", "_listeners")

    def __init__(self):  # an unregistered device: no runtime; the settings' defaults
        self.rt = None  # the C++ runtime module (csrc/)
        self.num_cores = 0  # logical NeuronCores: neuron:0 .. neuron:num_cores-1
        self.core_memory_bytes = 0  # capacity accounted per logical core
        self.sync = False  # every unit of work runs at its launch (NATIVELAB_SYNC=1)
        self.fast_path = True  # the C++ kernel queues the common case (off: every op through Python)
        self.strict = False  # a CPU fallback raises at the call that caused it
        self.quiet = False  # no "emulated on the host CPU" line
        self.dtype_policy = True  # the real device's int64 -> int32 / float64 -> float32 narrowing
        self.threads: str | int = "auto"  # the host thread team: a fixed count, or "auto" (threads.py)
        self.bf16_gemm = "auto"  # bf16 products: "bf16", "fp32" GEMMs of upcast operands, "auto" (gemm_policy.py)
        self._listeners: list = []  # called after a mode changes

    def build(self, cfg: Config) -> Device:
        """Load the runtime and take the settings of `cfg` (register() calls it once)."""
        self.rt = runtime.load()
        self.num_cores, self.core_memory_bytes = cfg.num_cores, cfg.core_memory_bytes
        self.sync, self.fast_path, self.strict = cfg.sync, cfg.fast_path, cfg.strict
        self.quiet, self.dtype_policy = cfg.quiet, cfg.dtype_policy
        self.threads, self.bf16_gemm = cfg.threads, cfg.bf16_gemm
        return self

    def on_change(self, fn) -> None:
        """Call `fn()` after every change of a mode."""
        self._listeners.append(fn)

    def set(self, **modes) -> None:
        """Change modes (`sync`, `fast_path`, `strict`, `threads`) for the rest of the program."""
        bad = sorted(set(modes) - set(MODES))
        if bad:
            raise ValueError(f"neuron: {', '.join(bad)} is fixed at registration (modes that change: "
                             f"{', '.join(MODES)})")
        checked = {name: MODES[name](value) for name, value in modes.items()}  # all checked before any is set
        for name, value in checked.items():
            setattr(self, name, value)
        for fn in self._listeners:
            fn()

    @contextlib.contextmanager
    def mode(self, **modes):
        """The block runs with these modes; the previous ones come back after it, also after an exception."""
        old = {name: getattr(self, name) for name in modes if name in MODES}
        self.set(**modes)
        try:
            yield self
        finally:
            self.set(**old)


device = Device()  # the one device state of this process
