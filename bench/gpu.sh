#!/usr/bin/env bash
# The GPU check in one go (an H200 lent for a few minutes): environment, the Lab 2 benchmark on CUDA, the CUDA
# and Triton tests, the kernel table. Run from the repository root, nothing installed:
#     OUT=/some/dir bash bench/gpu.sh
# Every step runs under its own timeout inside an overall budget (GPU_BUDGET_S, default 450 s) and a failure
# never stops the next step; logs land in $OUT (at most 8 files) and summary.txt collects the figures.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${GPU_BUDGET_S:-450}
START=$(date +%s)
export PYTHONUNBUFFERED=1 NATIVELAB_QUIET=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0
# nativelab from this checkout; pytest from .gpu-deps when the machine has none (bench/gpu_deps.sh makes it)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! $PY -c "import pytest" 2>/dev/null && [ -d .gpu-deps ]; then export PYTHONPATH="$PYTHONPATH:$PWD/.gpu-deps"; fi

step() {  # step NAME LIMIT_S CMD...: run CMD with at most LIMIT_S, and never past the overall budget
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - START) ))
  (( limit > left )) && limit=$left
  if (( limit < 15 )); then echo "== $name: skipped, budget spent" | tee -a "$OUT/summary.txt"; return; fi
  echo "== $name (limit ${limit}s): $*" | tee "$OUT/$name.log"
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$OUT/$name.log" "$OUT/summary.txt"
}

{
  nvidia-smi
  $PY -c "import sys, torch, triton; print('python', sys.version.split()[0], '| torch', torch.__version__, \
'| cuda', torch.version.cuda, '| triton', triton.__version__, '|', torch.cuda.get_device_name())"
  $PY -c "import pytest; print('pytest', pytest.__version__)" || echo "pytest: not available (run bench/gpu_deps.sh here, carry .gpu-deps)"
  $PY -W always -c "import nativelab; print('nativelab imported; emulated neuron registered:', nativelab.device.is_registered())"
} > "$OUT/env.log" 2>&1 || true
echo "smollm2-135m: not run here (its 98 MB GGUF file and the gguf reader are not on this machine)" >> "$OUT/env.log"
cat "$OUT/env.log"

# The headline: the three tiers compiled (Inductor) and eager, greedy, against the HBM roofline.
step lab2 250 $PY bench/lab2.py --device cuda --size small --tokens 50 --repeats 3 --skip-top-p || true
# (not slow: the one slow test checks CPU-only logic through the CPU kernel compiler, not this machine's concern)
step tests 120 $PY -m pytest -q -p no:cacheprovider -rfE -m "not slow" tests/test_cuda.py tests/test_triton.py || true
step kernels 40 $PY bench/kernels.py --device cuda --skip-compiled --iters 100 || true
# Top-p through the device sampler (eager; no compile), the Lab 2 table format.
step run_top_p 30 $PY -m nativelab.cli run --device cuda --model all --size small --tokens 50 --warmup 1 --repeat 3 || true

{
  echo "---- figures"
  grep -hE "^torch |bytes per decode step|^compiled|^eager|^  (base|core|experimental) |experimental / base" "$OUT/lab2.log" 2>/dev/null
  grep -hE "passed|failed|error" "$OUT/tests.log" 2>/dev/null | tail -3
  grep -hE "^  [a-z_]" "$OUT/kernels.log" 2>/dev/null
  grep -hE "^(base|core|experimental) " "$OUT/run_top_p.log" 2>/dev/null
  echo "total $(( $(date +%s) - START ))s"
} >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
