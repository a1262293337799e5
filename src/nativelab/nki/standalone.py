"""NKI without a framework: nki.simulate, and AWS's standalone decorators nki.baremetal, nki.benchmark and
nki.profile (the neuronxcc.nki API, before NKI 0.3), answered here without a NeuronDevice. Their signatures and
result objects are AWS's, from these pages:

  [baremetal] https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.baremetal.html
  [benchmark] https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.benchmark.html
  [profile]   https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.profile.html
  [attn]      aws-neuron-sdk nki/examples/attention/test_attention.py (in the repository until 38480a9):
              `bench_func = benchmark(warmup=5, iters=10)(version)`, then
              `bench_func.benchmark_result.nc_latency.get_latency_percentile(50)` printed with "usec"
  [mamba]     aws-neuron-sdk nki/guides/tutorials/fused_mamba.rst: "a device execution latency of 172.93 usec"

- nki.baremetal runs the kernel (compiled, as `@nki.jit` runs it) on NumPy arrays and returns NumPy arrays.
- nki.benchmark answers with the estimate (nki/cost.py): `benchmark_result.nc_latency.get_latency_percentile(p)`
  is the estimated time in microseconds, AWS's unit ([attn], [mamba]), the same for every p (one estimate, no
  spread). neuron-bench runs the NEFF warmup + iters times; here nothing runs (the kernel is traced, its limits
  and races checked, and estimated), so warmup and iters are checked and otherwise unused.
- nki.profile writes the estimate's engine timeline as a Chrome / Perfetto trace (JSON) where AWS writes its NTFF:
  working_directory / save_trace_name ([profile]); nki.benchmark and nki.baremetal at save_trace_name, if given.
- No NEFF is written (save_neff_name is accepted and unused), nor are AWS's profile-summary JSON files.

Each of the three warns once per process (EstimateWarning) that its figures are Trainium2 estimates, not
measurements."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from .jit import JitKernel, jit
from .order import ORDERS

PERCENTILES = (0, 1, 10, 25, 50, 90, 99, 99.9, 100)  # the ones printed (neuron-bench's are from a real run)


class EstimateWarning(UserWarning):
    """nki.benchmark / nki.profile / nki.baremetal: the figures are an estimate, no NeuronDevice ran the kernel."""


_warned: set = set()  # the entry points that have warned in this process


def simulate(kernel, order: str | None = None, seed: int = 0):
    """`nki.simulate(kernel)(*args)`, AWS's CPU simulator's entry point: the kernel interpreted instruction
    by instruction on CPU tensors (same checks and results as the compiled run, no compile: for debugging).

    nativelab's order check: order="reverse" or "shuffle" (seeded by `seed`) also runs every nl.affine_range
    loop's iterations, and a launch grid's programs, in that order, and raises nki.order.OrderError naming the
    first output element that differs from the in-order run and the loop it traces to (nki/order.py)."""
    if order is not None and order not in ORDERS:
        raise ValueError(f"nki.simulate: order must be one of {ORDERS} (or None: in order), got {order!r}")
    fn = kernel.fn if isinstance(kernel, JitKernel) else kernel
    options = dict(kernel.options) if isinstance(kernel, JitKernel) else {}
    options.update(simulate=True, order=order, seed=int(seed))
    return JitKernel(fn, kernel.grid if isinstance(kernel, JitKernel) else (), **options)


class LatencyResult:
    """`benchmark_result.nc_latency`: the kernel's latency on the NeuronCore, here the estimate."""

    def __init__(self, estimate):
        self.estimate = estimate  # the nki/cost.py Estimate it answers from

    def get_latency_percentile(self, percentile) -> float:
        """The p-th percentile latency in microseconds ([attn]): the estimate, whatever p (no spread)."""
        if isinstance(percentile, bool) or not isinstance(percentile, (int, float)) or not 0 <= percentile <= 100:
            raise ValueError(f"get_latency_percentile: percentile must be a number from 0 to 100, got {percentile!r}")
        return self.estimate.seconds * 1e6


class BenchmarkResult:
    """`kernel.benchmark_result` after a call of an nki.benchmark kernel."""

    def __init__(self, estimate):
        self.nc_latency = LatencyResult(estimate)


def _check_options(api: str, options: dict, allowed: dict) -> dict:
    """AWS's keywords for `api` with their defaults filled in; an unknown one is a TypeError naming it."""
    for name in options:
        if name not in allowed:
            raise TypeError(f"nki.{api}() got an unexpected keyword argument {name!r} "
                            f"(it takes {', '.join(allowed)})")
    got = {**allowed, **options}
    for name in ("warmup", "iters", "profile_nth"):
        if name not in got:
            continue
        v, least = got[name], 0 if name == "warmup" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"nki.{api}: {name} must be an int >= {least}, got {v!r}")
    for name in ("save_neff_name", "save_trace_name"):
        v = got.get(name)
        if v is not None and not isinstance(v, (str, os.PathLike)):
            raise TypeError(f"nki.{api}: {name} must be a file name (str or path), got {v!r}")
    return got


_NOT_MEASURED = ("Trainium2 (NeuronCore-v3) estimates from nativelab's cost model (nki/cost.py), not measurements: "
                 "no NeuronDevice ran this kernel. Rank variants with them; measure on a chip before trusting a "
                 "figure. No NEFF is written.")
