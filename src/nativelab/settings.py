"""Every environment variable that sets how nativelab behaves: its name, the values it takes, its default, when
it is read. The one module that reads them (tests/test_layers.py checks it); `device/config.py` builds the
device's `Config` from it.

It sits in the utility layer, beside `cpp_build.py` and `files.py`, because the C++ build cache's directory is
one of these settings and nothing below `device/` may import `device/`. The C++ code reads no environment at
all: Python passes it what it needs when it installs or binds it.

A bad value is one ValueError naming the variable and the values it takes. A mode that a program sets for a
block (`with CPU_KERNELS.set(False): ...`) is an override held by this process, never a write to `os.environ`,
so it does not leak into the child processes started inside the block (a compile worker, a torchrun worker,
`subprocess.run`): those read the environment they were started with, as this process did.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

PREFIX = "NATIVELAB_"
_UNSET = object()
_overrides: dict[str, object] = {}  # variable name -> the value a `set` block gives it in this process


class Variable:
    """One environment variable: `get()` is its value (an override of this process, else the environment's,
    parsed, else the default). `read` says when nativelab reads it: a value read at registration is fixed
    for the process from then on."""

    __slots__ = ("name", "parse", "allowed", "default", "default_text", "read", "doc")

    def __init__(self, name: str, parse: Callable[[str], object], allowed: str, default, default_text: str,
                 read: str, doc: str):
        self.name, self.parse, self.allowed, self.default = name, parse, allowed, default
        self.default_text, self.read, self.doc = default_text, read, doc

    def __repr__(self) -> str:
        return f"Variable({self.name})"

    def raw(self) -> str | None:
        """The environment's text, None when unset or blank."""
        raw = os.environ.get(self.name)
        return raw if raw is not None and raw.strip() else None

    def get(self):
        value = _overrides.get(self.name, _UNSET)
        if value is not _UNSET:
            return value
        raw = self.raw()
        if raw is None:
            return self.default() if callable(self.default) else self.default
        return self.parse_text(raw)

    def parse_text(self, raw: str):
        try:
            return self.parse(raw.strip())
        except ValueError:
            raise ValueError(f"{self.name}={raw!r}: expected {self.allowed}") from None

    @contextlib.contextmanager
    def set(self, value):
        """The block runs with `value` (validated as the environment's text would be), in this process only;
        the previous value comes back after it, also after an exception."""
        parsed = self.parse_text(str(value))
        old = _overrides.get(self.name, _UNSET)
        _overrides[self.name] = parsed
        try:
            yield parsed
        finally:
            if old is _UNSET:
                del _overrides[self.name]
            else:
                _overrides[self.name] = old


