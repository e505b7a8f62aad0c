#!/usr/bin/env bash
# GPU session entry point: install the project into the device image's Python (DESIGN.md §7: the image already has
# torch, triton, transformers, accelerate, peft, …; --no-deps so pip never replaces its CUDA torch), then run
# scripts/gpu_check.py with the given arguments (tests on CUDA + every GPU benchmark + summary; see its --help).
#   bash scripts/gpu_check.sh                   # everything (longer than one 10-minute device call: split with --only)
#   bash scripts/gpu_check.sh --only tests      # then --only gemm sync, --only rollout, --only rl_step ar_decode …
#   GPU_CHECK_SKIP_INSTALL=1 bash scripts/gpu_check.sh --only summary
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
if [ -z "${GPU_CHECK_SKIP_INSTALL:-}" ]; then
  "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e .
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
