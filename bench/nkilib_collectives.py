"""AWS's nki-library collective tests on several ranks: each case's own kernel, inputs and goldens, run unmodified
from a checkout outside the repository through `nki.multi_rank_simulate` (one CPU process, nki/ranks.py).

    python bench/nkilib_collectives.py --nkilib /tmp/nkilib [--budget 120] [-k EXPR]

Why a driver of its own: nki-library's harness (test/utils/simulation_setup.py at d2ad3a5) simulates every case
with one single-rank call, `nki.cpu_simulate(kernel)[lnc](**inputs)`, whatever its `collective_ranks`, and hands
multi-rank inputs (`PerRankLazyInputGenerator`) to it as if they were a dict; AWS's simulator of that date
implemented no collectives ("Known Gaps" on its NKI CPU Simulator page). So these cases cannot pass in that
harness on any simulator. Here pytest collects the collective test files as they are, with `--noconftest` and a
plugin that replaces only what executes a case: `test_manager.execute(KernelArgs(...))` runs the kernel on
`collective_ranks` ranks (each rank's inputs from the case's per-rank generator, or the same dict on every rank),
the launch as `kernel[logical_nc_config]`, and validates as nki-library's output_validator.py does: a per-rank
golden on every rank, a single golden on rank 0 only, at the case's relative / absolute accuracy. The harness's
dataclasses are stood in by plain ones (nki-library's import metrics and AWS packages a CPU run has no use for).
Nothing of nki-library is in this repository; this file is glue only. A case past --budget seconds is reported as
a timeout (no verdict)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap

PLUGIN = textwrap.dedent('''
    """nativelab's stand-in for nki-library's test executor (bench/nkilib_collectives.py)."""
    import signal
    import sys
    import types

    import numpy as np
    import pytest

    import nativelab  # noqa: F401  (installs nativelab's `nki`)
    import nki


    class _Args:
        def __init__(self, *args, **kwargs):
            self.__dict__.update(kwargs)


    class LazyGoldenGenerator(_Args):
        def golden(self, rank):
            if getattr(self, "output_ndarray", None) is None:
                self.output_ndarray = self.lazy_golden_generator()
            return self.output_ndarray


    class PerRankLazyGenerator:
        def __init__(self, generator):
            self.generator = generator

        def for_rank(self, rank):
            return self.generator(rank_id=rank)

        golden = for_rank


    class PerRankLazyInputGenerator(PerRankLazyGenerator):
        pass


    class PerRankLazyGoldenGenerator(PerRankLazyGenerator):
        pass


    class Orchestrator:
        budget = 120

        def execute(self, case):
            inference = getattr(case, "inference_args", None)
            ranks = getattr(inference, "collective_ranks", 1) or 1
            lnc = getattr(getattr(case, "compiler_input", None), "logical_nc_config", 1) or 1
            given = case.kernel_input
            inputs = [given.for_rank(r) if isinstance(given, PerRankLazyInputGenerator) else dict(given)
                      for r in range(ranks)]
            kernel = case.kernel_func if isinstance(case.kernel_func, nki.JitKernel) else nki.jit(case.kernel_func)
            kernel = kernel[lnc] if lnc > 1 else kernel

            def late(*_):
                raise TimeoutError(f"past the budget of {self.budget} s (no verdict)")

            signal.signal(signal.SIGALRM, late)
            signal.alarm(self.budget)
            try:
                outs = nki.multi_rank_simulate(kernel, world_size=ranks,
                                               per_rank_inputs=[((), kwargs) for kwargs in inputs])
            finally:
                signal.alarm(0)
            check = case.validation_args
            per_rank = isinstance(check.golden_output, PerRankLazyGoldenGenerator)
            failed = []
            for r in range(ranks) if per_rank else range(1):  # output_validator.py: a single golden, rank 0 only
                golden = check.golden_output.golden(r)
                out = outs[r] if isinstance(outs[r], (list, tuple)) else [outs[r]]
                assert len(out) == len(golden), f"rank {r}: {len(out)} outputs, golden has {len(golden)}"
                for (name, want), got in zip(golden.items(), out):
                    want32, got32 = np.asarray(want, dtype=np.float32), np.asarray(got, dtype=np.float32)
                    if want32.shape != got32.shape or not np.allclose(
                            got32, want32, rtol=getattr(check, "relative_accuracy", 1e-5),
                            atol=getattr(check, "absolute_accuracy", 1e-5)):
                        failed.append(f"rank {r} {name}")
            assert not failed, "outputs differ from the golden: " + ", ".join(failed)


    def _module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m


    _module("test.utils.common_dataclasses", CompilerArgs=_Args, InferenceArgs=_Args, KernelArgs=_Args,
            ValidationArgs=_Args, LazyGoldenGenerator=LazyGoldenGenerator,
            PerRankLazyInputGenerator=PerRankLazyInputGenerator, PerRankLazyGoldenGenerator=PerRankLazyGoldenGenerator)
    _module("test.utils.test_orchestrator", Orchestrator=Orchestrator)
    _module("test.utils.pytest_test_metadata", pytest_test_metadata=lambda **_: (lambda cls: cls))


    def pytest_addoption(parser):
        parser.addoption("--case-budget", type=int, default=120)


    @pytest.fixture
    def test_manager(request):
        Orchestrator.budget = request.config.getoption("--case-budget")
        return Orchestrator()
''')


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nkilib", required=True, help="a checkout of aws-neuron/nki-library (outside this repository)")
    ap.add_argument("--budget", type=int, default=120, help="seconds per case before it counts as a timeout")
    ap.add_argument("-k", default=None, help="pytest -k expression to pick cases")
    args = ap.parse_args()
    cases = os.path.join(args.nkilib, "test", "integration", "nkilib", "experimental", "collectives")
    if not os.path.isdir(cases):
        sys.exit(f"bench/nkilib_collectives.py: {cases} does not exist: --nkilib must be an nki-library checkout")
    with tempfile.TemporaryDirectory() as glue:
        with open(os.path.join(glue, "nativelab_collectives_plugin.py"), "w") as f:
            f.write(PLUGIN)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([glue, args.nkilib, os.path.join(args.nkilib, "src"),
                                             env.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "pytest", cases, "-q", "-rA", "--noconftest", "-p", "nativelab_collectives_plugin",
               "-p", "no:cacheprovider", "-W", "ignore::nativelab.nki.hazards.HazardWarning", f"--case-budget={args.budget}",
               "--rootdir", args.nkilib, "--import-mode=append"]
        if args.k:
            cmd += ["-k", args.k]
        return subprocess.call(cmd, env=env, cwd=args.nkilib)


if __name__ == "__main__":
    sys.exit(main())