def _flag(text: str) -> bool:
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _int_from(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise ValueError(text)
        return value
    return parse


def _positive_number(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.lower()
        if value not in choices:
            raise ValueError(text)
        return value
    return parse


def _lnc(text: str) -> int:
    value = int(text)
    if value not in (1, 2):
        raise ValueError(text)
    return value


def _platform(text: str) -> int:
    """NKI's target names -> the NeuronCore generation; NeuronCore-v2 (trn1 / inf2) is not emulated."""
    value = {"trn2": 3, "gen3": 3, "trn3": 4, "gen4": 4}.get(text.lower())
    if value is None:
        raise ValueError(text)
    return value


def _threads(text: str) -> str | int:
    return "auto" if text.lower() == "auto" else _int_from(1)(text)


def _cache_default(name: str) -> Callable[[], Path]:
    def default() -> Path:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "nativelab" / name
    return default


def _flag_var(name: str, default: bool, read: str, doc: str) -> Variable:
    return Variable(name, _flag, "0 or 1", default, "1" if default else "0", read, doc)


def _cache_var(name: str, folder: str, doc: str) -> Variable:
    return Variable(name, Path, "a directory only this user can write (else a private one is used)",
                    _cache_default(folder),
                    f"`$XDG_CACHE_HOME/nativelab/{folder}` (`~/.cache/nativelab/{folder}`)", "at each use", doc)


PHYSICAL_CORES = 8  # trn2.3xlarge: one Trainium2 chip, 8 physical NeuronCores, 96 GB of HBM
HBM_GB = 96.0
REGISTRATION = "at registration"  # import nativelab: fixed for the process from then on

# AWS's Neuron runtime variables, read as the runtime reads them (the device's shape)
VIRTUAL_CORE_SIZE = Variable(
    "NEURON_RT_VIRTUAL_CORE_SIZE", _lnc, "1 or 2", 2, "2", REGISTRATION,
    "physical NeuronCores per logical core (LNC): 2 shows 4 logical cores of 24 GB, 1 shows 8 of 12 GB")
NUM_CORES = Variable(
    "NEURON_RT_NUM_CORES", _int_from(1), "an integer >= 1", lambda: PHYSICAL_CORES // VIRTUAL_CORE_SIZE.get(),
    "8 / LNC", REGISTRATION, "logical cores: `neuron:0` .. `neuron:N-1`")

# AWS's NKI compiler's target, read as nki.jit reads it
PLATFORM_TARGET = Variable(
    "NEURON_PLATFORM_TARGET_OVERRIDE", _platform, "trn2, gen3, trn3 or gen4", 3, "trn2", "at each NKI trace",
    "the NeuronCore NKI kernels are traced for: trn3 makes NeuronCore-v4's MX instructions (nc_matmul_mx, "
    "quantize_mx) available and nisa.get_nc_version() gen4; limits and costs stay NeuronCore-v3's")

# torchrun's, read as torchrun sets it
LOCAL_RANK = Variable(
    "LOCAL_RANK", _int_from(0), "an integer >= 0", None, "unset (not under torchrun)",
    "when a process group is made", "this process's rank on its node: it drives `neuron:{LOCAL_RANK}` "
    "(`cuda:{LOCAL_RANK}` when fine-tuning on CUDA)")

# nativelab's own
CORE_MEMORY_GB = Variable(
    "NATIVELAB_CORE_MEMORY_GB", _positive_number, "a number of GB > 0",
    lambda: HBM_GB / PHYSICAL_CORES * VIRTUAL_CORE_SIZE.get(), "96 / 8 x LNC (24)", REGISTRATION,
    "memory accounted per logical core; beyond it `torch.OutOfMemoryError`")
SYNC = _flag_var("NATIVELAB_SYNC", False, REGISTRATION,
                 "every op completes before returning (like `CUDA_LAUNCH_BLOCKING=1`)")
DTYPE_POLICY = _flag_var("NATIVELAB_DTYPE_POLICY", True, REGISTRATION,
                         "the real device's int64 -> int32 and float64 -> float32 narrowing (0: off)")
FAST_PATH = _flag_var("NATIVELAB_FAST_PATH", True, REGISTRATION,
                      "ops queued by the C++ kernel (0: every op through the Python kernel, the reference path)")
QUIET = _flag_var("NATIVELAB_QUIET", False, REGISTRATION, "no \"emulated on the host CPU\" line at the first "
                  "allocation")
STRICT = _flag_var("NATIVELAB_STRICT", False, REGISTRATION,
                   "a CPU fallback raises at the line that caused it")
EMULATE = _flag_var("NATIVELAB_EMULATE", False, REGISTRATION,
                    "register the emulated device on a CUDA machine too (CUDA backward then fails)")
THREADS = Variable(
    "NATIVELAB_THREADS", _threads, "auto or a thread count >= 1", "auto", "auto", REGISTRATION,
    "the device's host thread team: a fixed count, or `auto`: the cores other processes leave idle")
BF16_GEMM = Variable(
    "NATIVELAB_BF16_GEMM", _one_of("auto", "bf16", "fp32"), "auto, bf16 or fp32", "auto", "auto", REGISTRATION,
    "bf16 matrix products in bf16, or as fp32 GEMMs of upcast operands; `auto` "
    "decides by the CPU")
CPU_KERNELS = _flag_var("NATIVELAB_CPU_KERNELS", True, "at each kernel launch",
                        "the hand-written C++ decode kernels (0: their traced-and-compiled path)")
DECODE_CONFIG = Variable(
    "NATIVELAB_DECODE_CONFIG", str, "default, or fields such as rows=8,ahead=2,hint=l2,split=block,tile=4x6",
    None, "unset: measured", "at a decode plan's first step",
    "the decode kernels' loop configuration, forced (nothing measured)")
NKI_PROFILE = _flag_var("NATIVELAB_NKI_PROFILE", False, "at each NKI compile",
                        "print an NKI kernel's est. trn2 time once per new signature")
NKI_HAZARDS = Variable(
    "NATIVELAB_NKI_HAZARDS", _one_of("off", "auto", "full", "strict"), "off, auto, full or strict", "auto", "auto",
    "at each NKI trace",
    "the hazard checker (races between nl.affine_range iterations and a grid's programs): a warning per race; "
    "`auto` stops at a budget of elements compared, `full` has none, `strict` raises instead")
NKI_FIRST_CALL = Variable(
    "NATIVELAB_NKI_FIRST_CALL", _one_of("interpret", "compile"), "interpret or compile", "interpret", "interpret",
    "at each NKI launch",
    "a new signature's first launch: `interpret` runs it instruction by instruction (nki.simulate's path: seconds, "
    "not a compile's minutes) and compiles at its second launch, or at its first where it was compiled before "
    "(the disk cache has it); `compile` compiles at the first launch")
NKI_LOWER = _flag_var("NATIVELAB_NKI_LOWER", True, "at each NKI launch",
                      "an NKI kernel with a declared lowering (the library's: `kernel.lowering`) runs it on the host, "
                      "after its checks, at the speed of the C++ it lowers to; 0: its own traced code, compiled")
CACHE_DIR = _cache_var("NATIVELAB_CACHE_DIR", "neff", "compiled device graphs (the guide's NEFF cache)")
CPP_CACHE_DIR = _cache_var("NATIVELAB_CPP_CACHE_DIR", "cpp", "nativelab's C++ extensions, built on first use")
TUNE_CACHE_DIR = _cache_var("NATIVELAB_TUNE_CACHE_DIR", "tune", "the decode kernels' measured configurations")

VARIABLES: tuple[Variable, ...] = tuple(v for v in globals().values() if isinstance(v, Variable))


def table() -> str:
    """The variables as a Markdown table (README.md's "Settings" holds this text: a test compares them)."""
    rows = ["| variable | values | default | read | what it sets |", "|---|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.allowed} | {v.default_text} | {v.read} | {v.doc} |" for v in VARIABLES]
    return "\n".join(rows)