_WHAT = {"benchmark": "the kernel is traced, not run, and the latencies it reports are",
         "profile": "the kernel is traced, not run, and the trace it writes (an NTFF on a chip) holds",
         "baremetal": "the kernel runs on this CPU, and the trace it writes at save_trace_name holds"}


def _warn_once(api: str) -> None:
    if api not in _warned:
        _warned.add(api)
        warnings.warn(f"nki.{api}: {_WHAT[api]} {_NOT_MEASURED}", EstimateWarning, stacklevel=3)


class StandaloneKernel:
    """A kernel decorated with nki.baremetal, nki.benchmark or nki.profile: call it with NumPy arrays."""

    def __init__(self, api: str, kernel, options: dict):
        if not callable(kernel):
            raise TypeError(f"nki.{api}: expects a kernel function, got {kernel!r}")
        self.api = api
        self.kernel = kernel if isinstance(kernel, JitKernel) else jit(kernel)
        self.options = options
        self.benchmark_result: BenchmarkResult | None = None  # nki.benchmark: set by each call
        self.__wrapped__ = self.kernel.fn
        self.__name__ = getattr(self.kernel.fn, "__name__", self.kernel.name)
        self.__doc__ = getattr(self.kernel.fn, "__doc__", None)

    def __getitem__(self, grid) -> "StandaloneKernel":  # kernel[grid](...), as an @nki.jit kernel
        return StandaloneKernel(self.api, self.kernel[grid], self.options)

    def __call__(self, *args, **kwargs):
        if self.api == "baremetal":
            _warn_once("baremetal")
            out = self.kernel(*args, **kwargs)
            if self.options["save_trace_name"] is not None:
                self._save(self.kernel.estimate(*args, **kwargs), Path(self.options["save_trace_name"]))
            return out
        est = self.kernel.estimate(*args, **kwargs)  # traced, limits and races checked; nothing runs
        if self.api == "benchmark":
            _warn_once("benchmark")
            self.benchmark_result = BenchmarkResult(est)
            if self.options["save_trace_name"] is not None:
                self._save(est, Path(self.options["save_trace_name"]))
            lat = self.benchmark_result.nc_latency
            print(f"nki.benchmark {self.__name__}: Trainium2 estimate, not a measurement (warmup="
                  f"{self.options['warmup']}, iters={self.options['iters']}: nothing ran)\n  latency (usec): "
                  + "  ".join(f"p{p:g} {lat.get_latency_percentile(p):.2f}" for p in PERCENTILES)
                  + f"\n  {est.summary()}", file=sys.stdout)
            return None
        _warn_once("profile")
        directory = Path(self.options["working_directory"])
        directory.mkdir(parents=True, exist_ok=True)
        self._save(est, directory / self.options["save_trace_name"], self.options["overwrite"])
        return None  # [profile]: "Returns: None"

    def _save(self, est, path: Path, overwrite: bool = True) -> None:
        if path.exists() and not overwrite:
            raise FileExistsError(f"nki.{self.api}: {path} exists; pass overwrite=True to replace it")
        path.parent.mkdir(parents=True, exist_ok=True)
        est.save_trace(path)  # Chrome / Perfetto JSON, under AWS's NTFF name (ui.perfetto.dev opens it)


_COMMON = {"save_neff_name": None, "save_trace_name": None, "additional_compile_opt": None}
_OPTIONS = {
    "baremetal": _COMMON,  # [baremetal]
    # [benchmark]; its defaults for warmup / iters are not in the page's text we read: these are neuron-bench's
    # usual small loop, and unused (nothing runs)
    "benchmark": {"warmup": 10, "iters": 100, **_COMMON},
    "profile": {"working_directory": None, "save_neff_name": "file.neff", "save_trace_name": "profile.ntff",
                "additional_compile_opt": None, "overwrite": False, "profile_nth": 1},  # [profile]
}


def _decorator(api: str, kernel, options: dict):
    """@nki.<api>, @nki.<api>(...), and nki.<api>(kernel, ...) as AWS's are used."""
    got = _check_options(api, options, _OPTIONS[api])
    if api == "profile":
        wd = got["working_directory"]
        if wd is None or not Path(wd).is_absolute():
            raise ValueError(f"nki.profile: working_directory must be given, as an absolute path ([profile]), "
                             f"got {wd!r}")
    if kernel is None:
        return lambda k: StandaloneKernel(api, k, got)
    return StandaloneKernel(api, kernel, got)


def baremetal(kernel=None, **kwargs):
    """nki.baremetal(kernel=None, **kwargs): run the kernel on NumPy arrays, returning NumPy arrays ([baremetal];
    save_neff_name, save_trace_name, additional_compile_opt). The trace at save_trace_name is the estimate's."""
    return _decorator("baremetal", kernel, kwargs)


def benchmark(kernel=None, **kwargs):
    """nki.benchmark(kernel=None, **kwargs) ([benchmark]: warmup, iters, save_neff_name, save_trace_name,
    additional_compile_opt): each call sets `kernel.benchmark_result.nc_latency.get_latency_percentile(p)`, the
    estimated latency in microseconds, and prints it; the trace at save_trace_name is the estimate's."""
    return _decorator("benchmark", kernel, kwargs)


def profile(func=None, **kwargs):
    """nki.profile(func=None, **kwargs) ([profile]: working_directory (absolute), save_neff_name, save_trace_name,
    additional_compile_opt, overwrite, profile_nth): each call writes the estimate's Perfetto trace to
    working_directory / save_trace_name (profile.ntff by default) and returns None."""
    return _decorator("profile", func, kwargs)
