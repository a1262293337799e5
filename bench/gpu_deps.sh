#!/usr/bin/env bash
# Copy pytest and its pure-Python dependencies from a local environment into .gpu-deps/ (git-ignored), for a
# GPU machine without pip: carry .gpu-deps with the checkout and bench/gpu.sh puts it on PYTHONPATH if needed.
#     bash bench/gpu_deps.sh [python]
set -euo pipefail
PY=${1:-python3}
SITE=$($PY -c "import os, pytest; print(os.path.dirname(os.path.dirname(pytest.__file__)))")
rm -rf .gpu-deps.tmp && mkdir .gpu-deps.tmp
for p in pytest _pytest pluggy iniconfig packaging pygments py.py; do
  [ -e "$SITE/$p" ] && cp -r "$SITE/$p" .gpu-deps.tmp/
done
find .gpu-deps.tmp -name __pycache__ -prune -exec rm -rf {} +
rm -rf .gpu-deps && mv .gpu-deps.tmp .gpu-deps
du -sh .gpu-deps
